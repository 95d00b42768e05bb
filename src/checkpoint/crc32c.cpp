#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

namespace zt {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

const std::array<uint32_t, 256>& table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> x{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      x[i] = c;
    }
    return x;
  }();
  return t;
}

uint32_t crc_table(const unsigned char* p, size_t n, uint32_t c) {
  const auto& t = table();
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return c;
}

// The product a * b modulo the polynomial (both reflected, as the CRC register): zlib's multmodp.
uint32_t mult_mod_p(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 n) modulo the polynomial: multiplying a register by it appends n zero bytes to the message.
uint32_t shift_bytes(size_t n) {
  uint32_t p = 1u << 31, x = 1u << 30;  // x^0; x^1, squared for each bit of 8 n
  for (size_t e = 8 * n; e; e >>= 1, x = mult_mod_p(x, x))
    if (e & 1) p = mult_mod_p(x, p);
  return p;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of 3 cycles and a throughput of 1: one stream runs at a
// third of its speed. Three lanes of kLane bytes are checksummed at once, each from a zero
// register but the first, and joined as the register is linear: CRC(A B, r) = CRC(B, 0) xor
// CRC(A, r) shifted over |B| zero bytes.
constexpr size_t kLane = 8192;

__attribute__((target("sse4.2"))) uint32_t crc_sse42(const unsigned char* p, size_t n, uint32_t c) {
  static const uint32_t lane_shift = shift_bytes(kLane);
  for (; n >= 3 * kLane; n -= 3 * kLane, p += 3 * kLane) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t u, v, w;
      std::memcpy(&u, p + i, 8);
      std::memcpy(&v, p + kLane + i, 8);
      std::memcpy(&w, p + 2 * kLane + i, 8);
      a = __builtin_ia32_crc32di(a, u);
      b = __builtin_ia32_crc32di(b, v);
      d = __builtin_ia32_crc32di(d, w);
    }
    c = mult_mod_p(lane_shift, mult_mod_p(lane_shift, uint32_t(a)) ^ uint32_t(b)) ^ uint32_t(d);
  }
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
  }
  uint32_t c32 = uint32_t(c64);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}
bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (have_sse42()) return ~crc_sse42(p, n, c);
#endif
  return ~crc_table(p, n, c);
}

}  // namespace zt
