// Plan loading, the mesh's pipeline axis (docs/design.md §3.14, docs/pipeline.md): which pipeline
// plans this build runs; every refusal is one line naming the field and the arithmetic.
#include <cstdint>
#include <string>

#include "plan/plan.h"
#include "plan/plan_detail.h"

namespace zt {

using namespace plan_detail;

// Pipeline stages (docs/design.md §3.14): what this build runs with them, each refusal one line.
void plan_detail::check_pipeline(const Plan& p) {
  const int P = p.mesh.pipeline, v = p.mesh.chunks, L = p.model.n_layer;
  const bool interleaved = p.mesh.schedule == "interleaved";
  if (v > 1 && (P == 1 || !interleaved))
    bad("mesh.chunks", std::to_string(v) + " model chunks per rank run under mesh.schedule \"interleaved\" with "
                       "mesh.pipeline > 1 (got " + shown(json(p.mesh.schedule)) + ", mesh.pipeline " +
                       std::to_string(P) + "); set mesh.chunks 1");
  if (P == 1) return;
  const std::string with = "with mesh.pipeline " + std::to_string(P);
  if (P > L)
    bad("mesh.pipeline", std::to_string(P) + " stages for model.n_layer " + std::to_string(L) +
                             ": every stage holds at least one block (give at most " + std::to_string(L) + ")");
  if (interleaved && v < 2)
    bad("mesh.chunks", "\"interleaved\" runs at least 2 model chunks per rank, got " + std::to_string(v) +
                           " (with one it is \"1f1b\")");
  if (interleaved && int64_t(P) * v > L)
    bad("mesh.chunks", std::to_string(v) + " chunks x " + std::to_string(P) + " stages = " + std::to_string(P * v) +
                           " virtual stages for model.n_layer " + std::to_string(L) +
                           ": every chunk holds at least one block");
  if (interleaved && p.batch.grad_accum % P != 0)
    bad("batch.grad_accum", std::to_string(p.batch.grad_accum) + " micro-batches " + with +
                                ": \"interleaved\" takes them in groups of the " + std::to_string(P) +
                                " pipeline ranks (use a multiple of " + std::to_string(P) + ", or \"1f1b\")");
  if (p.zero.stage >= 2)
    bad("zero.stage", std::to_string(p.zero.stage) + " " + with + ": stage " + std::to_string(p.zero.stage) +
                          (p.zero.stage == 2 ? " reduce-scatters gradients every micro-batch"
                                             : " gathers every unit for every micro-batch's forward and backward") +
                          ", m = batch.grad_accum times a step on the data axis (DeepSpeed refuses it for the same "
                          "reason); use zero.stage 0 or 1, which reduce once per step");
}

}  // namespace zt
