#include "checkpoint/reader.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checked_read.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/rank_file.h"

namespace fs = std::filesystem;

namespace zt::ckpt {

namespace {
std::string hex(uint32_t x) {
  char s[16];
  std::snprintf(s, sizeof s, "%08x", x);
  return s;
}
std::string hex64(uint64_t x) {
  char s[24];
  std::snprintf(s, sizeof s, "%016llx", (unsigned long long)x);
  return s;
}
}  // namespace

namespace {
// How far ahead of the reader each rank file is read (readahead.h): several pieces of the default
// checkpoint.chunk_mb, so that the disk streams while a piece is checksummed.
constexpr uint64_t kReadaheadWindow = uint64_t(256) << 20;
}  // namespace

CheckpointReader::~CheckpointReader() {
  readahead_.clear();
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

std::string CheckpointReader::file_path(int rank) const { return (fs::path(dir_) / rank_file_name(rank)).string(); }

CheckpointReader::CheckpointReader(const std::string& step_dir) : dir_(step_dir) {
  h5::init();
  std::error_code ec;
  ZT_REQUIRE(fs::is_directory(dir_, ec), "checkpoint: " << dir_ << " is not a directory");
  // Every rank file present, whatever rank 0 says the world was: a file left from another save
  // (another world size, step or run) would otherwise be read as part of this one, or ignored.
  std::map<int, std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    int rank = -1;
    if (is_rank_file_name(name, rank)) found[rank] = e.path().string();
  }
  ZT_REQUIRE(!ec, "checkpoint: cannot list " << dir_ << ": " << ec.message());
  ZT_REQUIRE(found.count(0), "checkpoint: " << file_path(0) << " is missing (incomplete checkpoint?)");
  std::vector<h5::Id> files;
  std::vector<Meta> metas;
  for (const auto& [rank, path] : found) {
    Meta m;
    h5::Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    ZT_REQUIRE(f.valid(), "checkpoint: cannot open " << path << " as HDF5 (truncated or damaged file: "
                                                     << h5::error_text() << ")");
    const std::string bad = read_meta(f, m);
    ZT_REQUIRE(bad.empty(), "checkpoint: " << path << ": attribute " << bad
                                           << " is missing or invalid (not a zerotrain checkpoint file?)");
    ZT_REQUIRE(m.format_version == kFormatVersion, "checkpoint: " << path << " has format version " << m.format_version
                                                                  << "; this build reads version " << kFormatVersion);
    ZT_REQUIRE(m.rank == rank && m.world > 0, "checkpoint: " << path << " says it is rank " << m.rank << " of "
                                                             << m.world);
    files.push_back(std::move(f));
    metas.push_back(m);
  }
  // Before anything else: all from one save (same step, run and plan), then all of its ranks.
  meta_ = metas[0];
  size_t i = 0;
  for (const auto& [rank, path] : found) {
    const Meta& m = metas[i++];
    ZT_REQUIRE(m.step == meta_.step && m.plan_hash == meta_.plan_hash && m.run_id == meta_.run_id &&
                   m.world == meta_.world && m.tensor == meta_.tensor && m.pipeline == meta_.pipeline && m.seed == meta_.seed && m.next_sequence == meta_.next_sequence &&
                   m.param_dtype == meta_.param_dtype && describe_shape(m.model) == describe_shape(meta_.model),
               "checkpoint: " << dir_ << " holds rank files from different saves (step/plan hash differ): "
                              << rank_file_name(rank) << " is step " << m.step << " of " << m.world
                              << " rank(s), plan hash " << hex64(m.plan_hash) << "; " << rank_file_name(0) << " is step "
                              << meta_.step << " of " << meta_.world << " rank(s), plan hash " << hex64(meta_.plan_hash));
    ZT_REQUIRE(rank < meta_.world, "checkpoint: " << dir_ << " holds rank files from different saves (step/plan hash "
                                                  << "differ): " << path << " is past the " << meta_.world
                                                  << " rank(s) of " << file_path(0));
  }
  for (int r = 0; r < meta_.world; ++r)
    ZT_REQUIRE(found.count(r), "checkpoint: " << file_path(r) << " is missing (incomplete checkpoint?)");
  files_ = std::move(files);
  for (const auto& [rank, path] : found) {
    h5::Id fcpl(H5Fget_create_plist(files_[size_t(rank)]));
    hsize_t userblock = 1;
    const bool plain = fcpl.valid() && H5Pget_userblock(fcpl, &userblock) >= 0 && userblock == 0;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    fds_.push_back(fd >= 0 && plain ? fd : -1);
    if (fd >= 0 && !plain) ::close(fd);
    struct stat st;
    if (fds_.back() >= 0 && ::fstat(fd, &st) == 0)
      readahead_.push_back(std::make_unique<Readahead>(fd, uint64_t(st.st_size), kReadaheadWindow));
    else
      readahead_.push_back(nullptr);
  }
  for (int k = 0; k < kNumKinds; ++k)
    for (const h5::Id& f : files_)
      if (H5Lexists(f, kind_name(Kind(k)), H5P_DEFAULT) > 0) has_[k] = true;
  layout_ = std::make_unique<ParamLayout>(meta_.model, 1);
}

Meta read_step_meta(const std::string& step_dir) {
  h5::init();
  const std::string path = (fs::path(step_dir) / rank_file_name(0)).string();
  std::error_code ec;
  ZT_REQUIRE(fs::exists(path, ec), "checkpoint: " << path << " is missing (incomplete checkpoint?)");
  h5::Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ZT_REQUIRE(f.valid(), "checkpoint: cannot open " << path << " as HDF5 (truncated or damaged file: " << h5::error_text()
                                                   << ")");
  Meta m;
  const std::string bad = read_meta(f, m);
  ZT_REQUIRE(bad.empty(), "checkpoint: " << path << ": attribute " << bad
                                         << " is missing or invalid (not a zerotrain checkpoint file?)");
  return m;
}

void CheckpointReader::verify(const ParamLayout& layout) {
  std::vector<unsigned char> buf;
  for (int k = 0; k < kNumKinds; ++k) {
    if (!has(Kind(k))) continue;
    const size_t eb = dtype_bytes(dtype(Kind(k)));
    for (const TensorSlot& slot : layout.tensors())
      for (const Piece& p : pieces(Kind(k), slot)) {
        buf.resize(p.count * eb);
        read(Kind(k), slot, p.offset, p.count, buf.data());
      }
  }
}

const std::vector<Piece>& CheckpointReader::pieces(Kind k, const TensorSlot& slot) {
  const auto key = std::make_pair(int(k), slot.name);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  // The checkpoint's own shape of the tensor (wte's rows as padded where it was saved).
  const TensorSlot* own = &slot;
  for (const TensorSlot& s : layout_->tensors())
    if (s.name == slot.name) own = &s;
  const size_t numel = own->numel, cols = own->shape.empty() ? 1 : size_t(own->shape.back());
  std::vector<Piece> out;
  const std::string group = std::string(kind_name(k)) + "/" + tensor_path(slot.name);
  for (int r = 0; r < int(files_.size()); ++r) {
    const hid_t f = files_[size_t(r)];
    if (!h5::path_exists(f, group)) continue;
    const std::string path = file_path(r);
    h5::Id g(H5Gopen2(f, group.c_str(), H5P_DEFAULT));
    H5G_info_t info;
    ZT_REQUIRE(g.valid() && H5Gget_info(g, &info) >= 0, "checkpoint: " << path << ": cannot read group /" << group);
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      char name[64] = {};
      const ssize_t len = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
      const std::string ds = "/" + group + "/" + (len > 0 ? name : "?");
      h5::Id d(len > 0 && size_t(len) < sizeof name ? H5Dopen2(g, name, H5P_DEFAULT) : -1);
      ZT_REQUIRE(d.valid(), "checkpoint: " << path << ": cannot open dataset " << ds << " (damaged file?)");
      h5::Id space(H5Dget_space(d));
      const hssize_t count = space.valid() ? H5Sget_simple_extent_npoints(space) : -1;
      const int ndims = space.valid() ? H5Sget_simple_extent_ndims(space) : -1;
      hsize_t dims[2] = {0, 0};
      if (ndims == 2) H5Sget_simple_extent_dims(space, dims, nullptr);
      int64_t offset = -1;
      uint64_t crc = 0;
      std::string tensor;
      // A 2-D dataset is a block of columns [offset % cols, + width) of rows from offset / cols.
      ZT_REQUIRE(count > 0 && (ndims == 1 || ndims == 2) && h5::read_attr(d, "offset", offset) &&
                     h5::read_attr(d, "crc32c", crc) && h5::read_attr(d, "tensor", tensor) && tensor == slot.name &&
                     offset >= 0 && shard_dataset(k, slot.name, size_t(offset)) == ds &&
                     (ndims == 1 || (dims[1] > 0 && size_t(offset) % cols + size_t(dims[1]) <= cols)),
                 "checkpoint: " << path << ": dataset " << ds << " has missing or inconsistent attributes "
                                << "(tensor, offset, crc32c, shape)");
      if (ndims == 1) {
        out.push_back(Piece{r, ds, size_t(offset), size_t(count), uint32_t(crc), 0, size_t(count), 0});
      } else {
        const size_t rows = size_t(dims[0]), width = size_t(dims[1]);
        for (size_t row = 0; row < rows; ++row)
          out.push_back(Piece{r, ds, size_t(offset) + row * cols, width, uint32_t(crc), row * width, size_t(count), width});
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  size_t at = 0;
  for (const Piece& p : out) {
    ZT_REQUIRE(p.offset == at, "checkpoint: " << dir_ << ": " << kind_name(k) << " of tensor " << slot.name
                                              << (p.offset > at ? ": elements missing from " : ": overlapping datasets at ")
                                              << at << " (" << file_path(p.file) << ": " << p.dataset << ")");
    at += p.count;
  }
  ZT_REQUIRE(at == numel, "checkpoint: " << dir_ << ": " << kind_name(k) << " of tensor " << slot.name << " covers "
                                         << at << " of its " << numel << " elements");
  return index_.emplace(key, std::move(out)).first->second;
}

void CheckpointReader::read(Kind k, const TensorSlot& slot, size_t offset, size_t count, void* dst) {
  ZT_ASSERT(offset + count <= slot.numel);
  const size_t eb = dtype_bytes(dtype(k));
  const hid_t mtype = eb == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT;
  const std::vector<Piece>& ps = pieces(k, slot);
  const size_t have = ps.empty() ? 0 : ps.back().offset + ps.back().count;
  if (offset + count > have) {  // wte's rows padded past the checkpoint's: zeros
    ZT_ASSERT(slot.id == ParamId::wte);
    const size_t from = std::max(offset, have);
    std::memset(static_cast<unsigned char*>(dst) + (from - offset) * eb, 0, (offset + count - from) * eb);
    if (offset >= have) return;
    count = have - offset;
  }
  // The first piece that ends past `offset`.
  auto first = std::upper_bound(ps.begin(), ps.end(), offset,
                                [](size_t o, const Piece& p) { return o < p.offset + p.count; });
  for (auto pit = first; pit != ps.end() && pit->offset < offset + count; ++pit) {
    const Piece& p = *pit;
    const size_t lo = std::max(offset, p.offset), hi = std::min(offset + count, p.offset + p.count);
    if (lo >= hi) continue;
    // The whole dataset, so that its checksum can be verified: in place when the caller wants all
    // of it, else through the cache.
    const bool in_place = lo == p.offset && hi == p.offset + p.count && p.count == p.total;
    unsigned char* out = static_cast<unsigned char*>(dst) + (lo - offset) * eb;
    const size_t from = (p.at + lo - p.offset) * eb;
    if (!in_place) {
      auto c = std::find_if(cache_.begin(), cache_.end(),
                            [&](const Cached& e) { return e.file == p.file && e.dataset == p.dataset; });
      if (c != cache_.end()) {  // read and verified already
        std::memcpy(out, c->data.data() + from, (hi - lo) * eb);
        if (c + 1 != cache_.end()) std::rotate(c, c + 1, cache_.end());  // most recently used last
        continue;
      }
    }
    std::vector<unsigned char> fresh;
    if (!in_place) {
      const size_t keep = size_t(std::max<int64_t>(2, meta_.tensor + 1));
      if (cache_.size() >= keep) {  // the least recently used one's memory is reused
        fresh = std::move(cache_.front().data);
        cache_.erase(cache_.begin());
      }
      fresh.resize(p.total * eb);
    }
    unsigned char* into = in_place ? out : fresh.data();
    const std::string path = file_path(p.file);
    h5::Id d(H5Dopen2(files_[size_t(p.file)], p.dataset.c_str(), H5P_DEFAULT));
    h5::Id ft(d.valid() ? H5Dget_type(d) : -1);
    ZT_REQUIRE(ft.valid() && H5Tget_size(ft) == eb,
               "checkpoint: " << path << ": dataset " << p.dataset << " does not hold " << eb << "-byte elements");
    const size_t bytes = p.total * eb;
    const haddr_t at = H5Dget_offset(d);
    uint32_t crc = 0;
    if (fds_[size_t(p.file)] >= 0 && at != HADDR_UNDEF && H5Dget_storage_size(d) == bytes && H5Tequal(ft, mtype) > 0) {
      if (readahead_[size_t(p.file)]) readahead_[size_t(p.file)]->reached(at + bytes);
      const CheckedRead got = read_checked(fds_[size_t(p.file)], at, bytes, into);
      ZT_REQUIRE(got.bytes == bytes, "checkpoint: " << path << ": cannot read dataset " << p.dataset
                                                    << " (truncated or damaged file: " << got.bytes << " of its " << bytes
                                                    << " bytes read" << (got.error ? ": " : "")
                                                    << (got.error ? std::strerror(got.error) : "") << ")");
      crc = got.crc;
    } else {
      ZT_REQUIRE(H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, into) >= 0,
                 "checkpoint: " << path << ": cannot read dataset " << p.dataset << " (truncated or damaged file: "
                                << h5::error_text() << ")");
      crc = crc32c(into, bytes);
    }
    ZT_REQUIRE(crc == p.crc, "checkpoint: " << path << ": dataset " << p.dataset << " fails its checksum (crc32c "
                                            << hex(crc) << ", stored " << hex(p.crc) << "): the file is damaged");
    bytes_read_ += bytes;
    if (!in_place) {
      std::memcpy(out, fresh.data() + from, (hi - lo) * eb);
      cache_.push_back(Cached{p.file, p.dataset, std::move(fresh)});
    }
  }
}

}  // namespace zt::ckpt
