// How this process was started: what mpirun or srun told it in the environment (docs/slurm.md).
// In the runtime (the ground) because the plan's checks count the CPUs too.
// The communicator stays the authority on rank and locality (MPI learns them from the same
// launcher, through PMIx under both); this says what MPI cannot: whether a launcher started the
// process at all (progress decoration), how many tasks it started (a launcher of another MPI starts
// N singletons that each believe they are the whole run), and how many CPUs Slurm gave each task.
#pragma once
#include <string>

namespace zt {

struct Launch {
  std::string launcher;   // "mpirun", "srun", "pmix" (another PMIx launcher) or "" (started by hand)
  int world = 1;          // tasks the launcher started (1 when it does not say)
  int rank = 0;
  int local_rank = 0;     // among the tasks on this host
  int local_world = 1;
  int cpus_per_task = 0;  // SLURM_CPUS_PER_TASK; 0: not given
};

// From this process's environment now. Open MPI's OMPI_COMM_WORLD_* come first: ranks of an mpirun
// inside a Slurm allocation inherit the batch script's SLURM_PROCID=0 and SLURM_LOCALID=0. An srun
// task is told apart from the batch script by SLURM_STEP_NUM_TASKS (set for steps only).
Launch launch_from_env();

// The environment as the program found it, before MPI_Init (a singleton MPI_Init sets PMIX_RANK in
// our own environment).
const Launch& this_launch();

// CPUs this process may run on (sched_getaffinity; the whole host when nothing bound it).
int affinity_cpus();

// Compute threads per rank: the CPUs Slurm gave the task when it says (SLURM_CPUS_PER_TASK), else
// the CPUs this process may run on, shared by the host's ranks. A grant of more than 4 x the CPUs
// this process may run on is refused, as run.threads is.
int threads_per_rank(const Launch& launch, int affinity_cpus, int local_world);

// Refuses a communicator that disagrees with the launcher on the world size: an srun plugin or an
// mpirun that ./train's MPI cannot talk to starts tasks that each initialise a world of one
// (Debian's Open MPI itself refuses srun without --mpi=pmix; other MPIs may not).
void check_launch(const Launch& launch, int comm_world);

}  // namespace zt
