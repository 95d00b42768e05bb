// Token shards in llm.c's format: a 256 x int32 header (magic 20240520, version 1, token count),
// then the tokens as uint16. Shards are memory-mapped read-only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zt {

constexpr int kShardMagic = 20240520;
constexpr int kShardVersion = 1;

class TokenShard {
 public:
  explicit TokenShard(const std::string& path);  // throws zt::Error naming the file and the problem
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  TokenShard(TokenShard&& o) noexcept;

  const uint16_t* tokens() const { return tokens_; }
  size_t size() const { return n_; }
  // Position of the first token >= limit (an id outside a vocabulary of `limit`), or size() if none.
  size_t first_token_at_least(uint32_t limit) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  size_t n_ = 0;
};

// Writes a shard (used by tests and tools; scripts/prepare_data writes the same format).
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// Sorted list of files matching a glob; throws naming the pattern when nothing matches.
std::vector<std::string> glob_files(const std::string& pattern);

// The files a data.train / data.val value names, as DataLoader opens them: the glob's matches when
// it has glob characters (* ? [), else the path itself. Throws as glob_files does.
std::vector<std::string> data_files(const std::string& pattern);

}  // namespace zt
