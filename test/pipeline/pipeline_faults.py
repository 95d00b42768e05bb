#!/usr/bin/env python3
"""A pipeline stage that fails mid-step is diagnosed, never a hang (issue 54).

1. A stage that never sends: at step 2, world rank 1 (stage 1 of P 2; then the middle stage of P 3)
   drops its first send (comm.fault_skip_rank / fault_skip_step, comm/comm.h). The stage waiting for
   it must time out after comm.timeout_s (5 s) naming the recv, the stage it waited for ("from stage
   1") and the group "pipeline", and the whole job must end non-zero within the timeout + 15 s. The
   same at P 2 under the interleaved schedule (2 chunks per stage: the first send is chunk 0's
   output, which stage 0's chunk 1 waits for).
2. A stage that stops: SIGSTOP on the last stage's process once step 3 has been logged (mid-run,
   between or inside steps). Its neighbour must time out naming "stage 2" (P 3) and the job end
   non-zero within the timeout + 15 s of the stop.
3. A stage that is killed: SIGKILL on the middle stage's process mid-run: the job ends non-zero
   within 15 s (mpirun takes every rank down and names the rank).

  /usr/bin/python3 test/pipeline/pipeline_faults.py [--train ./train] [--mpirun mpirun]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "test", "zero"))
import zero_equivalence as zm  # noqa: E402  (launcher, env)

TIMEOUT_S, SLACK_S = 5, 15


def sets(workdir, P, steps, extra=None):
    s = {"model.n_layer": 3, "model.n_head": 4, "model.n_embd": 32, "model.seq_len": 16,
         "data.train": "data/sample/train_*.bin", "data.val": "data/sample/val.bin", "data.tokenizer": "",
         "batch.micro_batch": 2, "batch.grad_accum": 4, "mesh.pipeline": P, "device": "cpu",
         "run.steps": steps, "run.eval_every": 0, "run.eval_batches": 1, "run.threads": 1,
         "comm.timeout_s": TIMEOUT_S, "run.log": os.path.join(workdir, "metrics.jsonl")}
    s.update(extra or {})
    out = []
    for k, v in s.items():
        out += ["--set", f"{k}={v}"]
    return out


def rank_pid(train, rank):
    """The pid of the train process of MPI world rank `rank` (the tests run one job at a time)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            argv0 = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0]
        except OSError:
            continue
        if os.path.basename(argv0) == os.path.basename(train).encode() and \
                f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(pid)
    return None


def dropped_send(train, mpirun, work, P, errs, extra=None, what=""):
    d = os.path.join(work, f"drop{P}{'_'.join(str(v) for v in (extra or {}).values())}")
    os.makedirs(d)
    cmd = zm.launcher(mpirun, P) + [train, "plans/default.json"] + sets(
        d, P, 6, dict(extra or {}, **{"comm.fault_skip_rank": 1, "comm.fault_skip_step": 2}))
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    secs = time.monotonic() - t0
    lines = [l for l in p.stdout.splitlines() if l.startswith("error: rank")]
    named = [l for l in lines if re.search(r'recv #\d+ from stage 1 .*in group "pipeline" .*did not complete within '
                                           rf'{TIMEOUT_S} s', l)]
    # The skipping rank says so when it skips; its log dump may not make it out before rank 0's abort.
    skipped = re.search(r'^note: rank 1: send #\d+ to stage \d \(rank \d of the world\) in group "pipeline" '
                        r'\(\d+ bytes, step 2\) skipped \(fault injection', p.stdout, re.M)
    ok = p.returncode != 0 and named and secs < TIMEOUT_S + SLACK_S and skipped
    print(f"  {'ok ' if ok else 'BAD'} P {P}{what}: stage 1 drops its first send at step 2: exit {p.returncode} after "
          f"{secs:.0f} s: {named[0][:150] if named else p.stdout.strip()[-300:]}", flush=True)
    if not ok:
        errs.append(f"dropped send at P {P}{what}: exit {p.returncode} after {secs:.0f} s, error lines {lines[:2]}")


def signalled(train, mpirun, work, sig, rank, P, want, errs):
    d = os.path.join(work, f"sig{sig}")
    os.makedirs(d)
    cmd = zm.launcher(mpirun, P) + [train, "plans/default.json"] + sets(d, P, 100000)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, victim, t_sig = [], None, None
    deadline = time.monotonic() + 120
    try:
        for line in proc.stdout:
            out.append(line)
            if victim is None and re.match(r"step\s+3/", line):
                victim = rank_pid(train, rank)
                if victim is None:
                    break
                os.kill(victim, sig)
                t_sig = time.monotonic()
                break
        rest, _ = proc.communicate(timeout=TIMEOUT_S + SLACK_S + 30)
        out.append(rest)
    except subprocess.TimeoutExpired:
        proc.kill()
        out.append(proc.communicate()[0])
    finally:
        if victim:
            try:
                os.kill(victim, signal.SIGKILL)
            except OSError:
                pass
        if time.monotonic() > deadline:
            proc.kill()
    text = "".join(out)
    secs = time.monotonic() - t_sig if t_sig else -1
    bound = (TIMEOUT_S if sig == signal.SIGSTOP else 0) + SLACK_S
    named = re.search(want, text) if want else True
    ok = victim is not None and proc.returncode not in (0, None) and 0 <= secs < bound and named
    what = {signal.SIGSTOP: "stops", signal.SIGKILL: "is killed"}[sig]
    line = next((l for l in text.splitlines() if l.startswith("error: rank")), text.strip().splitlines()[-1:])
    print(f"  {'ok ' if ok else 'BAD'} P {P}: world rank {rank} {what} after step 3: exit {proc.returncode} "
          f"{secs:.1f} s later: {str(line)[:150]}", flush=True)
    if not ok:
        errs.append(f"rank {rank} {what}: victim pid {victim}, exit {proc.returncode} after {secs:.1f} s "
                    f"(bound {bound} s), wanted {want!r}: {text.strip()[-400:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    ap.add_argument("--mpirun", default="mpirun")
    a = ap.parse_args()
    train = os.path.realpath(a.train)
    work = tempfile.mkdtemp(prefix="pipeline_faults.")
    errs = []
    dropped_send(train, a.mpirun, work, 2, errs)
    dropped_send(train, a.mpirun, work, 3, errs)
    dropped_send(train, a.mpirun, work, 2, errs, {"model.n_layer": 4, "mesh.schedule": "interleaved", "mesh.chunks": 2},
                 " interleaved x 2 chunks")
    signalled(train, a.mpirun, work, signal.SIGSTOP, 2, 3, r'from stage 2 .*in group "pipeline"', errs)
    signalled(train, a.mpirun, work, signal.SIGKILL, 1, 3, None, errs)
    if errs:
        print(f"\npipeline_faults FAILED ({len(errs)}):")
        for e in errs:
            print("  - " + e)
        return 1
    print("pipeline_faults passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
