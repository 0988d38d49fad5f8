// CRC-32C with a 8 x 256-entry table (slicing by 8), built once on first use.
#include "lib/util/crc32c.h"

#include <cstring>

namespace strata {
namespace {

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Tables &GetTables() {
  static const Tables tables;
  return tables;
}

}  // namespace

uint32_t Crc32c(uint32_t crc, const void *data, size_t n) {
  const Tables &T = GetTables();
  const auto *p = static_cast<const uint8_t *>(data);
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // little-endian hosts only (Strata's targets)
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = T.t[7][lo & 0xff] ^ T.t[6][(lo >> 8) & 0xff] ^ T.t[5][(lo >> 16) & 0xff] ^ T.t[4][lo >> 24] ^
          T.t[3][hi & 0xff] ^ T.t[2][(hi >> 8) & 0xff] ^ T.t[1][(hi >> 16) & 0xff] ^ T.t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ T.t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

}  // namespace strata
