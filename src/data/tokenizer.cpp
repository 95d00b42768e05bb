// GPT-2 decode table in llm.c's format (gpt2_tokenizer.bin, written by scripts/prepare_data):
//
//   256 x int32 little-endian header: magic 20240328, version (1 or 2), vocab size, end-of-text id
//   (version 2 only; version 1 files imply 50256), then for each token: uint8 length, length bytes.
//
// A GPT-2 token is a string of bytes, not of characters: one character's UTF-8 bytes can be split
// across tokens, so a single token (or a sampled sequence) may not be valid UTF-8. decode(vector)
// repairs that so the text prints safely.
#include "data/tokenizer.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include "runtime/error.h"
#include "runtime/output_path.h"

namespace zt {

namespace {

constexpr int32_t kTokenizerMagic = 20240328;
constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);

int32_t read_i32le(const unsigned char* p) {
  return int32_t(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
}

// Appends s to out, replacing each maximal ill-formed subsequence with U+FFFD (the Unicode /
// WHATWG "maximal subpart" practice): overlong forms, surrogates and code points past U+10FFFF
// are ill-formed too.
void append_valid_utf8(const std::string& s, std::string& out) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b0 = p[i];
    if (b0 < 0x80) {
      out.push_back(char(b0));
      ++i;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;  // no overlongs
      if (b0 == 0xED) hi = 0x9F;  // no surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;  // no overlongs
      if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    }
    if (len == 0) {  // continuation byte without a lead, or a byte that never appears in UTF-8
      out += kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;
    while (k < size_t(len) && i + k < n) {
      const unsigned char c = p[i + k];
      const bool ok = (k == 1) ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++k;
    }
    if (k == size_t(len)) {
      out.append(s, i, k);
    } else {
      out += kReplacement;
    }
    i += k;
  }
}

}  // namespace

Tokenizer::Tokenizer(const std::string& path) {
  check_input_file("tokenizer file", path);  // before the open, which a FIFO would block
  std::ifstream f(path, std::ios::binary);
  ZT_REQUIRE(f, "tokenizer file " << path << ": cannot open: " << std::strerror(errno)
                                  << " (run scripts/prepare_data; data/sample/gpt2_tokenizer.bin is a committed copy)");
  const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ZT_REQUIRE(!f.bad(), "tokenizer file " << path << ": read failed");
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  ZT_REQUIRE(data.size() >= kHeaderBytes, "tokenizer file " << path << ": " << data.size()
                                                           << " bytes, too small for the " << kHeaderBytes
                                                           << "-byte header of an llm.c tokenizer");
  const int32_t magic = read_i32le(p), version = read_i32le(p + 4), vocab = read_i32le(p + 8);
  ZT_REQUIRE(magic == kTokenizerMagic, "tokenizer file " << path << ": bad magic " << magic
                                                         << " (expected an llm.c GPT-2 tokenizer, magic "
                                                         << kTokenizerMagic << ")");
  ZT_REQUIRE(version == 1 || version == 2,
             "tokenizer file " << path << ": unsupported version " << version << " (expected 1 or 2)");
  ZT_REQUIRE(vocab > 0 && vocab <= 1 << 20, "tokenizer file " << path << ": bad vocabulary size " << vocab);
  eot_ = version == 2 ? read_i32le(p + 12) : 50256;
  ZT_REQUIRE(eot_ >= 0 && eot_ < vocab, "tokenizer file " << path << ": end-of-text id " << eot_
                                                          << " is outside the vocabulary of " << vocab);

  table_.reserve(size_t(vocab));
  size_t pos = kHeaderBytes;
  for (int32_t id = 0; id < vocab; ++id) {
    ZT_REQUIRE(pos < data.size(), "tokenizer file " << path << ": truncated at token " << id << " of " << vocab);
    const size_t len = p[pos++];
    ZT_REQUIRE(pos + len <= data.size(),
               "tokenizer file " << path << ": truncated inside token " << id << " of " << vocab);
    table_.emplace_back(data, pos, len);
    pos += len;
  }
  ZT_REQUIRE(pos == data.size(), "tokenizer file " << path << ": " << (data.size() - pos)
                                                   << " unexpected bytes after the last token");
}

const std::string& Tokenizer::decode(int token) const {
  if (token < 0 || size_t(token) >= table_.size()) return empty_;
  return table_[size_t(token)];
}

std::string Tokenizer::decode(const std::vector<int>& tokens) const {
  std::string raw;
  for (int t : tokens) raw += decode(t);
  std::string out;
  out.reserve(raw.size());
  append_valid_utf8(raw, out);
  return out;
}

}  // namespace zt
