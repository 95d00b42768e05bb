#!/usr/bin/env python3
"""PyTorch GPT-2 training-throughput baseline for the GPU (the number zerotrain is measured against).

    python3 bench/torch_gpu_bench.py --B 16 --T 1024 --steps 30 [--warmup 5]
    /usr/bin/python3 bench/torch_gpu_bench.py --device cpu --no-compile --steps 2 --B 1 --T 64

Model: GPT-2 as in torch_gpt.py (learned wte + wpe; pre-LN blocks; fused qkv with bias; causal
attention; GELU tanh MLP 4C; LayerNorm eps 1e-5; LM head tied to wte), written nanoGPT-style for
speed: vocabulary padded to a multiple of 128 (50257 -> 50304; the pad rows get no targets),
F.scaled_dot_product_attention(is_causal=True) (flash attention on the GPU; on torch 1.13 the
private equivalent, else explicit attention), torch.compile(model) unless --no-compile or
unavailable, bf16 autocast on CUDA (TF32 allowed for what stays fp32), AdamW(fused=True when
available; lr 6e-4, betas 0.9/0.95, wd 0.1 on 2-D tensors), clip_grad_norm_(1.0) -- the same
step as zerotrain's trainer.

Tokens: data/brown/train_000.bin when present (llm.c shard format), else uniform random.
A step = zero_grad + forward + loss + backward + clip + AdamW.step, timed with a device sync at
each end; the first --warmup steps (compilation happens there) are not timed. Reports medians
over the timed steps; the last stdout line is one JSON object:
{"impl": "pytorch", "tokens_per_s", "ms_per_step", "B", "T", "params", "device", ...}.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--B", type=int, default=16, help="micro-batch (sequences per step)")
    ap.add_argument("--T", type=int, default=1024, help="sequence length")
    ap.add_argument("--steps", type=int, default=30, help="steps in all, warm-up included")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--L", type=int, default=12)
    ap.add_argument("--NH", type=int, default=12)
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--V", type=int, default=50257)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                    help="autocast dtype (default: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "brown", "train_000.bin"),
                    help="llm.c token shard; random tokens when missing")
    ap.add_argument("--json-out", default=None, help="also write the JSON result here")
    return ap.parse_args()


# ---- model -----------------------------------------------------------------------------------------

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")          # torch >= 2.0
HAVE_PRIVATE_SDPA = hasattr(F, "_scaled_dot_product_attention")  # torch 1.13


class CausalSelfAttention(nn.Module):
    def __init__(self, C, NH, maxT):
        super().__init__()
        self.C, self.NH = C, NH
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.c_proj.SCALE_INIT = True
        if not (HAVE_SDPA or HAVE_PRIVATE_SDPA):
            self.register_buffer("mask", torch.tril(torch.ones(maxT, maxT, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        k = k.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        v = v.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif HAVE_PRIVATE_SDPA:
            y, _ = F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = F.softmax(att.masked_fill(~self.mask[:T, :T], float("-inf")), dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)
        self.c_proj.SCALE_INIT = True

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, NH, maxT):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = CausalSelfAttention(C, NH, maxT)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, L, NH, C, maxT, V):
        super().__init__()
        self.L, self.V = L, V
        self.Vp = ((V + 127) // 128) * 128
        self.wte = nn.Embedding(self.Vp, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList([Block(C, NH, maxT) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.lm_head = nn.Linear(C, self.Vp, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init)

    def _init(self, m):
        if isinstance(m, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.L) if getattr(m, "SCALE_INIT", False) else 0.02
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


# ---- data --------------------------------------------------------------------------------------------


class Tokens:
    """Consecutive (B, T+1) windows of an llm.c shard, or uniform random tokens."""

    def __init__(self, path, B, T, V, seed):
        self.B, self.T, self.V = B, T, V
        self.tokens, self.pos = None, 0
        self.gen = torch.Generator().manual_seed(seed)
        self.source = "random"
        if path and os.path.exists(path):
            import numpy as np
            with open(path, "rb") as f:
                header = np.frombuffer(f.read(256 * 4), dtype=np.int32)
                n = int(header[2])
                toks = np.frombuffer(f.read(2 * n), dtype=np.uint16)
            if header[0] == 20240520 and toks.size > B * T + 1:
                self.tokens = torch.from_numpy(toks.astype(np.int64))
                self.source = os.path.relpath(path, ROOT)

    def next(self):
        n = self.B * self.T + 1
        if self.tokens is None:
            buf = torch.randint(0, self.V, (n,), generator=self.gen)
        else:
            if self.pos + n > self.tokens.numel():
                self.pos = 0
            buf = self.tokens[self.pos:self.pos + n]
            self.pos += n - 1
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)


# ---- benchmark ---------------------------------------------------------------------------------------


def main():
    a = parse()
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dtype = a.dtype or ("bf16" if cuda else "fp32")
    if cuda:
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in fp32
        name = torch.cuda.get_device_name(dev)
    else:
        import platform
        name = platform.processor() or "cpu"

    model = GPT(a.L, a.NH, a.C, a.T, a.V).to(dev)
    n_params = sum(p.numel() for p in model.parameters())  # tied weight counted once
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    fused = False
    try:
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
        fused = cuda
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    compiled = False
    fwd = model
    if not a.no_compile and hasattr(torch, "compile"):
        fwd = torch.compile(model)
        compiled = True

    if dtype == "bf16":
        autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    else:
        import contextlib
        autocast = contextlib.nullcontext()

    data = Tokens(a.data, a.B, a.T, a.V, a.seed)
    warm = max(0, min(a.warmup, a.steps - 1))

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    times, losses = [], []
    for step in range(a.steps):
        x, y = data.next()
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()  # syncs too
        sync()
        dt = time.perf_counter() - t0
        losses.append(lv)
        if step >= warm:
            times.append(dt)
        print(f"step {step:4d} loss {lv:.4f} {1e3 * dt:9.1f} ms {a.B * a.T / dt:12.0f} tok/s"
              f"{'' if step >= warm else ' (warm-up)'}", file=sys.stderr, flush=True)

    med = statistics.median(times)
    out = {"impl": "pytorch", "tokens_per_s": round(a.B * a.T / med, 1), "ms_per_step": round(1e3 * med, 3),
           "ms_mean": round(1e3 * sum(times) / len(times), 3), "ms_min": round(1e3 * min(times), 3),
           "B": a.B, "T": a.T, "L": a.L, "NH": a.NH, "C": a.C, "V": a.V, "Vp": model.Vp,
           "params": n_params, "steps": a.steps, "warmup": warm, "steps_timed": len(times),
           "device": name, "dtype": dtype, "compile": compiled, "fused_adamw": fused,
           "attn": "sdpa" if HAVE_SDPA else ("sdpa-private" if HAVE_PRIVATE_SDPA else "explicit"),
           "data": data.source, "first_loss": round(losses[0], 4), "final_loss": round(losses[-1], 4),
           "torch": torch.__version__}
    if cuda:
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    line = json.dumps(out)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
