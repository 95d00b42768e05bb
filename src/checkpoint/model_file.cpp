#include "checkpoint/model_file.h"

#include <filesystem>

#include "checkpoint/h5.h"
#include "checkpoint/rank_file.h"
#include "checkpoint/reader.h"

namespace zt::ckpt {

namespace {

// Maps elements [src, src + n) of a shard onto the rectangle rows x cols at (row, col) of the
// tensor (rank 2), or onto [row * cols + col, + n) (rank 1).
void map_piece(hid_t dcpl, hid_t vspace, int rank, const std::string& file, const std::string& dataset,
               hsize_t shard_count, hsize_t src, hsize_t row, hsize_t col, hsize_t rows, hsize_t cols) {
  h5::Id sspace(ZT_CHECK_H5(H5Screate_simple(1, &shard_count, nullptr)));
  const hsize_t n = rows * cols;
  ZT_CHECK_H5(H5Sselect_hyperslab(sspace, H5S_SELECT_SET, &src, nullptr, &n, nullptr));
  if (rank == 1) {
    const hsize_t start = row * cols + col;
    ZT_CHECK_H5(H5Sselect_hyperslab(vspace, H5S_SELECT_SET, &start, nullptr, &n, nullptr));
  } else {
    const hsize_t start[2] = {row, col}, count[2] = {rows, cols};
    ZT_CHECK_H5(H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start, nullptr, count, nullptr));
  }
  ZT_CHECK_H5(H5Pset_virtual(dcpl, vspace, file.c_str(), dataset.c_str(), sspace));
}

}  // namespace

void write_model_file(const std::string& step_dir) {
  CheckpointReader rd(step_dir);
  const std::string path = (std::filesystem::path(step_dir) / kModelFile).string();
  h5::Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  ZT_REQUIRE(f.valid(), "checkpoint: cannot create " << path << ": " << h5::error_text());
  Meta m = rd.meta();
  m.rank = -1;  // the whole model
  write_meta(f, m);
  const bool mixed = rd.has(Kind::master);
  const ParamLayout layout(m.model, 1);
  for (int k = 0; k < kNumKinds; ++k) {
    const Kind kind = Kind(k);
    if (!rd.has(kind)) continue;
    const bool bf16 = rd.dtype(kind) == DType::bf16;
    for (const TensorSlot& s : layout.tensors()) {
      const int rank = int(s.shape.size());
      ZT_ASSERT(rank == 1 || rank == 2);
      const hsize_t cols = hsize_t(s.shape.back());
      std::vector<hsize_t> dims(s.shape.begin(), s.shape.end());
      h5::Id vspace(ZT_CHECK_H5(H5Screate_simple(rank, dims.data(), nullptr)));
      h5::Id dcpl(ZT_CHECK_H5(H5Pcreate(H5P_DATASET_CREATE)));
      for (const Piece& p : rd.pieces(kind, s)) {
        const std::string file = rank_file_name(p.file);
        if (p.width > 0) {  // a 2-D dataset (a block of input columns): one mapping, at its first row
          if (p.at != 0) continue;
          const hsize_t sdims[2] = {p.total / p.width, p.width};
          h5::Id sspace(ZT_CHECK_H5(H5Screate_simple(2, sdims, nullptr)));
          ZT_CHECK_H5(H5Sselect_all(sspace));
          const hsize_t start[2] = {p.offset / cols, p.offset % cols};
          ZT_CHECK_H5(H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start, nullptr, sdims, nullptr));
          ZT_CHECK_H5(H5Pset_virtual(dcpl, vspace, file.c_str(), p.dataset.c_str(), sspace));
          continue;
        }
        hsize_t pos = p.offset, src = 0;
        const hsize_t end = p.offset + p.count;
        while (pos < end) {
          const hsize_t row = pos / cols, col = pos % cols;
          if (col != 0 || end - pos < cols) {  // part of one row
            const hsize_t len = std::min(cols - col, end - pos);
            map_piece(dcpl, vspace, rank, file, p.dataset, p.count, src, row, col, 1, len);
            pos += len, src += len;
          } else {  // whole rows
            const hsize_t rows = (end - pos) / cols;
            map_piece(dcpl, vspace, rank, file, p.dataset, p.count, src, row, 0, rows, cols);
            pos += rows * cols, src += rows * cols;
          }
        }
      }
      ZT_CHECK_H5(H5Sselect_all(vspace));
      const std::string name = model_path(kind, s.name, mixed);
      const size_t slash = name.rfind('/');
      h5::Id group = slash == 0 ? h5::Id(ZT_CHECK_H5(H5Gopen2(f, "/", H5P_DEFAULT)))
                                : h5::create_groups(f, name.substr(1, slash - 1));
      h5::Id ds(ZT_CHECK_H5(H5Dcreate2(group, name.substr(slash + 1).c_str(), bf16 ? H5T_STD_U16LE : H5T_IEEE_F32LE,
                                       vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
      h5::write_attr(ds, "tensor", s.name);
      h5::write_attr(ds, "kind", std::string(kind_name(kind)) + (bf16 ? " (bf16 bits as uint16)" : ""));
    }
  }
  ZT_REQUIRE(f.close() >= 0, "checkpoint: cannot write " << path << ": " << h5::error_text());
}

}  // namespace zt::ckpt
