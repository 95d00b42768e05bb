#!/usr/bin/env python3
"""Device memory on a GPU: `train estimate` against the tracker and against the CUDA runtime's count.

    memory_check.py path/to/train [--quick] [--json OUT.json]

For each configuration (the default plan and GPT-2 124M at zero.stage 0 and 3, recompute "none"
and "block"; --quick: the default plan only) one short bf16 run at world 1 and `train estimate`
of the same plan. Three numbers per run:
  estimate  `train estimate --json`: memory.device.total
  tracked   the run's summary: peak_memory_bytes.device (the tracker's high-water mark)
  used      the run's summary: device_memory.used_peak_bytes -- cudaMemGetInfo's free once the
            context and cuBLASLt's workspace exist, minus the lowest free after any step
            (src/train/report.cpp, DeviceMemory): everything the run allocated, tracked or not.
Passes when tracked == estimate exactly and estimate <= used <= estimate * 1.02 + 64 MiB (the
allocator rounds each cudaMalloc up to its 2 MiB pages; a few small buffers are untracked). The
context's own share (total - free at start: driver, kernels' code, cuBLASLt workspace) is printed.
Exit 77 (ctest: skipped) when no GPU is usable and ZT_EXPECT_GPU is not 1.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MIB = 1 << 20
SLACK_FRAC, SLACK_BYTES = 0.02, 64 * MIB


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.chdir(root)
    gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True) if \
        any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in os.environ.get("PATH", "").split(":")) else None
    if gpu is None or gpu.returncode != 0 or "GPU" not in gpu.stdout:
        if os.environ.get("ZT_EXPECT_GPU") == "1":
            print("memory_check: no GPU (nvidia-smi -L) but ZT_EXPECT_GPU=1")
            return 1
        print("memory_check: no GPU: skipped")
        return 77
    plans = [("default", "plans/default.json", ["--set", "data.train=data/sample/train_*.bin",
                                                "--set", "data.val=data/sample/val.bin"])]
    if not a.quick:
        plans.append(("gpt2-124m", "plans/gpt2-124m.json", ["--set", "batch.micro_batch=8"]))
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as work:
        for name, plan, extra in plans:
            for stage in (0, 3):
                for rec in ("none", "block"):
                    sets = [plan, "--set", "device=cuda", "--set", "precision.compute=bf16",
                            "--set", f"zero.stage={stage}", "--set", f"recompute.policy={rec}",
                            "--set", "run.steps=2", "--set", "run.eval_every=0", "--set", "run.eval_batches=1",
                            "--set", "run.sample_every=0", "--set", "data.tokenizer=", "--set", "run.final_weights=",
                            *extra]
                    tag = f"{name}_s{stage}_{rec}"
                    log = os.path.join(work, tag, "metrics.jsonl")
                    run([a.train, *sets, "--set", f"run.log={log}"])
                    summ = next(json.loads(l)["summary"] for l in open(log) if '"summary"' in l)
                    est = json.loads(run([a.train, "estimate", *sets, "--json"]))["memory"]["device"]["total"]
                    tracked = summ["peak_memory_bytes"]["device"]
                    if isinstance(tracked, dict):
                        tracked = tracked.get("total", tracked.get("peak"))
                    dm = summ["device_memory"]
                    used = dm["used_peak_bytes"]
                    ctx = dm["total_bytes"] - dm["free_at_start_bytes"]
                    good = tracked == est and est <= used <= est * (1 + SLACK_FRAC) + SLACK_BYTES
                    ok &= good
                    rows.append({"config": tag, "estimate": est, "tracked": tracked, "used": used,
                                 "overhead": used - est, "context_and_workspace": ctx, "ok": good})
                    print(f"{tag:22s} estimate {est / MIB:9.1f} MiB  tracked {tracked / MIB:9.1f} MiB  "
                          f"used (cudaMemGetInfo) {used / MIB:9.1f} MiB  overhead {(used - est) / MIB:+7.1f} MiB "
                          f"({100 * (used - est) / max(est, 1):+.2f}%)  context+workspace {ctx / MIB:7.1f} MiB  "
                          f"{'ok' if good else 'FAILED'}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "ok": ok, "slack_frac": SLACK_FRAC, "slack_bytes": SLACK_BYTES}, f, indent=1)
    print(f"memory_check: {'ok' if ok else 'FAILED'} (bound: tracked == estimate <= used <= "
          f"estimate * {1 + SLACK_FRAC} + {SLACK_BYTES // MIB} MiB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
