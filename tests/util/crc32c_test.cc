// CRC-32C against the check values of RFC 3720 (iSCSI) appendix B.4 and the standard check string,
// and chained calls equal one call over the whole.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "lib/util/crc32c.h"

TEST_CASE("crc32c: published check values", "[util]") {
  CHECK(strata::Crc32c(0, "123456789", 9) == 0xE3069283u);
  std::vector<uint8_t> b(32, 0);
  CHECK(strata::Crc32c(0, b.data(), b.size()) == 0x8A9136AAu);
  std::fill(b.begin(), b.end(), 0xff);
  CHECK(strata::Crc32c(0, b.data(), b.size()) == 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(i);
  CHECK(strata::Crc32c(0, b.data(), b.size()) == 0x46DD794Eu);
  CHECK(strata::Crc32c(0, nullptr, 0) == 0u);
}

TEST_CASE("crc32c: chained calls equal one call, at every split", "[util]") {
  std::vector<uint8_t> b(1000);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint32_t whole = strata::Crc32c(0, b.data(), b.size());
  for (size_t cut = 0; cut <= b.size(); cut += 37) {
    CHECK(strata::Crc32c(strata::Crc32c(0, b.data(), cut), b.data() + cut, b.size() - cut) == whole);
  }
}
