#!/usr/bin/env python3
"""Stop signals and the checkpoint directory (src/train/stop_signal.h, docs/checkpoints.md): what a
signal at an awkward moment leaves behind. The saves are caught half way by ZT_FAULT_PAUSE_IN_SAVE
(the rank waits there until a signal arrives), and the test signals once the save's .tmp_step
directory is there, so nothing depends on a save being slow enough.

  sighup       SIGHUP mid-run is a stop signal like SIGTERM: exit 0, "stopped by SIGHUP", a
               checkpoint, no .lock (it took the default action: exit 129, nothing saved, a stale lock).
  in_save      SIGTERM during a periodic save makes it the last: the run stops after that step, no
               further step or save (it ran one more step and saved again).
  second       a second SIGTERM during the final save abandons it: exit 1, one error line, no
               .tmp_step and no .lock left (it killed the process mid-write, leaving both).
  leftovers    a run killed in a save (kill -9) leaves .tmp_step_N and its .lock; the next run with
               resume "auto" removes both and says so in one line naming them.

  /usr/bin/python3 test/checkpoint/signals_test.py [CASE...] --train ./train [--keep]
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_test as ct  # noqa: E402  (sets, run, losses, check, env, command)

check, sets, losses = ct.check, ct.sets, ct.losses
CASES = ["sighup", "in_save", "second", "leftovers"]


def start(work, extra_env=None, **plan):
    e = ct.env()
    e.update(extra_env or {})
    return subprocess.Popen(ct.command(1, sets(work, **plan)), cwd=ct.ROOT, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(cond, proc, what, limit=120):
    t0 = time.time()
    while not cond():
        if proc.poll() is not None or time.time() - t0 > limit:
            proc.kill()
            out, err = proc.communicate()
            raise SystemExit(f"gave up waiting for {what} (exit {proc.returncode}): {out[-1500:]} {err[-1500:]}")
        time.sleep(0.01)


def tmp_steps(ck):
    return sorted(n for n in os.listdir(ck) if n.startswith(".tmp")) if os.path.isdir(ck) else []


def finish(proc):
    try:
        return proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise SystemExit(f"the run did not end within 120 s of the signal: {out[-1500:]} {err[-1500:]}")


def case_sighup(tmp):
    ck = os.path.join(tmp, "ckpt")
    proc = start(tmp, steps=400, checkpoint__dir=ck)
    wait_for(lambda: os.path.exists(os.path.join(tmp, "metrics.jsonl")) and len(losses(tmp)) >= 2, proc, "step 2")
    proc.send_signal(signal.SIGHUP)
    out, err = finish(proc)
    stopped = [l for l in out.splitlines() if l.startswith("stopped by SIGHUP on rank 0")]
    latest = open(os.path.join(ck, "latest")).read().strip() if os.path.exists(os.path.join(ck, "latest")) else ""
    check(proc.returncode == 0 and stopped and latest.startswith("step_") and not os.path.exists(os.path.join(ck, ".lock")),
          f"SIGHUP: exit {proc.returncode}, {stopped[0] if stopped else 'no stop line'}, latest {latest or 'none'}, "
          f"lock {'left' if os.path.exists(os.path.join(ck, '.lock')) else 'gone'}")


def case_in_save(tmp):
    ck = os.path.join(tmp, "ckpt")
    proc = start(tmp, {"ZT_FAULT_PAUSE_IN_SAVE": "0@4"}, steps=40, checkpoint__dir=ck, checkpoint__every=4)
    wait_for(lambda: ".tmp_step_00000004" in tmp_steps(ck), proc, "the save of step 4")
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    stopped = [l for l in out.splitlines() if l.startswith("stopped by SIGTERM on rank 0")]
    steps = sorted(n for n in os.listdir(ck) if n.startswith("step_"))
    check(proc.returncode == 0 and stopped and "after step 4 " in stopped[0] and steps == ["step_00000004"]
          and max(losses(tmp)) == 4,
          f"SIGTERM during the save of step 4: exit {proc.returncode}, {stopped[0] if stopped else 'no stop line'}, "
          f"saved {steps}, last step run {max(losses(tmp))}")


def case_second(tmp):
    ck = os.path.join(tmp, "ckpt")
    proc = start(tmp, {"ZT_FAULT_PAUSE_IN_SAVE": "0"}, steps=400, checkpoint__dir=ck)
    wait_for(lambda: os.path.exists(os.path.join(tmp, "metrics.jsonl")) and len(losses(tmp)) >= 2, proc, "step 2")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: tmp_steps(ck), proc, "the final save")
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    lines = [l for l in err.splitlines() if l.strip() and not l.startswith("warning: plan:")]
    left = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
    check(proc.returncode == 1 and len(lines) == 1 and "save abandoned on a second SIGTERM" in lines[0] and not left,
          f"second SIGTERM during the save: exit {proc.returncode}, {lines[0][:200] if len(lines) == 1 else lines}, "
          f"left in checkpoint.dir: {left or 'nothing'}")


def case_leftovers(tmp):
    ck = os.path.join(tmp, "ckpt")
    p = ct.run(1, sets(tmp, steps=8, checkpoint__dir=ck, checkpoint__every=4), expect_ok=False,
               extra_env={"ZT_FAULT_KILL_IN_SAVE": "0@8"})
    left = sorted(os.listdir(ck))
    check(p.returncode != 0 and ".tmp_step_00000008" in left and ".lock" in left,
          f"killed in the save of step 8 (exit {p.returncode}): left {left}")
    # Resumed from step 4 to step 6: the run never saves step 8 again, which would remove its
    # temporary directory anyway.
    p = ct.run(1, sets(tmp, steps=6, checkpoint__dir=ck, checkpoint__every=0, checkpoint__resume="auto"))
    said = [l for l in p.stdout.splitlines() if "removed what an interrupted run left in" in l]
    left = sorted(os.listdir(ck))
    check(len(said) == 1 and ".tmp_step_00000008" in said[0] and "its lock (pid " in said[0]
          and not any(n.startswith(".") for n in left) and "resuming at step 4" in p.stdout,
          f"resume auto after the kill: {said[0] if said else 'nothing said'}; left {left}")


def main():
    return ct.run_case_script("checkpoint_signals", CASES, globals(), with_mpirun=False)


if __name__ == "__main__":
    sys.exit(main())
