#!/usr/bin/python3
"""One CPU training run against the machine's sgemm: where the step's time goes, op by op.

Usage (scripts/bench_cpu.sh runs it after each training run; Debian's numpy is in /usr/bin/python3):
    /usr/bin/python3 bench/cpu_step.py --trace T.rank0.json --log metrics.jsonl --warm 2 \
        --layers 12 --embd 768 --seq 64 --batch 4 --threads 2

The trace is the run's run.trace (rank 0): the CPU backend draws every op on the "ops" track
(backend/ops_cpu.h), the trainer every step on the "step" track. Over the timed steps (the first
`warm` dropped) it prints the median step, each op group's share of it, and "outside ops" (hooks,
gradient norm bookkeeping, data, logging). Then it times numpy's sgemm (OpenBLAS, same threads) on
the GEMMs of one step at the model's shapes, with the transposes the model uses, and prints the
step's rate against it:

    model FLOPs per step = GEMMs (6 per weight per token: forward, input and weight gradients,
                           the tied LM head over the padded vocabulary) + causal attention
                           (QK^T and AV: 2 * 2 * C * (t + 1) per token at position t, backward twice)
    achieved = model FLOPs per step / median step;  ratio = achieved / sgemm rate

The last line is JSON (every number above) for the caller's table.
"""

import argparse
import json
import os
import statistics
import sys
import time

# Op groups of the breakdown: each op name on the ops track (backend/ops_cpu.h) in one group.
GROUPS = {
    "matmul": ("matmul_forward", "matmul_backward"),
    "attention": ("attention_forward", "attention_backward"),
    "layernorm": ("layernorm_forward", "layernorm_backward"),
    "gelu": ("gelu_forward", "gelu_backward"),
    "softmax+loss": ("softmax_xent", "xent_chunk_partial", "xent_chunk_finish", "xent_chunk_grad"),
    "adamw": ("adamw",),
    "embedding": ("encoder_forward", "encoder_backward"),
    "bias grad": ("bias_backward",),
    "residual": ("residual_forward",),
    "zero/copy": ("zero", "copy"),
    "grad norm": ("sum_squares",),
}


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--log", required=True, help="the run's metrics.jsonl (tokens/s)")
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--embd", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--vocab-padded", type=int, default=50304)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--sgemm-reps", type=int, default=5)
    return ap.parse_args()


def gemms(L, C, N, Vp):
    """(M, N, K, a_trans, b_trans) of one step's GEMMs, as model/ and kernels/matmul.cpp call them."""
    out = []
    for _ in range(L):
        for IC, OC in ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)):
            out.append((N, OC, IC, False, True))   # forward: inp (N,IC) @ W^T, W (OC,IC)
            out.append((N, IC, OC, False, False))  # dinp = dout (N,OC) @ W
            out.append((OC, IC, N, True, False))   # dW = dout^T @ inp
    out += [(N, Vp, C, False, True), (N, C, Vp, False, False), (Vp, C, N, True, False)]  # the LM head
    return out


def attention_flops(L, C, B, T):
    # per layer and sequence: sum over t of 4 C (t + 1) forward, twice that backward
    return L * B * 3 * 4 * C * (T * (T + 1) // 2)


def sgemm_rate(shapes, threads, reps):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    import numpy as np  # after the thread count is set: OpenBLAS reads it at load

    rng = np.random.default_rng(0)
    ops = []
    for M, N, K, ta, tb in shapes:
        a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
        ops.append((a.T if ta else a, b.T if tb else b, np.empty((M, N), dtype=np.float32)))
    flops = sum(2 * M * N * K for M, N, K, _, _ in shapes)
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        for a, b, c in ops:
            np.matmul(a, b, out=c)
        times.append(time.perf_counter() - t0)
    return flops / statistics.median(times[1:]), flops


def main():
    args = parse()
    with open(args.trace) as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in evs if e["tid"] == 0 and e["name"].startswith("step ")), key=lambda e: e["ts"])
    timed = steps[args.warm:]
    if not timed:
        sys.exit(f"cpu_step: no timed steps in {args.trace} ({len(steps)} steps, {args.warm} warm)")
    group_of = {op: g for g, ops in GROUPS.items() for op in ops}
    per_step = {g: [] for g in list(GROUPS) + ["outside ops"]}
    ops = [e for e in evs if e["tid"] == 6]
    for s in timed:
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        sums = dict.fromkeys(per_step, 0.0)
        for e in ops:
            if t0 <= e["ts"] < t1:
                g = group_of.get(e["name"])
                if g is None:
                    sys.exit(f"cpu_step: op {e['name']!r} has no group (bench/cpu_step.py GROUPS)")
                sums[g] += e["dur"]
        sums["outside ops"] = s["dur"] - sum(sums.values())
        for g, v in sums.items():
            per_step[g].append(v)
    step_s = statistics.median(s["dur"] for s in timed) / 1e6
    with open(args.log) as f:
        rows = [json.loads(line) for line in f]
    tps = statistics.median([r["tokens_per_s"] for r in rows if "tokens_per_s" in r and "step" in r][args.warm:])

    L, C, T, B = args.layers, args.embd, args.seq, args.batch
    shapes = gemms(L, C, B * T, args.vocab_padded)
    rate, gemm_flops = sgemm_rate(shapes, args.threads, args.sgemm_reps)
    flops = gemm_flops + attention_flops(L, C, B, T)
    achieved = flops / step_s
    ms = {g: statistics.median(v) / 1e3 for g, v in per_step.items()}
    matmul_rate = gemm_flops / (ms["matmul"] / 1e3) if ms["matmul"] > 0 else 0.0

    print(f"  step {step_s * 1e3:.1f} ms (median of {len(timed)}), {tps:.1f} tokens/s")
    for g, v in sorted(ms.items(), key=lambda kv: -kv[1]):
        print(f"    {g:<14} {v:9.2f} ms  {100 * v / (step_s * 1e3):5.1f} %")
    print(f"  sgemm (numpy/OpenBLAS, {args.threads} threads, this step's {len(shapes)} GEMM shapes): "
          f"{rate / 1e9:.1f} GFLOP/s; our matmul ops {matmul_rate / 1e9:.1f} GFLOP/s")
    print(f"  model {flops / 1e9:.2f} GFLOP/step ({100 * gemm_flops / flops:.1f} % GEMM): "
          f"{achieved / 1e9:.1f} GFLOP/s = {100 * achieved / rate:.1f} % of sgemm")
    print(json.dumps({"tokens_per_s": tps, "step_ms": step_s * 1e3, "sgemm_gflops": rate / 1e9,
                      "matmul_gflops": matmul_rate / 1e9, "achieved_gflops": achieved / 1e9,
                      "of_sgemm": achieved / rate, "ops_ms": ms}))


if __name__ == "__main__":
    main()
