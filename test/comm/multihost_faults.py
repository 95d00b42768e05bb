#!/usr/bin/env python3
"""Network faults end a multi-host job (docs/multihost.md; docs/design.md §3.8).

Hosts are network namespaces (scripts/cluster); mpirun runs on host 0 and starts Open MPI's
daemons on the others through the cluster's launch agent, so ranks on different hosts talk over
TCP exactly as on a cluster. A tiny model trains for many steps with comm.timeout_s = TIMEOUT_S;
once it is past step 2, a fault hits host 1:

  link    host 1's cable is cut (its switch port goes down: no carrier, packets dropped)
  kill9   the rank process on host 1 is killed with SIGKILL

Then, for every process of the job (each rank, each Open MPI daemon, mpirun), the time from the
fault to its exit is measured by polling the namespaces' process lists every 50 ms, and:

  * mpirun exits non-zero, every process is gone within TIMEOUT_S + BOUND_S seconds of the fault;
  * no process is left in any host namespace (checked before the cluster is torn down);
  * link: a rank on host 0 reports the stuck collective ("collective OP #SEQ ... did not complete
    within TIMEOUT_S s") -- the diagnostic names it;
  * kill9: mpirun reports the killed rank.

Skipped (exit 77, with the reason) where namespaces cannot be made (not root, no ip/tc, no
permission). Prints one table of exit times per fault.

  /usr/bin/python3 test/comm/multihost_faults.py [--train ./train] [--faults link,kill9] [--ranks-per-host 1]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(ROOT, "scripts", "cluster")
TIMEOUT_S = 5      # comm.timeout_s of the run
BOUND_S = 10       # every process gone within TIMEOUT_S + BOUND_S after the fault (the stated bound)
OUTER_S = 120      # the whole job is killed (and the test fails) past this


def env(name):
    e = dict(os.environ)
    e["ZT_CLUSTER"] = name
    e["OMP_NUM_THREADS"] = "1"
    e["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    e["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return e


def cluster(name, *args, check=True):
    p = subprocess.run([CLUSTER, *args], env=env(name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"scripts/cluster {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def procs(name, hosts):
    """{pid: (host, command name)} of every process in the cluster's host namespaces."""
    out = {}
    for h in hosts:
        p = cluster(name, "pids", h, check=False)
        for tok in p.stdout.split():
            try:
                with open(f"/proc/{tok}/comm") as f:
                    out[int(tok)] = (h, f.read().strip())
            except OSError:
                pass
    return out


def run_fault(name, hosts, fault, train, work, ranks_per_host):
    log = os.path.join(work, fault, "metrics.jsonl")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    n = len(hosts) * ranks_per_host
    hostlist = ",".join(f"{h}:{ranks_per_host}" for h in hosts)
    sets = {
        "model.n_layer": 2, "model.n_head": 4, "model.n_embd": 64, "model.seq_len": 32,
        "data.train": "data/sample/train_*.bin", "data.val": "data/sample/val.bin", "data.tokenizer": "",
        "batch.micro_batch": 2, "run.steps": 100000, "run.eval_every": 0, "run.eval_batches": 1,
        "run.sample_every": 0, "run.threads": 1, "run.log": log, "zero.stage": 3, "zero.bucket_mb": 0.05,
        "comm.timeout_s": TIMEOUT_S,
    }
    cmd = [CLUSTER, "mpirun", "--oversubscribe", "-np", str(n), "-H", hostlist, train, "plans/default.json"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    out_path = os.path.join(work, fault, "output.txt")
    out = open(out_path, "w")
    job = subprocess.Popen(cmd, cwd=ROOT, env=env(name), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    why = []
    t_start = time.monotonic()
    # Wait until training is past step 2 (every rank is in the loop, collectives in flight).
    while time.monotonic() - t_start < 60:
        if job.poll() is not None:
            break
        try:
            with open(log) as f:
                if sum(1 for l in f if '"loss"' in l) >= 3:
                    break
        except OSError:
            pass
        time.sleep(0.05)
    if job.poll() is not None:
        out.close()
        return [f"the job ended before the fault (exit {job.returncode}):\n" + open(out_path).read()[-3000:]], {}
    before = procs(name, hosts)
    ranks = {pid: h for pid, (h, c) in before.items() if c == "train"}
    victim = next((pid for pid, h in ranks.items() if h == hosts[1]), None)
    if len(ranks) != n or victim is None:
        why.append(f"expected {n} train processes ({ranks_per_host} on each host), found {sorted(ranks.items())}")
    if victim is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        out.close()
        return why + ["no rank process found on host 1: " + repr(before)], {}
    t_fault = time.monotonic()
    if fault == "link":
        cluster(name, "link", hosts[1], "down")
    else:
        os.kill(victim, signal.SIGKILL)
    gone = {}
    t_mpirun = None
    while time.monotonic() - t_fault < OUTER_S:
        now = procs(name, hosts)
        t = time.monotonic() - t_fault
        for pid in before:
            if pid not in now and pid not in gone:
                gone[pid] = t
        if t_mpirun is None and job.poll() is not None:
            t_mpirun = t
        if t_mpirun is not None and not now:
            break
        time.sleep(0.05)
    if job.poll() is None:
        why.append(f"mpirun still running {OUTER_S} s after the fault (killed by the test)")
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    out.close()
    left = procs(name, hosts)
    if left:
        why.append("processes left behind: " + ", ".join(f"{c} (pid {p}) on {h}" for p, (h, c) in sorted(left.items())))
    if fault == "link":
        cluster(name, "link", hosts[1], "up")
    text = open(out_path, errors="replace").read()
    rc = job.returncode
    if rc == 0:
        why.append("mpirun exited 0 after a fault")
    limit = TIMEOUT_S + BOUND_S
    rows = []
    for pid, (h, c) in sorted(before.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0])):
        t = gone.get(pid)
        rows.append((h, c, pid, t))
        if t is None or t > limit:
            why.append(f"{c} (pid {pid}) on {h}: " + (f"exited {t:.1f} s after the fault, bound {limit} s" if t else "never exited"))
    if t_mpirun is None or t_mpirun > limit:
        why.append(f"mpirun exited {t_mpirun} s after the fault, bound {limit} s")
    if fault == "link":
        import re
        # Either this rank's own timeout fired first, or Open MPI's keepalive declared host 1 lost
        # and the launcher terminated the ranks: then the SIGTERM note names the collective.
        m = re.search(r"rank \d+: collective [a-z_]+ #\d+ \(\d+ bytes, step \d+\) did not complete within "
                      rf"{TIMEOUT_S} s", text) or \
            re.search(r"rank \d+: terminated by signal 15 .* while waiting [0-9.]+ s for collective [a-z_]+ #\d+ "
                      r"\(\d+ bytes, step \d+\)", text)
        if not m:
            why.append("no rank reported the stuck collective ('rank R: collective OP #SEQ (...) did not complete' "
                       "or 'rank R: terminated by signal 15 ... while waiting ... for collective OP #SEQ')")
    else:
        if "signal 9" not in text and "Killed" not in text and "killed" not in text:
            why.append("mpirun's output does not mention the killed rank")
    return why, {"rows": rows, "mpirun": t_mpirun, "rc": rc, "text": text}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    ap.add_argument("--faults", default="link,kill9")
    ap.add_argument("--ranks-per-host", type=int, default=1)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    train = os.path.abspath(args.train)
    chk = subprocess.run([CLUSTER, "check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if chk.returncode != 0:
        print(f"multihost_faults SKIPPED: {chk.stdout.strip()}")
        sys.exit(77)
    name = f"ztf{os.getpid() % 100000}"
    work = tempfile.mkdtemp(prefix="multihost_faults.")
    failures = []

    def teardown(*_):
        cluster(name, "down", check=False)
        if _:
            sys.exit(1)
    signal.signal(signal.SIGTERM, teardown)
    signal.signal(signal.SIGINT, teardown)
    try:
        for fault in args.faults.split(","):
            # A fresh cluster per fault: nothing of the previous job (ARP entries, a bridge port that
            # was down) carries over.
            cluster(name, "down", check=False)
            cluster(name, "up", "2")
            hosts = cluster(name, "hosts").stdout.split()
            t0 = time.monotonic()
            why, res = run_fault(name, hosts, fault, train, work, args.ranks_per_host)
            print(f"\nfault '{fault}' on {hosts[1]} (comm.timeout_s {TIMEOUT_S}, bound {TIMEOUT_S + BOUND_S} s): "
                  f"mpirun exit {res.get('rc')} after {res.get('mpirun') or float('nan'):.1f} s")
            for h, c, pid, t in res.get("rows", []):
                print(f"  {h:>12} {c:>10} pid {pid:>7}  " + (f"exited {t:5.1f} s after the fault" if t is not None else "NEVER EXITED"))
            diag = [l for l in res.get("text", "").splitlines() if "did not complete" in l or "signal 9" in l
                    or "lost communication" in l or "while waiting" in l]
            for l in diag[:3]:
                print("    | " + l[:200])
            print(f"  ({time.monotonic() - t0:.1f} s)")
            if why:
                failures += [f"{fault}: {w}" for w in why]
                print("  --- output (last 30 lines) ---")
                for l in res.get("text", "").splitlines()[-30:]:
                    print("  | " + l)
    finally:
        cluster(name, "down", check=False)
    if failures:
        print(f"\nmultihost_faults FAILED ({len(failures)}), outputs in {work}:")
        for f in failures:
            print("  - " + f)
        sys.exit(1)
    if not args.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    print("multihost_faults passed")


if __name__ == "__main__":
    main()
