#!/usr/bin/env bash
# Optimizer-state offload (docs/design.md §3.6; the numbers: docs/offload.md), measured on this
# machine in one run:
#   1. CPU AdamW parameters/s: ours (kernels/adamw.cpp) vs torch.optim.AdamW (foreach and the
#      single-tensor loop, same threads) vs the streaming limit measured by the same binary (a
#      kernel with AdamW's 28 bytes/parameter of traffic: read p, g, m, v; write p, m, v).
#   2. Disk: write / read GB/s of our io_uring path (O_DIRECT, 1 MiB pieces, queue depth QD) and of
#      the optimizer's read/write pipeline, vs dd with oflag=direct / iflag=direct, same directory.
#   3. Step time of the same plan (stage 1, one rank) with the moments in memory and in swap files.
#   4. Step time of the same plan at stage 3 (one rank) in memory, with offload.params nvme, and with
#      both offload.params and offload.optimizer nvme (parameter, gradient and optimizer shards on disk).
#   5. The bytes/s of an offloaded step (parameters and optimizer on disk) against the io_uring
#      probes on the same directory around it (mixed: reads and writes at once, the anchor; and
#      sequential), the ratios printed (scripts/bench_offload_rate.sh).
#   scripts/bench_offload.sh [--dir DIR] [--threads N] [--params N] [--mib MIB] [--qd QD]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DIR=runs/bench_offload; THREADS=$(nproc); PARAMS=67108864; MIB=1024; QD=32
while [ $# -gt 0 ]; do
  case $1 in
    --dir) DIR=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --params) PARAMS=$2; shift 2 ;;
    --mib) MIB=$2; shift 2 ;;
    --qd) QD=$2; shift 2 ;;
    *) echo "usage: $0 [--dir DIR] [--threads N] [--params N] [--mib MIB] [--qd QD]" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
BENCH=build/zt_bench_offload
[ -x "$BENCH" ] && [ -x ./train ] || { echo "bench_offload: run make first" >&2; exit 1; }
mkdir -p "$DIR"
out=$(mktemp -d); trap 'rm -rf "$out"; rm -f "$DIR"/dd.tmp "$DIR"/*.swap; rmdir "$DIR" 2>/dev/null || true' EXIT

echo "== 1. AdamW, $PARAMS fp32 parameters, $THREADS threads" >&2
OMP_NUM_THREADS=$THREADS "$BENCH" adamw "$PARAMS" "$THREADS" > "$out/adamw.json"
$PY - "$PARAMS" "$THREADS" > "$out/torch.json" <<'EOF'
import json, sys, time, torch
n, threads = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
res = {}
for name, kw in (("foreach", {"foreach": True}), ("for-loop", {"foreach": False})):
    p = torch.nn.Parameter(torch.full((n,), 0.5))
    p.grad = torch.full((n,), 0.01)
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw)
    opt.step()  # creates the moments
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter(); opt.step(); best = min(best, time.perf_counter() - t0)
    res[name] = n / best
    del opt, p
print(json.dumps(res))
EOF

echo "== 2. disk: $MIB MiB in $DIR, queue depth $QD" >&2
"$BENCH" io "$DIR" "$MIB" "$QD" > "$out/io.json"
dd_rate() { grep -oE '[0-9.,]+ [GMk]B/s' | tail -1; }
# dd gets the same non-zero bytes ours writes (a virtual disk may skip blocks of zeros): a source
# file in the page cache, so reading it costs dd a memory copy, not disk time.
$PY -c "import sys; f = open(sys.argv[1], 'wb'); [f.write(b'\x01' * (1 << 20)) for _ in range(int(sys.argv[2]))]" \
    "$out/ones" "$MIB"
dd if="$out/ones" of=/dev/null bs=1M 2>/dev/null  # warm the page cache
dd if="$out/ones" of="$DIR/dd.tmp" bs=1M count="$MIB" oflag=direct 2>&1 | dd_rate > "$out/dd_write"
rm -f "$out/ones"
dd if="$DIR/dd.tmp" of=/dev/null bs=1M iflag=direct 2>&1 | dd_rate > "$out/dd_read"
rm -f "$DIR/dd.tmp"

echo "== 3. step time, stage 1, one rank, in memory vs offloaded" >&2
model=(--set model.n_layer=4 --set model.n_head=4 --set model.n_embd=256 --set model.seq_len=64
       --set batch.micro_batch=2 --set batch.grad_accum=1 --set run.steps=8 --set optim.warmup_steps=1
       --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0 --set data.tokenizer=
       --set data.train='data/sample/train_*.bin' --set data.val=data/sample/val.bin --set zero.stage=1
       --set run.threads=$THREADS)
for mode in memory nvme s3memory s3params s3both; do
  extra=()
  case $mode in
    nvme) extra=(--set offload.optimizer=nvme --set offload.nvme_dir="$DIR") ;;
    s3memory) extra=(--set zero.stage=3) ;;
    s3params) extra=(--set zero.stage=3 --set offload.params=nvme --set offload.nvme_dir="$DIR") ;;
    s3both) extra=(--set zero.stage=3 --set offload.params=nvme --set offload.optimizer=nvme --set offload.nvme_dir="$DIR") ;;
  esac
  [ $mode != memory ] && [ $mode != nvme ] && echo "== 4. step time, stage 3, one rank: $mode" >&2
  ./train plans/default.json "${model[@]}" "${extra[@]}" --set run.log="$out/$mode/metrics.jsonl" \
      --set run.trace="$out/$mode/trace.json" > "$out/$mode.log" 2>&1 || { cat "$out/$mode.log" >&2; exit 1; }
done

$PY - "$out" <<'EOF'
import glob, json, statistics, sys
out = sys.argv[1]
a = json.load(open(f"{out}/adamw.json")); t = json.load(open(f"{out}/torch.json")); io = json.load(open(f"{out}/io.json"))
def rate(path):
    v, unit = open(path).read().split()
    return float(v.replace(",", ".")) * {"GB/s": 1.0, "MB/s": 1e-3, "kB/s": 1e-6}[unit]
def adamw_ms(mode):
    """Median per-step time, and median duration of the traced AdamW span (steps after the first)."""
    rows = [json.loads(l) for l in open(f"{out}/{mode}/metrics.jsonl")]
    steps = [r["ms"] for r in rows if "ms" in r][1:]
    ev = json.load(open(glob.glob(f"{out}/{mode}/trace*.json")[0]))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    opt = [e["dur"] / 1e3 for e in ev if e.get("name") == "adamw"][1:]
    summ = [r["summary"] for r in rows if "summary" in r][0]
    return statistics.median(steps), statistics.median(opt), summ["peak_rss_bytes"] / 2**20
print(f"AdamW, {a['params']} fp32 parameters, {a['threads']} threads")
print(f"  ours                      {a['adamw_params_per_s'] / 1e6:8.1f} M params/s  {a['adamw_gb_per_s']:6.2f} GB/s")
print(f"  streaming limit (28 B/p)  {a['limit_params_per_s'] / 1e6:8.1f} M params/s  {a['stream_gb_per_s']:6.2f} GB/s"
      f"   ours = {a['adamw_params_per_s'] / a['limit_params_per_s']:.0%} of it")
for k, v in t.items():
    print(f"  torch.optim.AdamW {k:8s}{v / 1e6:8.1f} M params/s   ours = {a['adamw_params_per_s'] / v:.1f}x")
dw, dr = rate(f"{out}/dd_write"), rate(f"{out}/dd_read")
print(f"disk, {io['mib']} MiB, queue depth {io['queue_depth']} (io_uring: {io['io_uring']})")
print(f"  write  ours {io['write_gb_per_s']:6.2f} GB/s   dd oflag=direct {dw:6.2f} GB/s   ours = {io['write_gb_per_s'] / dw:.0%}")
print(f"  read   ours {io['read_gb_per_s']:6.2f} GB/s   dd iflag=direct {dr:6.2f} GB/s   ours = {io['read_gb_per_s'] / dr:.0%}")
print(f"  optimizer pipeline, read + write {io['pipeline_read_plus_write_gb_per_s']:6.2f} GB/s: I/O alone "
      f"{io['pipeline_io_s'] * 1e3:.0f} ms, AdamW alone {io['update_s'] * 1e3:.0f} ms, both pipelined "
      f"{io['pipeline_with_update_s'] * 1e3:.0f} ms ({io['overlap']:.0%} of the shorter hidden)")
(m_step, m_opt, m_rss), (n_step, n_opt, n_rss) = adamw_ms("memory"), adamw_ms("nvme")
print("step time, stage 1, one rank (L=4, C=256: 16.1M parameters, 123 MiB of moments), medians")
print(f"  in memory   step {m_step:7.1f} ms   AdamW {m_opt:6.1f} ms   peak RSS {m_rss:6.1f} MiB")
print(f"  offloaded   step {n_step:7.1f} ms   AdamW {n_opt:6.1f} ms   peak RSS {n_rss:6.1f} MiB"
      f"   step x{n_step / m_step:.2f}")
print("step time, stage 3, one rank (same model: 246 MiB of model states at 16 bytes/parameter), medians")
s3 = {m: adamw_ms(m) for m in ("s3memory", "s3params", "s3both")}
for m, label in (("s3memory", "in memory"), ("s3params", "params+grads on disk"), ("s3both", "params+grads+optimizer")):
    st, op, rss = s3[m]
    print(f"  {label:24s} step {st:7.1f} ms   AdamW {op:6.1f} ms   peak RSS {rss:6.1f} MiB   step x{st / s3['s3memory'][0]:.2f}")
EOF

echo "== 5. offloaded step's bytes/s against the io_uring probes, same directory" >&2
scripts/bench_offload_rate.sh --dir "$DIR" --threads "$THREADS"
