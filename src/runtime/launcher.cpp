#include "runtime/launcher.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/error.h"

namespace zt {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  ZT_REQUIRE(*end == '\0' && x >= 0 && x < (1L << 30), name << "=" << v << ": not a count the launcher would set");
  return int(x);
}

// Slurm's SLURM_STEP_TASKS_PER_NODE: tasks on each node of the step in node order, runs of equal
// counts compressed ("2(x3),1" = 2,2,2,1). The count of node `node`.
int tasks_on_node(const std::string& spec, int node) {
  const char* p = spec.c_str();
  while (*p) {
    char* end = nullptr;
    const long tasks = std::strtol(p, &end, 10);
    long repeat = 1;
    if (end != p && end[0] == '(' && end[1] == 'x') {
      p = end + 2;
      repeat = std::strtol(p, &end, 10);
      ZT_REQUIRE(end != p && *end == ')', "SLURM_STEP_TASKS_PER_NODE=" << spec << ": not Slurm's form");
      ++end;
    }
    ZT_REQUIRE(end != p && (*end == ',' || *end == '\0'), "SLURM_STEP_TASKS_PER_NODE=" << spec << ": not Slurm's form");
    if (node < repeat) return int(tasks);
    node -= int(repeat);
    p = *end ? end + 1 : end;
  }
  throw Error("SLURM_STEP_TASKS_PER_NODE=" + spec + " names fewer nodes than SLURM_NODEID");
}

}  // namespace

Launch launch_from_env() {
  Launch l;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    l.launcher = "mpirun";
    l.world = env_int("OMPI_COMM_WORLD_SIZE", 1);
    l.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    l.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    l.local_world = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (std::getenv("SLURM_STEP_NUM_TASKS")) {
    l.launcher = "srun";
    l.world = env_int("SLURM_STEP_NUM_TASKS", 1);
    l.rank = env_int("SLURM_PROCID", 0);
    l.local_rank = env_int("SLURM_LOCALID", 0);
    const char* per_node = std::getenv("SLURM_STEP_TASKS_PER_NODE");
    l.local_world = per_node ? tasks_on_node(per_node, env_int("SLURM_NODEID", 0)) : 1;
  } else if (std::getenv("PMIX_RANK") || std::getenv("PMI_SIZE")) {
    l.launcher = "pmix";  // says its rank; the world comes from MPI
    l.rank = env_int("PMIX_RANK", 0);
  }
  l.cpus_per_task = env_int("SLURM_CPUS_PER_TASK", 0);
  return l;
}

namespace {
// Read before main; a variable it cannot read is reported when the program first asks (an
// exception here would end the process before main could print it).
struct AtStart {
  Launch launch;
  std::string error;
};
AtStart read_at_start() {
  try {
    return {launch_from_env(), ""};
  } catch (const Error& e) {
    return {Launch{}, e.what()};
  }
}
const AtStart kAtStart = read_at_start();
}  // namespace

const Launch& this_launch() {
  ZT_REQUIRE(kAtStart.error.empty(), kAtStart.error);
  return kAtStart.launch;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

int threads_per_rank(const Launch& launch, int affinity, int local_world) {
  // The rule run.threads is held to (plan.cpp, check_machine): a grant far beyond the CPUs this
  // process may use is a mistyped or foreign SLURM_CPUS_PER_TASK, and its threads would only thrash.
  ZT_REQUIRE(int64_t(launch.cpus_per_task) <= 4 * int64_t(std::max(1, affinity)),
             "SLURM_CPUS_PER_TASK=" << launch.cpus_per_task << " is more than 4 x the " << affinity
                                    << " cores this process may use; request the CPUs the task has (srun -c), "
                                       "or set run.threads");
  if (launch.cpus_per_task > 0) return launch.cpus_per_task;
  return std::max(1, affinity / std::max(1, local_world));
}

void check_launch(const Launch& launch, int comm_world) {
  const bool says_world = launch.launcher == "mpirun" || launch.launcher == "srun";
  ZT_REQUIRE(!says_world || launch.world == comm_world,
             launch.launcher << " started " << launch.world << " tasks but MPI sees a world of " << comm_world
                             << (launch.launcher == "srun"
                                     ? ": start the ranks with `srun --mpi=pmix` (srun --mpi=list shows what this Slurm offers)"
                                     : ": ./train's MPI is not the one this mpirun belongs to"));
}

}  // namespace zt
