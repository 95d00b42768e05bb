// One rank's checkpoint file, written with plain serial HDF5 (docs/design.md §3.7; the layout is in
// format.h). The writer streams: each shard goes to disk as it is added, so a rank holds at most one
// tensor range in host memory besides its store.
#pragma once
#include <cstdint>
#include <string>

#include "checkpoint/format.h"
#include "checkpoint/h5.h"
#include "model/layout.h"
#include "zero/store.h"

namespace zt::ckpt {

// Root attributes of a rank file (and of model.h5).
void write_meta(hid_t file, const Meta& m);
// Fills `m`; returns the name of the first attribute that is missing or mistyped ("" when all read).
std::string read_meta(hid_t file, Meta& m);

class RankFileWriter {
 public:
  RankFileWriter(const std::string& path, const Meta& meta);
  ~RankFileWriter();
  RankFileWriter(const RankFileWriter&) = delete;
  RankFileWriter& operator=(const RankFileWriter&) = delete;
  // Elements [offset, offset + count) of tensor `slot` (global flat indices), `dtype` each, from host
  // memory; with a width, count / width rows of `width` columns from element `offset` on, one row
  // of the tensor apart (a 2-D dataset: a block of a tensor-parallel rank's input columns).
  void add(Kind k, DType dtype, const TensorSlot& slot, size_t offset, size_t count, const void* host,
           size_t width = 0);
  // Closes the file and fsyncs it: after finish() returns the data is on disk.
  void finish();
  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  h5::Id file_;
  // The file opened beside HDF5 to start its writeback as each piece is added: the kernel would
  // otherwise hold the whole file in the page cache (below its dirty thresholds: 10% of memory)
  // until finish()'s fsync, and write nothing while the pieces are copied and checksummed.
  int writeback_fd_ = -1;
  uint64_t bytes_ = 0;
};

// fsync of a file or directory (a rename is durable once its directory is synced). Failures name
// the path: they are the user's disk.
void fsync_path(const std::string& path);

}  // namespace zt::ckpt
