#!/usr/bin/env python3
"""docs/tensor.md's traffic table against `train estimate --json`.

The table between `<!-- formulas: tensor_bytes ... -->` and `<!-- end formulas -->` lists, for tensor
parallelism without and with sequence parallelism (column `sp`), every collective a rank makes on its
tensor group per micro-step: how many (`count`) and the bytes of each (`bytes each`), as Python
expressions in T (mesh.tensor), N (micro_batch x seq_len), C (n_embd), L (n_layer), Rc (blocks
recomputed) and E (bytes per activation element: 4, or 2 for the CUDA backend's bf16). Their sum
times grad_accum must equal the estimate's `bytes_per_step_tensor_group` for every shape below
(and 0 at mesh.tensor 1), so the document cannot drift from the code without this test failing. (That the estimate is what a run sends: test/tensor/tensor_equivalence.py.)

  /usr/bin/python3 test/docs/tensor_doc_check.py --train ./train
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "tensor.md")


def read_table():
    text = open(DOC).read()
    m = re.search(r"<!-- formulas: tensor_bytes.*?-->(.*?)<!-- end formulas -->", text, re.S)
    if not m:
        sys.exit("tensor_doc_check: docs/tensor.md has no tensor_bytes table")
    rows = [l for l in m.group(1).strip().splitlines() if l.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    if header != ["sp", "collective", "where", "count", "bytes each"]:
        sys.exit(f"tensor_doc_check: unexpected header {header}")
    table = {"no": [], "yes": []}
    for line in rows[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        code = lambda c: re.fullmatch(r"`(.*)`", c).group(1)  # noqa: E731
        table[cells[0]].append((cells[2], code(cells[3]), code(cells[4])))
    if not table["no"] or not table["yes"]:
        sys.exit("tensor_doc_check: the table needs rows for sp no and yes")
    return table


# (W, T, sp, n_layer, n_head, n_embd, seq_len, micro_batch, grad_accum, recompute policy, every, stage)
SHAPES = [
    (2, 2, False, 2, 6, 48, 32, 2, 1, "none", 1, 0),
    (4, 2, False, 3, 4, 64, 64, 3, 2, "block", 2, 1),
    (3, 3, False, 2, 6, 48, 31, 1, 1, "selective", 1, 0),
    (8, 4, False, 4, 8, 64, 16, 2, 3, "block", 1, 3),
    (6, 3, False, 5, 3, 96, 27, 2, 1, "none", 1, 2),
    (2, 2, True, 2, 6, 48, 32, 2, 1, "none", 1, 0),
    (4, 2, True, 3, 4, 64, 64, 3, 2, "block", 2, 1),
    (3, 3, True, 2, 6, 48, 30, 1, 1, "selective", 1, 0),
    (8, 4, True, 4, 8, 64, 16, 2, 3, "block", 1, 3),
    (6, 3, True, 5, 3, 96, 27, 2, 1, "block", 3, 2),
]
# On the CUDA backend in bf16 (E = 2; the estimate needs no GPU; head size 16 at least).
BF16_SHAPES = [
    (2, 2, False, 2, 6, 96, 32, 2, 1, "none", 1, 0),
    (4, 2, True, 3, 4, 64, 64, 3, 2, "block", 2, 1),
]


def estimate(train, W, sets):
    args = [train, "estimate", "plans/default.json", "--world", str(W), "--json"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    p = subprocess.run(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {p.stdout}{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    args = ap.parse_args()
    table = read_table()
    failures = []
    cases = [(shape, False) for shape in SHAPES] + [(shape, True) for shape in BF16_SHAPES]
    for (W, T, sp, L, NH, C, seq, B, A, policy, every, stage), bf16 in cases:
        sets = {"model.n_layer": L, "model.n_head": NH, "model.n_embd": C, "model.seq_len": seq,
                "batch.micro_batch": B, "batch.grad_accum": A, "recompute.policy": policy, "recompute.every": every,
                "zero.stage": stage, "mesh.tensor": T, "mesh.sequence_parallel": "true" if sp else "false",
                "data.train": "x", "data.val": "x"}
        if bf16:
            sets.update({"device": "cuda", "precision.compute": "bf16"})
        Rc = (L - 1) // every + 1 if policy == "block" else 0
        env = {"T": T, "N": B * seq, "C": C, "L": L, "Rc": Rc, "E": 2 if bf16 else 4}
        doc = A * sum(eval(count, {}, env) * eval(each, {}, env) for _, count, each in table["yes" if sp else "no"])
        e = estimate(args.train, W, sets)
        got = e.get("bytes_per_step_tensor_group")
        data_axis = e["bytes_per_step"] - got if got is not None else None
        name = f"{'bf16 ' if bf16 else ''}W={W} T={T} sp={'yes' if sp else 'no'} L={L} C={C} seq={seq} B={B} A={A} {policy}/{every} stage {stage}"
        ok = got == doc and e.get("tensor") == T and e.get("data_world") == W // T
        print(f"{'ok ' if ok else 'BAD'} {name}: docs/tensor.md {doc}, estimate {got} (+ {data_axis} on the data axis)")
        if not ok:
            failures.append(f"{name}: docs/tensor.md gives {doc} bytes per step on the tensor group, the estimate "
                            f"{got} (tensor {e.get('tensor')}, data_world {e.get('data_world')})")
        # Without tensor parallelism the same table gives nothing, and the estimate agrees.
        if T == 2 and not sp:
            one = estimate(args.train, W // T, dict(sets, **{"mesh.tensor": 1}))
            if one.get("bytes_per_step_tensor_group") != 0 or one.get("tensor") != 1:
                failures.append(f"{name} at mesh.tensor 1: tensor group bytes {one.get('bytes_per_step_tensor_group')}")
    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
        return 1
    print(f"\nall {len(cases)} shapes: docs/tensor.md's table == train estimate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
