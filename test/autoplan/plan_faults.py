#!/usr/bin/env python3
"""`train plan` under hostile conditions (issue 50's planner items), each case on a tiny model with a
private calibration cache, every command under a timeout:

  disagree        ranks with different ZT_COMM_COLLECTIVES (or --global-batch) are refused in one line
                  naming the environment before any probe, in seconds, nothing written
  checkpoint      a base with checkpoint.every, checkpoint.dir, final weights and a trace plans and
                  validates: its engine and --validate runs write none of them, and leave no directory
  comm_cache      the cache is keyed by the comm settings: ZT_COMM_* overrides are printed, measured
                  anew (not reused from the ring's probes), and written into the chosen plan
  bad_cache       negative, zero, huge and non-number cached values are measured again with a warning
                  naming the file and key (the prediction stays positive); entries of the wrong type,
                  or a number past a double, refuse the file in one line naming it
  signals         SIGINT during a --validate run (one rank, and to mpirun at two) leaves no run
                  directory, beside --out or in the system temp directory
  nvme_env        ZT_NVME_FREE_BYTES=abc is refused, not taken as "no offload"
  hopeless        a model no candidate can hold is refused by arithmetic, before any probe
  global_batch    --global-batch past a long is quoted as given
  set_fixed       --set of a searched key fixes it in the search (or is refused where none has it)
  lock            a second planner on the same cache waits for the first; both keep their entries
  world           the chosen plan records its world (batch.world); training it at another is refused

  /usr/bin/python3 test/autoplan/plan_faults.py --train ./train [--mpirun mpirun] [--only a,b]
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = ["data.train=data/sample/train_*.bin", "data.val=data/sample/val.bin", "data.tokenizer=",
        "model.n_layer=2", "model.n_embd=64", "model.n_head=2", "model.seq_len=32",
        "batch.micro_batch=1", "batch.grad_accum=1", "zero.bucket_mb=1", "run.threads=1", "comm.timeout_s=10"]
# One candidate's worth of probes: the searched keys fixed (set_fixed tests that this is honoured).
FEW = ["zero.stage=0", "recompute.policy=none"]


def sets(items):
    return [a for s in items for a in ("--set", s)]


class Case:
    def __init__(self, args, work):
        self.args, self.work, self.failures = args, work, []
        self.env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
        for k in ("ZT_MEM_AVAILABLE_BYTES", "ZT_NVME_FREE_BYTES") + tuple(k for k in os.environ if k.startswith("ZT_COMM_")):
            self.env.pop(k, None)

    def check(self, cond, what):
        if not cond:
            self.failures.append(what)
        return cond

    def base(self, extra=(), few=True):
        return sets(TINY + [f"offload.nvme_dir={self.work}/swap"] + (FEW if few else []) + list(extra))

    def run(self, cmd, world=1, env=None, timeout=120):
        full = ([self.args.mpirun, "--oversubscribe", "-np", str(world)] if world > 1 else []) + cmd
        t0 = time.time()
        try:
            p = subprocess.run(full, env=dict(self.env, **(env or {})), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = "timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), \
                (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return rc, out, err, time.time() - t0

    def plan(self, out, cal, extra=(), world=1, few=True, options=(), env=None, timeout=120):
        cmd = [self.args.train, "plan", "plans/default.json", "--world", str(world), "--out", out,
               "--calibration", cal] + list(options) + self.base(extra, few)
        return self.run(cmd, world, env, timeout)


def errors(text):
    return [l for l in text.splitlines() if l.startswith("error:")]


def temp_runs():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "zt-plan-validate-*")))


def case_disagree(c):
    out, cal = f"{c.work}/d.json", f"{c.work}/d.cal.json"
    one = [c.args.train, "plan", "plans/default.json", "--world", "2", "--out", out, "--calibration", cal] + c.base()
    for name, a, b in (("ZT_COMM_COLLECTIVES", ["-x", "ZT_COMM_COLLECTIVES=ring"], ["-x", "ZT_COMM_COLLECTIVES=mpi_blocking"]),
                       ("--global-batch", ["--global-batch", "2"], ["--global-batch", "4"])):
        env_a, env_b = (a, b) if name.startswith("ZT_") else ([], [])
        opt_a, opt_b = ([], []) if name.startswith("ZT_") else (a, b)
        cmd = [c.args.mpirun, "--oversubscribe", "-np", "1"] + env_a + one + opt_a + [":", "-np", "1"] + env_b + one + opt_b
        rc, so, se, took = c.run(cmd, timeout=90)
        errs = errors(so + se)
        want = ["environment", "ZT_COMM_COLLECTIVES", "mpi_blocking"] if name.startswith("ZT_") else ["different plan"]
        c.check(rc not in (0, "timeout") and errs and all(w in errs[0] for w in want),
                f"disagreeing {name}: rc {rc} after {took:.1f} s, errors {errs[:2]} (wanted one naming {want})")
        c.check(took < 30, f"disagreeing {name}: refused after {took:.1f} s (a probe ran?)")
        c.check(not os.path.exists(out) and not os.path.exists(cal), f"disagreeing {name}: wrote {out} or {cal}")
        print(f"disagreeing {name}: rc {rc} in {took:.1f} s: {errs[0] if errs else (so + se)[-300:]}")


def case_checkpoint(c):
    before = temp_runs()
    out, cal = f"{c.work}/c/best.json", f"{c.work}/c.cal.json"
    ckpt, fw, trace = f"{c.work}/ckpt", f"{c.work}/fw.bin", f"{c.work}/trace.json"
    extra = [f"checkpoint.dir={ckpt}", "checkpoint.every=1", f"run.final_weights={fw}", f"run.trace={trace}",
             "zero.stage=2", "offload.optimizer=nvme", "recompute.policy=none"]
    rc, so, se, took = c.plan(out, cal, extra, few=False, options=["--global-batch", "1", "--validate", "1",
                                                                     "--validate-steps", "2", "--validate-rounds", "1"])
    if not c.check(rc == 0, f"checkpoint.every base: rc {rc}: {(so + se)[-600:]}"):
        return
    rep = json.load(open(out[:-5] + ".report.json"))
    c.check(any(k.startswith("engine ") for k in rep["probes"]), "checkpoint.every base: no engine run probed")
    c.check(rep["candidates"][0].get("measured_step_s", 0) > 0, "checkpoint.every base: nothing validated")
    best = json.load(open(out))
    c.check(best["checkpoint"]["every"] == 1 and best["checkpoint"]["dir"] == ckpt, "the chosen plan lost checkpoint.*")
    left = glob.glob(f"{ckpt}/*") + [p for p in (fw, trace) if os.path.exists(p)]
    c.check(not left, f"probe or validation runs wrote outside their directory: {left}")
    runs = glob.glob(f"{c.work}/c/zt-plan-run-*") + sorted(temp_runs() - before)
    c.check(not runs, f"run directories left: {runs}")
    print(f"checkpoint.every base: planned and validated in {took:.1f} s, nothing written outside")


def case_comm_cache(c):
    out, cal = f"{c.work}/cc.json", f"{c.work}/cc.cal.json"
    opts = ["--global-batch", "2"]
    rc, so, se, _ = c.plan(out, cal, world=2, options=opts)
    if not c.check(rc == 0, f"comm cache, first run: rc {rc}: {(so + se)[-600:]}"):
        return
    env = {"ZT_COMM_COLLECTIVES": "mpi_blocking", "ZT_COMM_THREAD": "0"}
    rc, so, se, _ = c.plan(out, cal, world=2, options=opts, env=env)
    if not c.check(rc == 0, f"comm cache, mpi_blocking: rc {rc}: {(so + se)[-600:]}"):
        return
    c.check("environment: ZT_COMM_COLLECTIVES=mpi_blocking overrides comm.collectives" in so
            and "environment: ZT_COMM_THREAD=0 overrides comm.thread" in so, f"the overrides are not printed: {so[:400]}")
    m = re.search(r"calibration: (\d+) probe\(s\) measured", so)
    c.check(m and int(m.group(1)) > 0, f"the ring's link probes were reused for mpi_blocking without the thread: {m and m.group(0)}")
    rep = json.load(open(out[:-5] + ".report.json"))
    links = [k for k in rep["probes"] if k.startswith("link ")]
    c.check(links and all("mpi_blocking" in k and "thread0" in k for k in links), f"link probes not keyed by the comm settings: {links[:2]}")
    best = json.load(open(out))["comm"]
    c.check(best["collectives"] == "mpi_blocking" and best["thread"] is False,
            f"the chosen plan does not record the comm settings it was measured with: {best}")
    rc, so, se, _ = c.plan(out, cal, world=2, options=opts, env=env)
    c.check(rc == 0 and "calibration: 0 probe(s) measured" in so, f"the same settings again did not reuse the cache: {so[-300:]}")
    print("comm cache: keyed by the comm settings, the overrides printed and recorded")


def case_bad_cache(c):
    out, cal = f"{c.work}/b.json", f"{c.work}/b.cal.json"
    rc, so, se, _ = c.plan(out, cal)
    if not c.check(rc == 0, f"bad cache, first run: rc {rc}: {(so + se)[-600:]}"):
        return
    good = json.load(open(cal))
    keys = sorted(k for k in good["entries"] if k.startswith("micro_step") or k.startswith("adamw"))
    bad = dict(zip(keys, [-1.0, 1e308, "abc", 0]))
    j = json.loads(json.dumps(good))
    j["entries"].update(bad)
    json.dump(j, open(cal, "w"))
    rc, so, se, _ = c.plan(out, cal)
    if c.check(rc == 0, f"bad cached values: rc {rc}: {(so + se)[-600:]}"):
        for k in bad:
            c.check(any(cal in l and k in l and l.startswith("warning:") for l in se.splitlines()),
                    f"no warning naming {cal} and {k}: {se[-400:]}")
        m = re.search(r"calibration: (\d+) probe\(s\) measured", so)
        c.check(m and int(m.group(1)) == len(bad), f"bad entries not measured again: {m and m.group(0)}")
        ch = re.search(r"chosen: .*?: (\S+) ms/step predicted", so)
        c.check(ch and re.fullmatch(r"[0-9.]+", ch.group(1)) and float(ch.group(1)) > 0, f"prediction from bad rates: {ch and ch.group(0)}")
        c.check(not re.search(r"-nan|\binf\b|nan%", so), "nan or inf printed")
        now = json.load(open(cal))["entries"]
        c.check(all(isinstance(now[k], float) and 0 < now[k] < 1e5 for k in bad), "the bad entries were not replaced")
    for name, text in (("entries an array", json.dumps(dict(good, entries=[1, 2]))),
                       ("a number past a double", json.dumps(good).replace(json.dumps(good["entries"][keys[0]]), "1e400", 1))):
        open(cal, "w").write(text)
        rc, so, se, _ = c.plan(out, cal)
        errs = errors(so + se)
        c.check(rc not in (0, "timeout") and len(errs) == 1 and cal in errs[0] and "Traceback" not in se,
                f"cache with {name}: rc {rc}, errors {errs[:2]}")
        c.check(open(cal).read() == text, f"cache with {name} was changed")
        print(f"cache with {name}: {errs[0] if errs else '?'}")


def case_signals(c):
    for world in (1, 2):
        before = temp_runs()
        d = f"{c.work}/s{world}"
        out, cal = f"{d}/best.json", f"{c.work}/s{world}.cal.json"
        cmd = [c.args.train, "plan", "plans/default.json", "--world", str(world), "--out", out, "--calibration", cal,
               "--global-batch", str(world), "--validate", "1", "--validate-steps", "1000", "--validate-rounds", "1"] + c.base()
        full = ([c.args.mpirun, "--oversubscribe", "-np", str(world)] if world > 1 else []) + cmd
        p = subprocess.Popen(full, env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen, t0 = "", time.time()
        while time.time() - t0 < 90:
            line = p.stdout.readline()
            if not line:
                break
            seen += line
            if line.startswith("validating the top"):
                break
        time.sleep(2)  # into the 1000-step run
        p.send_signal(signal.SIGINT)
        try:
            rest, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            rest, _ = p.communicate()
        left = glob.glob(f"{d}/zt-plan-run-*") + sorted(temp_runs() - before)
        c.check("validating the top" in seen, f"SIGINT at {world} rank(s): never reached --validate: {(seen + rest)[-400:]}")
        c.check(p.returncode != 0, f"SIGINT at {world} rank(s): exit 0")
        c.check(not left, f"SIGINT at {world} rank(s) during --validate left {left}")
        print(f"SIGINT at {world} rank(s) during --validate: rc {p.returncode}, left {left}")
        time.sleep(1)  # mpirun's ranks gone before the next case


def case_nvme_env(c):
    rc, so, se, _ = c.plan(f"{c.work}/n.json", f"{c.work}/n.cal.json", env={"ZT_NVME_FREE_BYTES": "abc"})
    errs = errors(so + se)
    c.check(rc not in (0, "timeout") and errs and "ZT_NVME_FREE_BYTES" in errs[0], f"ZT_NVME_FREE_BYTES=abc: rc {rc}, {errs[:1]}")
    print(f"ZT_NVME_FREE_BYTES=abc: {errs[0] if errs else so[-200:]}")


def case_hopeless(c):
    cal = f"{c.work}/h.cal.json"
    # A fixed machine (8 GiB, 10 GB of disk), so that 65536 layers of 128 channels (12.9G parameters)
    # are hopeless wherever this runs; sizing each candidate of it took minutes before.
    rc, so, se, took = c.plan(f"{c.work}/h.json", cal, ["model.n_layer=65536", "model.n_embd=128"], few=False,
                              env={"ZT_MEM_AVAILABLE_BYTES": str(8 << 30), "ZT_NVME_FREE_BYTES": str(10 ** 10)}, timeout=60)
    errs = errors(so + se)
    c.check(rc not in (0, "timeout") and errs and "no candidate fits" in errs[0], f"65536 layers: rc {rc}, {errs[:1]} {so[-300:]}")
    c.check(took < 15 and not os.path.exists(cal) and "calibrating" not in so, f"65536 layers: refused after {took:.1f} s of probes")
    print(f"65536 layers: refused in {took:.1f} s: {errs[0][:200] if errs else ''}")


def case_global_batch(c):
    rc, so, se, _ = c.plan(f"{c.work}/g.json", f"{c.work}/g.cal.json", options=["--global-batch", "99999999999999999999"])
    errs = errors(so + se)
    c.check(rc not in (0, "timeout") and errs and "99999999999999999999" in errs[0], f"--global-batch 1e20: {errs[:1]}")
    print(f"--global-batch 99999999999999999999: {errs[0] if errs else so[-200:]}")


def case_set_fixed(c):
    out, cal = f"{c.work}/f.json", f"{c.work}/f.cal.json"
    rc, so, se, _ = c.plan(out, cal, ["zero.stage=1"], few=False)
    errs = errors(so + se)
    c.check(rc not in (0, "timeout") and errs and "zero.stage=1" in errs[0], f"--set zero.stage=1 at one rank: rc {rc}, {errs[:1]}")
    print(f"--set zero.stage=1 at one rank: {errs[0] if errs else so[-200:]}")
    rc, so, se, _ = c.plan(out, cal, ["zero.stage=0", "recompute.policy=selective"], few=False, options=["--global-batch", "2"])
    if c.check(rc == 0, f"--set zero.stage=0 recompute.policy=selective: rc {rc}: {(so + se)[-400:]}"):
        cands = json.load(open(out[:-5] + ".report.json"))["candidates"]
        got = {(x["choice"]["zero.stage"], x["choice"]["recompute.policy"]) for x in cands}
        c.check(got == {(0, "selective")}, f"--set zero.stage=0 recompute.policy=selective searched {sorted(got)}")
        c.check(len({x["choice"]["batch.micro_batch"] for x in cands}) == 2, "the micro-batch is still searched")
        print(f"--set zero.stage=0 recompute.policy=selective: {len(cands)} candidates, all {sorted(got)}")


def case_lock(c):
    cal = f"{c.work}/l.cal.json"
    a_cmd = [c.args.train, "plan", "plans/default.json", "--out", f"{c.work}/la.json", "--calibration", cal,
             "--global-batch", "4"] + c.base(few=False)
    a = subprocess.Popen(a_cmd, env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = ""
    while True:
        line = a.stdout.readline()
        seen += line
        if not line or line.startswith("calibrating"):
            break
    rc_b, so_b, se_b, _ = c.plan(f"{c.work}/lb.json", cal, ["model.n_embd=32"])
    rest, _ = a.communicate(timeout=120)
    c.check(a.returncode == 0 and rc_b == 0, f"two planners: rc {a.returncode} and {rc_b}: {(seen + rest)[-300:]} {(so_b + se_b)[-300:]}")
    c.check("in use by another planner" in so_b, f"the second planner did not wait for the first: {so_b[:300]}")
    keys = json.load(open(cal))["entries"]
    c64 = [k for k in keys if k.startswith("micro_step C64 ")]
    c32 = [k for k in keys if k.startswith("micro_step C32 ")]
    c.check(c64 and c32, f"entries lost: {len(c64)} of the first planner's, {len(c32)} of the second's")
    print(f"two planners on one cache: the second waited; {len(c64)} + {len(c32)} micro-step entries kept")


def case_world(c):
    out, cal = f"{c.work}/w.json", f"{c.work}/w.cal.json"
    rc, so, se, _ = c.plan(out, cal)
    if not c.check(rc == 0, f"plan at 1: rc {rc}: {(so + se)[-400:]}"):
        return
    c.check(json.load(open(out))["batch"].get("world") == 1, "the chosen plan does not record its world")
    log = f"{c.work}/wrun/metrics.jsonl"
    rc, so, se, _ = c.run([c.args.train, out, "--set", "run.steps=1", "--set", f"run.log={log}"], world=2, timeout=60)
    errs = errors(so + se)
    c.check(rc not in (0, "timeout") and errs and "batch.world" in errs[0] and not os.path.exists(log),
            f"a plan for 1 rank trained at 2: rc {rc}, {errs[:1]}")
    print(f"a plan for 1 rank at 2: {errs[0] if errs else so[-200:]}")


CASES = {"disagree": case_disagree, "checkpoint": case_checkpoint, "comm_cache": case_comm_cache,
         "bad_cache": case_bad_cache, "signals": case_signals, "nvme_env": case_nvme_env, "hopeless": case_hopeless,
         "global_batch": case_global_batch, "set_fixed": case_set_fixed, "lock": case_lock, "world": case_world}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    args.train = os.path.abspath(args.train)
    os.chdir(ROOT)
    names = args.only.split(",") if args.only else list(CASES)
    failures = []
    for name in names:
        work = tempfile.mkdtemp(prefix=f"zt-plan-faults-{name}-")
        c = Case(args, work)
        t0 = time.time()
        try:
            CASES[name](c)
        except Exception as e:  # a case that crashes is a failure, the others still run
            c.failures.append(f"{type(e).__name__}: {e}")
        print(f"[{name}] {time.time() - t0:.1f} s, {'ok' if not c.failures else 'FAILED'}", flush=True)
        failures += [f"{name}: {f}" for f in c.failures]
        if not c.failures:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"  files kept in {work}")
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
