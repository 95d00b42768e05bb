# shellcheck shell=bash disable=SC2034  # sourced: TRAIN_SETS, LAUNCH, WHERE, L.. are for the caller
# Shared pieces of the training benchmarks that run ranks under mpirun, on this machine or across
# namespace hosts (scripts/cluster). Sourced, not run: scripts/bench_comm.sh, scripts/bench_hybrid.sh.
#
#   bench_model NAME        set L NH C T B for a benchmark model (BENCH_MODELS lists the names);
#                           unknown: a line naming the known ones, return 2
#   bench_train_sets        fill the array TRAIN_SETS with the --set options every benchmark run
#                           shares: the model (L NH C T B), grad_accum 1, data/sample, no eval
#                           (one batch at the end), no samples, one thread per rank
#   bench_env               the environment of the ranks (root may run mpirun; one OpenMP thread)
#   bench_outdir            a temporary directory $out for the runs' logs, removed at exit; with
#                           BENCH_KEEP=DIR its contents are copied there first (function keep)
#   bench_cluster NAME HOSTS PER_HOST RATE
#                           make the namespace hosts (cluster NAME, exported as ZT_CLUSTER) and remove
#                           them at exit whatever ends the script (then keep), limit every host's
#                           egress to RATE with tc tbf ("off": unlimited veth), set LAUNCH (mpirun on
#                           host 0, PER_HOST ranks on each host, by slot: consecutive ranks share a
#                           host) and WHERE (a line saying so)
#
# Models: gpt2-124m = L12 H12 C768 at seq_len 64, micro_batch 1 (~2.4 GB per rank);
#         small     = L4 H4 C256 at seq_len 64, micro_batch 2;
#         mh        = L6 H6 C384 at seq_len 64, micro_batch 2 (~30M parameters: 120 MB sent per
#                     step at stages 0-1 with 2 ranks; issue 14's model);
#         ovl       = the same model at seq_len 128, micro_batch 8 (the multi-host default): 8x
#                     the tokens, so compute is a few times the 1 Gbit/s link's ~2 s per step
#                     (compute grows with B*T, bytes with the parameters): something to hide.
#         deep      = ovl with twice the layers (L12 H6 C384, ~41M parameters): the blocks are about
#                     half the bytes and most of the compute (the head's share of forward halves).
#         emb       = ovl at micro_batch 4 (issue 55's embedding-heavy model: the embedding's 19.3M
#                     parameters outweigh the blocks' 10.6M, and at half ovl's tokens compute and
#                     the 1 Gbit/s link's time per step are about equal).
#         tiny      = L2 H2 C64 at seq_len 32, micro_batch 2 (~3.3M parameters, nearly all the
#                     embedding): a run in seconds, for checking a benchmark script, not for numbers.
BENCH_MODELS="gpt2-124m, small, mh, ovl, deep, emb or tiny"

bench_model() {
  case $1 in
    mh) L=6 NH=6 C=384 T=64 B=2 ;;
    ovl) L=6 NH=6 C=384 T=128 B=8 ;;
    deep) L=12 NH=6 C=384 T=128 B=8 ;;
    emb) L=6 NH=6 C=384 T=128 B=4 ;;
    gpt2-124m) L=12 NH=12 C=768 T=64 B=1 ;;
    small) L=4 NH=4 C=256 T=64 B=2 ;;
    tiny) L=2 NH=2 C=64 T=32 B=2 ;;
    *) echo "$(basename "$0" .sh): unknown --model $1 ($BENCH_MODELS)" >&2; return 2 ;;
  esac
}

bench_train_sets() {
  TRAIN_SETS=(--set model.n_layer="$L" --set model.n_head="$NH" --set model.n_embd="$C" --set model.seq_len="$T"
    --set batch.micro_batch="$B" --set batch.grad_accum=1
    --set 'data.train=data/sample/train_*.bin' --set data.val=data/sample/val.bin --set data.tokenizer=
    --set run.eval_every=0 --set run.eval_batches=1 --set run.sample_every=0 --set run.threads=1)
}

bench_env() {
  if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  export OMP_NUM_THREADS=1
}

keep() { [ -z "${BENCH_KEEP:-}" ] || cp -r "$out/." "$BENCH_KEEP/"; rm -rf "$out"; }

bench_outdir() {
  out=$(mktemp -d)
  trap keep EXIT
}

bench_cluster() {
  local name=$1 hosts=$2 per_host=$3 rate=$4
  export ZT_CLUSTER=$name
  trap 'scripts/cluster down; keep' EXIT
  trap 'exit 130' INT TERM  # through the EXIT trap: the namespaces go whatever ends the run
  scripts/cluster up "$hosts" >/dev/null
  [ "$rate" = off ] || scripts/cluster shape "$rate"
  local hl; hl=$(scripts/cluster hosts | sed "s/\$/:$per_host/" | paste -sd,)
  LAUNCH=(scripts/cluster mpirun --oversubscribe -np $((hosts * per_host)) -H "$hl")
  WHERE="$hosts hosts x $per_host rank$([ "$per_host" = 1 ] || echo s) x 1 thread, TCP, link $rate (tc tbf)"
}
