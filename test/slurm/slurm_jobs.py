#!/usr/bin/env python3
"""zerotrain under a real Slurm (docs/slurm.md): slurmctld and one slurmd per namespace host of
scripts/cluster, jobs submitted with the docs' own scripts/slurm/train.sbatch (2 nodes x 1 rank,
srun --mpi=pmix, CPU backend, a tiny model).

  1. uninterrupted: the job's losses equal the single-rank run's at the same global batch
     (N=1 with grad_accum 2 vs N=2 with grad_accum 1, relative 1e-5 as test/zero/zero_equivalence.py);
     `mpirun` inside a 2-node allocation (sbatch --wrap) gives the srun job's losses exactly.
  2. preempted: `scontrol requeue` mid-run; the ranks get SIGTERM, save, Slurm requeues the job,
     checkpoint.resume "auto" continues; final weights == the uninterrupted job's, bit for bit.
  3. time limit: the batch shell gets SIGUSR1 as --signal=B:USR1@120 sends it (here from
     `scancel --batch --signal=USR1`, not a 2-minute wait); the script forwards it to the ranks,
     they save, the script requeues the job, it resumes; final weights equal again.
  4. a real time limit: --time=1 with --signal=B:USR1@20 and a run longer than that; Slurm signals,
     the job saves, requeues itself before the limit and resumes at the next step (time_limit()).
Prints the measured times: submit to first step, signal to saved checkpoint, requeue to resumed
step. Afterwards no Slurm daemon, munged or rank of this cluster may be left running.
Exit 77 (ctest: Skipped) with the reason where namespaces or the Slurm packages are missing.

  /usr/bin/python3 test/slurm/slurm_jobs.py --train build/train
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(ROOT, "scripts", "cluster")
SBATCH = os.path.join(ROOT, "scripts", "slurm", "train.sbatch")
NAME = f"zsl{os.getpid() % 100000}"
# Preempt once the log shows step STOP_AFTER. The run goes on while the signal travels (the test's
# scontrol polling, slurmctld, srun): at 30 steps of ~40 ms that took the whole rest of the run
# under the full suite's -j2 load on a slow machine, and the signal found the run finished.
STEPS, STOP_AFTER = 60, 8
LOSS_TOL = 1e-5
TINY = {"model.n_layer": 3, "model.n_head": 5, "model.n_embd": 35, "model.seq_len": 31,
        "data.train": "data/sample/train_*.bin", "data.val": "data/sample/val.bin", "data.tokenizer": "",
        "batch.micro_batch": 2, "optim.warmup_steps": 3, "run.steps": STEPS, "run.eval_every": 0,
        "run.eval_batches": 1, "run.sample_every": 0, "device": "cpu"}
ONE_THREAD = {"run.threads": 1}  # runs outside srun -c 1


def env(extra=None):
    e = dict(os.environ, ZT_CLUSTER=NAME, OMP_NUM_THREADS="1",
             OMPI_MCA_pml="ob1", OMPI_MCA_btl="tcp,vader,self")  # TCP between hosts, as docs/multihost.md
    e.update(extra or {})
    return e


def sets(d):
    return " ".join(f"--set {k}={v}" for k, v in d.items())


def slurm(*args, check=True):
    p = subprocess.run([CLUSTER, "slurm", *args], env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stdout.strip()}")
    return p.stdout.strip()


def job_field(job, key):
    for kv in slurm("scontrol", "-o", "show", "job", job).split():
        if kv.startswith(key + "="):
            return kv.split("=", 1)[1]
    return ""


def losses(log):
    # The resumed run moves the first run's log aside: it may vanish between a check and the open.
    try:
        with open(log) as f:
            return [json.loads(l) for l in f if '"loss"' in l]
    except FileNotFoundError:
        return []


def wait_for(what, cond, timeout, job=None):
    """Polls cond until it returns something true; with job, gives up as soon as the job has ended
    without it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = cond()
        if v:
            return v
        if job and (state := job_field(job, "JobState")) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            v = cond()  # it may have come just before the end
            if v:
                return v
            raise RuntimeError(f"job {job} ended {state} while waiting for {what}")
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def submit(work, tag, train, more=None, ckpt=None, sbatch_args=()):
    """sbatch of the docs' script; more: further --set options; ckpt: checkpoint.dir (default: the
    job's own directory's)."""
    d = os.path.join(work, tag)
    os.makedirs(d)
    run = dict(TINY, **{"run.log": f"{d}/metrics.jsonl", "run.final_weights": f"{d}/final.bin"}, **(more or {}))
    job_env = {"PLAN": "plans/default.json", "CKPT": ckpt or f"{d}/ckpt", "TRAIN": train, "TRAIN_ARGS": sets(run)}
    # --cpus-per-task=1: the ranks must take their thread count from Slurm (runtime/launcher.h).
    p = subprocess.run([CLUSTER, "slurm", "sbatch", "--parsable", "--cpus-per-task=1", f"--chdir={ROOT}",
                        f"--output={d}/job.out", *sbatch_args, SBATCH],
                       env=env(job_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"sbatch: {p.stdout.strip()}")
    return p.stdout.strip().split(";")[0], d, time.monotonic()


def finish(job, d, timeout=120):
    state = wait_for(f"job {job} to end", lambda: (s := job_field(job, "JobState")) in
                     ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") and s, timeout)
    out = open(os.path.join(d, "job.out")).read()
    if state != "COMPLETED":
        raise RuntimeError(f"job {job} ended {state}; the end of its output:\n{out[-1500:]}")
    return out


def alive(pids):
    """'pid name' of those of pids that still exist (a zombie too)."""
    found = []
    for p in pids:
        try:
            found.append(f"{p} {open(f'/proc/{p}/comm').read().strip()}")
        except OSError:
            pass  # gone, also between listing and reading
    return found


def weights(d):
    return open(os.path.join(d, "final.bin"), "rb").read()


def interrupted(work, tag, train, how):
    """Submits, stops the job mid-run `how` (a function of the job id), waits for the resumed job to
    finish; returns the directory and the three measured times."""
    job, d, t_sub = submit(work, tag, train)
    log = os.path.join(d, "metrics.jsonl")
    wait_for(f"step {STOP_AFTER}", lambda: len(losses(log)) >= STOP_AFTER, 120, job)
    t_sig = time.monotonic()
    how(job)
    # Saved: the ranks print the stop line after the checkpoint is complete.
    wait_for("the checkpoint after the signal", lambda: "checkpoint saved" in open(os.path.join(d, "job.out")).read(), 60, job)
    t_saved = time.monotonic()
    # Resumed: the new run's first step (its log replaces the first run's, moved aside).
    first = wait_for("the resumed run's first step",
                     lambda: job_field(job, "Restarts") == "1" and (l := losses(log)) and l[0]["step"] > 1 and l[0], 120, job)
    t_res = time.monotonic()
    out = finish(job, d)
    if len(losses(log)) != STEPS - first["step"] + 1 or losses(log)[-1]["step"] != STEPS:
        raise RuntimeError(f"{tag}: the resumed run logged steps {first['step']}..{losses(log)[-1]['step']}, not up to {STEPS}")
    return d, out, {"signal to saved checkpoint": t_saved - t_sig, "requeue to resumed step": t_res - t_saved,
                    "resumed at step": first["step"]}


class Session:
    """The frame every Slurm test runs in: --train, the skip (exit 77) where no Slurm cluster can be
    made here, a work directory, the failures list, and end(): the cluster down, nothing of it left
    (not even a zombie), the report and the exit status."""

    def __init__(self, name):
        ap = argparse.ArgumentParser(description=name)
        ap.add_argument("--train", default="build/train")
        self.name, self.train = name, os.path.abspath(ap.parse_args().train)
        chk = subprocess.run([CLUSTER, "slurm", "check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if chk.returncode != 0:
            print(f"{name} SKIPPED: {chk.stdout.strip()}")
            sys.exit(77)
        self.inside = []  # every process that ran on a host: daemons, job steps, ranks
        signal.signal(signal.SIGTERM, self.down)
        signal.signal(signal.SIGINT, self.down)
        self.work = tempfile.mkdtemp(prefix=name + ".")
        self.failures, self.t_all = [], time.monotonic()

    def down(self, *sig):
        self.inside.extend(subprocess.run([CLUSTER, "pids"], env=env(), stdout=subprocess.PIPE, text=True).stdout.split())
        subprocess.run([CLUSTER, "down"], env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if sig:
            sys.exit(1)

    def end(self):
        self.down()
        # Gone, not even a zombie (killed daemons are reaped by init within a few seconds).
        try:
            wait_for("the cluster's processes to be gone", lambda: not alive(self.inside), 15)
        except RuntimeError:
            self.failures.append(f"left after `scripts/cluster down`: {', '.join(alive(self.inside))}")
        print(f"{time.monotonic() - self.t_all:.0f} s in all")
        if self.failures:
            print(f"\n{self.name} FAILED ({len(self.failures)}), run directories in {self.work}:")
            for f in self.failures:
                print("  - " + f)
            sys.exit(1)
        shutil.rmtree(self.work, ignore_errors=True)
        print(f"{self.name} passed")


def main():
    s = Session("slurm_jobs")
    train, work, failures = s.train, s.work, s.failures
    try:
        subprocess.run([CLUSTER, "up", "2"], env=env(), check=True, stdout=subprocess.DEVNULL)
        subprocess.run([CLUSTER, "slurm", "up"], env=env(), check=True)

        # The oracle: one rank, no Slurm, the same global batch.
        ref = os.path.join(work, "ref")
        os.makedirs(ref)
        subprocess.run([train, "plans/default.json", *sets(dict(TINY, **ONE_THREAD, **{
            "batch.grad_accum": 2, "run.log": f"{ref}/metrics.jsonl"})).split()],
            cwd=ROOT, env=env(), check=True, stdout=subprocess.DEVNULL)
        ref_loss = [r["loss"] for r in losses(f"{ref}/metrics.jsonl")]

        job, d_full, t_sub = submit(work, "uninterrupted", train)
        wait_for("the first step", lambda: losses(f"{d_full}/metrics.jsonl"), 120, job)
        t_first = time.monotonic() - t_sub
        out = finish(job, d_full)
        got = [r["loss"] for r in losses(f"{d_full}/metrics.jsonl")]
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref_loss)) if len(got) == len(ref_loss) == STEPS else float("inf")
        print(f"uninterrupted 2x1 job {job}: {len(got)} steps, loss {got[0]:.4f} -> {got[-1]:.4f}, "
              f"worst relative difference to the single rank {worst:.1e} (tol {LOSS_TOL}); submit to first step {t_first:.1f} s")
        # Threads from SLURM_CPUS_PER_TASK, not from the CPUs the rank may run on (all of the host's).
        threads_ok = "2 rank(s) x 1 threads" in out
        print(f"threads per rank under srun -c 1: {'1' if threads_ok else 'not 1'} (the process may run on "
              f"{len(os.sched_getaffinity(0))} CPUs)")
        if not threads_ok:
            failures.append("srun -c 1: the ranks did not run 1 thread each:\n" +
                            "\n".join(l for l in out.splitlines() if "rank(s) x" in l))
        if not worst <= LOSS_TOL:
            failures.append(f"uninterrupted job: losses differ from the single-rank run by {worst:.2e} relative\n{out[-2000:]}")

        # mpirun inside an allocation (Open MPI starts its daemons through Slurm): the same run.
        d_mp = os.path.join(work, "mpirun")
        os.makedirs(d_mp)
        wrap = f"mpirun {train} plans/default.json " + sets(dict(TINY, **ONE_THREAD, **{"run.log": f"{d_mp}/metrics.jsonl"}))
        p = subprocess.run([CLUSTER, "slurm", "sbatch", "--parsable", "-N2", "--ntasks-per-node=1", f"--chdir={ROOT}",
                            f"--output={d_mp}/job.out", f"--wrap={wrap}"], env=env({"OMPI_ALLOW_RUN_AS_ROOT": "1",
                           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        finish(p.stdout.strip().split(";")[0], d_mp)
        same = [r["loss"] for r in losses(f"{d_mp}/metrics.jsonl")] == got
        print(f"mpirun inside a 2-node allocation: losses {'==' if same else '!='} the srun job's")
        if not same:
            failures.append("mpirun inside the allocation: losses differ from the srun job's")

        cases = [("scontrol requeue", lambda job: slurm("scontrol", "requeue", job)),
                 ("time-limit signal (B:USR1)", lambda job: slurm("scancel", "--batch", "--signal=USR1", job))]
        for tag, how in cases:
            d, out, t = interrupted(work, tag.split()[0].replace("-", "_"), train, how)
            same = weights(d) == weights(d_full)
            print(f"{tag}: resumed at step {t['resumed at step']}, final weights {'==' if same else '!='} the uninterrupted "
                  f"job's; signal to saved checkpoint {t['signal to saved checkpoint']:.1f} s, "
                  f"requeue to resumed step {t['requeue to resumed step']:.1f} s")
            if not same:
                failures.append(f"{tag}: final weights differ from the uninterrupted job's\n{out[-2000:]}")

        time_limit(work, train, failures)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        failures.append(str(e))
    finally:
        s.end()


def time_limit(work, train, failures):
    """A real time limit: --time=1 (the shortest Slurm has) with --signal=B:USR1@20, and a run far
    longer than a minute. slurmctld looks at time limits every 30 s (its PERIODIC_TIMEOUT) and sends
    the signal at the first look within 20 + 30 s of the limit, so 10-40 s after the start; the
    limit itself is enforced at the first look past 60 s. The job must save, requeue itself before
    that and resume at the next step; then it is cancelled (it would stop and requeue every minute)."""
    job, d, t_sub = submit(work, "real_time_limit", train, {"run.steps": 100000}, sbatch_args=["--time=1", "--signal=B:USR1@20"])
    log, job_out = os.path.join(d, "metrics.jsonl"), os.path.join(d, "job.out")
    wait_for("the first step", lambda: losses(log), 120, job)
    t_first = time.monotonic()
    wait_for("the time limit's signal", lambda: "SIGUSR1 (time limit near)" in open(job_out).read(), 90, job)
    t_sig = time.monotonic()
    saved = wait_for("the checkpoint after the signal",
                     lambda: [l for l in open(job_out).read().split("SIGUSR1 (time limit near)")[1].splitlines()
                             if "checkpoint: saved" in l], 60, job)
    t_saved = time.monotonic()
    first = wait_for("the resumed run's first step",
                     lambda: job_field(job, "Restarts") == "1" and (l := losses(log)) and l[0]["step"] > 1 and l[0], 120, job)
    t_res = time.monotonic()
    slurm("scancel", job)
    state = wait_for(f"job {job} to end", lambda: (st := job_field(job, "JobState")) in
                     ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") and st, 60)
    out = open(job_out).read()
    at = int(saved[0].split("/step_")[1].split(":")[0])
    ok = (first["step"] == at + 1 and state == "CANCELLED" and "saved before the time limit: requeuing job" in out)
    print(f"time limit (--time=1, --signal=B:USR1@20): signal {t_sig - t_sub:.1f} s after submit ({t_sig - t_first:.1f} s after the first step), "
          f"saved at step {at} {t_saved - t_sig:.1f} s later, requeued by the script, resumed at step {first['step']} "
          f"{t_res - t_saved:.1f} s later; cancelled then: {state}")
    if not ok:
        failures.append(f"time limit: the job did not save at the signal and resume at the next step\n{out[-2000:]}")

if __name__ == "__main__":
    main()
