// The checkpoint format (docs/design.md §3.7): names and metadata shared by the writer, the reader
// and export. Everything is addressed by global tensor name and element offset, never by unit or
// rank, so a checkpoint loads into any world size, stage and unit layout.
//
//   <checkpoint.dir>/latest                 "step_00001000\n": the newest complete checkpoint
//   <checkpoint.dir>/.lock                  "PID HOST\n", flock-ed by the run saving here (checkpoint_dir.h)
//   <checkpoint.dir>/step_00001000/
//     rank_00003.h5   root attributes: Meta (format_version, step, seed, next_sequence, world,
//                     rank, zero_stage, shard_group, tensor, plan_hash, model_shape, param_dtype, rng, run_id, plan)
//                     /<kind>/<tensor path>/<offset, 15 digits>: 1-D dataset, `count` elements of
//                     tensor <tensor path> from element <offset> (row-major), or 2-D dataset
//                     (rows, width): the block of `width` columns from column offset % cols of
//                     `rows` rows from row offset / cols (a tensor-parallel rank's input columns);
//                     attributes tensor (global name), shape (global), offset, crc32c
//     model.h5        virtual datasets over the rank files: /<tensor path> (fp32 weights: master
//                     when the run keeps one, else parameters), /adam_m/<tensor path>,
//                     /adam_v/<tensor path>, and /bf16/<tensor path> for bf16 parameters
//
// kind: param (parameters as the run holds them: f32 or bf16), master (fp32 master weights, mixed
// precision only), adam_m, adam_v. tensor path: the layout's name with dots as groups:
// "h.3.attn.c_attn.weight" -> h/3/attn/c_attn/weight; shapes are llm.c's ((out, in) for linears,
// wte with the padded vocabulary Vp rows).
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"
#include "zero/store.h"

namespace zt::ckpt {

constexpr int64_t kFormatVersion = 1;

enum class Kind : int { param = 0, master, adam_m, adam_v, count };
constexpr int kNumKinds = int(Kind::count);
const char* kind_name(Kind k);
// The kind a persistent store buffer is saved as (params and param_shard are both `param`).
Kind kind_of(StateId id);

// "h.3.attn.c_attn.weight" -> "h/3/attn/c_attn/weight"
std::string tensor_path(const std::string& tensor_name);
// "/param/h/3/attn/c_attn/weight/000000000001536"
std::string shard_dataset(Kind k, const std::string& tensor_name, size_t offset);
// Where model.h5 shows tensor `name` of kind k: "/h/3/..." for the fp32 weights, "/adam_m/h/3/...".
std::string model_path(Kind k, const std::string& tensor_name, bool mixed_precision);

std::string step_dir_name(int64_t step);  // "step_00001000"
std::string rank_file_name(int rank);     // "rank_00003.h5"
bool is_rank_file_name(const std::string& name, int& rank);      // the other way
bool is_step_dir_name(const std::string& name, int64_t& step);  // "step_00001000" -> 1000
constexpr const char* kModelFile = "model.h5";
constexpr const char* kLatestFile = "latest";

// What a rank file says about the run besides its tensors. The RNGs are counter-based on (seed,
// step) (docs/design.md §3.9), so those two are every rank's whole RNG state; next_sequence is the
// data loader's position.
struct Meta {
  int64_t format_version = kFormatVersion;
  int64_t step = 0;
  uint64_t seed = 0;
  int64_t next_sequence = 0;
  int64_t world = 1, rank = 0, stage = 0;
  // Ranks per shard group (hybrid sharding, zero/data_mesh.h): world / shard_group groups saved the
  // same shards, each a share of them. Absent from older checkpoints: one group (0 = the world).
  int64_t shard_group = 0;
  // Tensor-parallel ranks (mesh.tensor, model/tensor_parallel.h): rank r saved its share of tensor
  // rank r % tensor's slices. Absent from older checkpoints: 1. The model below is the whole one
  // (tp 1), wte padded as at this tensor size (GPTConfig::pad_vocab(V, tensor)).
  int64_t tensor = 1;
  // Pipeline stages (mesh.pipeline, outermost): rank r saved what stage r / (world / pipeline) holds
  // (its blocks; the embedding only on the first). Absent from older checkpoints: 1.
  int64_t pipeline = 1;
  uint64_t plan_hash = 0;
  GPTConfig model;
  std::string param_dtype = "f32";  // "f32" | "bf16"
  // The lineage: drawn when a run starts fresh, inherited by every run that resumes from one of its
  // checkpoints, so that a run can tell its own checkpoints from another run's (checkpoint_dir.h).
  // 0 in checkpoints saved before it was recorded.
  uint64_t run_id = 0;
  std::string plan;  // the resolved plan (JSON) of the run that saved; "" in older checkpoints
};

// "n_layer 4, n_head 4, n_embd 128, seq_len 64, vocab_size 50257": for shape messages.
std::string describe_shape(const GPTConfig& c);

}  // namespace zt::ckpt
