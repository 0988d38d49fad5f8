// libFuzzer target for hotlists (`strata profile` output, read by --hotlist and pack): two bytes
// choose the model's layer and expert counts, the rest is the file's text. Any text must give a
// list or a status naming the line; a list must hold each (layer, expert) once, inside the model,
// ordered by count, most used first.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string_view>
#include <utility>

#include "lib/model/pack.h"
#include "tests/fuzz/fuzz_util.h"

using strata::fuzz::Require;
using strata::fuzz::RequireRefusal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  strata::model::HParams hp;
  hp.n_layer = 1 + data[0] % 64;
  hp.n_expert = 1 + data[1];
  const std::string_view text(reinterpret_cast<const char *>(data + 2), size - 2);
  auto r = strata::model::ParseHotlist(text, "fuzz.hotlist", hp);
  if (!r.ok()) {
    RequireRefusal(r.status(), {MOE_ERR_INVALID_ARGUMENT});
    Require(r.status().message().find("fuzz.hotlist") != std::string_view::npos);
    return 0;
  }
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < r->size(); ++i) {
    const strata::model::HotExpert &h = (*r)[i];
    Require(h.layer >= 0 && h.layer < hp.n_layer && h.expert >= 0 && h.expert < hp.n_expert);
    Require(seen.insert({h.layer, h.expert}).second);
    Require(i == 0 || (*r)[i - 1].count >= h.count);
  }
  return 0;
}
