#!/usr/bin/python3
"""PyTorch CPU training-throughput baseline for the GPT-2 in torch_gpt.py.

Usage (Debian's torch lives in /usr/bin/python3 only):
    /usr/bin/python3 bench/torch_bench.py --layers 4 --heads 4 --embd 128 --seq 128 \
        --batch 8 --steps 10 --warmup-steps 2 --threads 2

One full step = zero_grad(set_to_none) + forward + loss + backward + clip_grad_norm_ +
AdamW.step (foreach=True when available), fp32; with --precision bf16 the forward and loss run
under torch.autocast("cpu", bfloat16) (PyTorch's CPU mixed precision: its linear layers in bf16
through oneDNN, fp32 parameters, gradients and AdamW; the anchor of the backend cpu-bf16). Warmup steps are untimed. With --attn both
(default) each attention implementation available in torch 1.13 is timed (explicit
matmul+mask+softmax, and the private F._scaled_dot_product_attention with is_causal=True) and
the faster one is reported in the final JSON line; all variants are listed under "variants".
"""

import argparse
import json
import os
import sys
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--attn", default="both", choices=["explicit", "sdpa", "both"])
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    return ap.parse_args()


args = parse()
# OpenBLAS (Debian torch's BLAS) sizes its own pool from these, not from set_num_threads.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "ref"))
import torch_gpt as tg  # noqa: E402


def bench(attn_impl):
    torch.manual_seed(args.seed)
    model = tg.GPT(args.layers, args.heads, args.embd, args.seq, args.vocab, attn_impl)
    tg.init_weights(model, args.seed, perturb=False)
    model.train()
    foreach = True
    try:
        opt = tg.make_optimizer(model, args.lr, 0.9, 0.95, 1e-8, 0.1, foreach=True)
    except TypeError:
        foreach = False
        opt = tg.make_optimizer(model, args.lr, 0.9, 0.95, 1e-8, 0.1)
    g = torch.Generator().manual_seed(args.seed + 1)
    n = args.warmup_steps + args.steps
    data = torch.randint(0, args.vocab, (n, args.batch, args.seq + 1), generator=g)

    times, loss = [], float("nan")
    for s in range(n):
        x, y = data[s, :, :-1], data[s, :, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            _, l = model(x, y)
        l.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        loss = l.item()
        dt = time.perf_counter() - t0
        if s >= args.warmup_steps:
            times.append(dt)
    n_params = sum(p.numel() for p in model.parameters())
    mean = sum(times) / len(times)
    med = sorted(times)[len(times) // 2] if len(times) % 2 else \
        0.5 * (sorted(times)[len(times) // 2 - 1] + sorted(times)[len(times) // 2])
    return {"attn": attn_impl, "ms_per_step": 1e3 * mean, "ms_min": 1e3 * min(times),
            "ms_median": 1e3 * med, "ms_steps": [round(1e3 * t, 1) for t in times],
            "tokens_per_s": args.batch * args.seq / mean, "final_loss": loss,
            "foreach": foreach, "params": n_params}


def main():
    torch.set_num_threads(args.threads)
    impls = ["explicit", "sdpa"] if args.attn == "both" else [args.attn]
    variants = []
    for impl in impls:
        r = bench(impl)
        variants.append(r)
        print(f"# attn={impl}: {r['ms_per_step']:.1f} ms/step (mean), "
              f"{r['tokens_per_s']:.1f} tok/s; steps(ms) {r['ms_steps']}", file=sys.stderr)
    best = min(variants, key=lambda r: r["ms_per_step"])
    out = {"impl": "pytorch", "tokens_per_s": round(best["tokens_per_s"], 2),
           "ms_per_step": round(best["ms_per_step"], 2), "ms_min": round(best["ms_min"], 2),
           "ms_median": round(best["ms_median"], 2),
           "attn": best["attn"], "foreach": best["foreach"], "params": best["params"],
           "L": args.layers, "NH": args.heads, "C": args.embd, "T": args.seq,
           "V": args.vocab, "B": args.batch, "steps": args.steps,
           "warmup_steps": args.warmup_steps, "threads": torch.get_num_threads(),
           "torch": torch.__version__, "dtype": "float32" if args.precision == "fp32" else "autocast bfloat16",
           "variants": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()
                         if k in ("attn", "ms_per_step", "tokens_per_s")} for r in variants]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
