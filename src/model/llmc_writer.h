// Writing an llm.c model file (fp32, version 3) one tensor at a time (docs/design.md §3.7): the
// header first, then each tensor at its place in the file whenever it comes (llm.c orders tensors
// by kind across layers, we produce them unit by unit or from a checkpoint). Used by
// run.final_weights (GPT::save_llmc_units) and `train export --format llmc`.
#pragma once
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "model/layout.h"

namespace zt {

class LlmcWriter {
 public:
  // Creates `path` and writes the header for the layout's configuration. Failures name the file
  // and the system's reason (the user's disk or path).
  LlmcWriter(const std::string& path, const ParamLayout& layout);
  static constexpr size_t kWhole = ~size_t(0);
  // Elements [begin, begin + count) of layout tensor k (default: all numel), fp32: a unit may hold
  // only part of a tensor (stage 3's embedding chunks, model/layout.h).
  void write(int k, const float* values, size_t begin = 0, size_t count = kWhole);
  // Flushes, fsyncs and closes: on disk before the caller renames it into place.
  void finish();

 private:
  struct Closer {
    void operator()(FILE* f) const { if (f) std::fclose(f); }
  };
  std::string path_;
  const ParamLayout& layout_;
  std::unique_ptr<FILE, Closer> f_;
  std::vector<size_t> at_;  // byte offset of each tensor in the file
};

}  // namespace zt
