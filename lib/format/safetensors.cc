// safetensors files and Hugging Face checkpoint directories. JSON goes through the bounded reader
// (lib/format/json.h), which refuses duplicate keys here (nlohmann would silently keep the last) and
// deep nesting; every tensor is validated before anything is trusted.
#include "lib/util/hash_containers.h"
#include "lib/format/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>

#include "lib/format/json.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the safetensors reader assumes a little-endian host");

namespace strata::format {
namespace {

using json = nlohmann::json;

constexpr uint64_t kConfigMaxBytes = 16u << 20;
constexpr uint64_t kIndexMaxBytes = 64u << 20;
constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kConfigName[] = "config.json";
constexpr char kMetadataKey[] = "__metadata__";

// Parser messages quote the offending token, which in a hostile file can be megabytes long.
std::string Clip(std::string s, size_t max = 200) {
  if (s.size() > max) {
    s.resize(max);
    s += "...";
  }
  return s;
}

struct DtypeInfo {
  const char *name;
  uint64_t bytes;
  uint32_t ggml;
};

// The dtypes of the safetensors format; those with a ggml counterpart map to its id.
constexpr DtypeInfo kDtypes[] = {
    {"F64", 8, 28},  {"F32", 4, 0},  {"F16", 2, 1},  {"BF16", 2, 30},
    {"I64", 8, 27},  {"I32", 4, 26}, {"I16", 2, 25}, {"I8", 1, 24},
    {"U64", 8, kUnsupportedDtype},   {"U32", 4, kUnsupportedDtype},
    {"U16", 2, kUnsupportedDtype},   {"U8", 1, kUnsupportedDtype},
    {"BOOL", 1, kUnsupportedDtype},  {"F8_E4M3", 1, kUnsupportedDtype},
    {"F8_E5M2", 1, kUnsupportedDtype},
};

const DtypeInfo *FindDtype(const std::string &name) {
  for (const DtypeInfo &d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

// Validates one header entry into `t` (offsets still relative to the data section).
absl::Status ParseEntry(const std::string &name, const json &entry, SafetensorsTensor *t) {
  auto fail = [&](moe_status code, const std::string &what) {
    return MakeError(code, absl::StrCat("tensor '", Clip(name), "': ", what));
  };
  if (!entry.is_object()) {
    return fail(MOE_ERR_FORMAT_TENSOR, absl::StrCat("entry is a JSON ", entry.type_name(),
                                                    ", not an object"));
  }
  for (const auto &[field, unused] : entry.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      return fail(MOE_ERR_FORMAT_TENSOR, absl::StrCat("unknown field '", Clip(field), "'"));
    }
  }
  t->name = name;
  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    return fail(MOE_ERR_FORMAT_TENSOR, "missing string field 'dtype'");
  }
  t->dtype = dtype->get_ref<const std::string &>();
  const DtypeInfo *info = FindDtype(t->dtype);
  if (info == nullptr) {
    return fail(MOE_ERR_FORMAT_TENSOR, absl::StrCat("unknown dtype '", Clip(t->dtype), "'"));
  }
  t->type = info->ggml;

  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) {
    return fail(MOE_ERR_FORMAT_TENSOR, "missing array field 'shape'");
  }
  uint64_t elems = 1;
  t->shape.reserve(shape->size());
  for (size_t d = 0; d < shape->size(); ++d) {
    const json &v = (*shape)[d];
    if (v.is_number_integer() && !v.is_number_unsigned()) {
      return fail(MOE_ERR_FORMAT_TENSOR,
                  absl::StrCat("shape[", d, "] is negative (", v.get<int64_t>(), ")"));
    }
    if (!v.is_number_unsigned()) {
      return fail(MOE_ERR_FORMAT_TENSOR,
                  absl::StrCat("shape[", d, "] is a ", v.type_name(), ", not an integer"));
    }
    uint64_t n = v.get<uint64_t>();
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(elems, n, &elems)) {
      return fail(MOE_ERR_FORMAT_TENSOR, "element count of the shape overflows 64 bits");
    }
    t->shape.push_back(static_cast<int64_t>(n));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(elems, info->bytes, &bytes)) {
    return fail(MOE_ERR_FORMAT_TENSOR, "byte size of the shape overflows 64 bits");
  }

  auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return fail(MOE_ERR_FORMAT_TENSOR,
                "'data_offsets' must be an array of two non-negative integers [begin, end]");
  }
  uint64_t begin = (*offsets)[0].get<uint64_t>();
  uint64_t end = (*offsets)[1].get<uint64_t>();
  if (end < begin) {
    return fail(MOE_ERR_FORMAT_TENSOR,
                absl::StrCat("data_offsets [", begin, ", ", end, "] end before they begin"));
  }
  if (end - begin != bytes) {
    return fail(MOE_ERR_FORMAT_TENSOR,
                absl::StrCat("data_offsets [", begin, ", ", end, "] span ", end - begin,
                             " bytes but ", t->dtype, " of ", elems, " elements needs ", bytes));
  }
  t->offset = begin;
  t->nbytes = bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensorsImpl(const Source &src,
                                                                    const SafetensorsLimits &limits) {
  const uint64_t size = src.size();
  if (size < 8) {
    return Errorf(MOE_ERR_FORMAT_TRUNCATED,
                  "file is %u bytes, too short for the 8-byte header length", size);
  }
  uint64_t n = 0;
  STRATA_RETURN_IF_ERROR(src.ReadAt(0, &n, 8));
  if (n > limits.max_header_bytes) {
    return Errorf(MOE_ERR_FORMAT_HEADER, "header length %u is over the limit of %u bytes", n,
                  limits.max_header_bytes);
  }
  if (n > size - 8) {
    return Errorf(MOE_ERR_FORMAT_TRUNCATED,
                  "header length %u runs past the end of the file (%u bytes)", n, size);
  }
  std::string header(static_cast<size_t>(n), '\0');
  STRATA_RETURN_IF_ERROR(src.ReadAt(8, header.data(), n));
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;

  JsonOptions strict;
  strict.reject_duplicates = true;
  STRATA_ASSIGN_OR_RETURN(const json root, ParseJson(header, MOE_ERR_FORMAT_METADATA, "header", strict));
  if (!root.is_object()) {
    return Errorf(MOE_ERR_FORMAT_METADATA, "header is a JSON %s, not an object", root.type_name());
  }

  std::vector<SafetensorsTensor> tensors;
  tensors.reserve(root.size());
  for (const auto &[key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        return Errorf(MOE_ERR_FORMAT_METADATA, "'%s' is a JSON %s, not an object", kMetadataKey,
                      value.type_name());
      }
      for (const auto &[mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return Errorf(MOE_ERR_FORMAT_METADATA, "'%s' entry '%s' is a JSON %s, not a string",
                        kMetadataKey, Clip(mk), mv.type_name());
        }
      }
      continue;
    }
    SafetensorsTensor t;
    STRATA_RETURN_IF_ERROR(ParseEntry(key, value, &t));
    if (t.offset + t.nbytes > data_size) {  // no wrap: end >= begin and both are uint64 values
      return Errorf(MOE_ERR_FORMAT_TRUNCATED,
                    "tensor '%s': data_offsets [%u, %u] run past the end of the data section "
                    "(%u bytes)",
                    Clip(key), t.offset, t.offset + t.nbytes, data_size);
    }
    tensors.push_back(std::move(t));
  }

  // The reference implementation requires the tensors to tile the data section exactly: sorted by
  // offset they start at 0, each begins where the previous ended, and the last ends at the end.
  std::sort(tensors.begin(), tensors.end(), [](const SafetensorsTensor &a, const SafetensorsTensor &b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  uint64_t expect = 0;
  const SafetensorsTensor *prev = nullptr;
  for (const SafetensorsTensor &t : tensors) {
    if (t.offset < expect) {
      return Errorf(MOE_ERR_FORMAT_TENSOR, "tensors '%s' [%u, %u) and '%s' [%u, %u) overlap",
                    Clip(prev->name), prev->offset, prev->offset + prev->nbytes, Clip(t.name), t.offset,
                    t.offset + t.nbytes);
    }
    if (t.offset > expect) {
      return Errorf(MOE_ERR_FORMAT_TENSOR,
                    "gap: bytes [%u, %u) of the data section before tensor '%s' belong to no tensor",
                    expect, t.offset, Clip(t.name));
    }
    expect = t.offset + t.nbytes;
    prev = &t;
  }
  if (expect != data_size) {
    return Errorf(MOE_ERR_FORMAT_TENSOR,
                  "the data section has %u bytes but the tensors cover only %u%s", data_size, expect,
                  prev ? absl::StrCat(" (the last is '", Clip(prev->name), "')") : std::string());
  }
  for (SafetensorsTensor &t : tensors) t.offset += data_start;
  return tensors;
}

bool IsPlainFileName(const std::string &name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

bool IsDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Something is at `path` (a FIFO or a device included: its open then says what it is, rather than
// the file being taken for absent).
bool Exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Reads and parses a JSON object file of the checkpoint (config.json, the index).
absl::StatusOr<json> ReadJsonObject(const std::string &path, uint64_t max_bytes,
                                    bool reject_duplicates) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, max_bytes);
  if (!text.ok()) {
    if (StatusToMoe(text.status()) == MOE_ERR_LIMIT) {
      return MakeError(MOE_ERR_FORMAT_CONFIG, std::string(text.status().message()));
    }
    return text.status();
  }
  JsonOptions options;
  options.reject_duplicates = reject_duplicates;
  STRATA_ASSIGN_OR_RETURN(json value, ParseJson(*text, MOE_ERR_FORMAT_CONFIG, path, options));
  if (!value.is_object()) {
    return Errorf(MOE_ERR_FORMAT_CONFIG, "%s: is a JSON %s, not an object", path, value.type_name());
  }
  return value;
}

// Opens and parses one shard, appending its tensors (tagged with `file_index`) to `out`.
absl::Status AddShard(const std::string &path, HfCheckpoint *out) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<File> file, File::Open(path));
  STRATA_ASSIGN_OR_RETURN(std::vector<SafetensorsTensor> tensors, ParseSafetensors(*file));
  const int file_index = static_cast<int>(out->files.size());
  out->files.push_back(std::move(file));
  for (SafetensorsTensor &t : tensors) {
    t.file_index = file_index;
    out->tensors.push_back(std::move(t));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensors(const Source &src,
                                                                const SafetensorsLimits &limits) {
  absl::StatusOr<std::vector<SafetensorsTensor>> r = ParseSafetensorsImpl(src, limits);
  if (!r.ok()) return Annotate(r.status(), src.name());
  return r;
}

const SafetensorsTensor *HfCheckpoint::Find(const std::string &name) const {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

bool IsHfCheckpointDir(const std::string &path) {
  return IsDirectory(path) && Exists(path + "/" + kConfigName);
}

absl::StatusOr<HfCheckpoint> OpenHfCheckpoint(const std::string &dir) {
  if (!IsDirectory(dir)) {
    return Errorf(MOE_ERR_IO_OPEN, "'%s' is not a directory (or does not exist)", dir);
  }
  HfCheckpoint out;
  out.dir = dir;
  // Duplicate keys in config.json are tolerated, last one wins, as Python's json does.
  STRATA_ASSIGN_OR_RETURN(out.config, ReadJsonObject(dir + "/" + kConfigName, kConfigMaxBytes,
                                                     /*reject_duplicates=*/false));

  const std::string index_path = dir + "/" + kIndexName;
  if (Exists(index_path)) {
    STRATA_ASSIGN_OR_RETURN(json index, ReadJsonObject(index_path, kIndexMaxBytes,
                                                       /*reject_duplicates=*/true));
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      return Errorf(MOE_ERR_FORMAT_CONFIG, "%s: missing object 'weight_map'", index_path);
    }
    // name -> shard, and the shards in name order so file_index is deterministic.
    HashMap<std::string, std::string> where;
    std::vector<std::string> shards;
    for (const auto &[name, shard] : wm->items()) {
      if (!shard.is_string()) {
        return Errorf(MOE_ERR_FORMAT_CONFIG, "%s: weight_map entry '%s' is a JSON %s, not a file name",
                      index_path, Clip(name), shard.type_name());
      }
      const std::string &file = shard.get_ref<const std::string &>();
      if (!IsPlainFileName(file)) {
        return Errorf(MOE_ERR_FORMAT_CONFIG,
                      "%s: weight_map entry '%s' names shard '%s', which is not a plain file name "
                      "in the checkpoint directory",
                      index_path, Clip(name), Clip(file));
      }
      where.emplace(name, file);
      shards.push_back(file);
    }
    std::sort(shards.begin(), shards.end());
    shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
    for (const std::string &shard : shards) {
      STRATA_RETURN_IF_ERROR(AddShard(dir + "/" + shard, &out));
    }
    for (size_t k = 0; k < out.tensors.size(); ++k) {
      const SafetensorsTensor &t = out.tensors[k];
      const std::string &shard = shards[static_cast<size_t>(t.file_index)];
      auto it = where.find(t.name);
      if (it == where.end()) {
        return Errorf(MOE_ERR_FORMAT_CONFIG, "tensor '%s' of shard '%s' is not in %s", t.name, shard,
                      kIndexName);
      }
      if (it->second != shard) {
        return Errorf(MOE_ERR_FORMAT_CONFIG, "tensor '%s' is in shard '%s' but %s puts it in '%s'",
                      t.name, shard, kIndexName, it->second);
      }
      if (!out.index.emplace(t.name, k).second) {
        return Errorf(MOE_ERR_FORMAT_CONFIG, "tensor '%s' appears twice in shard '%s'", t.name, shard);
      }
    }
    for (const auto &[name, shard] : where) {
      if (out.index.count(name) == 0) {
        return Errorf(MOE_ERR_FORMAT_CONFIG, "%s puts tensor '%s' in shard '%s', which lacks it",
                      kIndexName, Clip(name), shard);
      }
    }
    return out;
  }

  std::vector<std::string> shards;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    constexpr std::string_view kSuffix = ".safetensors";
    if (name.size() > kSuffix.size() &&
        name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {  // opening refuses non-files
      shards.push_back(name);
    }
  }
  if (ec) {
    return Errorf(MOE_ERR_IO_OPEN, "cannot list '%s': %s", dir, ec.message());
  }
  if (shards.empty()) {
    return Errorf(MOE_ERR_IO_OPEN, "'%s' has no *.safetensors files and no %s", dir, kIndexName);
  }
  std::sort(shards.begin(), shards.end());
  for (const std::string &shard : shards) {
    STRATA_RETURN_IF_ERROR(AddShard(dir + "/" + shard, &out));
  }
  for (size_t k = 0; k < out.tensors.size(); ++k) {
    const SafetensorsTensor &t = out.tensors[k];
    auto [it, inserted] = out.index.emplace(t.name, k);
    if (!inserted) {
      return Errorf(MOE_ERR_FORMAT_METADATA, "tensor '%s' is in both '%s' and '%s'", t.name,
                    shards[static_cast<size_t>(out.tensors[it->second].file_index)],
                    shards[static_cast<size_t>(t.file_index)]);
    }
  }
  return out;
}

}  // namespace strata::format
