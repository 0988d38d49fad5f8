// libFuzzer target for session snapshots, loaded into a context over the bundled demo model (opened
// once). So that mutations reach the sections behind the checksum, most inputs get their header's
// total size and their CRC trailer set to match their bytes before loading (an input whose size is
// 7 mod 8 is loaded as it is). Any bytes must load a session that is then closed, or fail with a
// status and a message naming the snapshot; never crash, leak or over-allocate.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "lib/runtime/context.h"
#include "lib/runtime/snapshot.h"
#include "lib/util/crc32c.h"
#include "tests/fuzz/fuzz_util.h"

using strata::fuzz::Require;
using strata::fuzz::RequireRefusal;

namespace {

strata::runtime::Context &DemoContext() {
  static strata::runtime::Context *ctx = [] {
    strata::runtime::ContextOptions o;
    o.model_path = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe-q4_k.gguf";
    o.n_threads = 1;
    o.n_io_threads = 1;
    o.max_sessions = 2;
    auto c = strata::runtime::Context::Open(o);
    Require(c.ok());
    return c->release();
  }();
  return *ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using strata::runtime::kSnapshotHeaderBytes;
  strata::runtime::Context &ctx = DemoContext();
  std::vector<uint8_t> blob(data, data + size);
  if (size >= kSnapshotHeaderBytes + 4 && size % 8 != 7) {
    const uint64_t total = size;
    std::memcpy(blob.data() + 16, &total, 8);  // after the magic, the version and the header size
    const uint32_t crc = strata::Crc32c(0, blob.data(), size - 4);
    std::memcpy(blob.data() + size - 4, &crc, 4);
  }
  absl::StatusOr<strata::runtime::Session *> s = ctx.LoadSessionBytes(blob.data(), blob.size(), "fuzz.session", nullptr);
  if (!s.ok()) {
    RequireRefusal(s.status(), {MOE_ERR_FORMAT, MOE_ERR_UNSUPPORTED, MOE_ERR_LIMIT, MOE_ERR_INVALID_ARGUMENT});
    Require(s.status().message().find("fuzz.session") != std::string::npos ||
                MOE_STATUS_CATEGORY(strata::StatusToMoe(s.status())) == MOE_ERR_LIMIT,
            s.status());
    return 0;
  }
  ctx.CloseSession(*s);
  return 0;
}
