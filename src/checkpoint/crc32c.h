// CRC-32C (Castagnoli), the checksum of every checkpoint dataset (docs/design.md §3.7): computed
// over the bytes as written, stored as the dataset's `crc32c` attribute, verified on every read.
// Uses the SSE4.2 instruction where the CPU has it (GB/s, so a save is not checksum-bound), else a
// table; both give the same value (the unit test checks the standard test vector).
#pragma once
#include <cstddef>
#include <cstdint>

namespace zt {

// Continues `crc` (0 to start) over n bytes.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace zt
