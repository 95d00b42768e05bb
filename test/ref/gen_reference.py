#!/usr/bin/python3
"""Generate PyTorch reference data for zerotrain's CPU-backend parity tests.

Usage (Debian's torch lives in /usr/bin/python3 only):
    /usr/bin/python3 test/ref/gen_reference.py --out /tmp/ref_tiny --config tiny

Writes into --out:
  config.json      model/batch/optimizer settings (see CONFIGS and OPTIM below)
  model.bin        initial weights, llm.c checkpoint format (256 x int32 header, version 3 fp32)
  tokens.bin       int32 (steps, B, T+1); step s: inputs = [s, :, :T], targets = [s, :, 1:]
  logits.bin       float32 (B, T, V): step-0 batch at the initial weights
  grads.bin        float32 grads of the step-0 loss at the initial weights, llm.c 16-tensor
                   layout, no header (wte grad padded with zero rows to Vp)
  losses.json      {"loss0", "losses"[steps] (loss before the update of step s),
                    "grad_norms"[steps] (pre-clip global norm), "lrs"[steps], "clipped"[steps]}
  model_final.bin  weights after `steps` AdamW steps, llm.c format
  fp64_noise.json  fp32-vs-fp64 differences of the step-0 loss/logits/grads (noise floor)
All computation is float32 on CPU with 2 threads, deterministic for a given seed.
"""

import argparse
import copy
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt as tg  # noqa: E402

CONFIGS = {
    # L, NH, C, maxT, V, B, T, grad_clip (chosen so clipping triggers in some steps only)
    "tiny": dict(L=2, NH=2, C=32, maxT=16, V=97, B=2, T=16, grad_clip=1.5),
    "odd": dict(L=3, NH=3, C=48, maxT=24, V=211, B=3, T=13, grad_clip=1.7),
    "wide": dict(L=1, NH=4, C=64, maxT=32, V=50257, B=2, T=32, grad_clip=1.55),
}

OPTIM = dict(steps=10, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
             warmup_steps=3, schedule="cosine", min_lr_ratio=0.1)


def make_tokens(steps, B, T, V, seed):
    """int64 (steps, B, T+1) tokens in [0, V): a noisy random bigram chain (next = perm[prev]
    with prob 0.75, else uniform) so there is something to learn and the loss curve moves."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(V, generator=g)
    toks = torch.empty(steps, B, T + 1, dtype=torch.int64)
    toks[:, :, 0] = torch.randint(0, V, (steps, B), generator=g)
    for t in range(1, T + 1):
        follow = torch.rand(steps, B, generator=g) < 0.75
        rnd = torch.randint(0, V, (steps, B), generator=g)
        toks[:, :, t] = torch.where(follow, perm[toks[:, :, t - 1]], rnd)
    return toks


def diff_stats(a32, a64):
    a32 = np.asarray(a32, dtype=np.float64)
    a64 = np.asarray(a64, dtype=np.float64)
    d = np.abs(a32 - a64)
    ref = np.abs(a64)
    mx = float(ref.max()) if ref.size else 0.0
    sig = ref > 1e-3 * mx  # ignore near-zero entries for the element-wise ratio
    elem = float((d[sig] / ref[sig]).max()) if sig.any() else 0.0
    return {"max_abs_diff": float(d.max()), "max_abs_ref": mx,
            "rel_to_max": float(d.max() / mx) if mx > 0 else 0.0,
            "max_elem_rel_sig": elem}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--grad-clip", type=float, default=None, help="override the config value")
    ap.add_argument("--schedule", default=None, choices=["cosine", "constant"])
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    cfg = dict(CONFIGS[args.config])
    cfg.update(OPTIM)
    if args.grad_clip is not None:
        cfg["grad_clip"] = args.grad_clip
    if args.schedule is not None:
        cfg["schedule"] = args.schedule
    L, NH, C, maxT, V, B, T = (cfg[k] for k in ("L", "NH", "C", "maxT", "V", "B", "T"))
    cfg["Vp"] = tg.padded_vocab(V)
    steps = cfg["steps"]
    os.makedirs(args.out, exist_ok=True)

    model = tg.GPT(L, NH, C, maxT, V).float()
    tg.init_weights(model, args.seed)

    tokens = make_tokens(steps, B, T, V, args.seed + 1)

    keys = ["L", "NH", "C", "maxT", "V", "Vp", "B", "T", "steps", "lr", "beta1", "beta2",
            "eps", "weight_decay", "grad_clip", "warmup_steps", "schedule", "min_lr_ratio"]
    cfg_out = {k: cfg[k] for k in keys}
    cfg_out["config"] = args.config
    cfg_out["seed"] = args.seed
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg_out, f, indent=1)
    tg.save_llmc(model, os.path.join(args.out, "model.bin"))
    tokens.to(torch.int32).numpy().tofile(os.path.join(args.out, "tokens.bin"))

    # ---- step 0 at the initial weights: logits, loss, grads (fp32) + fp64 noise floor ----
    x0, y0 = tokens[0, :, :T], tokens[0, :, 1:]
    model.zero_grad(set_to_none=True)
    logits, loss0 = model(x0, y0)
    loss0.backward()
    logits.detach().numpy().astype(np.float32).tofile(os.path.join(args.out, "logits.bin"))
    tg.save_grads(model, os.path.join(args.out, "grads.bin"))
    loss0_f = loss0.item()
    grads32 = tg.llmc_arrays(model, grads=True)

    m64 = copy.deepcopy(model).double()
    m64.zero_grad(set_to_none=True)
    logits64, loss64 = m64(x0, y0)
    loss64.backward()
    grads64 = tg.llmc_arrays(m64, grads=True, dtype=np.float64)
    noise = {"loss": {"fp32": loss0_f, "fp64": loss64.item(),
                      "rel": abs(loss0_f - loss64.item()) / abs(loss64.item())},
             "logits": diff_stats(logits.detach().numpy(), logits64.detach().numpy())}
    for (name, a32), (_, a64) in zip(grads32, grads64):
        noise["grad_" + name] = diff_stats(a32, a64)
    m64.zero_grad(set_to_none=True)
    model.zero_grad(set_to_none=True)

    # ---- reload check: model.bin must reproduce loss0 exactly ----
    reloaded = tg.load_llmc(os.path.join(args.out, "model.bin"))
    with torch.no_grad():
        _, l_re = reloaded(x0, y0)
    assert l_re.item() == loss0_f, f"reload mismatch {l_re.item()} vs {loss0_f}"

    # ---- training curve ----
    opt = tg.make_optimizer(model, cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["eps"],
                            cfg["weight_decay"])
    losses, norms, lrs, clipped = [], [], [], []
    for s in range(steps):
        loss, norm, lr_s = tg.train_step(model, opt, tokens[s, :, :T], tokens[s, :, 1:], s, cfg)
        losses.append(loss)
        norms.append(norm)
        lrs.append(lr_s)
        clipped.append(bool(cfg["grad_clip"] > 0 and norm > cfg["grad_clip"]))
    assert losses[0] == loss0_f
    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump({"loss0": loss0_f, "losses": losses, "grad_norms": norms, "lrs": lrs,
                   "clipped": clipped}, f, indent=1)
    tg.save_llmc(model, os.path.join(args.out, "model_final.bin"))

    # ---- the same training in fp64: how far plain fp32 rounding moves the curve/weights ----
    opt64 = tg.make_optimizer(m64, cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["eps"],
                              cfg["weight_decay"])
    losses64 = [tg.train_step(m64, opt64, tokens[s, :, :T], tokens[s, :, 1:], s, cfg)[0]
                for s in range(steps)]
    noise["train_losses_max_abs_diff"] = max(abs(a - b) for a, b in zip(losses, losses64))
    fin32, fin64 = tg.llmc_arrays(model), tg.llmc_arrays(m64, dtype=np.float64)
    for (name, a32), (_, a64) in zip(fin32, fin64):
        noise["final_" + name] = diff_stats(a32, a64)
    with open(os.path.join(args.out, "fp64_noise.json"), "w") as f:
        json.dump(noise, f, indent=1)

    # ---- summary ----
    print(f"[{args.config}] L={L} NH={NH} C={C} maxT={maxT} V={V} Vp={cfg['Vp']} B={B} T={T}"
          f" -> {args.out}")
    print(f"  loss0 fp32={loss0_f:.9f} fp64={loss64.item():.9f} rel={noise['loss']['rel']:.2e}"
          f"  (reload of model.bin reproduces loss0 exactly)")
    worst = max((v["rel_to_max"], k) for k, v in noise.items()
                if k.startswith("grad_") or k == "logits")
    print(f"  fp32 vs fp64 (max|d|/max|ref|): logits {noise['logits']['rel_to_max']:.2e};"
          f" worst tensor {worst[1]} {worst[0]:.2e}")
    for k, v in noise.items():
        if not isinstance(v, dict) or k == "loss":
            continue
        print(f"    {k:16s} rel_to_max={v['rel_to_max']:.2e} max_elem_rel_sig="
              f"{v['max_elem_rel_sig']:.2e} max_abs_diff={v['max_abs_diff']:.2e}")
    print("  step  loss         grad_norm    lr          clipped")
    for s in range(steps):
        print(f"  {s:4d}  {losses[s]:.7f}  {norms[s]:.6f}  {lrs[s]:.6e}  {clipped[s]}")
    print(f"  fp32 vs fp64 training: max |loss diff| over {steps} steps = "
          f"{noise['train_losses_max_abs_diff']:.2e}")
    print(f"  clipping triggered in {sum(clipped)}/{steps} steps (grad_clip={cfg['grad_clip']})")


if __name__ == "__main__":
    main()
