#!/usr/bin/env python3
"""`train plan` (docs/autoplan.md) on a small model at 2 ranks, against independent oracles.

  - Every candidate's step shape and predicted parts in the report, recomputed from the formulas
    in docs/autoplan.md (read from the document itself) and the report's rates: the document cannot
    drift from the code.
  - The rates, recomputed from the raw probe timings the report lists (block and fixed parts from
    the 1- and 3-block models; recomputation never negative).
  - Memory: for a sample of candidates, host bytes = `train estimate --json` (host + pinned) of that
    very plan + Vp*C*4 + 256 MiB, swap-file bytes = its nvme total; the table is sorted by predicted
    step time; the written plan is the first candidate's and `train estimate` accepts it.
  - --validate 2: the top two were trained (a measured step time each), twice (the rounds, the second
    in reverse order), and each counts its faster run.
  - The cache: a second run measures nothing; a cache naming another machine is measured again and
    replaced; a file that is not a calibration is refused and left as it was.
  - Hostile input, each one line and exit 1 before anything is written: a world that does not divide
    the global batch, --world unlike the ranks launched, an output that is a directory, a model that
    fits nowhere (with the smallest need), a bad --validate, a CUDA plan, --validate without data.

  /usr/bin/python3 test/autoplan/plan_check.py --train ./train [--mpirun mpirun]
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "autoplan.md")
MiB = 1 << 20
OVERHEAD = 256 * MiB

BASE_SETS = ["data.train=data/sample/train_*.bin", "data.val=data/sample/val.bin", "data.tokenizer=",
             "model.n_layer=2", "model.n_embd=64", "model.n_head=2", "model.seq_len=64",
             "batch.micro_batch=2", "batch.grad_accum=1", "zero.bucket_mb=1"]


def formulas(name):
    text = open(DOC).read()
    m = re.search(r"<!-- formulas: " + name + r" -->(.*?)<!-- end formulas -->", text, re.S)
    rows = [l for l in m.group(1).strip().splitlines() if l.startswith("|")][2:]
    out = []
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out.append((cells[0], re.fullmatch(r"`(.*)`", cells[1]).group(1)))
    return out


def evaluate(formula, env):
    """A docs formula over a candidate's terms (the terms as globals, so comprehensions see them)."""
    return eval(formula, dict(env, __builtins__={}))


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    args = ap.parse_args()
    train = os.path.abspath(args.train)
    os.chdir(ROOT)
    work = tempfile.mkdtemp(prefix="zt-plan-check-")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("ZT_MEM_AVAILABLE_BYTES", None)
    sets = [a for s in BASE_SETS + [f"offload.nvme_dir={work}/swap"] for a in ("--set", s)]
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
        return cond

    def run(cmd, world=2, extra_env=None):
        full = ([args.mpirun, "--oversubscribe", "-np", str(world)] if world > 1 else []) + cmd
        return subprocess.run(full, env=dict(env, **(extra_env or {})), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)

    cal = os.path.join(work, "cal.json")
    out = os.path.join(work, "best.json")
    plan_cmd = [train, "plan", "plans/default.json", "--world", "2", "--global-batch", "8", "--out", out,
                "--calibration", cal, "--validate", "2", "--validate-steps", "2"] + sets
    p = run(plan_cmd)
    print(p.stdout)
    if not check(p.returncode == 0, f"train plan exited {p.returncode}"):
        return report(failures, work)
    rep = json.load(open(os.path.join(work, "best.report.json")))
    cands = rep["candidates"]
    print(f"{len(cands)} candidates in the report")
    check(len(cands) > 20, f"only {len(cands)} candidates fit: the space should hold stages 0-3, offload, 4 policies, 4 batches")

    # Shape and time, from the document's formulas.
    shape_f, time_f = formulas("shape"), formulas("time")
    check(len(shape_f) == 6 and len(time_f) == 14, "the formula tables changed size")
    worst = 0.0
    for i, c in enumerate(cands):
        s, ch = c["shape"], c["choice"]
        env_f = dict(s)
        env_f.update(offload_optimizer=ch["offload.optimizer"] == "nvme", offload_params=ch["offload.params"] == "nvme")
        for term, f in shape_f:
            v = eval(f, {"__builtins__": {}}, env_f)
            if not check(close(v, s[term]), f"candidate {i}: shape {term} = {s[term]}, docs formula gives {v}"):
                break
        env_t = dict(s)
        env_t.update(c["rates"])
        env_t.update(min=min, max=max, sum=sum, range=range)
        for term, f in time_f:
            v = evaluate(f, env_t)
            env_t[term] = v
            got = c["predicted"][term]
            for vi, gi in zip(v, got) if isinstance(v, list) else [(v, got)]:
                if abs(gi) > 1e-9:
                    worst = max(worst, abs(vi - gi) / abs(gi))
            same = len(v) == len(got) and all(close(a, b) for a, b in zip(v, got)) if isinstance(v, list) else close(v, got)
            if not check(same, f"candidate {i}: {term} = {got}, docs formula gives {v}"):
                break
    print(f"formulas: every candidate recomputed, largest relative difference {worst:.2e}")

    # Rates from the raw probes.
    probes = rep["probes"]
    def probe(b, pol, L, rows, tp, stage=False):
        # tp: "" (the whole model) or "tp2" / "tp2 sp" (a tensor rank's); stage: the first stage of a
        # pipeline holding L blocks (no head)
        tail = f" stage L{L}" if stage else f" L{L}"
        ks = [k for k in probes if k.startswith("micro_step ") and f" {b} {pol} " in k and k.endswith(tail)
              and (" stage " in k) == stage and f"embedding_rows{rows} {tp + ' ' if tp else ''}threads" in k]
        check(len(ks) == 1, f"probe {b} {pol}{tail} embedding_rows{rows} {tp}: {ks}")
        return probes[ks[0]]
    for key, m in rep["rates"]["micro_step"].items():
        b, policy, _, rows, *tpw = key.split()
        tp = " ".join(tpw)
        # A block: the 2-block headless stage's per block; the rest: what the 1-block model adds.
        t1, stage2 = probe(b, "none", 1, rows, tp), probe(b, "none", 2, rows, tp, stage=True)
        plain = stage2 / 2
        block = plain
        if policy != "none":
            # What the policy's stage adds per block, per sequence, over every micro-batch it is probed at.
            added = sequences = 0.0
            for other in rep["rates"]["micro_step"]:
                ob, opol, _, orows, *otp = other.split()
                if opol == policy and orows == rows and " ".join(otp) == tp:
                    added += (probe(ob, policy, 2, rows, tp, True) - probe(ob, "none", 2, rows, tp, True)) / 2
                    sequences += int(ob[1:])
            block += max(0.0, added / sequences) * int(b[1:])
        check(close(m["fixed_s"], max(0.0, t1 - plain)), f"{key}: fixed_s {m['fixed_s']} not t1 - block")
        check(close(m["block_s"], block), f"{key}: block_s {m['block_s']}, from the probes {block}")
        check(m["block_s"] >= 0 and m["fixed_s"] >= 0, f"{key}: a negative rate")

    # Offload rates: each candidate's from the probes of its own sizes (this model is under the
    # probes' caps, so nothing is scaled).
    offloaded = 0
    def probe_values(prefix, suffix=""):
        return [v for k, v in probes.items() if k.startswith(prefix) and k.endswith(suffix)]
    for i, c in enumerate(cands):
        ch, r = c["choice"], c["rates"]
        if ch["offload.optimizer"] != "nvme":
            check(r["pipeline_s_per_byte"] == 0 and r["pass_first_s"] == 0, f"candidate {i}: offload rates without offload")
            continue
        offloaded += 1
        # With the data there, the engine's own short run of the candidate's partition (at stage 3:
        # the same shard; micro-batch 1, the candidate's sequence): the update's time over the
        # bytes it moves, from a run of one micro-step, and with parameter offload the micro-steps
        # of a second run, of 4 (the first, the later ones and the flush after them, inside that
        # run's step), which give the passes.
        params = ch["offload.params"] == "nvme"
        tag = ("opt+params" if params else "opt") + " units"
        def engine(x, ga):
            ga = f" grad_accum{ga} "
            return [v for k, v in probes.items() if k.startswith("engine ") and f" {tag}" in k and ga in k
                    and ga + x == k[k.index(ga):] and f" numel{int(c['shape']['shard_params'])} " in k]
        update, step = engine("update", 1), engine("step", 1)
        if check(len(update) == 1 and len(step) == 1, f"candidate {i}: engine run probes {update} {step}"):
            check(close(r["pipeline_s_per_byte"] * c["shape"]["optimizer_io_bytes"], update[0]),
                  f"candidate {i}: pipeline_s_per_byte {r['pipeline_s_per_byte']} is not the engine run's update over its bytes")
            check(0 < update[0] < step[0], f"candidate {i}: the engine run's update {update[0]} not within its step {step[0]}")
        runs = {"1"} | ({"4"} if params else set())
        other = [k for k in probes if k.startswith("engine ") and f" {tag}" in k and k.split(" grad_accum")[1].split()[0] not in runs]
        check(not other, f"candidate {i}: engine runs at a grad_accum other than {runs}: {other}")
        if params:
            check(not engine("update", 4), f"candidate {i}: an update taken from the passes' run of 4 micro-steps")
            first, nxt, flush, step4 = engine("first", 4), engine("next", 4), engine("flush", 4), engine("step", 4)
            ep = c.get("engine_passes")
            if check(len(first) == 1 and len(nxt) == 1 and len(flush) == 1 and len(step4) == 1 and ep,
                     f"candidate {i}: engine pass probes {first} {nxt} {flush} {step4} {ep}"):
                check(ep["first_micro_s"] == first[0] and ep["next_micro_s"] == nxt[0] and ep["flush_s"] == flush[0],
                      f"candidate {i}: engine_passes {ep} are not the engine run's micro-steps {first} {nxt} {flush}")
                # The micro-steps are parts of one step (each the slowest rank's, so 10% leeway at 2 ranks).
                check(0 < first[0] and 0 < nxt[0] and 0 <= flush[0] and first[0] + 3 * nxt[0] + flush[0] < 1.10 * step4[0],
                      f"candidate {i}: engine run's micro-steps {first[0]} + 3 x {nxt[0]} + {flush[0]} not within its step {step4[0]}")
                # The model's time for that micro-step without the transfers: the docs' time formulas
                # on one micro-step of micro-batch 1 without recomputation, its collectives alone.
                s1 = dict(c["shape"])
                A = s1["grad_accum"]
                s1.update(grad_accum=1, recomputed_blocks=0, stage_recomputed=[0.0] * len(s1["stage_recomputed"]),
                          comm_bytes=s1["comm_bytes"] / A,
                          grad_path_bytes=s1["grad_path_bytes"] / A, collectives=s1["buckets"] + 2 * s1["units"],
                          optimizer_io_bytes=0)
                one = rep["rates"]["micro_step"][f"B1 none embedding_rows {c['embedding_rows']}"]
                e1 = dict(s1)
                e1.update(r)
                e1.update(block_s=one["block_s"], block_recomputed_s=one["block_s"], fixed_s=one["fixed_s"],
                          pass_first_s=0, pass_next_s=0, min=min, max=max, sum=sum, range=range)
                for term, f in time_f:
                    e1[term] = evaluate(f, e1)
                check(close(ep["base_compute_s"], e1["compute_s"]) and close(ep["base_micro_s"], e1["compute_s"] + e1["exposed_comm_s"])
                      and close(ep["tail_s"], e1["tail_s"]),
                      f"candidate {i}: engine base {ep}, the formulas give compute {e1['compute_s']} + comm {e1['exposed_comm_s']}")
                # The transfers backed out of each micro-step's excess over it by the docs' overlap
                # formula's inverse, and that formula gives the excess back.
                share, comp = r["pass_exposed"], e1["compute_s"]
                for name, micro_s in (("pass_first_s", first[0]), ("pass_next_s", nxt[0])):
                    x = micro_s - e1["compute_s"] - e1["exposed_comm_s"]
                    io = 0 if x <= 0 else x + (1 - share) * comp if x >= share * comp else x / share
                    check(close(r[name], io), f"candidate {i}: {name} {r[name]}, backed out of {micro_s}: {io}")
                    if io > 0:
                        check(close(io - (1 - share) * min(comp, io), x), f"candidate {i}: {name} {io} does not give back {x}")
                # The flush, all exposed, less the last collective the model counts apart.
                check(close(r["pass_flush_s"], max(0.0, flush[0] - e1["tail_s"])),
                      f"candidate {i}: pass_flush_s {r['pass_flush_s']}, from the flush {flush[0]} and tail {e1['tail_s']}")
            check(r["pass_exposed"] in probe_values("pass ", " exposed") and 0 <= r["pass_exposed"] <= 1,
                  f"candidate {i}: pass_exposed {r['pass_exposed']} is not the pass probe's")
        else:
            check(r["pass_first_s"] == 0 and r["pass_flush_s"] == 0, f"candidate {i}: pass rates without parameter offload")
    check(offloaded > 0, "no offload candidate in the report")

    # The mesh: what the plan's checks refuse is counted by reason, not sized (2 layers: interleaved
    # 2 x 2 chunks hold no block); each mesh axis priced from its own link.
    left = rep.get("left_out", {})
    check(left.get("a model chunk would hold no block", 0) > 0, f"left_out {left}: wanted the chunk refusals counted")
    check("mesh candidate(s) left out before sizing" in p.stdout, "the first lines do not count the refused mesh candidates")
    links = rep["rates"]["links"]
    for i, c in enumerate(cands):
        ch, r = c["choice"], c["rates"]
        if ch["mesh.tensor"] > 1:
            own = [v for k, v in links.items() if k.startswith(f"all_reduce tensor P{ch['mesh.pipeline']}T{ch['mesh.tensor']} ")]
            check(any(v["bytes_per_s"] == r["tensor_bytes_per_s"] and v["alpha_s"] == r["tensor_alpha_s"] for v in own),
                  f"candidate {i}: tensor rates {r['tensor_alpha_s']}, {r['tensor_bytes_per_s']} are not its tensor group's link {own}")
        else:
            check(c["predicted"]["tensor_comm_s"] == 0, f"candidate {i}: tensor collectives without a tensor group")
        if ch["mesh.pipeline"] > 1:
            own = [v for k, v in links.items() if k.startswith(f"stage_link P{ch['mesh.pipeline']} ")]
            check(any(v["bytes_per_s"] == r["p2p_bytes_per_s"] for v in own), f"candidate {i}: stage link not probed: {own}")
            if c["shape"]["ranks_per_host"] == c["shape"]["ranks"]:  # stages sharing the host's cores
                own = [v for k, v in probes.items()
                       if k.startswith(f"stage_idle_share P{ch['mesh.pipeline']} ") and f" B{ch['batch.micro_batch']} " in k]
                check(len(own) == 1 and r["idle_share"] == own[0] and 0 < own[0] <= 1,
                      f"candidate {i}: idle_share {r['idle_share']} is not its stage idle probe's {own}")
            check(c["choice"]["zero.stage"] <= 1 and len(c["shape"]["stage_blocks"]) == ch["mesh.pipeline"],
                  f"candidate {i}: stages {c['shape']['stage_blocks']} at ZeRO stage {c['choice']['zero.stage']}")
        else:
            check(c["predicted"]["bubble_s"] == 0 and c["predicted"]["p2p_s"] == 0, f"candidate {i}: a bubble without stages")

    # Sorted, and the written plan is the first.
    steps = [c["predicted"]["step_s"] for c in cands]
    check(steps == sorted(steps), "the report's candidates are not sorted by predicted step time")
    best = json.load(open(out))
    for k, v in cands[0]["choice"].items():
        sec, key = k.split(".")
        check(best[sec][key] == v, f"--out's {k} = {best[sec][key]}, the first candidate's is {v}")

    # Memory against train estimate, plan by plan (a sample: first, last, and a few between).
    sample = {0, len(cands) - 1, len(cands) // 3, 2 * len(cands) // 3}
    for axis in ("mesh.pipeline", "mesh.tensor"):  # and the first of each mesh axis
        meshed = [i for i, c in enumerate(cands) if c["choice"][axis] > 1]
        if check(meshed, f"no candidate with {axis} > 1 in the report"):
            sample.add(meshed[0])
    sample = sorted(sample)
    for i in sample:
        c = cands[i]
        cset = [a for k, v in c["choice"].items() for a in ("--set", f"{k}={json.dumps(v) if isinstance(v, bool) else v}")]
        e = run([train, "estimate", "plans/default.json", "--world", "2", "--json"] + sets + cset, world=1)
        if not check(e.returncode == 0, f"estimate of candidate {i} failed: {e.stdout[-300:]}"):
            continue
        est = json.loads(e.stdout)
        mem = est["memory"]
        # With stages, the fullest stage's rank counts; its blocks are the shape's.
        host = max(m.get("host", {}).get("total", 0) + m.get("pinned", {}).get("total", 0)
                   for m in [mem] + [st["memory"] for st in est.get("pipeline_stages", [])])
        if est.get("pipeline_stages"):
            blocks = [float(st["layers"]) for st in est["pipeline_stages"]]
            check(c["shape"]["stage_blocks"] == blocks, f"candidate {i}: stage blocks {c['shape']['stage_blocks']}, the estimate's {blocks}")
        vp = (50257 + 127) // 128 * 128
        want = host + vp * 64 * 4 + OVERHEAD
        check(c["host_bytes_per_rank"] == want, f"candidate {i}: host {c['host_bytes_per_rank']}, estimate + transient + overhead {want}")
        check(c["nvme_bytes_per_rank"] == mem.get("nvme", {}).get("total", 0), f"candidate {i}: nvme bytes differ from the estimate")
        check(c["shape"]["comm_bytes"] == est["bytes_per_step_shard_group"] and
              c["shape"]["comm_bytes"] + c["shape"]["replica_bytes"] + c["shape"]["tensor_bytes"] == est["bytes_per_step"],
              f"candidate {i}: data-axis bytes differ from the estimate's")
        check(c["shape"]["tensor_bytes"] == est["bytes_per_step_tensor_group"], f"candidate {i}: tensor bytes differ from the estimate's")
    e = run([train, "estimate", out, "--world", "2"], world=1)
    check(e.returncode == 0, f"train estimate refused the written plan: {e.stdout[-300:]}")

    # --validate 2.
    measured = [c.get("measured_step_s", 0) for c in cands[:2]]
    check(all(m > 0 for m in measured), f"--validate 2 measured {measured}")
    check("measured fastest" in p.stdout, "no 'measured fastest' line after --validate")
    # two rounds by default, the second in reverse order; a candidate's time is its fastest run
    runs = [c.get("measured_runs_s", []) for c in cands[:2]]
    updates = [c.get("measured_update_runs_s", []) for c in cands[:2]]
    check(all(len(u) == 2 and all(0 < x < y for x, y in zip(u, r)) for u, r in zip(updates, runs)),
          f"--validate: the update's part of each run {updates} is not within its step {runs}")
    check(all(len(r) == 2 for r in runs) and all(m == min(r) for m, r in zip(measured, runs)),
          f"--validate rounds: runs {runs}, measured {measured} (wanted 2 runs each, the fastest counted)")
    order = [l.split(", ")[1].split(" ")[0] for l in p.stdout.splitlines() if l.startswith("  round ")]
    check(order == ["1/2", "2/2", "2/2", "1/2"], f"--validate rounds ran the candidates in order {order}, wanted 1 2 2 1")

    # The cache: reused, then replaced when it names another machine, refused when not ours.
    # (and --out in directories that do not exist yet: made)
    nested = os.path.join(work, "new", "dir", "best.json")
    p2_cmd = plan_cmd[:plan_cmd.index("--validate")] + sets
    p2_cmd[p2_cmd.index(out)] = nested
    p2 = run(p2_cmd)
    check(p2.returncode == 0 and "calibration: 0 probe(s) measured" in p2.stdout, f"second run did not reuse the cache: {p2.stdout[-400:]}")
    check(os.path.isfile(nested) and os.path.isfile(nested[:-len(".json")] + ".report.json"), "--out in a new directory was not written")
    c = json.load(open(cal))
    c["machine"]["host"] = "another-machine"
    json.dump(c, open(cal, "w"))
    p3 = run(plan_cmd[:plan_cmd.index("--validate")] + sets)
    check(p3.returncode == 0 and "another machine" in p3.stdout and "calibration: 0 probe(s) measured" not in p3.stdout,
          f"a cache from another machine was not measured again: {p3.stdout[-400:]}")
    check(json.load(open(cal))["machine"]["host"] != "another-machine", "the other machine's cache was not replaced")

    # Without training data (no --validate): parameter offload's passes from the pass probe, said.
    nodata_out = os.path.join(work, "nodata.json")
    p4 = run([train, "plan", "plans/default.json", "--world", "2", "--global-batch", "8", "--out", nodata_out,
              "--calibration", cal] + sets + ["--set", "data.train=nope/*.bin"])
    if check(p4.returncode == 0 and "no training data" in p4.stdout, f"plan without data: {p4.stdout[-400:]}"):
        rep4 = json.load(open(os.path.join(work, "nodata.report.json")))
        firsts = [v for k, v in rep4["probes"].items() if k.startswith("pass ") and k.endswith(" first")]
        pc = [c["rates"]["pass_first_s"] for c in rep4["candidates"] if c["choice"]["offload.params"] == "nvme"]
        check(pc and all(x in firsts for x in pc), f"without data, pass_first_s {pc[:2]} is not the pass probe's {firsts}")
        fl = [c["rates"]["pass_flush_s"] for c in rep4["candidates"]]
        check(not any(fl), f"without data, a flush {max(fl)} where the pass probe measures none")
        pipes = [v for k, v in rep4["probes"].items() if k.startswith("optimizer_pipeline ")]
        po = [c["rates"]["pipeline_s_per_byte"] for c in rep4["candidates"] if c["choice"]["offload.optimizer"] == "nvme"]
        check(po and all(x in pipes for x in po), f"without data, pipeline_s_per_byte {po[:2]} is not the pipeline probe's {pipes}")

    # Hostile input: one line, exit 1, nothing written.
    foreign = os.path.join(work, "foreign.json")
    open(foreign, "w").write('{"not": "a calibration"}\n')
    fresh = os.path.join(work, "fresh.json")
    base = [train, "plan", "plans/default.json", "--out", fresh] + sets
    cases = [
        ("global batch", base + ["--world", "2", "--global-batch", "5", "--calibration", cal], 2, {}, "does not divide among 2 ranks"),
        ("world unlike launch", base + ["--world", "3", "--calibration", cal], 2, {}, "--world 3 but 2 rank(s)"),
        ("output a directory", [train, "plan", "plans/default.json", "--out", work, "--calibration", cal] + sets, 1, {}, "--out"),
        ("fits nowhere", base + ["--calibration", cal], 1, {"ZT_MEM_AVAILABLE_BYTES": str(100 * MiB)}, "no candidate fits: the smallest needs"),
        ("global batch 0", base + ["--global-batch", "0", "--calibration", cal], 1, {}, "--global-batch must be"),
        ("bad --validate", base + ["--validate", "x", "--calibration", cal], 1, {}, "--validate takes"),
        ("no --validate rounds", base + ["--validate-rounds", "0", "--calibration", cal], 1, {}, "--validate-rounds must be"),
        ("foreign cache", base + ["--calibration", foreign], 1, {}, "not a zerotrain calibration"),
        # Sized against the GPU it will run on (docs/autoplan.md, "On the CUDA backend"): none here
        # (test/emu/autoplan_cuda_emu.sh plans on the emulated one); a build without CUDA says so.
        ("cuda plan, no GPU", base + ["--set", "device=cuda", "--calibration", cal], 1, {}, 'plan: device "cuda" but'),
        ("cuda plan, --validate", base + ["--set", "device=cuda", "--validate", "1", "--calibration", cal], 1, {},
         "on the CUDA backend nothing is predicted"),
        ("no data to validate on", base + ["--validate", "1", "--set", "data.train=nope/*.bin", "--calibration", cal], 1, {},
         "no files match"),
    ]
    for name, cmd, world, xenv, want in cases:
        r = run(cmd, world=world, extra_env=xenv)
        errs = [l for l in r.stdout.splitlines() if l.startswith("error:")]
        ok = r.returncode != 0 and errs and want in errs[0] and not os.path.exists(fresh)
        check(ok, f"{name}: exit {r.returncode}, error lines {errs[:2]} (wanted one containing {want!r})")
        print(f"{name}: {errs[0] if errs else r.stdout[-200:]}")
    check(open(foreign).read() == '{"not": "a calibration"}\n', "the foreign cache file was changed")
    return report(failures, work)


def report(failures, work):
    for f in failures[:40]:
        print("FAIL:", f)
    if not failures:
        shutil.rmtree(work, ignore_errors=True)
        print("PASS")
        return 0
    print(f"{len(failures)} failure(s); files kept in {work}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
