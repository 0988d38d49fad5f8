// libFuzzer target for the GGUF parser: any byte string must parse or fail with a format status,
// never crash, hang or over-allocate; a file that parses must satisfy the invariants checked here.
#include <cstddef>
#include <cstdint>

#include "lib/format/gguf.h"

namespace {

// A parsed file breaking an invariant the parser promises is a bug: stop loudly.
void Require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata::format;
  MemorySource src(data, size, "fuzz.gguf");
  absl::StatusOr<GgufFile> r = ParseGguf(src);
  if (!r.ok()) {
    Require(MOE_STATUS_CATEGORY(strata::StatusToMoe(r.status())) == MOE_ERR_FORMAT);
    return 0;
  }
  const GgufFile &g = *r;
  Require(g.version == 2 || g.version == 3);
  Require(g.alignment != 0 && (g.alignment & (g.alignment - 1)) == 0);
  Require(g.data_offset % g.alignment == 0);
  for (const auto &[key, value] : g.kv) {
    Require(g.Find(key) == &value);
    // The getters must answer (a value or an error) for every key, whatever its type.
    (void)g.GetUint(key);
    (void)g.GetFloat(key);
    (void)g.GetString(key);
    (void)g.GetBool(key);
    // An array holds exactly its elements: strings, or numbers at their own width.
    if (value.type == GgufType::kArray) {
      if (value.elem_type == GgufType::kString) {
        Require(value.arr_str.size() == value.arr_len && value.arr_raw.empty());
      } else {
        Require(value.IsIntArray() != value.IsFloatArray() && value.arr_str.empty());
        Require(value.arr_raw.size() == value.arr_len * GgufElemBytes(value.elem_type));
        if (value.arr_len > 0) (void)value.FloatAt(value.arr_len - 1);
      }
    }
  }
  for (const GgufTensorInfo &t : g.tensors) {
    Require(g.FindTensor(t.name) == &t);
    Require(t.n_dims >= 1 && t.n_dims <= 4);
    Require(t.offset >= g.data_offset && t.offset % g.alignment == 0);
    Require(t.nbytes <= size && t.offset <= size - t.nbytes);
    Require(t.nbytes == t.nb[3] * static_cast<uint64_t>(t.ne[3]));
  }
  return 0;
}
