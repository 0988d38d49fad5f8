// `strata imatrix` against llama.cpp's: the importance matrix llama-imatrix wrote for the demo model
// over a committed text (tests/quant/fixtures/imatrix, scripts/quant/make_imatrix_fixture.sh) is
// read, and Strata's over the same model, text and windows agrees with it. llama.cpp rounds the
// activations to 8 bits in its products, so a few tokens route to other experts and the sums differ
// within that: the dense tensors' columns to 2%, each well-used expert's mean square to 1e-3 (gate,
// up) and 3% (down: its input passed through the expert), the counts to a few tokens.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "lib/model/imatrix.h"
#include "tests/format/format_test_util.h"

#ifdef STRATA_CLI_PATH
TEST_CASE("imatrix: llama.cpp's file is read, and Strata's over the same text agrees with it", "[imatrix]") {
  const std::string src = std::string(STRATA_SOURCE_DIR);
  const std::string dir = src + "/tests/quant/fixtures/imatrix/";
  auto ref = strata::model::ReadImatrix(dir + "llama_cpp_imatrix.gguf");
  INFO(ref.status().message());
  REQUIRE(ref.ok());
  CHECK(!ref->legacy);
  CHECK(ref->chunk_count == 4);
  CHECK(ref->chunk_size == 512);
  REQUIRE(ref->datasets.size() == 1);
  CHECK(ref->datasets[0] == "persuasion_23.txt");
  CHECK(ref->entries.size() == 4 * 8);

  strata::format::testing::TempDir tmp;
  const std::string out = tmp.File("strata.gguf");
  const std::string cmd = std::string(STRATA_CLI_PATH) + " imatrix --model " + src +
                          "/examples/models/austen-moe-q4_k.gguf --file " + dir + "persuasion_23.txt -c 512 --chunks 4 --out " +
                          out + " >/dev/null 2>" + tmp.File("err");
  const int rc = std::system(cmd.c_str());
  REQUIRE((WIFEXITED(rc) && WEXITSTATUS(rc) == 0));
  auto got = strata::model::ReadImatrix(out);
  REQUIRE(got.ok());
  REQUIRE(got->entries.size() == ref->entries.size());
  for (const auto &[name, want] : ref->entries) {
    INFO(name);
    REQUIRE(got->entries.count(name) == 1);
    const auto &e = got->entries.at(name);
    REQUIRE(e.n_cols == want.n_cols);
    REQUIRE(e.n_mat() == want.n_mat());
    if (want.n_mat() == 1) {
      CHECK(e.counts[0] == want.counts[0]);
      double peak = 0;
      for (double v : want.sums) peak = std::max(peak, v);
      for (int64_t j = 0; j < want.n_cols; ++j) {
        CHECK(std::abs(e.sums[j] - want.sums[j]) <= 0.02 * std::max(want.sums[j], 1e-3 * peak));
      }
      continue;
    }
    int64_t total = 0, total_want = 0;
    const bool down = name.find("ffn_down_exps") != std::string::npos;
    for (int64_t m = 0; m < want.n_mat(); ++m) {
      total += e.counts[m];
      total_want += want.counts[m];
      CHECK(std::abs(e.counts[m] - want.counts[m]) <= 5);
      if (std::min(e.counts[m], want.counts[m]) < 100) continue;
      double a = 0, b = 0;
      for (int64_t j = 0; j < want.n_cols; ++j) {
        a += e.sums[m * want.n_cols + j];
        b += want.sums[m * want.n_cols + j];
      }
      a /= static_cast<double>(e.counts[m]);
      b /= static_cast<double>(want.counts[m]);
      CHECK(std::abs(a - b) <= (down ? 0.03 : 1e-3) * b);
    }
    CHECK(total == total_want);
    CHECK(total == 2 * 4 * 512);  // top-2 over four windows
  }
}
#endif
