// The data axis as a 2-D mesh (docs/design.md §3.12): hybrid sharding.
//
// The world's W ranks are cut into W / S shard groups of S consecutive ranks. ZeRO shards the model
// state within a shard group exactly as it would over a world of S; the R = W / S groups hold the
// same shards and, after each group's gradient reduce-scatter, sum their shards over the replicate
// group (the ranks with the same place in their group). With the shard group a host, every
// parameter all-gather and gradient reduce-scatter stays inside the host, and only the shard
// all-reduce (2 (R-1)/R x Ψ/S per rank and step) crosses the slow link between hosts.
//
//   world 4, S = 2 (2 hosts x 2 ranks):   shard groups  {0,1} {2,3}   (rank / S)
//                                          replicate     {0,2} {1,3}   (rank % S)
//
// S = W (zero.shard_group "world", the default) is plain ZeRO: one group, no replicas.
//
// With tensor parallelism (mesh.tensor = T > 1, docs/design.md §3.13) the mesh has one more axis,
// innermost: T adjacent ranks split every block (a tensor group, rank % T), and the data axis above
// is the W / T ranks with the same place in their tensor group (rank / T along it); each is a data
// mesh of its own, over the tensor rank's part of the model.
//
//   world 4, T = 2:   tensor groups {0,1} {2,3}   data axes {0,2} {1,3}
//
// With pipeline parallelism (mesh.pipeline = P > 1, docs/design.md §3.14) the outermost axis cuts the
// world into P stages of W / P consecutive ranks (stage = rank / (W / P); the stages may sit on
// different hosts: only activations cross between them); inside each stage the tensor and data axes
// above, over the stage's part of the model. A pipeline group is the P ranks with the same place in
// their stage.
//
//   world 8, P = 2, T = 2:   stages {0..3} {4..7}   pipeline groups {0,4} {1,5} {2,6} {3,7}
//                            tensor groups {0,1} {2,3} {4,5} {6,7}   data axes {0,2} {1,3} {4,6} {5,7}
#pragma once
#include <string>

#include "plan/plan.h"

namespace zt {

struct DataMesh {
  int pipeline = 1;  // P: pipeline stages
  int stage = 0;     // this rank's
  int world = 1;     // ranks along the data axis (the world / (pipeline x tensor))
  int rank = 0;      // this rank's place along it
  int tensor = 1;       // T: ranks per tensor group
  int tensor_rank = 0;  // place in it
  int shard = 1;     // S: ranks per shard group
  int replicas = 1;  // R = world / S: shard groups, each a full copy of the model state

  int shard_rank() const { return rank % shard; }  // place in the shard group (the partition's rank)
  int replica() const { return rank / shard; }     // which copy (place in the replicate group)
  bool hybrid() const { return replicas > 1; }

  // From the plan's mesh.tensor and zero.shard_group for rank `rank` of `world`. ranks_per_host: the launcher's local
  // world, which "host" needs (0 = unknown, as for `train estimate` without --ranks-per-host).
  // Refuses, in one line, a group size that does not divide the world and what hybrid sharding does
  // not run (stage 0: nothing is sharded; offload.params: the shard all-reduce needs the gradient
  // shard in memory).
  static DataMesh of(const Plan& plan, int world, int rank, int ranks_per_host);
};

// "2 shard groups of 2 ranks (replicated)", "one shard group of 4 ranks": for banners and estimates
// (the data axis; describe_tensor: the tensor axis).
std::string describe_mesh(const DataMesh& m);

}  // namespace zt
