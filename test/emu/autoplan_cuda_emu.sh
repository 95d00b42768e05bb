#!/usr/bin/env bash
# `train plan` on the CUDA backend, under the CUDA emulator (EMULATED, not a GPU): memory only
# (docs/autoplan.md, "On the CUDA backend"). The emulated GPU's memory is capped (ZT_EMU_MEM_MB)
# below what the base plan needs, so the planner must climb the memory ladder:
# - the base plan, trained under the cap, runs out of device memory (the cap binds);
# - the planner's choice is not the base plan, fits by its own count, and is the first of the
#   candidates that fit in the ladder's order (recomputed here from the report);
# - the chosen plan, as written, trains to the end under the same cap, its device memory (the
#   runtime's count, cudaMemGetInfo) within what the planner counted for it plus the 64 MiB kept;
# - --validate is refused in one line (nothing is predicted on the CUDA backend);
# - the shipped default plan, uncapped (the emulator's 16 GiB), is its own choice at one rank, and
#   at two ranks on the one emulated GPU each rank is given half its free memory less the 64 MiB.
# Emulator only: a real GPU's memory cannot be capped (scripts/device/run.sh does not run it).
# usage: autoplan_cuda_emu.sh path/to/zt_train_emu path/to/mpiexec
set -euo pipefail
EMU=${1:?usage: autoplan_cuda_emu.sh path/to/zt_train_emu path/to/mpiexec}
MPIEXEC=${2:?usage: autoplan_cuda_emu.sh path/to/zt_train_emu path/to/mpiexec}
source "$(dirname "$0")/common.sh"
[ "$WHERE" = "EMULATED CUDA, not a GPU" ] || { echo "autoplan_cuda_emu: the emulator only (it caps the GPU's memory)"; exit 1; }
# The cap. Whole logits (classifier_chunk 0) at 256 positions make the micro-batch's share large
# enough to climb past the 64 MiB the planner keeps (`zt_train_emu estimate ... --set device=cuda`):
# B 8 x 1 needs 260.1 MiB on the device, B 4 x 2 155.5 MiB. 270 MiB less the context's 32 MiB
# workspace less the 64 MiB kept leaves 173.9 MiB: B 4 x 2 fits, and B 8 x 1 does not even run.
export ZT_EMU_MEM_MB=270
base=(plans/default.json "${small[@]}" --set data.tokenizer= --set device=cuda --set model.seq_len=256 --set recompute.classifier_chunk=0
  --set batch.micro_batch=8 --set batch.grad_accum=1 --set optim.warmup_steps=2 --set run.steps=2)

# The base plan under the cap: out of device memory.
if "$EMU" "${base[@]}" --set run.log="$work/base/metrics.jsonl" > "$work/base.out" 2>&1; then
  echo "FAIL: the base plan trained under ZT_EMU_MEM_MB=$ZT_EMU_MEM_MB: the cap does not bind"; exit 1
fi
grep -q "out of device memory" "$work/base.out" || { echo "FAIL: the base plan failed, but not out of memory:"; tail -3 "$work/base.out"; exit 1; }

"$EMU" plan "${base[@]}" --out "$work/best.json" --calibration "$work/cal.json" > "$work/plan.out" 2>&1 \
  || { cat "$work/plan.out"; exit 1; }
cat "$work/plan.out"
# The chosen plan as written (its run.steps is the base's 2).
"$EMU" "$work/best.json" --set run.log="$work/chosen/metrics.jsonl" > "$work/chosen.out" 2>&1 \
  || { echo "FAIL: the chosen plan did not train under the cap:"; tail -5 "$work/chosen.out"; exit 1; }
if "$EMU" plan "${base[@]}" --out "$work/v.json" --validate 1 > "$work/validate.out" 2>&1; then
  echo "FAIL: --validate on the CUDA backend was not refused"; exit 1
fi

# The shipped default plan as users run it (its bucket, batch and stage), on the emulator's whole GPU.
shipped=(plans/default.json --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin
  --set data.tokenizer= --set device=cuda)
ZT_EMU_MEM_MB=16384 "$EMU" plan "${shipped[@]}" --out "$work/shipped1.json" > "$work/shipped1.out" 2>&1 \
  || { cat "$work/shipped1.out"; exit 1; }
ZT_EMU_MEM_MB=16384 "$MPIEXEC" -np 2 "$EMU" plan "${shipped[@]}" --world 2 --out "$work/shipped2.json" \
  > "$work/shipped2.out" 2>&1 || { cat "$work/shipped2.out"; exit 1; }

"$PY" - "$work" <<'PY'
import json, os, sys
w = sys.argv[1]
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + what)
    ok &= bool(cond)
rep = json.load(open(f"{w}/best.report.json"))
best = json.load(open(f"{w}/best.json"))
avail = rep["available_device_bytes_per_rank"]
cands = rep["candidates"]
check(rep["chosen_by"] == "memory ladder" and rep["backend"].startswith("cuda-"), f"report: {rep['backend']}, chosen by {rep['chosen_by']}")
check(cands and all(c["device_bytes_per_rank"] <= avail for c in cands),
      f"every candidate in the report fits the device: {len(cands)} of them, largest "
      f"{max(c['device_bytes_per_rank'] for c in cands) if cands else 0} <= {avail} bytes")
def key(ch):
    pol, every = ch["recompute.policy"], ch["recompute.every"]
    off = 2 if ch["offload.params"] != "none" else 1 if ch["offload.optimizer"] != "none" else 0
    rec = 0 if pol == "none" else 1 if pol == "selective" else 2 if every > 1 else 3
    return (off, ch["zero.stage"], rec, -ch["batch.micro_batch"], not ch["zero.overlap_comm"], -ch["zero.bucket_mb"])
first = min(cands, key=lambda c: key(c["choice"]))
chosen = {"zero.stage": best["zero"]["stage"], "offload.optimizer": best["offload"]["optimizer"],
          "offload.params": best["offload"]["params"], "recompute.policy": best["recompute"]["policy"],
          "recompute.every": best["recompute"]["every"], "batch.micro_batch": best["batch"]["micro_batch"],
          "batch.grad_accum": best["batch"]["grad_accum"], "zero.bucket_mb": best["zero"]["bucket_mb"],
          "zero.overlap_comm": best["zero"]["overlap_comm"]}
def data_axis(ch):  # the keys the memory ladder orders (the mesh is the base plan's on the CUDA backend)
    return {k: ch[k] for k in chosen}
check(data_axis(first["choice"]) == chosen and data_axis(cands[0]["choice"]) == chosen and
      all(c["choice"]["mesh.pipeline"] == 1 and c["choice"]["mesh.tensor"] == 1 for c in cands),
      f"the chosen plan is the ladder's first that fits: {chosen}")
check(chosen["batch.micro_batch"] * chosen["batch.grad_accum"] == 8 and not (chosen["batch.micro_batch"] == 8 and
      chosen["recompute.policy"] == "none" and chosen["offload.optimizer"] == "none"),
      "it keeps the global batch (8 sequences) and is not the base plan (which does not fit)")
rows = [json.loads(l) for l in open(f"{w}/chosen/metrics.jsonl")]
summ = next(r["summary"] for r in rows if "summary" in r)
steps = [r for r in rows if "step" in r and "loss" in r]
used = summ["device_memory"]["used_peak_bytes"]
counted = first["device_bytes_per_rank"]
check(len(steps) == 2, f"the chosen plan trained its 2 steps under the cap (losses {[round(r['loss'], 4) for r in steps]})")
check(used <= counted + rep["device_reserve_bytes"],
      f"its device memory (cudaMemGetInfo) {used} bytes <= counted {counted} + kept {rep['device_reserve_bytes']}")
v = open(f"{w}/validate.out").read().splitlines()
errs = [l for l in v if l.startswith("error:")]
check(len(errs) == 1 and "nothing is predicted" in errs[0], f"--validate refused in one line: {errs}")
for n in (1, 2):
    r = json.load(open(f"{w}/shipped{n}.report.json"))
    p = json.load(open(f"{w}/shipped{n}.json"))
    # Free: 16 GiB less the context's 32 MiB workspace and 64 KiB scratch (256-byte rounded), shared by n.
    free = (16384 << 20) - (32 << 20) - (64 << 10) - 256
    want = free // n - r["device_reserve_bytes"]
    check(abs(r["available_device_bytes_per_rank"] - want) <= 4096,
          f"shipped plan, {n} rank(s): {r['available_device_bytes_per_rank']} bytes per rank on the GPU, "
          f"arithmetic gives {want}")
    check((p["zero"]["stage"], p["batch"]["micro_batch"], p["batch"]["grad_accum"], p["recompute"]["policy"],
           p["offload"]["optimizer"]) == (0, 8, 1, "none", "none"),
          f"shipped plan, {n} rank(s): it fits as it is, and is its own choice")
print(f"autoplan_cuda_emu ({os.environ['WHERE']}): " + ("ok" if ok else "FAILED"))
sys.exit(0 if ok else 1)
PY
