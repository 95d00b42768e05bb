#!/usr/bin/env bash
# One rank on NCCL (comm.backend "nccl" asked for explicitly: "auto" keeps a single rank on MPI) against
# the same run on MPI, under the CUDA emulator (EMULATED, not a GPU) or, from scripts/device/run.sh,
# on a GPU with the real build: a world of one communicates nothing, so every step's loss and the
# final weights must be bit for bit those of the MPI run, in fp32 and bf16, and the run must say and
# record which comm ran ("comm: nccl", plan.json, the summary's comm_backend).
# usage: nccl_world1_emu.sh path/to/zt_train_emu (or ./train on a GPU)
set -euo pipefail
EMU=${1:?usage: nccl_world1_emu.sh path/to/zt_train_emu}
source "$(dirname "$0")/common.sh"
common=(plans/default.json
  --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer=
  --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=2 --set model.seq_len=64
  --set batch.micro_batch=2 --set batch.grad_accum=2 --set optim.lr=0.003 --set optim.warmup_steps=2
  --set run.steps=4 --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0 --set device=cuda)
for prec in fp32 bf16; do
  for comm in mpi nccl; do
    "$EMU" "${common[@]}" --set precision.compute=$prec --set comm.backend=$comm --set zero.stage=1 \
      --set run.log="$work/${prec}_$comm/metrics.jsonl" --set run.final_weights="$work/${prec}_$comm/w.bin" \
      > "$work/${prec}_$comm.out" 2>&1 || { tail -5 "$work/${prec}_$comm.out"; exit 1; }
  done
done
WHERE="$WHERE" "$PY" - "$work" <<'PY'
import json, os, sys
w = sys.argv[1]
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + what)
    ok &= bool(cond)
for prec in ("fp32", "bf16"):
    rows = {c: [json.loads(l) for l in open(f"{w}/{prec}_{c}/metrics.jsonl")] for c in ("mpi", "nccl")}
    loss = {c: [r["loss"] for r in rows[c] if "step" in r and "loss" in r] for c in rows}
    said = {c: next(r["summary"]["comm_backend"] for r in rows[c] if "summary" in r) for c in rows}
    plan = json.load(open(f"{w}/{prec}_nccl/plan.json"))["comm"]["backend"]
    line = "comm: nccl" in open(f"{w}/{prec}_nccl.out").read()
    same = open(f"{w}/{prec}_mpi/w.bin", "rb").read() == open(f"{w}/{prec}_nccl/w.bin", "rb").read()
    check(len(loss["mpi"]) == 4 and loss["mpi"] == loss["nccl"] and same,
          f"{prec}: NCCL at world 1 against MPI, losses {loss['nccl']} and final weights bit for bit")
    check(said == {"mpi": "mpi", "nccl": "nccl"} and plan == "nccl" and line,
          f"{prec}: the comm that ran is printed and recorded (summary {said}, plan.json {plan!r})")
print(f"nccl_world1_emu ({os.environ['WHERE']}): " + ("ok" if ok else "FAILED"))
sys.exit(0 if ok else 1)
PY
