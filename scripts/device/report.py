#!/usr/bin/env python3
"""One table from what scripts/device/run.sh left in its results folder.

    python3 scripts/device/report.py [--res build-gpu/device] [--out DIR] [--quiet]
    python3 scripts/device/report.py --check {sanitize,parity,bench}

Reads (all optional; a missing input shows as "not run"): phase_*.json (status and time of each
phase), env.json/env.txt, ctest_gpu.xml or test.log (ctest -L gpu), sanitize.log
(compute-sanitizer's ERROR SUMMARY), parity_cuda_bf16.jsonl + parity_cpu_fp32.jsonl (loss per
step), bench_ours.jsonl + bench_torch.json + bench_meta.json (GPT-2 124M throughput), kernels.json.
Prints the table and writes OUT/report.md and OUT/results.json (OUT: --out, else $OUT, else the
results folder). --check prints one line about one phase and exits 1 when it did not pass.

MFU: model FLOPs per token = 6*N + 12*L*C*T (nanoGPT's estimate_mfu: 6N for the weight matmuls
forward+backward, 12*L*H*Q*T for attention scores and values, no causal halving), N = parameters
without the position embedding (wte counted once: it is also the LM head), real vocabulary 50257
for both implementations. Peak: dense bf16 tensor-core FLOP/s of the GPU (table below).
"""

import argparse
import glob
import json
import math
import os
import re
import statistics
import sys
import xml.etree.ElementTree as ET

PARITY_TOL = 0.02
# Dense bf16 tensor-core peak, FLOP/s (no sparsity). First match wins, so specific names go first.
PEAK_BF16 = [
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("GH200", 989e12), ("H100", 989e12),
    ("H200", 989e12), ("H800", 989e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12),
    ("B200", 2250e12),
]


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        return None
    return rows


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def step_rows(rows):
    """Training-step lines of a metrics JSONL (not eval, not summary), in step order."""
    return sorted((r for r in rows or [] if "step" in r and "loss" in r), key=lambda r: r["step"])


# ---- per-phase results --------------------------------------------------------------------------


def phases(res):
    out = []
    for p in sorted(glob.glob(os.path.join(res, "phase_*.json")), key=os.path.getmtime):
        d = load_json(p)
        if d:
            out.append(d)
    return out


def test_result(res):
    xml = os.path.join(res, "ctest_gpu.xml")
    if os.path.exists(xml):
        try:
            counts = {"passed": 0, "failed": 0, "skipped": 0}
            failed = []
            for tc in ET.parse(xml).getroot().iter("testcase"):
                if tc.find("failure") is not None or tc.get("status") == "fail":
                    counts["failed"] += 1
                    failed.append(tc.get("name"))
                elif tc.find("skipped") is not None or tc.get("status") in ("notrun", "disabled"):
                    counts["skipped"] += 1
                else:
                    counts["passed"] += 1
            counts["failed_tests"] = failed
            counts["total"] = counts["passed"] + counts["failed"] + counts["skipped"]
            return counts
        except ET.ParseError:
            pass
    log = read_text(os.path.join(res, "test.log"))
    if log is None:
        return None
    m = re.findall(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", log)
    if not m:
        return {"error": "no ctest summary in test.log" if "No tests were found" not in log
                else "no tests with label gpu"}
    _, failed, total = (int(x) for x in m[-1])
    skipped = len(re.findall(r"\*\*\*Skipped|\(Skipped\)|Not Run", log))
    return {"passed": total - failed - skipped, "failed": failed, "skipped": skipped, "total": total,
            "failed_tests": re.findall(r"^\s*\d+ - (\S+) \(Failed\)", log, re.M)}


def sanitize_result(res):
    log = read_text(os.path.join(res, "sanitize.log"))
    if log is None:
        return None
    m = re.findall(r"ERROR SUMMARY: (\d+) errors?", log)
    rows = step_rows(load_jsonl(os.path.join(res, "sanitizer_metrics.jsonl")))
    race = read_text(os.path.join(res, "racecheck.log"))
    r = re.findall(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", race or "")
    tests = re.findall(r"\[  PASSED  \] (\d+) tests?", race or "")
    racecheck = None if race is None else {
        "hazards": int(r[-1][0]) if r else None, "tests_passed": int(tests[-1]) if tests else 0,
        "ok": bool(r) and int(r[-1][0]) == 0 and bool(tests)}
    return {"errors": int(m[-1]) if m else None, "steps_logged": len(rows),
            "ok": bool(m) and int(m[-1]) == 0 and (racecheck is None or racecheck["ok"]), "racecheck": racecheck}


def parity_result(res):
    gpu = load_jsonl(os.path.join(res, "parity_cuda_bf16.jsonl"))
    cpu = load_jsonl(os.path.join(res, "parity_cpu_fp32.jsonl"))
    if gpu is None and cpu is None:
        return None
    g = {r["step"]: r["loss"] for r in step_rows(gpu)}
    c = {r["step"]: r["loss"] for r in step_rows(cpu)}
    common = sorted(set(g) & set(c))
    out = {"steps_gpu": len(g), "steps_cpu": len(c), "steps_compared": len(common), "tol": PARITY_TOL}
    if not common:
        out.update(ok=False, error=f"no common steps (CUDA run logged {len(g)}, CPU run {len(c)})")
        return out
    devs = [(abs(g[s] - c[s]) / abs(c[s]) if c[s] else math.inf, s) for s in common]
    worst, at = max(devs)
    out.update(max_rel_dev=worst, at_step=at, mean_rel_dev=sum(d for d, _ in devs) / len(devs),
               loss_gpu_at=g[at], loss_cpu_at=c[at], final_loss_gpu=g[common[-1]],
               final_loss_cpu=c[common[-1]], ok=worst <= PARITY_TOL and len(g) == len(c))
    gv = {r["step"]: r["val_loss"] for r in gpu or [] if "val_loss" in r}
    cv = {r["step"]: r["val_loss"] for r in cpu or [] if "val_loss" in r}
    vcommon = sorted(set(gv) & set(cv))
    if vcommon:
        s = vcommon[-1]
        out.update(val_step=s, val_gpu=gv[s], val_cpu=cv[s],
                   val_rel_dev=abs(gv[s] - cv[s]) / abs(cv[s]) if cv[s] else math.inf)
    return out


def gpu_name(res, torch_json=None):
    env = load_json(os.path.join(res, "env.json")) or {}
    name = env.get("gpu") or ""
    if (not name or name == "unknown") and torch_json:
        name = torch_json.get("device", "")
    return name or "unknown"


def peak_flops(name):
    for key, peak in PEAK_BF16:
        if key.lower() in name.lower():
            return peak
    return None


def flops_per_token(L, C, T, V):
    n = V * C + L * (12 * C * C + 13 * C) + 2 * C  # without wpe; tied wte counted once
    return n, 6 * n + 12 * L * C * T


def bench_result(res):
    meta = load_json(os.path.join(res, "bench_meta.json"))
    ours_rows = load_jsonl(os.path.join(res, "bench_ours.jsonl"))
    torch_json = load_json(os.path.join(res, "bench_torch.json"))
    if meta is None and ours_rows is None and torch_json is None:
        return None
    meta = meta or {}
    L, C, V = meta.get("L", 12), meta.get("C", 768), meta.get("V", 50257)
    T = meta.get("T", (torch_json or {}).get("T", 1024))
    B = meta.get("B", (torch_json or {}).get("B"))
    warm = meta.get("warmup", 5)
    n, fpt = flops_per_token(L, C, T, V)
    name = gpu_name(res, torch_json)
    peak = peak_flops(name)
    out = {"B": B, "T": T, "L": L, "C": C, "V": V, "params_nonembedding": n,
           "flops_per_token": fpt, "gpu": name, "peak_flops": peak, "warmup": warm}
    rows = [r for r in step_rows(ours_rows) if "tokens_per_s" in r]
    timed = rows[warm:] if len(rows) > warm else []
    if timed:
        tps = statistics.median(r["tokens_per_s"] for r in timed)
        out["ours"] = {"tokens_per_s": tps, "ms_per_step": statistics.median(r["ms"] for r in timed if "ms" in r)
                       if any("ms" in r for r in timed) else None, "steps_timed": len(timed),
                       "final_loss": rows[-1]["loss"]}
        if peak:
            out["ours"]["mfu"] = tps * fpt / peak
    if torch_json and torch_json.get("tokens_per_s"):
        tps = torch_json["tokens_per_s"]
        out["torch"] = {k: torch_json.get(k) for k in ("tokens_per_s", "ms_per_step", "compile", "torch",
                                                       "final_loss", "params", "steps", "warmup")}
        if peak:
            out["torch"]["mfu"] = tps * fpt / peak
    if "ours" in out and "torch" in out:
        out["speedup"] = out["ours"]["tokens_per_s"] / out["torch"]["tokens_per_s"]
    return out


def kernels_result(res):
    return load_json(os.path.join(res, "kernels.json"))


# ---- formatting -----------------------------------------------------------------------------------


def fmt(x, nd=4):
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10000 else str(x)
    if isinstance(x, float):
        if x == 0 or not math.isfinite(x):
            return str(x)
        if abs(x) >= 1e4:
            return f"{x:,.0f}"
        return f"{x:.{nd}g}"
    return str(x)


def md_table(header, rows):
    cells = [[str(c).replace("|", "/") for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(lines)


def kernel_rows(k):
    """Generic rendering: a list of objects (or {"kernels": [...]}, or {name: {...}})."""
    if isinstance(k, dict):
        for key in ("kernels", "results", "rows", "benchmarks"):
            if isinstance(k.get(key), list):
                k = k[key]
                break
        else:
            if all(isinstance(v, dict) for v in k.values()):
                k = [dict(name=n, **v) for n, v in k.items()]
            else:
                return ["key", "value"], [[n, fmt(v)] for n, v in k.items()]
    if not isinstance(k, list) or not k:
        return None, None
    cols = []
    for r in k:
        if isinstance(r, dict):
            for c in r:
                if c not in cols and not isinstance(r[c], (list, dict)):
                    cols.append(c)
    cols = cols[:9]
    return cols, [[fmt(r.get(c)) if isinstance(r, dict) else fmt(r) for c in cols] for r in k]


def build(res):
    ph = phases(res)
    status = {p["phase"]: p for p in ph}
    t, s, p, b = test_result(res), sanitize_result(res), parity_result(res), bench_result(res)
    k = kernels_result(res)
    env = read_text(os.path.join(res, "env.txt")) or ""
    git = re.search(r"== git\n(.*)", env)
    summary = []

    def verdict(name, ok):
        st = status.get(name, {}).get("status")
        if st == "skip":
            return "skipped"
        if ok is None:
            return st or "not run"
        return "ok" if ok else "FAIL"

    if t is None:
        summary.append(["GPU tests (ctest -L gpu)", "not run", verdict("test", None)])
    elif "error" in t:
        summary.append(["GPU tests (ctest -L gpu)", t["error"], verdict("test", False)])
    else:
        txt = f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped (of {t['total']})"
        if t.get("failed_tests"):
            txt += ": " + ", ".join(t["failed_tests"][:6])
        summary.append(["GPU tests (ctest -L gpu)", txt, verdict("test", t["failed"] == 0 and t["total"] > 0)])
    if s is None:
        summary.append(["memcheck, 10 bf16 steps", "not run", verdict("sanitize", None)])
    else:
        txt = (f"{s['errors']} errors" if s["errors"] is not None else "no ERROR SUMMARY") + \
            f", {s['steps_logged']} steps logged"
        summary.append(["memcheck, 10 bf16 steps", txt, verdict("sanitize", s["errors"] == 0)])
        rc = s.get("racecheck")
        if rc is not None:
            txt = (f"{rc['hazards']} hazards" if rc["hazards"] is not None else "no RACECHECK SUMMARY") + \
                f", {rc['tests_passed']} attention tests passed"
            summary.append(["racecheck, attention tests (fp32, bf16)", txt, verdict("sanitize", rc["ok"])])
    if p is None:
        summary.append(["loss: CUDA bf16 vs CPU fp32", "not run", verdict("parity", None)])
    elif "error" in p:
        summary.append(["loss: CUDA bf16 vs CPU fp32", p["error"], verdict("parity", False)])
    else:
        txt = (f"max rel. dev. {100 * p['max_rel_dev']:.2f}% at step {p['at_step']} "
               f"({fmt(p['loss_gpu_at'])} vs {fmt(p['loss_cpu_at'])}), mean {100 * p['mean_rel_dev']:.2f}%, "
               f"{p['steps_compared']} steps; final {fmt(p['final_loss_gpu'])} vs {fmt(p['final_loss_cpu'])}")
        if "val_gpu" in p:
            txt += f"; val@{p['val_step']} {fmt(p['val_gpu'])} vs {fmt(p['val_cpu'])}"
        summary.append([f"loss: CUDA bf16 vs CPU fp32 (tol {100 * PARITY_TOL:g}%)", txt, verdict("parity", p["ok"])])
    if b is None:
        summary.append(["GPT-2 124M tokens/s", "not run", verdict("bench", None)])
    else:
        o, tr = b.get("ours", {}), b.get("torch", {})
        txt = (f"ours {fmt(o.get('tokens_per_s'))} ({fmt(o.get('ms_per_step'))} ms/step), "
               f"PyTorch {fmt(tr.get('tokens_per_s'))} ({fmt(tr.get('ms_per_step'))} ms/step)")
        sp = f"{b['speedup']:.2f}x" if "speedup" in b else verdict("bench", None if status.get("bench") is None
                                                                   else status["bench"]["status"] == "ok")
        summary.append([f"GPT-2 124M tokens/s, B={b['B']} T={b['T']}, median after {b['warmup']} warm-up",
                        txt, sp])
        peak = b.get("peak_flops")
        mfu = (f"ours {100 * o['mfu']:.1f}%, PyTorch " if "mfu" in o else "ours n/a, PyTorch ") + \
            (f"{100 * tr['mfu']:.1f}%" if "mfu" in tr else "n/a")
        summary.append([f"MFU ({b['gpu']}, peak {peak / 1e12:.0f} TFLOP/s bf16)" if peak else
                        f"MFU ({b['gpu']}: peak unknown)",
                        mfu + f"; {b['flops_per_token'] / 1e9:.3f} GFLOP/token = 6N+12LCT, N={b['params_nonembedding']:,}",
                        ""])
    ps = status.get("paths")
    if ps is None:
        summary.append(["emulator's checks on the GPU (test/emu/*.sh)", "not run", verdict("paths", None)])
    else:
        logs = sorted(glob.glob(os.path.join(res, "paths_*.log")))
        summary.append(["emulator's checks on the GPU (test/emu/*.sh)",
                        ps.get("note") or f"{len(logs)} scripts passed", verdict("paths", ps["status"] == "ok")])
    m = load_json(os.path.join(res, "memory.json"))
    if m is None:
        summary.append(["device memory vs estimate", "not run", verdict("memory", None)])
    else:
        txt = "; ".join(f"{r['config']}: est {r['estimate'] / 2**20:.0f} MiB, used {r['used'] / 2**20:.0f} MiB "
                        f"({100 * r['overhead'] / max(r['estimate'], 1):+.1f}%), ctx {r['context_and_workspace'] / 2**20:.0f} MiB"
                        for r in m.get("rows", []))
        summary.append(["device memory vs estimate", txt, verdict("memory", m.get("ok"))])
    if k is None:
        summary.append(["kernel benchmark", "not run", verdict("kernels", None)])

    lines = ["# zerotrain on the GPU machine", ""]
    name = b["gpu"] if b else gpu_name(res)
    lines.append(f"device: {name}; commit: {git.group(1).strip() if git else '?'}")
    lines += ["", md_table(["check", "result", "verdict"], summary), ""]
    if ph:
        lines += ["## phases", "", md_table(["phase", "status", "seconds", "note"],
                                            [[x.get("phase"), x.get("status"), x.get("seconds"), x.get("note", "")]
                                             for x in ph]), ""]
    if k is not None:
        cols, rows = kernel_rows(k)
        lines += ["## kernels (zt_bench_kernels)", ""]
        lines += [md_table(cols, rows) if cols else "```\n" + json.dumps(k, indent=1)[:4000] + "\n```", ""]
    failed = [x["phase"] for x in ph if x.get("status") == "fail"]
    lines.append(f"failed phases: {', '.join(failed) if failed else 'none'}")
    results = {"gpu": name, "phases": ph, "test": t, "sanitize": s, "parity": p, "bench": b, "kernels": k,
               "memory": m}
    return "\n".join(lines) + "\n", results


def check(res, what):
    if what == "sanitize":
        s = sanitize_result(res)
        ok = bool(s and s["ok"])
        print(f"sanitize: {s['errors'] if s else None} errors, racecheck {s['racecheck'] if s else None}"
              f" -> {'ok' if ok else 'FAIL'}")
    elif what == "parity":
        p = parity_result(res)
        ok = bool(p and p.get("ok"))
        if p and "max_rel_dev" in p:
            print(f"parity: max rel. loss deviation {100 * p['max_rel_dev']:.3f}% at step {p['at_step']} over "
                  f"{p['steps_compared']} steps (gpu {p['steps_gpu']}, cpu {p['steps_cpu']}), "
                  f"tol {100 * PARITY_TOL:g}% -> {'ok' if ok else 'FAIL'}")
        else:
            print(f"parity: {p} -> FAIL")
    elif what == "bench":
        b = bench_result(res) or {}
        ok = "ours" in b and "torch" in b
        o, t = b.get("ours", {}), b.get("torch", {})
        print(f"bench: ours {fmt(o.get('tokens_per_s'))} tok/s (MFU {fmt(o.get('mfu'))}), "
              f"torch {fmt(t.get('tokens_per_s'))} tok/s (MFU {fmt(t.get('mfu'))}), "
              f"speedup {fmt(b.get('speedup'))}")
    else:
        raise SystemExit(f"unknown check {what}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--res", default=os.path.join(here, "..", "..", "build-gpu", "device"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--check", choices=["sanitize", "parity", "bench"])
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    if a.check:
        return check(a.res, a.check)
    text, results = build(a.res)
    out = a.out or os.environ.get("OUT") or a.res
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    if not a.quiet:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
