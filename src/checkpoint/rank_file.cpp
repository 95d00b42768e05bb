#include "checkpoint/rank_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "checkpoint/crc32c.h"

namespace zt::ckpt {

void write_meta(hid_t f, const Meta& m) {
  h5::write_attr(f, "format_version", m.format_version);
  h5::write_attr(f, "step", m.step);
  h5::write_attr(f, "seed", m.seed);
  h5::write_attr(f, "next_sequence", m.next_sequence);
  h5::write_attr(f, "world", m.world);
  h5::write_attr(f, "rank", m.rank);
  h5::write_attr(f, "zero_stage", m.stage);
  h5::write_attr(f, "shard_group", m.shard_group > 0 ? m.shard_group : m.world);
  h5::write_attr(f, "tensor", m.tensor);
  h5::write_attr(f, "pipeline", m.pipeline);
  h5::write_attr(f, "plan_hash", m.plan_hash);
  h5::write_attr(f, "model_shape", std::vector<int64_t>{m.model.L, m.model.NH, m.model.C, m.model.maxT, m.model.V});
  h5::write_attr(f, "param_dtype", m.param_dtype);
  h5::write_attr(f, "rng", std::string("counter-based on (seed, step): no further state"));
  h5::write_attr(f, "run_id", m.run_id);
  h5::write_attr(f, "plan", m.plan);
}

std::string read_meta(hid_t f, Meta& m) {
  if (!h5::read_attr(f, "format_version", m.format_version)) return "format_version";
  if (!h5::read_attr(f, "step", m.step)) return "step";
  if (!h5::read_attr(f, "seed", m.seed)) return "seed";
  if (!h5::read_attr(f, "next_sequence", m.next_sequence)) return "next_sequence";
  if (!h5::read_attr(f, "world", m.world)) return "world";
  if (!h5::read_attr(f, "rank", m.rank)) return "rank";
  if (!h5::read_attr(f, "zero_stage", m.stage)) return "zero_stage";
  if (!h5::read_attr(f, "shard_group", m.shard_group)) m.shard_group = m.world;  // before hybrid sharding
  if (m.shard_group < 1 || m.shard_group > m.world || m.world % m.shard_group != 0) return "shard_group";
  if (!h5::read_attr(f, "tensor", m.tensor)) m.tensor = 1;  // before tensor parallelism
  if (m.tensor < 1 || m.world % m.tensor != 0) return "tensor";
  if (!h5::read_attr(f, "pipeline", m.pipeline)) m.pipeline = 1;  // before pipeline parallelism
  if (m.pipeline < 1 || m.world % (m.pipeline * m.tensor) != 0) return "pipeline";
  if (!h5::read_attr(f, "plan_hash", m.plan_hash)) return "plan_hash";
  std::vector<int64_t> s;
  if (!h5::read_attr(f, "model_shape", s) || s.size() != 5) return "model_shape";
  for (int64_t x : s)
    if (x <= 0 || x > (int64_t(1) << 30)) return "model_shape";
  m.model = GPTConfig::make(int(s[0]), int(s[1]), int(s[2]), int(s[3]), int(s[4]));
  m.model.Vp = GPTConfig::pad_vocab(m.model.V, int(m.tensor));  // wte as that tensor size padded it
  if (!h5::read_attr(f, "param_dtype", m.param_dtype) || (m.param_dtype != "f32" && m.param_dtype != "bf16"))
    return "param_dtype";
  // Recorded since the lineage checks (checkpoint_dir.h); absent from older checkpoints.
  if (H5Aexists(f, "run_id") > 0 && !h5::read_attr(f, "run_id", m.run_id)) return "run_id";
  if (H5Aexists(f, "plan") > 0 && !h5::read_attr(f, "plan", m.plan)) return "plan";
  return "";
}

RankFileWriter::RankFileWriter(const std::string& path, const Meta& meta) : path_(path) {
  h5::init();
  file_ = h5::Id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  ZT_REQUIRE(file_.valid(), "checkpoint: cannot create " << path << ": " << h5::error_text());
  write_meta(file_, meta);
  writeback_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // -1: no early writeback, still correct
}

RankFileWriter::~RankFileWriter() {
  if (writeback_fd_ >= 0) ::close(writeback_fd_);
}

void RankFileWriter::add(Kind k, DType dtype, const TensorSlot& slot, size_t offset, size_t count, const void* host,
                         size_t width) {
  ZT_ASSERT(width == 0 || (count % width == 0 && slot.shape.size() == 2 &&
                           offset % size_t(slot.shape[1]) + width <= size_t(slot.shape[1])));
  const std::string name = shard_dataset(k, slot.name, offset);
  const size_t slash = name.rfind('/');
  h5::Id group = h5::create_groups(file_, name.substr(1, slash - 1));
  const hsize_t n = count, dims[2] = {width ? count / width : 0, width};
  h5::Id space(ZT_CHECK_H5(width ? H5Screate_simple(2, dims, nullptr) : H5Screate_simple(1, &n, nullptr)));
  // bf16 has no HDF5 type: its bits are stored as 16-bit integers and param_dtype says "bf16".
  const hid_t ftype = dtype == DType::bf16 ? H5T_STD_U16LE : H5T_IEEE_F32LE;
  const hid_t mtype = dtype == DType::bf16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT;
  h5::Id ds(ZT_CHECK_H5(H5Dcreate2(group, name.substr(slash + 1).c_str(), ftype, space, H5P_DEFAULT, H5P_DEFAULT,
                                   H5P_DEFAULT)));
  // The data goes to disk here: a failure is the disk's (full, say), not a bug of this code.
  ZT_REQUIRE(H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, host) >= 0,
             "checkpoint: cannot write " << path_ << ": " << h5::error_text());
  // Starts writing what is dirty (this piece) and returns: the disk writes while the next piece
  // is prepared, and finish()'s fsync waits for the tail only.
  if (writeback_fd_ >= 0) (void)::sync_file_range(writeback_fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
  const size_t bytes = count * dtype_bytes(dtype);
  h5::write_attr(ds, "tensor", slot.name);
  std::vector<int64_t> shape(slot.shape.begin(), slot.shape.end());
  h5::write_attr(ds, "shape", shape);
  h5::write_attr(ds, "offset", int64_t(offset));
  h5::write_attr(ds, "crc32c", uint64_t(crc32c(host, bytes)));
  bytes_ += bytes;
}

void RankFileWriter::finish() {
  ZT_REQUIRE(H5Fflush(file_, H5F_SCOPE_LOCAL) >= 0 && file_.close() >= 0,
             "checkpoint: cannot write " << path_ << ": " << h5::error_text());
  if (writeback_fd_ >= 0) ::close(writeback_fd_), writeback_fd_ = -1;
  fsync_path(path_);
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ZT_REQUIRE(fd >= 0, "checkpoint: cannot open " << path << " to sync it: " << std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  ZT_REQUIRE(rc == 0, "checkpoint: cannot sync " << path << " to disk: " << std::strerror(err));
}

}  // namespace zt::ckpt
