// One dataset's bytes read from its rank file and checked against their CRC-32C at the same time
// (docs/design.md §3.7): a helper thread reads the bytes in segments while the caller checksums
// the segments already read, so the disk never waits for the checksum nor the checksum for the
// disk. A load at one rank measured 46% of `dd` when the two ran one after the other (whole
// dataset read, then checksummed: the kernel's readahead idles while the CRC runs); overlapped it
// is disk-bound (docs/checkpoints.md). The bytes go straight to their destination (no bounce
// buffer), so the memory a load holds is what it held before.
#pragma once
#include <cstddef>
#include <cstdint>

namespace zt::ckpt {

struct CheckedRead {
  size_t bytes = 0;   // read: fewer than asked when the file ends early (truncated) or a read fails
  uint32_t crc = 0;   // CRC-32C of those bytes
  int error = 0;      // errno of the failed read (0: the file ended)
};

// Reads `bytes` at file offset `at` of `fd` into dst, checksumming them as they arrive.
CheckedRead read_checked(int fd, uint64_t at, size_t bytes, void* dst);

}  // namespace zt::ckpt
