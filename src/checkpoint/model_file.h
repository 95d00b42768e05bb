// model.h5: every full tensor of a checkpoint as an HDF5 virtual dataset (VDS) over the rank files
// (docs/design.md §3.7), so h5py reads f["h/3/attn/c_attn/weight"] whole by name while no process
// ever held it whole. Source files are named relative ("rank_00003.h5"): HDF5 looks for them
// beside model.h5, so the directory can be renamed or copied as a whole.
//
// A shard is a 1-D run of elements and may start or end inside a row of a 2-D tensor. A VDS
// mapping pairs a source selection with a virtual selection of the same number of elements (the
// shapes may differ; HDF5 1.10 maps them in row-major order), but each selection must be one
// hyperslab, and the elements of a shard in the tensor are up to three rectangles: the rest of the
// first row, whole rows, the start of the last row. So each shard gets up to three mappings, each a
// 1-D hyperslab of the shard onto one rectangle (test/checkpoint checks that h5py reads them back).
#pragma once
#include <string>

namespace zt::ckpt {

// Writes <step_dir>/model.h5 from the rank files there (read through CheckpointReader, so every
// tensor is checked to be covered exactly once).
void write_model_file(const std::string& step_dir);

}  // namespace zt::ckpt
