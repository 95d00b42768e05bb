// The tensor-parallel index maps that checkpoints address slices by (model/tensor_parallel.h,
// docs/checkpoints.md): over the T ranks, global_index covers each element of the whole tensor
// exactly once, and global_run gives the longest stretch from i that is consecutive there.
#include <gtest/gtest.h>

#include <vector>

#include "model/layout.h"
#include "model/tensor_parallel.h"

namespace {

TEST(TensorParallelIndex, SlicesTileTheWholeTensorAndRunsAreMaximal) {
  const zt::GPTConfig model = zt::GPTConfig::make(2, 6, 12, 8, 300);
  for (int T : {1, 2, 3, 6}) {
    const zt::GPTConfig whole_cfg = model.split(T, 0);
    zt::GPTConfig w = whole_cfg;
    w.tp = 1, w.tp_rank = 0;
    const zt::ParamLayout whole(w, 1);
    std::vector<std::vector<int>> seen(whole.tensors().size());
    for (size_t k = 0; k < whole.tensors().size(); ++k) seen[k].assign(whole.tensors()[k].numel, 0);
    for (int r = 0; r < T; ++r) {
      const zt::GPTConfig cfg = model.split(T, r);
      const zt::ParamLayout local(cfg, 1);
      ASSERT_EQ(local.tensors().size(), whole.tensors().size());
      for (size_t k = 0; k < local.tensors().size(); ++k) {
        const zt::TensorSlot& s = local.tensors()[k];
        ASSERT_EQ(s.name, whole.tensors()[k].name);
        const bool replicated = !zt::split_over_tensor(s.id);
        for (size_t i = 0; i < s.numel; ++i) {
          const size_t g = zt::global_index(s, cfg, i);
          ASSERT_LT(g, whole.tensors()[k].numel) << s.name << " T " << T << " rank " << r;
          if (!replicated || r == 0) ++seen[k][g];
          const size_t run = zt::global_run(s, cfg, i);
          ASSERT_GE(run, 1u);
          ASSERT_LE(i + run, s.numel);
          // consecutive there for `run` elements (checked at its end), and no further
          ASSERT_EQ(zt::global_index(s, cfg, i + run - 1), g + run - 1) << s.name << " T " << T << " i " << i;
          if (i + run < s.numel) ASSERT_NE(zt::global_index(s, cfg, i + run), g + run) << s.name << " T " << T;
        }
      }
    }
    for (size_t k = 0; k < seen.size(); ++k)
      for (size_t g = 0; g < seen[k].size(); ++g)
        ASSERT_EQ(seen[k][g], 1) << whole.tensors()[k].name << " element " << g << " at T " << T;
  }
}

}  // namespace
