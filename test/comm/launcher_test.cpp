// runtime/launcher.h: what mpirun and srun put in the environment, as each would set it. Each case
// names what the code before the launcher module did wrong there.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "runtime/launcher.h"
#include "runtime/error.h"

namespace {

// Sets the given variables for one test, with every other launcher variable unset, and restores
// the environment after.
class LaunchEnv {
 public:
  explicit LaunchEnv(std::vector<std::pair<const char*, const char*>> set) {
    for (const char* name : kAll) {
      const char* v = std::getenv(name);
      saved_.push_back({name, v ? std::string(v) : std::string(), v != nullptr});
      unsetenv(name);
    }
    for (const auto& [name, value] : set) setenv(name, value, 1);
  }
  ~LaunchEnv() {
    for (const Saved& s : saved_) {
      if (s.was_set) setenv(s.name, s.value.c_str(), 1);
      else unsetenv(s.name);
    }
  }

 private:
  static constexpr const char* kAll[] = {
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
      "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
      "SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "PMIX_RANK", "PMI_SIZE"};
  struct Saved {
    const char* name;
    std::string value;
    bool was_set;
  };
  std::vector<Saved> saved_;
};

// srun --mpi=pmix -N2 --ntasks-per-node=2, the second task on the second node.
TEST(Launcher, SrunTaskFromSlurmVariables) {
  LaunchEnv env({{"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "1"},
                 {"SLURM_NODEID", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"PMIX_RANK", "3"}});
  const zt::Launch l = zt::launch_from_env();
  EXPECT_EQ(l.launcher, "srun");
  EXPECT_EQ(l.world, 4);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_world, 2);
}

// Uneven steps (-n 5 on 3 nodes: "2(x2),1"): the last node runs one task.
TEST(Launcher, SrunUnevenTasksPerNode) {
  LaunchEnv env({{"SLURM_STEP_NUM_TASKS", "5"}, {"SLURM_PROCID", "4"}, {"SLURM_LOCALID", "0"},
                 {"SLURM_NODEID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"}});
  EXPECT_EQ(zt::launch_from_env().local_world, 1);
  LaunchEnv first({{"SLURM_STEP_NUM_TASKS", "5"}, {"SLURM_NODEID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"}});
  EXPECT_EQ(zt::launch_from_env().local_world, 2);
}

// A value no launcher would set is refused with its name, never read as a number it is not.
TEST(Launcher, MalformedVariablesRefused) {
  LaunchEnv env({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2(3)"}});
  EXPECT_THROW(zt::launch_from_env(), zt::Error);
  LaunchEnv cpus({{"SLURM_CPUS_PER_TASK", "4x"}, {"SLURM_PROCID", "0"}});
  try {
    zt::launch_from_env();
    FAIL() << "SLURM_CPUS_PER_TASK=4x accepted";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_CPUS_PER_TASK=4x"), std::string::npos) << e.what();
  }
}

// mpirun inside an allocation: its ranks inherit the batch script's SLURM_PROCID=0 and
// SLURM_LOCALID=0; Open MPI's own variables say who they are.
TEST(Launcher, MpirunInsideAllocationIgnoresInheritedSlurmIds) {
  LaunchEnv env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
                 {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "1"}});
  const zt::Launch l = zt::launch_from_env();
  EXPECT_EQ(l.launcher, "mpirun");
  EXPECT_EQ(l.world, 4);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_world, 2);
}

// ./train run by hand in the batch script: Slurm's job variables are there, a step's are not.
TEST(Launcher, BatchScriptIsNotALauncher) {
  LaunchEnv env({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_CPUS_PER_TASK", "3"}});
  const zt::Launch l = zt::launch_from_env();
  EXPECT_EQ(l.launcher, "");
  EXPECT_EQ(l.world, 1);
  EXPECT_EQ(l.cpus_per_task, 3);
}

// srun -c 4 on a 64-CPU node with two tasks there (task/none: each task may run anywhere): four
// threads each, as Slurm granted; the whole node shared would give 32 each, 16 of them on CPUs
// granted to other jobs.
TEST(Launcher, ThreadsFromSlurmCpusPerTask) {
  LaunchEnv env({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_CPUS_PER_TASK", "4"}});
  EXPECT_EQ(zt::threads_per_rank(zt::launch_from_env(), 64, 2), 4);
}

// SLURM_CPUS_PER_TASK=1000 on 2 CPUs ran 1000 threads (5x slower) where run.threads=1000 is refused
// by the 4 x cores rule: the grant is held to the same rule, refused in one line naming it.
TEST(Launcher, SlurmCpusPerTaskBeyondCoresRefused) {
  LaunchEnv env({{"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_CPUS_PER_TASK", "1000"}});
  EXPECT_EQ(zt::threads_per_rank(zt::launch_from_env(), 250, 1), 1000);  // 4 x 250: allowed
  try {
    zt::threads_per_rank(zt::launch_from_env(), 2, 1);
    FAIL() << "SLURM_CPUS_PER_TASK=1000 on 2 CPUs accepted";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_CPUS_PER_TASK=1000 is more than 4 x the 2 cores"), std::string::npos)
        << e.what();
  }
}

// No grant named: the CPUs this process may run on, shared by the host's ranks, at least one.
TEST(Launcher, ThreadsFromAffinityShared) {
  LaunchEnv env({});
  EXPECT_EQ(zt::threads_per_rank(zt::launch_from_env(), 8, 2), 4);
  EXPECT_EQ(zt::threads_per_rank(zt::launch_from_env(), 1, 2), 1);
  EXPECT_GE(zt::affinity_cpus(), 1);
}

// srun without --mpi=pmix: every task is a world of one and would train the whole run alone,
// each writing the same checkpoints. Refused, naming the fix.
TEST(Launcher, SrunWithoutPmixRefused) {
  LaunchEnv env({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                 {"SLURM_NODEID", "1"}});
  const zt::Launch l = zt::launch_from_env();
  try {
    zt::check_launch(l, 1);
    FAIL() << "world 1 under srun -n 2 accepted";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("srun --mpi=pmix"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(zt::check_launch(l, 2));
  LaunchEnv none({});
  EXPECT_NO_THROW(zt::check_launch(zt::launch_from_env(), 1));
}

}  // namespace
