// Reads a checkpoint directory by global tensor name and element offset (docs/design.md §3.7):
// whichever rank files hold a range, whatever world size and stage wrote them. Every dataset read
// is verified against its CRC-32C; anything damaged, missing or not ours is one line naming the
// file and dataset (zt::Error, no source location: the file is at fault, not the code).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/h5.h"
#include "checkpoint/readahead.h"
#include "model/layout.h"

namespace zt::ckpt {

// Elements [offset, offset + count) of a tensor (global flat indices), contiguous in the tensor and
// in one dataset of a rank file, from its element `at`. A 1-D dataset (width 0) is one piece; a 2-D
// one (rows x width: a block of the tensor's columns, tensor parallelism's input-column split) is
// one piece per row, each `width` elements at a stride of the tensor's row length.
struct Piece {
  int file;  // rank of the file
  std::string dataset;
  size_t offset, count;
  uint32_t crc;
  size_t at = 0;     // the piece's first element in its dataset
  size_t total = 0;  // elements of the whole dataset (what its crc32c covers)
  size_t width = 0;  // 0: a 1-D dataset; else the columns of its rows
};

class CheckpointReader {
 public:
  // Opens every rank file of `step_dir` and checks that they come from one save (step, run, plan
  // hash, world) and that none of its ranks is missing, before anything else is read.
  explicit CheckpointReader(const std::string& step_dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const { return dir_; }
  const Meta& meta() const { return meta_; }  // rank 0's
  bool has(Kind k) const { return has_[size_t(k)]; }
  DType dtype(Kind k) const { return k == Kind::param && meta_.param_dtype == "bf16" ? DType::bf16 : DType::f32; }
  std::string file_path(int rank) const;

  // The pieces of tensor `slot` of kind k, by offset; refuses a tensor they do not cover exactly.
  // A tensor is known by its name; its size is the checkpoint's (wte's padded rows follow the
  // tensor size that saved it: GPTConfig::pad_vocab).
  const std::vector<Piece>& pieces(Kind k, const TensorSlot& slot);
  // Elements [offset, offset + count) of the tensor into host memory (dtype(k) each). Elements of
  // wte past the checkpoint's padded rows (a run padding its vocabulary further, for more tensor
  // ranks) read as zeros, as padded rows are.
  void read(Kind k, const TensorSlot& slot, size_t offset, size_t count, void* dst);
  uint64_t bytes_read() const { return bytes_read_; }
  // Reads every dataset of every tensor (of `layout`: the checkpoint's model) as a load would,
  // checking coverage and checksums; throws what a load would.
  void verify(const ParamLayout& layout);

 private:
  std::string dir_;
  Meta meta_;
  std::vector<h5::Id> files_;
  // The same files opened for plain reads (-1 where HDF5's addresses are not file offsets: a file
  // with a user block): a dataset stored contiguously as native bytes is read from its offset
  // while it is checksummed (checked_read.h); any other goes through H5Dread. Each file is read
  // ahead of the reader (readahead.h; declared after fds_: it stops before they close).
  std::vector<int> fds_;
  std::vector<std::unique_ptr<Readahead>> readahead_;
  bool has_[kNumKinds] = {};
  std::map<std::pair<int, std::string>, std::vector<Piece>> index_;
  // Datasets read whole and verified: a dataset larger than the caller's reads (saved with a larger
  // checkpoint.chunk_mb, or ranges cut for another world size) is read once. Several: a reader
  // at another tensor size takes each row from the blocks of up to meta_.tensor rank files in turn.
  struct Cached {
    int file;
    std::string dataset;
    std::vector<unsigned char> data;
  };
  std::vector<Cached> cache_;  // most recently used last
  std::unique_ptr<ParamLayout> layout_;  // the checkpoint's model (whole tensors)
  uint64_t bytes_read_ = 0;
};

// The metadata of a step directory's rank 0 file alone (which run and step saved it), without
// opening the others; throws naming the file when it cannot be read.
Meta read_step_meta(const std::string& step_dir);

}  // namespace zt::ckpt
