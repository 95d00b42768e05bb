#!/usr/bin/env bash
# The CUDA backend's NCCL path (comm.backend "nccl", src/comm/nccl_comm.cu) with several ranks under
# the CUDA emulator: each rank an MPI process with its own emulated device (ZT_EMU_DEVICES=3: a host
# with 3 GPUs), its NCCL collectives exchanged between the processes by test/emu/nccl.cpp, in stream
# order, under the emulator's stream-discipline checks. EMULATED: this is not a GPU run.
#   fp32: `mpirun -np 2` and `-np 3` at zero.stage 0-3 against N = 1 with the same global batch
#         (grad_accum x N = 6): every step's loss within 1e-5 relative; and the CPU backend, same bound.
#         Also -np 2 with overlap off (stages 0-3) and with the shipped bucket size (25 MB, stage 2),
#         and -np 2 with grad_accum 1 at stages 0-3 against N = 1 with grad_accum 2.
#   hybrid sharding: -np 4 as 2 shard groups of 2 (zero.shard_group 2: NCCL sub-communicators from
#         ncclCommSplit, the gradient shards summed across the replicas) at stages 1-3 against N = 1
#         with grad_accum 4, 1e-5 relative; bytes, memory and estimate as below (4 emulated GPUs).
#   stream waits: at stage 3 with overlap the compute stream waits on the collectives' events and
#         the host does not block (comm_host_waits 0 every step; the host-staged path: dozens).
#   bf16: -np 2 at stages 0-3 and -np 3 at stage 0 against N = 1 bf16, within 2e-2 relative (test/gpu
#         TenTrainingSteps' bound). NCCL reduces bf16 in bf16 (fp32 adds, a rounding after each,
#         nccl_comm.h); the host-staged path sums in fp32 and rounds once. With 2 ranks that is the
#         same one rounding (checked: equal losses); with 3, NCCL rounds twice: the difference of
#         the two -np 3 runs is printed and held to the same bound.
#   bytes: each run's bytes sent per step (the NCCL comm's collective log) = the theory of
#         docs/zero.md (summary bytes_sent_per_step_theory) = train estimate's bytes_per_step, at 2
#         bytes per bf16 element.
#   no host copies: no pinned "comm" tier (the MPI path's mirrors); train estimate with
#         comm.backend "nccl" equals every run's tracked peak, tier by tier.
#   what runs is said: "comm: nccl" at start, comm.backend "nccl" in plan.json and the summary.
#   refusal: comm.backend "nccl" with 2 ranks on 1 device exits 1 with one line naming ranks and GPU,
#         before anything is allocated; "auto" there runs the host-staged path.
#   hang: rank 1 skips its first collective of step 1 (comm.fault_skip_*), comm.timeout_s 5: a rank
#         prints its recent collectives with the one that timed out, calls ncclCommAbort, and every
#         rank exits non-zero within timeout_s + 15 s (start-up and step 0 included).
#   async error: a lost link on rank 1 (ZT_EMU_NCCL_ASYNC_ERROR, test/emu/nccl.cpp): ncclCommGetAsyncError
#         reports it; rank 1 prints its recent collectives, aborts the communicator, every rank exits
#         non-zero in well under comm.timeout_s.
# usage: nccl_emu.sh path/to/train path/to/zt_train_emu path/to/mpiexec
set -euo pipefail
TRAIN=${1:?usage: nccl_emu.sh train zt_train_emu mpiexec}
EMU=${2:?}
MPIRUN=${3:?}
source "$(dirname "$0")/common.sh"
export ZT_EMU_DEVICES=3
common=(plans/default.json "${small[@]}" --set data.tokenizer= --set optim.lr=0.003 --set optim.warmup_steps=2
  --set run.steps=3 --set run.final_weights="" --set zero.bucket_mb=0.05 --set zero.prefetch_units=2 --set device=cuda)

run() {  # name np precision stage grad_accum [extra --set ...]
  local name=$1 np=$2 prec=$3 stage=$4 accum=$5; shift 5
  local cmd=("$EMU" "${common[@]}" --set comm.backend=nccl --set precision.compute="$prec" --set zero.stage="$stage"
             --set batch.grad_accum="$accum" --set run.log="$work/$name/metrics.jsonl" "$@")
  "$MPIRUN" -np "$np" -x ZT_EMU_DEVICES "${cmd[@]}" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; exit 1; }
  grep -q '^comm: nccl ' "$work/$name.out" || { echo "$name: no 'comm: nccl' line at start"; exit 1; }
  "$EMU" estimate "${cmd[@]:1}" --world "$np" --json 2>/dev/null > "$work/$name.est"
  echo "ran $name: $(grep -c '^step ' "$work/$name.out") steps"
}

# The runs below are independent: two at a time (bg, common.sh), the 3-rank ones first; all checked
# after join. The refusal, hang and async-error runs after them go one at a time (they measure time).
cpu() { "$TRAIN" "${common[@]}" --set device=cpu --set batch.grad_accum=6 --set run.log="$work/cpu/metrics.jsonl" > "$work/cpu.out"; }
mpi_b16() {  # The host-staged bf16 reduction (fp32 sum, one rounding), to measure NCCL's bf16 sum against.
  local np=$1
  "$MPIRUN" -np $np -x ZT_EMU_DEVICES "$EMU" "${common[@]}" --set comm.backend=mpi --set precision.compute=bf16 \
    --set batch.grad_accum=$((6 / np)) --set run.log="$work/b16_n${np}_mpi/metrics.jsonl" > "$work/b16_n${np}_mpi.out" 2>&1 \
    || { cat "$work/b16_n${np}_mpi.out"; exit 1; }
}
for s in 0 1 2 3; do bg run f32_n3_s$s 3 fp32 $s 2; done
bg run b16_n3_s0 3 bf16 0 2
bg mpi_b16 3
for s in 0 1 2 3; do
  bg run f32_n2_s$s 2 fp32 $s 3
  bg run b16_n2_s$s 2 bf16 $s 3
done
for s in 0 1 2 3; do bg run f32_n2_s${s}_ga1 2 fp32 $s 1; done  # grad_accum 1 at N = 2 against f32_n1_ga2
for s in 0 1 2 3; do  # the naive path: per-unit collectives, waited on the spot
  bg run f32_n2_s${s}_blocking 2 fp32 $s 3 --set zero.overlap_comm=false
done
bg run f32_n2_s2_bucket25 2 fp32 2 3 --set zero.bucket_mb=25        # the shipped bucket size: one bucket
bg mpi_b16 2
bg run f32_n1 1 fp32 0 6
bg run b16_n1 1 bf16 0 6
bg run f32_n1_ga2 1 fp32 0 2  # the same global batch as grad_accum 1 at N = 2
bg run f32_n1_ga4 1 fp32 0 4  # ... as 4 ranks with grad_accum 1
for s in 1 2 3; do ZT_EMU_DEVICES=4 bg run f32_n4_s${s}_hybrid 4 fp32 $s 1 --set zero.shard_group=2; done
bg cpu
join

# Ranks sharing a GPU: nccl refused in one line before any allocation; auto takes the host-staged path.
fail=0
if ZT_EMU_DEVICES=1 "$MPIRUN" -np 2 -x ZT_EMU_DEVICES "$EMU" "${common[@]}" --set comm.backend=nccl \
     --set run.log="$work/refused/metrics.jsonl" > "$work/refused.out" 2> "$work/refused.err"; then
  echo "refusal: comm.backend nccl with 2 ranks on 1 GPU ran"; fail=1
fi
want='comm.backend: "nccl" needs a GPU per rank, but 2 ranks on this host share 1 GPU(s) (local ranks 0 and 1 on GPU 0)'
if [ "$(grep -c '^error' "$work/refused.err")" != 1 ] || ! grep -qF "$want" "$work/refused.err" \
   || grep -q 'memory per rank' "$work/refused.out" || [ -e "$work/refused/metrics.jsonl" ]; then
  echo "refusal: FAILED"; cat "$work/refused.err"; fail=1
else echo "refusal: $(grep '^error' "$work/refused.err")"; fi
ZT_EMU_DEVICES=1 "$MPIRUN" -np 2 -x ZT_EMU_DEVICES "$EMU" "${common[@]}" --set run.steps=1 \
  --set run.log="$work/auto/metrics.jsonl" > "$work/auto.out" 2>&1 || { cat "$work/auto.out"; exit 1; }
if grep -q '^comm: mpi (device buffers host-staged' "$work/auto.out" && grep -q '"backend": "mpi"' "$work/auto/plan.json"; then
  echo "auto with 2 ranks on 1 GPU: $(grep '^comm:' "$work/auto.out")"
else echo "auto with 2 ranks on 1 GPU: FAILED"; grep '^comm' "$work/auto.out"; fail=1; fi

# A collective that never completes: the skipping rank's peers wait; the timeout ends every rank.
t0=$(date +%s)
if "$MPIRUN" -np 2 -x ZT_EMU_DEVICES "$EMU" "${common[@]}" --set comm.backend=nccl --set precision.compute=fp32 \
     --set zero.stage=1 --set batch.grad_accum=1 --set comm.timeout_s=5 --set comm.fault_skip_rank=1 \
     --set comm.fault_skip_step=1 --set run.log="$work/hang/metrics.jsonl" > "$work/hang.out" 2> "$work/hang.err"; then
  echo "hang: a skipped collective did not end the run"; fail=1
fi
took=$(( $(date +%s) - t0 ))
if grep -qE 'collective reduce_scatter #[0-9]+ \(.* step 1\) did not complete within 5 s' "$work/hang.err" \
   && grep -q 'TIMED OUT' "$work/hang.err" && grep -q 'zt-emu: ncclCommAbort on rank' "$work/hang.err" && [ "$took" -le 20 ]; then
  echo "hang: every rank ended in ${took} s (timeout 5 s): $(grep -m1 '^error' "$work/hang.err")"
else echo "hang: FAILED (${took} s)"; grep -vE '^\[vm|EMULATED on the CPU' "$work/hang.err" | head -30; fail=1; fi

# An asynchronous NCCL error (a lost link): rank 1's collectives from its 3rd on never complete and
# ncclCommGetAsyncError reports it; that rank prints its recent collectives, aborts the communicator
# and the job ends well within the timeout.
t0=$(date +%s)
if ZT_EMU_NCCL_ASYNC_ERROR=1:3 "$MPIRUN" -np 2 -x ZT_EMU_DEVICES -x ZT_EMU_NCCL_ASYNC_ERROR "$EMU" "${common[@]}" \
     --set comm.backend=nccl --set zero.stage=2 --set batch.grad_accum=1 --set comm.timeout_s=30 \
     --set run.log="$work/async/metrics.jsonl" > "$work/async.out" 2> "$work/async.err"; then
  echo "async error: a broken link did not end the run"; fail=1
fi
took=$(( $(date +%s) - t0 ))
if grep -qE '^rank 1: NCCL reported an asynchronous error \(.*\) with collective [a-z_]+ #[0-9]+ in flight' "$work/async.err" \
   && grep -q ' pending since' "$work/async.err" && grep -q 'zt-emu: ncclCommAbort on rank 1' "$work/async.err" \
   && grep -q '^error: rank 1: NCCL reported an asynchronous error' "$work/async.err" && [ "$took" -le 25 ]; then
  echo "async error: every rank ended in ${took} s (timeout 30 s): $(grep -m1 '^error' "$work/async.err")"
else echo "async error: FAILED (${took} s)"; grep -vE '^\[vm|EMULATED on the CPU' "$work/async.err" | head -30; fail=1; fi

FAIL=$fail "$PY" - "$work" <<'PY'
import glob, json, os, sys
w = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl")]
def losses(name):
    return [r["loss"] for r in rows(name) if "loss" in r and "step" in r]
def summary(name):
    return next(r["summary"] for r in rows(name) if "summary" in r)
ok = os.environ["FAIL"] == "0"
def check(name, ref, bound):
    global ok
    a, b = losses(name), losses(ref)
    err = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(a) == len(b) == 3 else float("inf")
    good = err <= bound
    ok &= good
    print(f"{name:12s} vs {ref:10s}: {' '.join(f'{x:.6f}' for x in a)}  max rel err {err:.2e} (bound {bound:g}) "
          f"{'ok' if good else 'FAILED'}")
    return err
check("f32_n1", "cpu", 1e-5)
for s in range(4):
    for n in (2, 3):
        check(f"f32_n{n}_s{s}", "f32_n1", 1e-5)
        check(f"f32_n{n}_s{s}", "cpu", 1e-5)
for s in range(4):
    check(f"b16_n2_s{s}", "b16_n1", 2e-2)
check("b16_n3_s0", "b16_n1", 2e-2)
for s in range(4):
    check(f"f32_n2_s{s}_ga1", "f32_n1_ga2", 1e-5)
for s in range(4):
    check(f"f32_n2_s{s}_blocking", "f32_n1", 1e-5)
for s in (1, 2, 3):
    check(f"f32_n4_s{s}_hybrid", "f32_n1_ga4", 1e-5)
    sm = summary(f"f32_n4_s{s}_hybrid")
    good = (sm["shard_group"], sm["replicas"]) == (2, 2) and sm["bytes_replicate_group_per_step"] > 0 and \
        sm["bytes_replicate_group_per_step"] == sm["bytes_replicate_group_per_step_theory"] and \
        sm["bytes_shard_group_per_step"] == sm["bytes_shard_group_per_step_theory"]
    ok &= good
    print(f"f32_n4_s{s}_hybrid bytes per step: shard group {sm['bytes_shard_group_per_step']}, replicas "
          f"{sm['bytes_replicate_group_per_step']} (theory {sm['bytes_replicate_group_per_step_theory']}): "
          f"{'ok' if good else 'FAILED'}")
# Stage 3 with overlap: gathered units and reduced buckets are waited for by the compute stream
# (an event), not by the host; the host waits only at a pass's ends, when they are complete.
for name in ("f32_n2_s3", "f32_n3_s3", "b16_n2_s3", "f32_n2_s3_ga1"):
    waits = [r["comm_host_waits"] for r in rows(name) if "comm_host_waits" in r]
    good = len(waits) == 3 and max(waits) == 0
    ok &= good
    print(f"{name:12s} host waits per step {waits} (the host-staged path: dozens): {'ok' if good else 'FAILED'}")
check("f32_n2_s2_bucket25", "f32_n1", 1e-5)
e2 = check("b16_n2_s0", "b16_n2_mpi", 0.0)  # one rounding either way
e3 = check("b16_n3_s0", "b16_n3_mpi", 2e-2)
print(f"bf16 reductions, NCCL's bf16 sum vs the host-staged fp32 sum, stage 0: max rel loss diff {e2:.2e} at N = 2, "
      f"{e3:.2e} at N = 3")
runs = [os.path.basename(p)[:-4] for p in sorted(glob.glob(f"{w}/*.est"))]
for name in runs:
    sm = summary(name)
    plan = json.load(open(f"{w}/{name}/plan.json"))
    mem = sm["peak_memory_bytes"]
    said = sm.get("comm_backend") == "nccl" and plan["comm"]["backend"] == "nccl"
    got, theory = sm["bytes_sent_per_step"], sm["bytes_sent_per_step_theory"]
    est = json.load(open(f"{w}/{name}.est"))
    e = est["memory"]
    good = said and got == theory == est["bytes_per_step"] and "comm" not in mem.get("pinned", {}) and e == mem
    ok &= good
    print(f"{name:12s} bytes/step {got} (theory {theory}, estimate {est['bytes_per_step']}), "
          f"pinned comm {mem.get('pinned', {}).get('comm', 0)}, "
          f"estimate {'==' if e == mem else '!='} tracked, backend recorded {said}: {'ok' if good else 'FAILED'}")
print("nccl_emu (" + os.environ["WHERE"] + "):", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
