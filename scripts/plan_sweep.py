#!/usr/bin/env python3
"""The planner against an exhaustive sweep (docs/autoplan.md, "Measured").

Runs `train plan --validate all` (every candidate that fits is trained for a few steps, in the
planner's own processes, right after the calibration), then, as separate runs under the same
memory cap, the chosen plan to completion. Prints the table (predicted vs measured for every
candidate) and checks what the planner promises:

  - every candidate's prediction within +-TOLERANCE (20%) of its measured step time;
  - the chosen plan's measured step within 10% of the fastest measured candidate;
  - the chosen plan, run on its own under the cap (ZT_MEM_AVAILABLE_BYTES when --mem-cap is
    given), completes, and its peak RSS (every rank's) is within the host memory the planner
    counted for it (the estimate + init transient + the runtime overhead).

  /usr/bin/python3 scripts/plan_sweep.py --train ./train --base plans/default.json --world 2 \\
      [--global-batch 4] [--mem-cap-mib 1150] [--set model.n_embd=256 ...] [--steps 4] [--out DIR]
      [--validate K] [--hosts H [--rate 1gbit]]

--validate K validates the planner's top K instead of every candidate (the checks are over those).
--hosts H runs the planner and the chosen plan across H namespace hosts (scripts/cluster, root),
world / H ranks on each by slot, every host's egress limited to --rate: the 2-host bed.

Exit 0 when every check holds, 1 otherwise. Run it on a quiet machine: the calibration and the
sweep measure the same cores, and another job between them moves both.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

TOLERANCE = 0.20
CHOSEN_WITHIN = 0.10


def mpirun_prefix(world):
    if world == 1:
        return []
    return [shutil.which("mpirun") or "mpirun", "--oversubscribe", "-np", str(world)]


def label(ch):
    mesh = ""
    if ch.get("mesh.pipeline", 1) > 1 or ch.get("mesh.tensor", 1) > 1:
        mesh = (f"P{ch['mesh.pipeline']}" + (f"/{ch['mesh.chunks']}" if ch["mesh.chunks"] > 1 else "") +
                f" T{ch['mesh.tensor']}" + ("+sp" if ch["mesh.sequence_parallel"] else "") + " ")
    rc = ch["recompute.policy"] + (f"/{ch['recompute.every']}" if ch["recompute.policy"] == "block" and ch["recompute.every"] > 1 else "")
    off = "opt+params" if ch["offload.params"] == "nvme" else "opt" if ch["offload.optimizer"] == "nvme" else "-"
    return mesh + (f"st{ch['zero.stage']} {off:10s} {rc:9s} B{ch['batch.micro_batch']}x{ch['batch.grad_accum']} "
            f"bkt {ch['zero.bucket_mb']:g} ovl {'on' if ch['zero.overlap_comm'] else 'off'}" +
            (f" shard {ch['zero.shard_group']}" if ch.get("zero.shard_group", "world") != "world" else ""))


def mesh_of(ch):
    hybrid = ch.get("zero.shard_group", "world")
    return f"P{ch.get('mesh.pipeline', 1)} T{ch.get('mesh.tensor', 1)}" + (f" shard {hybrid}" if hybrid != "world" else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default="./train")
    ap.add_argument("--base", default="plans/default.json")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=0)
    ap.add_argument("--mem-cap-mib", type=int, default=0, help="ZT_MEM_AVAILABLE_BYTES for the planner and the runs")
    ap.add_argument("--set", action="append", default=[], help="base plan overrides, as ./train takes them")
    ap.add_argument("--steps", type=int, default=4, help="steps per validation run (the first not timed)")
    ap.add_argument("--out", default="", help="keep the plan, report and logs here (default: a temporary directory)")
    ap.add_argument("--validate", default="all", help="candidates to validate: K (the top K) or all")
    ap.add_argument("--rounds", type=int, default=2, help="validation rounds (the fastest run counts)")
    ap.add_argument("--hosts", type=int, default=1, help="namespace hosts (scripts/cluster) the ranks spread over")
    ap.add_argument("--rate", default="1gbit", help="with --hosts: every host's egress limit (tc tbf)")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    launch = mpirun_prefix(args.world)
    if args.hosts > 1:
        if args.world % args.hosts:
            print(f"plan_sweep: --world {args.world} does not divide over {args.hosts} hosts", file=sys.stderr)
            return 2
        cluster = os.path.join(root, "scripts", "cluster")
        os.environ.setdefault("ZT_CLUSTER", f"ztsweep{os.getpid()}")
        subprocess.run([cluster, "up", str(args.hosts)], check=True, stdout=subprocess.DEVNULL)
        if args.rate != "off":
            subprocess.run([cluster, "shape", args.rate], check=True)
        hosts = subprocess.run([cluster, "hosts"], check=True, stdout=subprocess.PIPE, text=True).stdout.split()
        launch = [cluster, "mpirun", "--oversubscribe", "-np", str(args.world), "-H",
                  ",".join(f"{h}:{args.world // args.hosts}" for h in hosts)]
        try:
            return sweep(args, launch)
        finally:
            subprocess.run([cluster, "down"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return sweep(args, launch)


def sweep(args, launch):

    out = args.out or tempfile.mkdtemp(prefix="zt-plan-sweep-")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if args.mem_cap_mib:
        env["ZT_MEM_AVAILABLE_BYTES"] = str(args.mem_cap_mib << 20)
    sets = [a for s in args.set for a in ("--set", s)]
    best = os.path.join(out, "best.json")
    cmd = launch + [args.train, "plan", args.base, "--world", str(args.world), "--out", best,
                                       "--validate", args.validate, "--validate-steps", str(args.steps),
                                       "--validate-rounds", str(args.rounds),
                                       "--calibration", os.path.join(out, "calibration.json"), "--show", "5"] + sets
    if args.global_batch:
        cmd += ["--global-batch", str(args.global_batch)]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    head = [l for l in p.stdout.splitlines() if l.startswith(("plan:", "calibration", "chosen", "next", "measured fastest"))]
    print("\n".join(head))
    if p.returncode != 0:
        print(p.stdout[-3000:])
        print(f"FAIL: the planner exited {p.returncode}")
        return 1
    report = json.load(open(os.path.join(out, "best.report.json")))
    cands = [c for c in report["candidates"] if c.get("measured_step_s")]
    print(f"left out before sizing: {report.get('left_out', {})}; {len(report['candidates'])} fit, {len(cands)} validated")
    failures = []
    print(f"\n| # | candidate | host/rank MiB | nvme/rank MiB | predicted ms | measured ms | error | bound |")
    print("|---|---|---|---|---|---|---|---|")
    for i, c in enumerate(cands, 1):
        pred, meas = c["predicted"]["step_s"], c.get("measured_step_s")
        err = pred / meas - 1
        print(f"| {i} | {label(c['choice'])} | {c['host_bytes_per_rank'] / 2**20:.0f} | {c['nvme_bytes_per_rank'] / 2**20:.0f} "
              f"| {pred * 1e3:.0f} | {meas * 1e3:.0f} | {err * 100:+.0f}% | {c['predicted']['bound']} |")
        if abs(err) > TOLERANCE:
            failures.append(f"#{i} {label(c['choice'])}: predicted {pred * 1e3:.0f} ms, measured {meas * 1e3:.0f} ms "
                            f"({err * 100:+.0f}%, beyond +-{TOLERANCE * 100:.0f}%)")
    measured = [c["measured_step_s"] for c in cands]
    fastest = min(measured)
    chosen = measured[0]
    errs = [abs(c["predicted"]["step_s"] / c["measured_step_s"] - 1) for c in cands]
    within = sum(e <= TOLERANCE for e in errs)
    print(f"\n{len(cands)} candidates validated; prediction error: median {statistics.median(errs) * 100:.1f}%, "
          f"largest {max(errs) * 100:.1f}%; within +-{TOLERANCE * 100:.0f}%: {within} of {len(cands)}")
    by_mesh = {}
    for c, e in zip(cands, errs):
        by_mesh.setdefault(mesh_of(c["choice"]), []).append((c["predicted"]["step_s"] / c["measured_step_s"] - 1) * 100)
    for m, es in sorted(by_mesh.items()):
        print(f"  {m}: {sum(abs(e) <= TOLERANCE * 100 for e in es)} of {len(es)} within, {min(es):+.0f}% to {max(es):+.0f}% "
              f"(median {statistics.median(es):+.0f}%)")
    print(f"chosen (#1): measured {chosen * 1e3:.0f} ms; fastest measured: #{measured.index(fastest) + 1} "
          f"{fastest * 1e3:.0f} ms; chosen is {(chosen / fastest - 1) * 100:.1f}% slower")
    if chosen > fastest * (1 + CHOSEN_WITHIN):
        failures.append(f"the chosen plan ({chosen * 1e3:.0f} ms) is more than {CHOSEN_WITHIN * 100:.0f}% slower "
                        f"than the fastest candidate ({fastest * 1e3:.0f} ms)")

    # The chosen plan on its own, under the same cap: it runs to the end, within its memory.
    log = os.path.join(out, "chosen", "metrics.jsonl")
    run = launch + [args.train, best, "--set", "run.steps=3", "--set", f"run.log={log}",
                                       "--set", "run.eval_every=0", "--set", "run.eval_batches=1",
                                       "--set", "run.sample_every=0", "--set", "data.tokenizer="]
    print("$", " ".join(run), flush=True)
    r = subprocess.run(run, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        failures.append(f"the chosen plan did not run to completion (exit {r.returncode}): {r.stdout[-500:]}")
    else:
        summary = [json.loads(l)["summary"] for l in open(log) if '"summary"' in l][-1]
        peaks = summary["peak_rss_bytes_per_rank"]
        need = cands[0]["host_bytes_per_rank"]
        print(f"chosen plan alone: peak RSS per rank {[round(x / 2**20) for x in peaks]} MiB, counted "
              f"{need / 2**20:.0f} MiB per rank" + (f", cap {args.mem_cap_mib} MiB per host" if args.mem_cap_mib else ""))
        if max(peaks) > need:
            failures.append(f"peak RSS {max(peaks) / 2**20:.0f} MiB is above the {need / 2**20:.0f} MiB the planner counted")
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"{len(failures)} check(s) failed", f"(files in {out})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
