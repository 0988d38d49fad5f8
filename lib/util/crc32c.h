// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of session snapshots and KV
// spill files. Table-driven, byte at a time; Crc32c(Crc32c(0, a), b) == Crc32c(0, a + b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

uint32_t Crc32c(uint32_t crc, const void *data, size_t n);

}  // namespace strata
