// GPT-2 tokenizer, decode side only, from llm.c's table format (gpt2_tokenizer.bin):
// 256 x int32 header (magic 20240328, version 2, vocab size, end-of-text id), then for each
// token a uint8 length and that many bytes.
#pragma once
#include <string>
#include <vector>

namespace zt {

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& path);  // throws zt::Error naming the file and problem
  // Bytes of one token ("" for ids outside the table).
  const std::string& decode(int token) const;
  // Concatenated bytes of a token sequence, with invalid UTF-8 replaced so it prints safely.
  std::string decode(const std::vector<int>& tokens) const;
  int eot() const { return eot_; }
  int vocab_size() const { return int(table_.size()); }

 private:
  std::vector<std::string> table_;
  int eot_ = 50256;
  std::string empty_;
};

}  // namespace zt
