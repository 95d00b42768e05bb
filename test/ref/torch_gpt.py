"""Compact PyTorch GPT-2 used as the numerical oracle for zerotrain's CPU backend.

No HuggingFace dependency; runs on Debian's python3-torch 1.13 (use /usr/bin/python3).

Model (matches llm.c's train_gpt2.py / train_gpt2.c):
  x = wte[idx] + wpe[pos]
  per block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
      attn: qkv = c_attn(x) (C -> 3C, bias), q|k|v split along the last dim in that order,
            heads are contiguous hs = C/NH slices of each; causal softmax(q k^T / sqrt(hs)) v;
            c_proj (C -> C, bias)
      mlp:  c_fc (C -> 4C) -> GELU(tanh approximation) -> c_proj (4C -> C)
  logits = ln_f(x) @ wte.T   (LM head tied to wte, over the real V only)
  LayerNorm eps 1e-5.  loss = mean cross-entropy over B*T tokens.

Checkpoint I/O in llm.c's model format (header 256 x int32, version 3 = fp32), gradient dump
in the same 16-tensor layout without a header, and the exact optimizer recipe (AdamW with
decay on 2-D tensors only, warmup + cosine schedule, clip_grad_norm_) used by gen_reference.py.
"""

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC = 20240326
VERSION_FP32 = 3
HEADER_INTS = 256


def padded_vocab(V, multiple=128):
    return ((V + multiple - 1) // multiple) * multiple


# --------------------------------------------------------------------------------------------
# model


class CausalSelfAttention(nn.Module):
    def __init__(self, C, NH, maxT, attn_impl="explicit"):
        super().__init__()
        assert C % NH == 0
        self.C, self.NH = C, NH
        self.attn_impl = attn_impl
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.register_buffer("mask", torch.tril(torch.ones(maxT, maxT, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        NH, hs = self.NH, C // self.NH
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)  # (B, NH, T, hs)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        if self.attn_impl == "sdpa":
            # private in torch 1.13: (q, k, v, attn_mask, dropout_p, need_attn_weights, is_causal)
            y, _ = F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, NH, maxT, attn_impl="explicit"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = CausalSelfAttention(C, NH, maxT, attn_impl)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, L, NH, C, maxT, V, attn_impl="explicit"):
        super().__init__()
        self.L, self.NH, self.C, self.maxT, self.V = L, NH, C, maxT, V
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList([Block(C, NH, maxT, attn_impl) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        assert T <= self.maxT
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t()  # tied head, (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, self.V), targets.reshape(-1))
        return logits, loss

    # ---- llm.c 16-tensor view ------------------------------------------------------------

    def llmc_tensors(self):
        """The 16 llm.c tensors as lists of per-layer parameters (un-stacked, unpadded)."""
        h = self.h
        return [
            ("wte", [self.wte.weight]),
            ("wpe", [self.wpe.weight]),
            ("ln1w", [b.ln_1.weight for b in h]),
            ("ln1b", [b.ln_1.bias for b in h]),
            ("qkvw", [b.attn.c_attn.weight for b in h]),
            ("qkvb", [b.attn.c_attn.bias for b in h]),
            ("attprojw", [b.attn.c_proj.weight for b in h]),
            ("attprojb", [b.attn.c_proj.bias for b in h]),
            ("ln2w", [b.ln_2.weight for b in h]),
            ("ln2b", [b.ln_2.bias for b in h]),
            ("fcw", [b.mlp.c_fc.weight for b in h]),
            ("fcb", [b.mlp.c_fc.bias for b in h]),
            ("fcprojw", [b.mlp.c_proj.weight for b in h]),
            ("fcprojb", [b.mlp.c_proj.bias for b in h]),
            ("lnfw", [self.ln_f.weight]),
            ("lnfb", [self.ln_f.bias]),
        ]

    def decay_params(self):
        """2-D tensors (wte, wpe, the four linear weights per layer) get weight decay."""
        return [p for p in self.parameters() if p.dim() >= 2]

    def no_decay_params(self):
        return [p for p in self.parameters() if p.dim() < 2]


# --------------------------------------------------------------------------------------------
# init


@torch.no_grad()
def init_weights(model, seed, perturb=True):
    """Deterministic, non-trivial init: N(0, 0.02) for weights/embeddings (c_proj scaled by
    1/sqrt(2L) as in GPT-2); biases and LN params are perturbed so their grads are meaningful."""
    g = torch.Generator().manual_seed(seed)

    def normal_(t, std):
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32) * std)

    L = model.L
    normal_(model.wte.weight, 0.02)
    normal_(model.wpe.weight, 0.02)
    lns = [model.ln_f] + [m for b in model.h for m in (b.ln_1, b.ln_2)]
    for b in model.h:
        for lin, std in ((b.attn.c_attn, 0.02), (b.attn.c_proj, 0.02 / math.sqrt(2 * L)),
                         (b.mlp.c_fc, 0.02), (b.mlp.c_proj, 0.02 / math.sqrt(2 * L))):
            normal_(lin.weight, std)
            lin.bias.zero_()
            if perturb:
                normal_(lin.bias, 0.02)
    for ln in lns:
        ln.weight.fill_(1.0)
        ln.bias.zero_()
        if perturb:
            ln.weight.add_(torch.randn(ln.weight.shape, generator=g) * 0.1)
            normal_(ln.bias, 0.05)


# --------------------------------------------------------------------------------------------
# llm.c checkpoint / gradient I/O


def llmc_arrays(model, grads=False, dtype=np.float32):
    """16 numpy arrays (float32 by default) in llm.c order/shapes (wte padded to Vp rows)."""
    Vp = padded_vocab(model.V)
    out = []
    for name, ts in model.llmc_tensors():
        if grads:
            ts = [t.grad if t.grad is not None else torch.zeros_like(t) for t in ts]
        if name in ("wte", "wpe", "lnfw", "lnfb"):
            a = ts[0].detach().cpu()
        else:
            a = torch.stack([t.detach().cpu() for t in ts])  # (L, ...)
        a = a.numpy().astype(dtype)
        if name == "wte":
            pad = np.zeros((Vp, model.C), dtype=dtype)
            pad[: model.V] = a
            a = pad
        out.append((name, a))
    return out


def llmc_header(model):
    h = np.zeros(HEADER_INTS, dtype=np.int32)
    h[0], h[1] = MAGIC, VERSION_FP32
    h[2], h[3], h[4], h[5], h[6] = model.maxT, model.V, model.L, model.NH, model.C
    h[7] = padded_vocab(model.V)
    return h


def save_llmc(model, path):
    with open(path, "wb") as f:
        f.write(llmc_header(model).tobytes())
        for _, a in llmc_arrays(model):
            f.write(np.ascontiguousarray(a, dtype=np.float32).tobytes())


def save_token_shard(path, tokens):
    """llm.c token shard: 256 x int32 header (magic 20240520, version 1, token count), then the
    tokens as uint16. What zerotrain's data loader reads (src/data/shard.cpp)."""
    tokens = np.asarray(tokens)
    assert tokens.ndim == 1 and tokens.min() >= 0 and tokens.max() < 65536, "uint16 tokens"
    h = np.zeros(HEADER_INTS, dtype=np.int32)
    h[0], h[1], h[2] = 20240520, 1, tokens.size
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def save_grads(model, path):
    """Raw float32 gradients, no header, same 16-tensor layout (wte grad padded to Vp rows)."""
    with open(path, "wb") as f:
        for _, a in llmc_arrays(model, grads=True):
            f.write(np.ascontiguousarray(a, dtype=np.float32).tobytes())


def load_llmc(path, attn_impl="explicit"):
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[: 4 * HEADER_INTS], dtype=np.int32)
    assert h[0] == MAGIC, f"bad magic {h[0]}"
    assert h[1] == VERSION_FP32, f"only fp32 (version 3) supported, got {h[1]}"
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    model = GPT(L, NH, C, maxT, V, attn_impl)
    data = np.frombuffer(raw[4 * HEADER_INTS:], dtype=np.float32)
    off = 0
    with torch.no_grad():
        for name, ts in model.llmc_tensors():
            if name == "wte":
                shape = (Vp, C)
            elif name in ("wpe", "lnfw", "lnfb"):
                shape = tuple(ts[0].shape)
            else:
                shape = (L,) + tuple(ts[0].shape)
            n = int(np.prod(shape))
            a = torch.from_numpy(data[off: off + n].copy()).view(shape)
            off += n
            if name == "wte":
                ts[0].copy_(a[:V])
            elif name in ("wpe", "lnfw", "lnfb"):
                ts[0].copy_(a)
            else:
                for l, t in enumerate(ts):
                    t.copy_(a[l])
    assert off == data.size, f"size mismatch: used {off} of {data.size} floats"
    return model


# --------------------------------------------------------------------------------------------
# optimizer recipe


def lr_at(step, lr, warmup_steps, steps, schedule, min_lr_ratio):
    """Learning rate of 0-based step `step`."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "cosine":
        r = (step - warmup_steps) / (steps - warmup_steps)
        min_lr = lr * min_lr_ratio
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - min_lr)
    return lr


def make_optimizer(model, lr, beta1, beta2, eps, weight_decay, foreach=None):
    """torch.optim.AdamW, decay on 2-D tensors only. Per parameter (torch 1.13, t = 1-based):
         p *= 1 - lr*wd
         m = b1*m + (1-b1)*g ;  v = b2*v + (1-b2)*g*g
         p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)"""
    groups = [{"params": model.decay_params(), "weight_decay": weight_decay},
              {"params": model.no_decay_params(), "weight_decay": 0.0}]
    kw = {}
    if foreach is not None:
        kw["foreach"] = foreach
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps, **kw)


def global_grad_norm(model):
    """Global L2 norm of all gradients, summed in float64. torch 1.13's fp32 norm of a 3.2M-element
    embedding gradient is off by ~1e-4 relative (measured against float64), which is more than
    the parity tolerance; the clipping recipe itself is unchanged (see train_step)."""
    total = sum(float(p.grad.detach().double().pow(2).sum()) for p in model.parameters()
                if p.grad is not None)
    return math.sqrt(total)


def train_step_accum(model, opt, micro_batches, step, cfg):
    """One optimizer step over several micro-batches, the way PyTorch code accumulates (and DDP
    averages over ranks): each micro-batch's mean loss is divided by their number before backward,
    so the accumulated gradient is that of the mean loss over every token of the step. Then
    clip_grad_norm_'s rule, coef = min(1, clip / (norm + 1e-6)) with the norm in float64, the
    schedule and AdamW. micro_batches: [(inputs, targets), ...]. Returns (mean loss, pre-clip
    norm, lr)."""
    opt.zero_grad(set_to_none=True)
    n = len(micro_batches)
    loss_sum = 0.0
    for inputs, targets in micro_batches:
        _, loss = model(inputs, targets)
        (loss / n).backward()
        loss_sum += loss.item()
    norm = global_grad_norm(model)
    if cfg["grad_clip"] > 0:
        coef = min(1.0, cfg["grad_clip"] / (norm + 1e-6))
        if coef < 1.0:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
    lr_s = lr_at(step, cfg["lr"], cfg["warmup_steps"], cfg["steps"], cfg["schedule"],
                 cfg["min_lr_ratio"])
    for g in opt.param_groups:
        g["lr"] = lr_s
    opt.step()
    return loss_sum / n, norm, lr_s


def train_step(model, opt, inputs, targets, step, cfg):
    """One step: zero_grad, fwd, bwd, clip, schedule, AdamW. Returns (loss, pre-clip norm, lr).
    The one-micro-batch case of train_step_accum (dividing the loss by 1 is exact)."""
    return train_step_accum(model, opt, [(inputs, targets)], step, cfg)
