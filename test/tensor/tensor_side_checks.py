"""The side checks of test/tensor/tensor_equivalence.py (its docstring says what each holds): one-line
refusals, the hang diagnosis and trace lane, model.init from an llm.c file, the shipped plan, and
each rank's resident memory against the estimate. Run through tensor_equivalence.py, not alone."""
import json
import os
import re
import subprocess
import time

import zero_equivalence as zm  # on the path tensor_equivalence.py set
from tensor_equivalence import LOSS_TOL, ROOT, estimate, plan_sets, rel

RSS_SLACK, RSS_OVERHEAD_MAX = 8 << 20, 400 << 20  # resident(): memory_formulas.py's slack; a sane runtime


# (W, mesh.tensor, more plan fields, regexes the one error line must match, also by `train estimate`)
REFUSALS = [
    (4, 3, {}, [r"mesh\.tensor", r"\b3\b", r"\b4\b", r"divide"], True),
    (2, 4, {}, [r"mesh\.tensor", r"\b4\b", r"n_head", r"\b6\b"], True),
    (2, 0, {}, [r"mesh\.tensor", r"\b0\b"], True),
    (2, -1, {}, [r"mesh\.tensor", r"-1\b"], True),
    (1, 1, {"mesh.sequence_parallel": "true"}, [r"sequence_parallel", r"mesh\.tensor"], True),
    (3, 3, {"mesh.sequence_parallel": "true"}, [r"sequence_parallel", r"seq_len", r"\b32\b", r"\b3\b"], True),
]


def refusal(train, mpirun, work, timeout, i, how):
    W, T, extra, says, _ = REFUSALS[i]
    d = os.path.join(work, f"refusal{i}_{how}")
    os.makedirs(d)
    x = {k: (os.path.join(d, v[1:]) if isinstance(v, str) and v.startswith("@") else v) for k, v in extra.items()}
    x["mesh.tensor"] = T
    name = f"W={W} mesh.tensor={T}" + "".join(f" {k}={v}" for k, v in extra.items())
    sets = plan_sets(d, x)
    cmd = (zm.launcher(mpirun, W) + [train, "plans/default.json"] if how == "mpirun" else
           [train, "estimate", "plans/default.json", "--world", str(W), "--json"]) + sets
    p = subprocess.run(cmd, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    out = p.stdout + p.stderr
    lines = [l for l in out.splitlines() if l.startswith("error")]
    written = [f for f in ("metrics.jsonl", "final.bin", "ckpt") if os.path.exists(os.path.join(d, f))]
    ok = (p.returncode != 0 and len(lines) == 1 and "unknown key" not in lines[0]
          and all(re.search(s, lines[0]) for s in says) and not written)
    line = f"  {'ok ' if ok else 'BAD'} {how:8s} {name}: exit {p.returncode}: " + \
        (lines[0][:150] if lines else out.strip()[-150:])
    return line, None if ok else (f"refusal {name} ({how}): exit {p.returncode}, {len(lines)} error line(s) "
                                  f"{lines[:2]}; wanted one matching {says}; written: {written}")


def hang_and_trace(train, mpirun, work, timeout):
    """A tensor rank that skips a collective: the rank left waiting (rank 0) times out naming the group and
    takes the job down within the timeout plus slack. The skipping rank waits in a later collective, so
    the first timeout's abort may end it before its own line prints (as in test/comm/hang_train.sh); its
    line, where it made it out, must name the group too. A traced run has the tensor group's collectives
    on their own lane ("comm tensor", docs/traces.md)."""
    errs = []
    d = os.path.join(work, "hang")
    os.makedirs(d)
    sets = plan_sets(d, {"mesh.tensor": 2, "run.steps": 3, "comm.fault_skip_rank": 1, "comm.fault_skip_step": 1,
                         "comm.timeout_s": 5})
    t0 = time.monotonic()
    p = subprocess.run(zm.launcher(mpirun, 2) + [train, "plans/default.json"] + sets, cwd=ROOT, env=zm.env(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    secs = time.monotonic() - t0
    lines = [l for l in p.stdout.splitlines() if l.startswith("error: rank")]
    named = [l for l in lines if 'in group "tensor"' in l and "did not complete within 5 s" in l]
    ranks = {l.split(":")[1].strip() for l in named}
    ok = p.returncode != 0 and "rank 0" in ranks and len(named) == len(lines) and secs < 5 + 15
    print(f"  {'ok ' if ok else 'BAD'} a tensor rank skipping a collective at step 1: exit {p.returncode} after {secs:.0f} s, "
          f"{len(named)} rank(s) name the group: {named[0][:120] if named else p.stdout.strip()[-200:]}", flush=True)
    if not ok:
        errs.append(f"hang diagnosis: exit {p.returncode}, lines {lines[:2]}")
    d = os.path.join(work, "trace")
    os.makedirs(d)
    sets = plan_sets(d, {"mesh.tensor": 2, "run.steps": 2, "run.trace": os.path.join(d, "trace.json")})
    p = subprocess.run(zm.launcher(mpirun, 2) + [train, "plans/default.json"] + sets, cwd=ROOT, env=zm.env(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    lanes = set()
    for f in os.listdir(d):
        if f.startswith("trace") and f.endswith(".json"):
            for ev in json.load(open(os.path.join(d, f))).get("traceEvents", []):
                if ev.get("ph") == "M" and ev.get("name") == "thread_name":
                    lanes.add(ev.get("args", {}).get("name"))
    ok = p.returncode == 0 and "comm tensor" in lanes
    print(f"  {'ok ' if ok else 'BAD'} traced run: lanes {sorted(x for x in lanes if x and x.startswith('comm'))}", flush=True)
    if not ok:
        errs.append(f"trace: exit {p.returncode}, lanes {sorted(x for x in lanes if x)}: no \"comm tensor\"")
    return errs


def init_from_llmc(train, mpirun, work, timeout):
    """model.init (an llm.c file of whole tensors): each tensor rank keeps its slices; T 2 x data 2 at stage 3
    with sequence parallelism starts from the same model as one rank and trains the same losses."""
    d = os.path.join(work, "init")
    os.makedirs(d)
    init = os.path.join(d, "init.bin")
    runs = {}
    for name, W, extra in (("write", 1, {"run.steps": 3, "run.final_weights": init}),
                           ("one", 1, {"run.steps": 4, "batch.grad_accum": 4, "model.init": init}),
                           ("tensor", 4, {"run.steps": 4, "batch.grad_accum": 2, "model.init": init, "mesh.tensor": 2,
                                          "zero.stage": 3, "mesh.sequence_parallel": "true"})):
        sub = os.path.join(d, name)
        os.makedirs(sub)
        p = subprocess.run(zm.launcher(mpirun, W) + [train, "plans/default.json"] + plan_sets(sub, extra), cwd=ROOT,
                           env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if p.returncode != 0:
            return [f"model.init run {name}: exit {p.returncode}: {p.stdout.strip()[-300:]}"]
        runs[name] = [json.loads(l) for l in open(os.path.join(sub, "metrics.jsonl")) if '"loss"' in l]
    worst = max(rel(a["loss"], b["loss"]) for a, b in zip(runs["one"], runs["tensor"]))
    ok = len(runs["tensor"]) == 4 and worst <= LOSS_TOL
    print(f"  {'ok ' if ok else 'BAD'} model.init: T=2 x data 2 stage 3 sequence parallel against one rank from the same "
          f"llm.c file: loss rel err {worst:.2e} over 4 steps", flush=True)
    return [] if ok else [f"model.init: T=2 losses against one rank rel {worst:.2e} > {LOSS_TOL}"]


def shipped_plan(train, mpirun, work, timeout):
    """plans/tensor2.json as users run it (its buckets, stage, sequence parallelism, evaluation and sample;
    only the data and the step count changed) on 4 ranks, against plans/zero1.json on 2 (the same global
    batch: the data axis of tensor2 is 2 ranks)."""
    runs = {}
    for name, plan, W in (("tensor2", "plans/tensor2.json", 4), ("zero1", "plans/zero1.json", 2)):
        d = os.path.join(work, "shipped_" + name)
        os.makedirs(d)
        sets = ["--set", "data.train=data/sample/train_*.bin", "--set", "data.val=data/sample/val.bin",
                "--set", "data.tokenizer=data/sample/gpt2_tokenizer.bin", "--set", "run.steps=3",
                "--set", f"run.log={d}/metrics.jsonl"]
        p = subprocess.run(zm.launcher(mpirun, W) + [train, plan] + sets, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if p.returncode != 0:
            return [f"shipped plan {plan} at {W} ranks: exit {p.returncode}: {p.stdout.strip()[-300:]}"]
        rows = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
        runs[name] = ([r["loss"] for r in rows if "loss" in r and "step" in r],
                      [r["val_loss"] for r in rows if "val_loss" in r], next(r["summary"] for r in rows if "summary" in r))
    (a, va, sa), (b, vb, _) = runs["tensor2"], runs["zero1"]
    worst = max(rel(x, y) for x, y in zip(a + va, b + vb)) if len(a) == len(b) == 3 and va and len(va) == len(vb) \
        else float("inf")
    ok = worst <= LOSS_TOL and sa.get("tensor") == 2 and sa.get("bytes_tensor_group_per_step", 0) > 0 and \
        sa.get("bytes_tensor_group_per_step") == sa.get("bytes_tensor_group_per_step_theory")
    print(f"  {'ok ' if ok else 'BAD'} plans/tensor2.json at 4 ranks against plans/zero1.json at 2: losses and val loss "
          f"rel err {worst:.2e}, {sa.get('bytes_tensor_group_per_step')} B per step on the tensor group", flush=True)
    return [] if ok else [f"shipped plans/tensor2.json: rel err {worst:.2e} against plans/zero1.json, summary "
                          f"tensor {sa.get('tensor')}, bytes {sa.get('bytes_tensor_group_per_step')}"]


def resident(train, mpirun, work, timeout):
    """Each rank's VmHWM (the summary's peak_rss_bytes_per_rank) at T 2 x data 2, stage 3, sequence
    parallelism: what the process holds besides the tracked buffers (libraries, runtimes, MPI, the init
    transient of one shard range) is measured per rank on a small model, and a larger one (several times
    the tracked bytes; its collectives' MPI temporaries grow by ~2 MiB) must then sit within RSS_SLACK of `train estimate`'s per-rank
    total plus that: a buffer the estimate does not know, or one it counts that is never allocated, of
    more than RSS_SLACK fails (docs/tensor.md; test/zero/memory_formulas.py does the same for ZeRO)."""
    models = {"small": {"model.n_layer": 2, "model.n_embd": 48, "model.vocab_size": 50257},
              "large": {"model.n_layer": 8, "model.n_embd": 192, "model.vocab_size": 50257}}
    got = {}
    for name, m in models.items():
        d = os.path.join(work, "resident_" + name)
        os.makedirs(d)
        sets = plan_sets(d, dict(m, **{"mesh.tensor": 2, "zero.stage": 3, "mesh.sequence_parallel": "true",
                                       "run.steps": 2, "run.final_weights": ""}))
        p = subprocess.run(zm.launcher(mpirun, 4) + [train, "plans/default.json"] + sets, cwd=ROOT, env=zm.env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if p.returncode != 0:
            return [f"resident {name}: exit {p.returncode}: {p.stdout.strip()[-300:]}"]
        s = next(json.loads(l)["summary"] for l in open(os.path.join(d, "metrics.jsonl")) if '"summary"' in l)
        got[name] = (s.get("peak_rss_bytes_per_rank", []), estimate(train, 4, sets)["memory"]["host"]["total"],
                     s["peak_memory_bytes"]["host"]["total"])
    (rss_s, est_s, _), (rss_l, est_l, tracked_l) = got["small"], got["large"]
    if len(rss_s) != 4 or len(rss_l) != 4:
        return [f"resident: peak_rss_bytes_per_rank has {len(rss_s)} / {len(rss_l)} entries, not 4"]
    errs = []
    MiB = 1 << 20
    for r in range(4):
        overhead = rss_s[r] - est_s
        want = est_l + overhead
        d = rss_l[r] - want
        ok = 0 < overhead <= RSS_OVERHEAD_MAX and abs(d) <= RSS_SLACK
        print(f"  {'ok ' if ok else 'BAD'} resident, T 2 x data 2 stage 3 sp, rank {r}: VmHWM {rss_l[r] / MiB:.1f} MiB, "
              f"predicted {want / MiB:.1f} (estimate {est_l / MiB:.1f} = tracked {tracked_l / MiB:.1f}, + overhead "
              f"{overhead / MiB:.1f} measured on the small model): {d / MiB:+.2f} MiB (slack {RSS_SLACK / MiB:.0f})",
              flush=True)
        if not ok:
            errs.append(f"resident rank {r}: VmHWM {rss_l[r] / MiB:.1f} MiB is {d / MiB:+.1f} MiB off the estimate "
                        f"+ overhead ({want / MiB:.1f} MiB; slack {RSS_SLACK / MiB:.0f}), overhead {overhead / MiB:.1f} MiB")
    if est_l < 3 * est_s:
        errs.append(f"resident: the large model's estimate {est_l} is not well above the small one's {est_s}")
    return errs


def refusal_control(train, work):
    """The same binary accepts mesh.tensor 2 at world 4 (and reports it), so the refusals are of values."""
    try:
        est = estimate(train, 4, plan_sets(os.path.join(work, "control"), {"mesh.tensor": 2, "zero.stage": 1}))
    except zm.RunFailed as e:
        return f"control: mesh.tensor 2 at world 4 is not accepted: {e}"
    if (est.get("tensor"), est.get("data_world")) != (2, 2):
        return f"control: estimate of mesh.tensor 2 at world 4 says tensor {est.get('tensor')}, " \
               f"data_world {est.get('data_world')}"
    return None
