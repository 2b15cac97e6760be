// CRC-32C (Castagnoli), as used by iSCSI, ext4 and LevelDB: the checksum of snapshot data.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pscluster::crc32c {

// Extends `crc` (the CRC of some earlier bytes, 0 to start) over data[0, n). Uses the
// SSE4.2 instruction where the CPU has it.
uint32_t Extend(uint32_t crc, const void* data, size_t n);

// The table-driven version, the same on every CPU (tests compare the two).
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);

inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

}  // namespace pscluster::crc32c
