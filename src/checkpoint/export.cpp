// `train export`: a checkpoint's fp32 weights as one file, one tensor at a time (docs/design.md §3.7).
#include <chrono>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/h5.h"
#include "checkpoint/reader.h"
#include "model/llmc_writer.h"
#include "runtime/output_path.h"

namespace fs = std::filesystem;

namespace zt::ckpt {

Transfer export_weights(const std::string& ckpt, const std::string& format, const std::string& out) {
  const auto t0 = std::chrono::steady_clock::now();
  ZT_REQUIRE(format == "hdf5" || format == "llmc", "export: --format must be hdf5 or llmc, got " << format);
  std::error_code ec;
  ZT_REQUIRE(fs::is_directory(ckpt, ec), "export: " << ckpt << " is not a directory");
  std::string dir = ckpt;
  if (!fs::exists(fs::path(ckpt) / rank_file_name(0), ec)) {
    dir = latest(ckpt);
    ZT_REQUIRE(!dir.empty(), "export: " << ckpt << " is neither a checkpoint (no " << rank_file_name(0)
                                        << ") nor a checkpoint.dir with a `latest`");
  }
  CheckpointReader rd(dir);
  const Kind weights = rd.has(Kind::master) ? Kind::master : Kind::param;
  ZT_REQUIRE(rd.has(weights) && rd.dtype(weights) == DType::f32, "export: " << dir << " has no fp32 weights");
  // llm.c's file pads the vocabulary to 128 whatever tensor size saved the checkpoint (wte's
  // further padded rows are zeros); the HDF5 file shows the tensors as model.h5 does.
  GPTConfig model = rd.meta().model;
  if (format == "llmc") model.Vp = GPTConfig::pad_vocab(model.V);
  const ParamLayout layout(model, 1);
  // Before anything is written: --out must not be the checkpoint it reads, nor a device (docs/design.md §3.8).
  OutputPaths paths;
  paths.input("the checkpoint being exported", dir);
  paths.input("the checkpoint directory given", ckpt);
  const std::string target = paths.output("export --out", out, 1024 + 4 * uint64_t(layout.num_params()));
  std::vector<float> buf;
  write_by_rename("export --out", target, [&](const std::string& tmp) {
    if (format == "llmc") {
      LlmcWriter w(tmp, layout);
      for (size_t k = 0; k < layout.tensors().size(); ++k) {
        const TensorSlot& s = layout.tensors()[k];
        buf.resize(s.numel);
        rd.read(weights, s, 0, s.numel, buf.data());
        w.write(int(k), buf.data());
      }
      w.finish();
      return;
    }
    h5::init();
    h5::Id f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    ZT_REQUIRE(f.valid(), "cannot create " << tmp << ": " << h5::error_text());
    for (const TensorSlot& s : layout.tensors()) {
      buf.resize(s.numel);
      rd.read(weights, s, 0, s.numel, buf.data());
      const std::string name = model_path(weights, s.name, weights == Kind::master);
      const size_t slash = name.rfind('/');
      std::vector<hsize_t> dims(s.shape.begin(), s.shape.end());
      h5::Id space(ZT_CHECK_H5(H5Screate_simple(int(dims.size()), dims.data(), nullptr)));
      h5::Id group = h5::create_groups(f, name.substr(1, slash - 1));
      h5::Id ds(ZT_CHECK_H5(H5Dcreate2(group, name.substr(slash + 1).c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                       H5P_DEFAULT, H5P_DEFAULT)));
      ZT_REQUIRE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0,
                 "cannot write " << tmp << ": " << h5::error_text());
      h5::write_attr(ds, "tensor", s.name);
    }
    ZT_REQUIRE(f.close() >= 0, "cannot write " << tmp << ": " << h5::error_text());
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Transfer{rd.bytes_read(), s, dir};
}

}  // namespace zt::ckpt
