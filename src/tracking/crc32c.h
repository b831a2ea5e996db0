// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) and TFRecord's masked form of it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace accel::tracking {

std::uint32_t crc32c(const void* data, std::size_t n);
// TFRecord's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so a CRC of data holding CRCs stays useful.
std::uint32_t masked_crc32c(const void* data, std::size_t n);

}  // namespace accel::tracking
