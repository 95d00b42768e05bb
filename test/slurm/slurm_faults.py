#!/usr/bin/env python3
"""zerotrain under a real Slurm when things go wrong (docs/slurm.md): the test bed and the docs'
scripts/slurm/train.sbatch as in slurm_jobs.py (its helpers), 2 namespace hosts, CPU backend,
a tiny model. slurm_jobs covers the runs that go right; this one, in a cluster of its own, so
ctest -j2 can run both at once:

  1. refused: a job whose plan is refused (a bad --set) ends at once, FAILED, not requeued, with
     the refusal's line in the job's output; the time from submit to its end is measured.
  2. scancel: a 2-node job with offload.optimizer "nvme" (swap files in offload.nvme_dir, held
     open by the ranks while they train) is cancelled mid-run; the ranks save on SIGTERM; then no
     process but the Slurm daemons is left on any host, no file in the swap directory, and no
     process holds one open.
  3. one node: a second job on 1 node with the cancelled job's checkpoint dir (grad_accum 2, the
     same global batch) resumes it; every continued loss within 1e-5 relative (the reshard
     tolerance of checkpoint_reshard) of the uninterrupted single-rank run.
Afterwards no Slurm daemon, munged or rank of this cluster may be left running.
Exit 77 (ctest: Skipped) with the reason where namespaces or the Slurm packages are missing.

  /usr/bin/python3 test/slurm/slurm_faults.py --train build/train
"""
import os
import subprocess
import time

from slurm_jobs import (CLUSTER, Session, LOSS_TOL, ONE_THREAD, ROOT, STEPS, STOP_AFTER, TINY, env, job_field,
                        losses, sets, slurm, submit, wait_for)

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
DAEMONS = {"munged", "slurmctld", "slurmscriptd", "slurmd"}  # slurmscriptd: slurmctld's helper
TIMEOUT_S = 5      # comm.timeout_s of the job whose node is lost
RANK_BOUND = 10    # a rank whose abort cannot reach the launcher ends itself 5 s after its timeout (docs/multihost.md)
SRUN_BOUND = 35    # srun waits KillWait + 2 s for a lost node's tasks, Slurm SlurmdTimeout to declare it down (30 s each here)
REFUSED_BY = 30  # seconds from submit to the end of a job whose plan is refused: "at once", with slack for 2 shared cores


def host_procs(host):
    """(pid, command name) of every process inside the host's namespace."""
    pids = subprocess.run([CLUSTER, "pids", host], env=env(), stdout=subprocess.PIPE, text=True).stdout.split()
    procs = []
    for p in pids:
        try:
            procs.append((p, open(f"/proc/{p}/comm").read().strip()))
        except OSError:
            pass  # ended meanwhile
    return procs


def open_in(dirpath, hosts):
    """'host pid -> file' for every open file under dirpath of a process on the hosts (swap files
    have no name: /proc shows 'dirpath/#inode (deleted)')."""
    found = []
    for h in hosts:
        for p, comm in host_procs(h):
            try:
                fds = os.listdir(f"/proc/{p}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{p}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(dirpath + "/"):
                    found.append(f"{h} {p} {comm} -> {target}")
    return found


def job_state(job):
    return (s := job_field(job, "JobState")) in ENDED and s


def main():
    s = Session("slurm_faults")
    train, work, failures = s.train, s.work, s.failures

    def check(ok, what, detail=""):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            failures.append(what + ("\n" + detail if detail else ""))
    try:
        subprocess.run([CLUSTER, "up", "2"], env=env(), check=True, stdout=subprocess.DEVNULL)
        subprocess.run([CLUSTER, "slurm", "up"], env=env(), check=True)
        hosts = subprocess.run([CLUSTER, "hosts"], env=env(), stdout=subprocess.PIPE, text=True).stdout.split()

        # 1. A plan refused at start: the job ends at once, with the reason in its output.
        job, d, t_sub = submit(work, "refused", train, {"batch.micro_batch": 0})
        state = wait_for(f"refused job {job} to end", lambda: job_state(job), 120)
        took = time.monotonic() - t_sub
        out = open(f"{d}/job.out").read()
        reason = [l for l in out.splitlines() if "batch.micro_batch: must be" in l]
        check(state == "FAILED" and reason and took <= REFUSED_BY and job_field(job, "Restarts") == "0",
              f"refused plan: job {state}, not requeued, {took:.1f} s from submit to its end (bound {REFUSED_BY} s); "
              f"reason in its output: {reason[0] if reason else None}", out[-1500:])

        # 2. scancel mid-run with the optimizer states in swap files.
        swap = os.path.join(work, "swap")
        ckpt = os.path.join(work, "ckpt")
        job, d, t_sub = submit(work, "scancel", train, {"zero.stage": 1, "offload.optimizer": "nvme", "offload.nvme_dir": swap}, ckpt=ckpt)
        wait_for(f"step {STOP_AFTER}", lambda: len(losses(f"{d}/metrics.jsonl")) >= STOP_AFTER, 120, job)
        held = open_in(swap, hosts)
        check(len({h.split()[0] for h in held}) == len(hosts),
              f"mid-run, the ranks of every host hold swap files open in offload.nvme_dir ({len(held)} open)", "\n".join(held))
        t_sig = time.monotonic()
        slurm("scancel", job)
        state = wait_for(f"cancelled job {job} to end", lambda: job_state(job), 60)
        out = open(f"{d}/job.out").read()
        check(state == "CANCELLED" and "checkpoint saved" in out,
              f"scancel: job {state} after the ranks saved ({'checkpoint saved' in out})", out[-1500:])

        def left():
            procs = [f"{h} {p} {c}" for h in hosts for p, c in host_procs(h) if c not in DAEMONS]
            files = sorted(os.listdir(swap)) if os.path.isdir(swap) else []
            return procs, files, open_in(swap, hosts)
        try:
            wait_for("the job's processes and swap files to be gone", lambda: left() == ([], [], []), 30)
        except RuntimeError:
            pass
        procs, files, held = left()
        t_clean = time.monotonic() - t_sig
        check(not procs and not files and not held,
              f"scancel: {t_clean:.1f} s later no process but the Slurm daemons on {len(hosts)} hosts "
              f"({len(procs)} left), no file in the swap directory ({len(files)}), none held open ({len(held)})",
              "\n".join(procs + files + held))

        # 3. The cancelled 2-node run continued by a job on 1 node (same global batch).
        ref = os.path.join(work, "ref")
        os.makedirs(ref)
        subprocess.run([train, "plans/default.json", *sets(dict(TINY, **ONE_THREAD, **{
            "batch.grad_accum": 2, "run.log": f"{ref}/metrics.jsonl"})).split()],
            cwd=ROOT, env=env(), check=True, stdout=subprocess.DEVNULL)
        ref_loss = {r["step"]: r["loss"] for r in losses(f"{ref}/metrics.jsonl")}
        job, d, t_sub = submit(work, "one_node", train, {"batch.grad_accum": 2}, ckpt=ckpt, sbatch_args=["--nodes=1"])
        state = wait_for(f"1-node job {job} to end", lambda: job_state(job), 180)
        out = open(f"{d}/job.out").read()
        got = {r["step"]: r["loss"] for r in losses(f"{d}/metrics.jsonl")}
        steps = sorted(got)
        worst = max((abs(got[s] - ref_loss[s]) / abs(ref_loss[s]) for s in steps), default=float("inf"))
        check(state == "COMPLETED" and steps and steps[0] > 1 and steps[-1] == STEPS and
              steps == list(range(steps[0], STEPS + 1)) and worst <= LOSS_TOL,
              f"2-node checkpoint resumed by a 1-node job ({state}): steps {steps[0] if steps else None}..{steps[-1] if steps else None}, "
              f"worst relative difference to the single-rank run {worst:.1e} (tol {LOSS_TOL})", out[-1500:])

        # 4. A node lost mid-job (its cable cut): the ranks end within comm.timeout_s (+ the bound
        # of a rank whose abort cannot reach the launcher), srun within its own bound, the script
        # requeues the job, which resumes from the last complete checkpoint once the node is back.
        job, d, t_sub = submit(work, "lost", train, {"comm.timeout_s": TIMEOUT_S, "checkpoint.every": 5})
        log = f"{d}/metrics.jsonl"
        wait_for("step 12", lambda: len(losses(log)) >= 12, 120, job)
        subprocess.run([CLUSTER, "link", hosts[-1], "down"], env=env(), check=True)
        t_cut = time.monotonic()
        wait_for("the ranks to end", lambda: not any(c == "train" for h in hosts for _, c in host_procs(h)), 60)
        t_ranks = time.monotonic() - t_cut
        # Requeued by the script (srun gave up on the lost node's task: KillWait + 2 s) or by Slurm
        # (it declared the node down: SlurmdTimeout), whichever comes first.
        wait_for("the job's requeue", lambda: job_field(job, "Restarts") == "1", 120)
        t_requeue = time.monotonic() - t_cut
        by = "its script" if "requeuing job" in open(f"{d}/job.out").read() else "Slurm (node failure)"
        latest = open(os.path.join(d, "ckpt", "latest")).read().strip()
        check(t_ranks <= TIMEOUT_S + RANK_BOUND and t_requeue <= TIMEOUT_S + RANK_BOUND + SRUN_BOUND,
              f"link of {hosts[-1]} cut: every rank gone {t_ranks:.1f} s later (bound comm.timeout_s {TIMEOUT_S} + "
              f"{RANK_BOUND}), the job requeued by {by} {t_requeue:.1f} s later (bound + {SRUN_BOUND})")
        subprocess.run([CLUSTER, "link", hosts[-1], "up"], env=env(), check=True)
        t_up = time.monotonic()
        first = wait_for("the requeued job's first step", lambda: job_field(job, "Restarts") == "1" and
                         (l := losses(log)) and l[0]["step"] > 1 and l[0], 180)
        t_resumed = time.monotonic() - t_up
        state = wait_for(f"requeued job {job} to end", lambda: job_state(job), 120)
        got = {r["step"]: r["loss"] for r in losses(log)}
        worst = max((abs(got[s] - ref_loss[s]) / abs(ref_loss[s]) for s in got), default=float("inf"))
        check(state == "COMPLETED" and first["step"] == int(latest.split("_")[1]) + 1 and max(got) == STEPS and
              worst <= LOSS_TOL,
              f"the requeued job ({state}) resumed at step {first['step']} from the last complete checkpoint "
              f"{latest}, {t_resumed:.1f} s after the link came back; worst relative difference to the single-rank "
              f"run {worst:.1e}", open(f"{d}/job.out").read()[-2000:])
    except (RuntimeError, subprocess.CalledProcessError) as e:
        failures.append(str(e))
    finally:
        s.end()

if __name__ == "__main__":
    main()
