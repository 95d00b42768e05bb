#!/usr/bin/env python3
"""Every formula in docs/zero.md against `train estimate --json`.

The formulas are read from the document itself (the tables between `<!-- formulas: ... -->` and
`<!-- end formulas -->`, plus the activation formula), so the document cannot drift from the code
without this test failing. The symbols they use (Ψ, P0, Pe, Pl, Pc, Pmax, Pblk, Bk, S, G, X) are computed
here from the layout rules written out independently of the C++ code (test/zero/layout_rules.py:
units: embedding (Vp+T)·C, at stage 3 in block-sized row chunks, blocks 12C²+13C, final norm 2C,
each padded to lcm(N, 128); buckets: blocks and final norm from the final norm down, closed once
they hold bucket_mb MiB, one unit per bucket without overlap; each embedding unit alone).

  /usr/bin/python3 test/docs/zero_doc_check.py --train ./train
"""
import argparse
import itertools
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "test", "zero"))
import layout_rules  # noqa: E402  (the layout's size rules, shared with the multi-rank tests)
DOC = os.path.join(ROOT, "docs", "zero.md")


def read_tables():
    text = open(DOC).read()
    tables = {}
    for name, body in re.findall(r"<!-- formulas: (\S+).*?-->(.*?)<!-- end formulas -->", text, re.S):
        rows = [l for l in body.strip().splitlines() if l.startswith("|")]
        header = [c.strip() for c in rows[0].strip("|").split("|")]
        table = {}
        for line in rows[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            stage = int(cells[0])
            table[stage] = {h: re.fullmatch(r"`(.*)`", c).group(1) for h, c in zip(header[1:], cells[1:])}
        tables[name] = table
    m = re.search(r"Activations do not depend on the stage: `([^`]*)` bytes", text)
    if not m:
        sys.exit("zero_doc_check: docs/zero.md has no activation formula in the expected sentence")
    tables["activations"] = m.group(1)
    if set(tables) != {"memory", "bytes_per_step", "activations"}:
        sys.exit(f"zero_doc_check: expected the memory and bytes_per_step tables, found {sorted(tables)}")
    for name in ("memory", "bytes_per_step"):
        if sorted(tables[name]) != [0, 1, 2, 3]:
            sys.exit(f"zero_doc_check: table {name} must have rows for stages 0-3")
    return tables


def paper_rows():
    """docs/zero.md's comparison with the paper: our columns (memory in bytes, written as multiples
    of Ψ with "+ comm" for the communication buffers; elements sent, without the ring's (N-1)/N)
    as Python expressions."""
    text = open(DOC).read()
    rows = {}
    for stage, name in enumerate(("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")):
        m = re.search(r"^\| " + name + r"[^|]*\|[^|]*\|([^|]*)\|[^|]*\|([^|]*)\|$", text, re.M)
        if not m:
            sys.exit(f"zero_doc_check: no {name} row in the paper comparison of docs/zero.md")

        def py(f):
            f = f.strip().replace("Ψ₀", "P0").replace("Ψ", "psi")
            f = re.sub(r"(\d)(psi|P0|Pe|Pl|Pc|X|\()", r"\1*\2", f)
            f = re.sub(r"\)(psi|P0|Pe|Pl|Pc|\()", r")*\1", f)
            return re.sub(r"A\(", "A*(", f)

        mem, sent = py(m.group(1)), py(m.group(2))
        rows[stage] = (mem.replace("+ comm", "").strip(), "+ comm" in mem, sent)
    return rows


def symbols(m, N, stage, overlap, bucket_mb, prefetch, A):
    Vp = (m["V"] + 127) // 128 * 128
    C, T = m["C"], m["T"]
    padded = layout_rules.padded_units(m["L"], C, T, Vp, N, stage)
    E = len(padded) - m["L"] - 1  # embedding units: stage 3 splits the embedding into row chunks
    limit = int(bucket_mb * 1024 * 1024) // 4
    buckets, cur = [], 0
    for u in range(len(padded) - 1, E - 1, -1):
        cur += padded[u]
        if not overlap or cur >= limit:
            buckets.append(cur)
            cur = 0
    if cur:
        buckets.append(cur)
    if E > 1:  # each chunk a bucket of its own, staged like the others
        buckets += padded[:E]
    one = E == 1  # a one-unit embedding: staged in a slot of its own, gathered into slot 0 only
    # The embedding's lookup exchange (stages 0-2, N > 1): every rank's (B, T, C) output gradient
    # and (B, T) token ids, unless that is larger than the embedding itself.
    X = N * m["B"] * T * (C + 1)
    X = X if N > 1 and stage <= 2 and one and X <= padded[0] else 0
    return {"N": N, "A": A, "e": 4, "psi": sum(padded), "P0": padded[0] if one else 0, "Pe": sum(padded[:E]),
            "Pl": padded[E - 1], "Pmax": max(padded), "Pblk": max(padded[1:] if one else padded),
            "Bk": max(buckets), "S": 2 if overlap else 1,
            "G": prefetch + 1 if overlap else 1, "X": X, "B": m["B"], "T": T, "C": C, "NH": m["NH"], "L": m["L"], "Vp": Vp}


def evaluate(expr, env):
    return eval(expr, {"__builtins__": {}}, dict(env))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    args = ap.parse_args()
    tables = read_tables()
    paper = paper_rows()
    models = [  # B*T a multiple of 16 (see the activation note in docs/zero.md)
        {"L": 3, "NH": 5, "C": 35, "T": 32, "B": 2, "V": 50257},
        {"L": 2, "NH": 4, "C": 64, "T": 16, "B": 3, "V": 50257},
        {"L": 4, "NH": 4, "C": 128, "T": 128, "B": 8, "V": 50257},
    ]
    failures, checked = [], 0
    for mi, m in enumerate(models):
        for N, stage, overlap, bucket_mb, A in itertools.product((1, 2, 3, 4), range(4), (True, False), (0.05, 25.0),
                                                                 (1, 3)):
            if mi > 0 and (bucket_mb, A) != (25.0, 3):
                continue  # the full grid on the first model; the others at the shipped bucket size
            prefetch = 2
            sets = {"model.n_layer": m["L"], "model.n_head": m["NH"], "model.n_embd": m["C"], "model.seq_len": m["T"],
                    "batch.micro_batch": m["B"], "batch.grad_accum": A, "zero.stage": stage,
                    "zero.overlap_comm": "true" if overlap else "false", "zero.bucket_mb": bucket_mb,
                    "zero.prefetch_units": prefetch, "data.tokenizer": "",
                    # Whole logits (the activation formula's) with overlap, 7-position classifier
                    # chunks without: at stage 3 with a split embedding, Pc = Pe gathered again.
                    "recompute.classifier_chunk": 0 if overlap else 7,
                    # The formulas are the CPU backend's (fp32, host memory); estimate resolves
                    # device "auto" as a run does, to the GPU where one is visible.
                    "device": "cpu"}
            cmd = [args.train, "estimate", "plans/default.json", "--world", str(N), "--json"]
            for k, v in sets.items():
                cmd += ["--set", f"{k}={v}"]
            p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if p.returncode != 0:
                failures.append(f"estimate failed: {' '.join(cmd)}: {p.stdout.decode(errors='replace').strip()}")
                continue
            est = json.loads(p.stdout)
            env = symbols(m, N, stage, overlap, bucket_mb, prefetch, A)
            env["Pc"] = env["Pe"] if stage == 3 and not overlap and env["Pe"] != env["Pl"] else 0
            where = f"model {mi} N={N} stage={stage} overlap={overlap} bucket_mb={bucket_mb} A={A}"
            mem = est["memory"]["host"]
            for cat, expr in tables["memory"][stage].items():
                want, got = evaluate(expr, env), mem.get(cat, 0)
                checked += 1
                if want != got:
                    failures.append(f"{where}: {cat} = `{expr}` = {want}, estimate says {got}")
            want = evaluate(tables["bytes_per_step"][stage]["bytes per step"], env)
            checked += 1
            if want != est["bytes_per_step"]:
                failures.append(f"{where}: bytes per step {want}, estimate says {est['bytes_per_step']}")
            mem_expr, with_comm, sent_expr = paper[stage]
            states = sum(mem.get(c, 0) for c in ("params", "grads", "optimizer"))
            got = states + (mem.get("comm", 0) if with_comm else 0)
            want = evaluate(mem_expr, env) + (mem.get("comm", 0) if with_comm else 0)
            checked += 2
            if abs(want - got) > 1e-6 * got:
                failures.append(f"{where}: paper table, ours: memory `{mem_expr}` = {want}, estimate says {got}")
            want = evaluate(sent_expr, env) * (N - 1) / N * env["e"]
            if abs(want - est["bytes_per_step"]) > 1e-6 * max(1, want):
                failures.append(f"{where}: paper table, ours: sent `{sent_expr}` x (N-1)/N x e = {want}, "
                                f"estimate says {est['bytes_per_step']}")
            if not overlap:
                continue  # classifier chunks: the activation formula is for whole logits
            want = evaluate(tables["activations"], env)
            checked += 1
            if want != mem.get("activations"):
                failures.append(f"{where}: activations {want}, estimate says {mem.get('activations')}")
    if failures:
        print(f"zero_doc_check FAILED ({len(failures)} of {checked} comparisons):")
        for f in failures[:30]:
            print("  - " + f)
        sys.exit(1)
    print(f"zero_doc_check passed: {checked} comparisons of docs/zero.md's formulas with train estimate")


if __name__ == "__main__":
    main()
