#!/usr/bin/python3
"""offload.optimizer "nvme" (docs/design.md §3.6), end to end on the CPU backend.

  parity    the zero_equivalence model (test/zero/zero_equivalence.py), 20 steps, N in {1, 3} x stage 1-3:
            with the AdamW moments in swap files (sub-groups of 2 I/O blocks, so every shard is
            several sub-groups and the read / update / write pipeline runs full) the loss curve and
            the final weights are BIT FOR BIT those of the same plan without offload (and once more
            with buffered I/O, as on a filesystem without O_DIRECT). Tracked peak
            memory equals `train estimate` in every tier (host and nvme), the estimate puts the
            moments (2 x 4 bytes x the shard) in the nvme tier and none in host memory, and no
            swap file is left afterwards.
  rss       a model with ~52 MiB of moments (C 128, L 2, N 1, stage 1): the measured peak resident
            memory (VmHWM) falls by at least 80% of the moments' bytes with offload.
  cleanup   swap files are held open while a run trains (one per rank per state, the estimate's
            size padded to 4 KiB) with no name on disk (found through /proc), and are gone after
            SIGTERM (N = 1, and N = 2 through mpirun, which forwards it), SIGINT, SIGHUP, SIGQUIT,
            SIGKILL, two SIGTERMs 0.01 / 0.05 / 0.15 s apart with checkpoint.dir (the second one
            ends the process at once), and after an error in the middle of a run (a diverged loss
            at N = 1 and 3; a hung collective at N = 2, which ends in MPI_Abort); SIGUSR1 without
            checkpoint.dir is ignored with a warning; a missing nvme_dir is created. At start,
            named swap files of processes that no longer run on this host are removed in one line
            and their space counted; those of live processes and other hosts stay byte-identical
            and are named when the space falls short.

offload.params "nvme" (stage 3: the parameter and gradient shards in swap files):

  params    N in {1, 3} x grad_accum {1, 2} x with and without the optimizer offloaded too, as a
            covering design (PARAMS_RUNS: every pair of the three factors' values once, 4 runs,
            not 8; a fault of the parameter swap depends on the world (shards), the accumulation
            (the gradient shard read back) or the optimizer's files beside it, not on all three):
            loss curve and final weights BIT FOR BIT those of the same plan in memory; tracked peak =
            estimate in every tier, the parameter and gradient shards (and the moments, when
            offloaded) in the nvme tier and not in host memory; no swap file left.
  inside    offload.overlap_update with optim.grad_clip 0: the optimizer step inside backward
            (zero/optimizer.h), N = 1, 2, 3, grad_accum 1 and 2, parameters, optimizer or both on
            disk: BIT FOR BIT against the plan in memory, on and off; the trace shows the update
            starting before backward ends (on), and never inside it (off).
  prss      a stage-3 model with ~150 MiB of model states per rank (C 256, L 8, N 2): with both
            offloaded, every rank's VmHWM falls by at least 80% of all its model-state bytes
            (parameters, gradients, m, v: 16 bytes per parameter of the shard); saving a
            checkpoint every step, and resuming from it, raise it by at most 25% of them (the
            offloaded states are streamed range by range, never copied whole to host memory).
  pcleanup  four swap files per rank during a run with both offloaded; none after SIGTERM
            (N = 1 and 2) and after an error mid-run (N = 3).

About two minutes on 2 cores.
  /usr/bin/python3 test/offload/offload_equivalence.py [--train ./train] [--mpirun mpirun]
        [--only parity|rss|cleanup|params|inside|prss|pcleanup]
"""
import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "zero"))
import zero_equivalence as zm  # noqa: E402  (the model, plan overrides, environment and launcher)

ROOT = zm.ROOT
BLOCK = 4096
SUBGROUP_MB = 2 * BLOCK / (1 << 20)  # two I/O blocks: 2048 elements per state per sub-group
LARGE = ["--set", "model.n_embd=128", "--set", "model.n_head=4", "--set", "model.n_layer=2",
         "--set", "model.seq_len=64", "--set", "run.steps=3", "--set", "run.final_weights="]


def nvme_sets(swap_dir, subgroup_mb=SUBGROUP_MB):
    return ["--set", "offload.optimizer=nvme", "--set", f"offload.nvme_dir={swap_dir}",
            "--set", f"offload.subgroup_mb={subgroup_mb}"]


def params_sets(swap_dir, optimizer=True, subgroup_mb=SUBGROUP_MB):
    return (nvme_sets(swap_dir, subgroup_mb) if optimizer else
            ["--set", f"offload.nvme_dir={swap_dir}", "--set", f"offload.subgroup_mb={subgroup_mb}"]) + \
        ["--set", "offload.params=nvme"]


def swap_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".swap")) if os.path.isdir(d) else []


def held_files(d):
    """(pid, bytes, links) of every file under d that a process holds open, through /proc: swap
    files have no name on disk while a run uses them (docs/design.md §3.6)."""
    prefix, out = os.path.abspath(d) + "/", []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    out.append((int(pid), st.st_size, st.st_nlink))
            except OSError:
                continue
    return out


def cmd_for(train, mpirun, n, stage, work, extra, accum=1):
    launch = zm.launcher(mpirun, n) if n > 1 else []
    return launch + [train, "plans/default.json"] + zm.plan_sets(stage, True, accum, work, 0.05) + extra


def run(train, mpirun, n, stage, work, extra, timeout=300, accum=1):
    """A finished run: its step losses (as logged), summary, final weights' bytes and estimate."""
    os.makedirs(work, exist_ok=True)
    cmd = cmd_for(train, mpirun, n, stage, work, extra, accum)
    p = subprocess.run(cmd, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    if p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}: {' '.join(cmd)}\n" + "\n".join(out.splitlines()[-12:]))
    rows = [json.loads(l) for l in open(os.path.join(work, "metrics.jsonl"))]
    final = os.path.join(work, "final.bin")
    est = subprocess.run([train, "estimate", "plans/default.json", "--world", str(n), "--json"] + cmd[cmd.index(train) + 2:],
                         cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, check=True, timeout=60)
    return {"losses": [r["loss"] for r in rows if "loss" in r],
            "summary": [r["summary"] for r in rows if "summary" in r][0],
            "weights": open(final, "rb").read() if os.path.exists(final) else b"",
            "estimate": json.loads(est.stdout), "output": out}


# (N, grad_accum, optimizer offloaded too) of params_parity: an orthogonal array, every pair of values once.
PARAMS_RUNS = [(1, 1, False), (1, 2, True), (3, 1, True), (3, 2, False)]
_in_memory = {}  # (N, stage, grad_accum) -> the run of the plan without offload, shared by parity and params


def in_memory(args, tmp, n, stage, accum=1):
    """The plan without offload, run once however many offloaded runs compare with it."""
    if (n, stage, accum) not in _in_memory:
        _in_memory[(n, stage, accum)] = run(args.train, args.mpirun, n, stage,
                                            os.path.join(tmp, f"ref_{n}_{stage}_{accum}"), [], accum=accum)
    return _in_memory[(n, stage, accum)]


def parity(args, tmp, fails):
    for n in (1, 3):
        for stage in (1, 2, 3):
            name = f"N={n} stage {stage}"
            swap = os.path.join(tmp, f"swap_{n}_{stage}")
            ref = in_memory(args, tmp, n, stage)
            off = run(args.train, args.mpirun, n, stage, os.path.join(tmp, f"off_{n}_{stage}"), nvme_sets(swap))
            errs, est = same_run(off, ref), off["estimate"]["memory"]
            shard_bytes = ref["estimate"]["memory"]["host"]["optimizer"]
            if est.get("nvme", {}).get("optimizer") != shard_bytes or "optimizer" in est["host"]:
                errs.append(f"estimate does not put the {shard_bytes} moment bytes in the nvme tier: {est}")
            if "O_DIRECT" not in off["output"]:
                errs.append("the start-up banner does not say the swap files use O_DIRECT")
            if swap_files(swap):
                errs.append(f"swap files left behind: {swap_files(swap)}")
            print(("FAIL " if errs else "ok   ") + f"parity {name}: {len(off['losses'])} losses and final weights "
                  f"bit for bit, tracked = estimate {sorted(est)}" + "".join("\n     " + e for e in errs))
            fails += [f"parity {name}: {e}" for e in errs]


def same_run(off, ref):
    """What an offloaded run must share with the run in memory: losses and final weights bit for
    bit, and its tracked peak equal to its estimate. The differences, as messages."""
    errs = []
    if len(off["losses"]) != zm.STEPS or off["losses"] != ref["losses"]:
        errs.append(f"losses differ: {off['losses'][:3]}... vs {ref['losses'][:3]}...")
    if not ref["weights"] or off["weights"] != ref["weights"]:
        errs.append("final weights differ (or are missing)")
    peak, est = off["summary"]["peak_memory_bytes"], off["estimate"]["memory"]
    if peak != est:
        errs.append(f"tracked peak {peak} != estimate {est}")
    return errs


def params_parity(args, tmp, fails):
    """offload.params nvme at stage 3, alone and with the optimizer, against the plan in memory."""
    pairs = [{(a, b) for a, b, _ in PARAMS_RUNS}, {(a, c) for a, _, c in PARAMS_RUNS}, {(b, c) for _, b, c in PARAMS_RUNS}]
    assert all(len(p) == 4 for p in pairs), PARAMS_RUNS  # every pair of values of two factors
    for n, accum, opt in PARAMS_RUNS:
        ref = in_memory(args, tmp, n, 3, accum)
        name = f"N={n} grad_accum {accum} {'params+optimizer' if opt else 'params'}"
        swap = os.path.join(tmp, f"pswap_{n}_{accum}_{opt}")
        off = run(args.train, args.mpirun, n, 3, os.path.join(tmp, f"poff_{n}_{accum}_{opt}"),
                  params_sets(swap, opt), accum=accum)
        errs, est = same_run(off, ref), off["estimate"]["memory"]
        host, nvme = ref["estimate"]["memory"]["host"], est.get("nvme", {})
        moved = ["params", "grads"] + (["optimizer"] if opt else [])
        for cat in moved:
            if nvme.get(cat) != host[cat] or cat in est["host"]:
                errs.append(f"estimate does not put the {host[cat]} {cat} bytes in the nvme tier: {est}")
        if not opt and est["host"].get("optimizer") != host["optimizer"]:
            errs.append("the moments left host memory without offload.optimizer")
        if swap_files(swap):
            errs.append(f"swap files left behind: {swap_files(swap)}")
        print(("FAIL " if errs else "ok   ") + f"params parity {name}: {len(off['losses'])} losses and final "
              f"weights bit for bit, tracked = estimate, {'+'.join(moved)} in nvme" +
              "".join("\n     " + e for e in errs))
        fails += [f"params parity {name}: {e}" for e in errs]


# (N, grad_accum, placement) of inside_backward: every world size and accumulation, each placement.
INSIDE_RUNS = [(1, 1, "params+optimizer"), (3, 2, "params"), (2, 2, "optimizer")]
NO_CLIP = ["--set", "optim.grad_clip=0"]


def inside_backward(args, tmp, fails):
    """offload.overlap_update with optim.grad_clip 0 at stage 3: the optimizer step runs inside
    backward (zero/optimizer.h). Bit for bit against the same plan in memory (clip 0 too), the
    tracked peak equal to the estimate, and the update seen to start before backward ends: in at
    least one step of the run the trace's first sub-group update comes before that step's
    "finish gradients" (a thread's timing: not every step). offload.overlap_update false: no update
    inside backward at all."""
    for n, accum, what in INSIDE_RUNS:
        name = f"N={n} grad_accum {accum} {what}"
        ref_key = (n, 3, accum, "noclip")
        if ref_key not in _in_memory:
            _in_memory[ref_key] = run(args.train, args.mpirun, n, 3, os.path.join(tmp, f"iref_{n}_{accum}"), NO_CLIP,
                                      accum=accum)
        ref = _in_memory[ref_key]
        swap = os.path.join(tmp, f"iswap_{n}_{accum}")
        sets = nvme_sets(swap) if what == "optimizer" else params_sets(swap, what == "params+optimizer")
        runs = {}
        for overlap in ("true", "false"):
            work = os.path.join(tmp, f"ioff_{n}_{accum}_{overlap}")
            trace = os.path.join(work, "trace.json")
            runs[overlap] = run(args.train, args.mpirun, n, 3, work, sets + NO_CLIP + [
                "--set", f"offload.overlap_update={overlap}", "--set", f"run.trace={trace}"], accum=accum)
            ev = json.load(open(trace.replace(".json", ".rank0.json")))
            ev = ev["traceEvents"] if isinstance(ev, dict) else ev
            updates = sorted(e["ts"] for e in ev if e.get("name") == "adamw (inside backward)")
            finishes = sorted(e["ts"] for e in ev if e.get("name") == "finish gradients")
            runs[overlap]["early"] = sum(u < f for u, f in zip(updates, finishes))
            runs[overlap]["updates"] = len(updates)
        errs = same_run(runs["true"], ref) + same_run(runs["false"], ref)
        on, off = runs["true"], runs["false"]
        if on["updates"] != zm.STEPS or on["early"] == 0:
            errs.append(f"the update did not run inside backward: {on['updates']} updates traced, "
                        f"{on['early']} of them before their step's finish gradients")
        if off["updates"]:
            errs.append(f"offload.overlap_update false still updated inside backward ({off['updates']} steps)")
        if swap_files(swap):
            errs.append(f"swap files left behind: {swap_files(swap)}")
        print(("FAIL " if errs else "ok   ") + f"inside backward {name}: {len(on['losses'])} losses and final weights "
              f"bit for bit (overlap_update on and off), tracked = estimate, the update began inside backward in "
              f"{on['early']} of {on['updates']} steps" + "".join("\n     " + e for e in errs))
        fails += [f"inside backward {name}: {e}" for e in errs]


def headline_plan(args, fails):
    """plans/largest_cpu_nvme.json (the 3B run of docs/offload.md, too long for a test): its estimate puts
    model states of more than twice a 24 GiB machine on disk, and keeps the host part small."""
    p = subprocess.run([args.train, "estimate", "plans/largest_cpu_nvme.json", "--json"], cwd=ROOT, env=zm.env(),
                       stdout=subprocess.PIPE, check=True, timeout=60)
    mem = json.loads(p.stdout)["memory"]
    GiB = 1 << 30
    states = sum(mem["nvme"].get(c, 0) for c in ("params", "grads", "optimizer"))
    host = mem["host"]["total"]
    ok = states >= 2 * 24 * GiB and host <= 6 * GiB and not any(c in mem["host"] for c in ("params", "grads", "optimizer"))
    print(("ok   " if ok else "FAIL ") + f"plans/largest_cpu_nvme.json: {states / GiB:.2f} GiB of model states on disk "
          f"(>= 2 x 24 GiB), {host / GiB:.2f} GiB on the host (<= 6 GiB)")
    if not ok:
        fails.append(f"largest_cpu_nvme estimate: {mem}")


def params_rss(args, tmp, fails):
    """Both offloaded: VmHWM per rank falls by >= 80% of the model states. Two ranks, so the tied
    embedding is split into block-sized chunks (one rank keeps it one unit, and then its read buffer
    and gradient buffer are wte-sized, docs/design.md §3.6); blocks are most of the model (C 256, L 8)."""
    big = ["--set", "model.n_embd=256", "--set", "model.n_head=4", "--set", "model.n_layer=8",
           "--set", "model.seq_len=32", "--set", "run.steps=2", "--set", "run.final_weights=",
           "--set", "zero.bucket_mb=1"]
    ref = run(args.train, args.mpirun, 2, 3, os.path.join(tmp, "prss_ref"), big)
    off = run(args.train, args.mpirun, 2, 3, os.path.join(tmp, "prss_off"),
              big + params_sets(os.path.join(tmp, "prss_swap"), True, 1))
    host = ref["estimate"]["memory"]["host"]
    states = host["params"] + host["grads"] + host["optimizer"]  # per rank
    before, after = max(ref["summary"]["peak_rss_bytes_per_rank"]), max(off["summary"]["peak_rss_bytes_per_rank"])
    fell = before - after
    ok = fell >= 0.8 * states and states >= 100 << 20 and off["losses"] == ref["losses"]
    MiB = 1 << 20
    print(("ok   " if ok else "FAIL ") + f"params rss (N=2, largest rank): VmHWM {before / MiB:.1f} -> {after / MiB:.1f} "
          f"MiB, fell {fell / MiB:.1f} MiB = {fell / states:.0%} of the {states / MiB:.1f} MiB of model states per rank "
          f"(need >= 80%), losses equal: {off['losses'] == ref['losses']}")
    if not ok:
        fails.append("params rss: peak resident memory did not fall by 80% of the model states")
    # Checkpoints of the offloaded states stream them range by range (checkpoint.cpp, state_io.h):
    # a run that saves every step, and one that resumes from it, stay within 25% of the states
    # above the run that never saves: the save holds one tensor's range at a time, the largest
    # being the embedding's shard (~25 MiB here, measured +22-23 MiB = 15-16% alone, +30 MiB = 21%
    # once under the full suite's load at -j2). A host copy of each whole state buffer (a mutation)
    # measured +55 MiB = 38%; of all of them at once it would be 100%.
    ckpt = os.path.join(tmp, "prss_ckpt")
    sets = big + params_sets(os.path.join(tmp, "prss_swap"), True, 1) + ["--set", f"checkpoint.dir={ckpt}"]
    saved = run(args.train, args.mpirun, 2, 3, os.path.join(tmp, "prss_save"), sets + ["--set", "checkpoint.every=1"])
    resumed = run(args.train, args.mpirun, 2, 3, os.path.join(tmp, "prss_resume"),
                  sets + ["--set", "checkpoint.resume=auto", "--set", "run.steps=3"])
    for name, r in (("save every step", saved), ("resume", resumed)):
        peak = max(r["summary"]["peak_rss_bytes_per_rank"])
        rise = peak - after
        good = rise <= 0.25 * states
        print(("ok   " if good else "FAIL ") + f"params rss with checkpoints ({name}): VmHWM {peak / MiB:.1f} MiB, "
              f"{rise / MiB:+.1f} MiB against the run without = {rise / states:.0%} of the model states (need <= 25%)")
        if not good:
            fails.append(f"params rss: a checkpoint ({name}) of offloaded states raised peak resident memory by more than 25%")
    if len(resumed["losses"]) != 1 or resumed["losses"][0] is None:
        fails.append("params rss: the resumed run did not run its one remaining step")


def buffered(args, tmp, fails):
    """A filesystem without O_DIRECT (acted out with ZT_NVME_NO_DIRECT): buffered I/O, said at start,
    the same numbers."""
    ref = run(args.train, args.mpirun, 1, 2, os.path.join(tmp, "buf_ref"), [])
    os.environ["ZT_NVME_NO_DIRECT"] = "1"
    try:
        off = run(args.train, args.mpirun, 1, 2, os.path.join(tmp, "buf_off"), nvme_sets(os.path.join(tmp, "buf_swap")))
    finally:
        del os.environ["ZT_NVME_NO_DIRECT"]
    ok = "buffered: the filesystem refused O_DIRECT" in off["output"] and off["losses"] == ref["losses"] and \
        off["weights"] == ref["weights"]
    print(("ok   " if ok else "FAIL ") + "buffered fallback (no O_DIRECT): said at start, bit for bit at N=1 stage 2")
    if not ok:
        fails.append("buffered fallback")


def rss(args, tmp, fails):
    ref = run(args.train, args.mpirun, 1, 1, os.path.join(tmp, "rss_ref"), LARGE)
    off = run(args.train, args.mpirun, 1, 1, os.path.join(tmp, "rss_off"), LARGE + nvme_sets(os.path.join(tmp, "rss_swap"), 1))
    moments = ref["estimate"]["memory"]["host"]["optimizer"]
    fell = ref["summary"]["peak_rss_bytes"] - off["summary"]["peak_rss_bytes"]
    ok = fell >= 0.8 * moments and moments >= 40 << 20
    MiB = 1 << 20
    print(("ok   " if ok else "FAIL ") + f"rss: VmHWM {ref['summary']['peak_rss_bytes'] / MiB:.1f} -> "
          f"{off['summary']['peak_rss_bytes'] / MiB:.1f} MiB, fell {fell / MiB:.1f} MiB = {fell / moments:.0%} of the "
          f"{moments / MiB:.1f} MiB of moments (need >= 80%)")
    if not ok:
        fails.append("rss: peak resident memory did not fall by 80% of the moments")


def start(args, n, work, swap, extra, stage=2, sets=None):
    os.makedirs(work, exist_ok=True)
    cmd = cmd_for(args.train, args.mpirun, n, stage, work, (sets if sets is not None else nvme_sets(swap)) + extra)
    return subprocess.Popen(cmd, cwd=ROOT, env=zm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True,  # no core file from SIGQUIT
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)))


def wait_gone(swap, seconds=10):
    """What is left of the swap files: names in the directory, and files a process still holds."""
    t0 = time.monotonic()
    while (swap_files(swap) or held_files(swap)) and time.monotonic() - t0 < seconds:
        time.sleep(0.1)
    return swap_files(swap) + [f"held by pid {h[0]}" for h in held_files(swap)]


def killed(args, tmp, n, sig, fails, params=False, then=(), extra=(), name=None):
    """Signal `sig` to a training run once its swap files are open and a step is logged, then `then`: (seconds, signal)
    pairs sent that long after the one before. No swap file may be left, named or held."""
    name = name or f"{signal.Signals(sig).name} at N={n}" + (" (params + optimizer)" if params else "")
    work = os.path.join(tmp, "sig_" + "".join(c if c.isalnum() else "_" for c in name))
    swap = os.path.join(work, "new", "swap")
    stage, sets = (3, params_sets(swap)) if params else (2, nvme_sets(swap))
    est = run_estimate(args, n, work, swap, stage, sets)
    want = [b["bytes"] for b in est["buffers"] if b["tier"] == "nvme"]
    per_rank = len(want)
    p = start(args, n, work, swap, ["--set", "run.steps=100000"] + list(extra), stage, sets)
    t0, held = time.monotonic(), []
    while time.monotonic() - t0 < 60 and p.poll() is None:
        held = held_files(swap)
        if len(held) == per_rank * n:
            break
        time.sleep(0.05)
    named = swap_files(swap)
    sizes = sorted(h[1] for h in held)
    log = os.path.join(work, "metrics.jsonl")  # signalled while it trains (the step handlers are installed)
    while time.monotonic() - t0 < 60 and p.poll() is None and not (os.path.exists(log) and '"loss"' in open(log).read()):
        time.sleep(0.02)
    padded = sorted((b + BLOCK - 1) // BLOCK * BLOCK for b in want * n)
    os.kill(p.pid, sig)
    alive_after = None
    for delay, s in then:
        time.sleep(delay)
        if alive_after is None:
            alive_after = p.poll() is None
        try:
            os.kill(p.pid, s)
        except ProcessLookupError:
            pass
    try:
        out = p.communicate(timeout=60)[0].decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out = p.communicate()[0].decode(errors="replace")
    left = wait_gone(swap)
    errs = []
    if len(held) != per_rank * n or sizes != padded:
        errs.append(f"during the run: {len(held)} swap files held open, of sizes {sizes}, expected {per_rank * n} of {padded}")
    if named or any(h[2] != 0 for h in held):
        errs.append(f"during the run the swap files have names on disk (links {[h[2] for h in held]}): {named}")
    if p.returncode == 0 and not then:
        errs.append("exit code 0")
    if left:
        errs.append(f"left behind: {left}")
    print(("FAIL " if errs else "ok   ") + f"cleanup {name}: {len(held)} unnamed swap files during the run "
          f"({sizes[0] if sizes else 0} bytes each), {len(left)} after (exit {p.returncode})" +
          "".join("\n     " + e for e in errs) + ("\n" + out[-800:] if errs else ""))
    fails += [f"cleanup {name}: {e}" for e in errs]
    return out, alive_after


def signals_without_dir(args, tmp, fails):
    """SIGUSR1 asks for a checkpoint: without checkpoint.dir the run goes on, with one warning."""
    out, alive = killed(args, tmp, 1, signal.SIGUSR1, fails, then=[(0.5, signal.SIGTERM)],
                        name="SIGUSR1 without checkpoint.dir, then SIGTERM")
    warning = "warning: SIGUSR1 asks for a checkpoint, but checkpoint.dir is not set"
    ok = alive and out.count(warning) == 1
    print(("ok   " if ok else "FAIL ") + f"SIGUSR1 without checkpoint.dir: running 0.5 s later: {alive}, "
          f"warned once: {out.count(warning) == 1}")
    if not ok:
        fails.append("SIGUSR1 without checkpoint.dir ended the run or did not warn once")


def digest(d):
    return {f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest() for f in sorted(os.listdir(d))}


def stale_at_start(args, tmp, fails):
    """Named swap files of dead processes on this host (a kill in the moment between creating and
    unlinking one, or an earlier version) are removed at start and count as free space; the files
    of a live process, of another host and anything else stay byte-identical."""
    work = os.path.join(tmp, "stale")
    swap = os.path.join(work, "swap")
    os.makedirs(swap)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    host, MiB = socket.gethostname(), 1 << 20
    stale = {f"zerotrain.r0.p{gone.pid}@{host}.adam_m.swap": 3 * MiB,
             f"zerotrain.r1.p{gone.pid}.adam_v.swap": MiB}  # an earlier version's name: no host
    live = f"zerotrain.r0.p{os.getpid()}@{host}.adam_m.swap"
    kept = {live: MiB, f"zerotrain.r0.p{gone.pid}@elsewhere.example.adam_m.swap": MiB, "notes.txt": 100}
    for f, size in {**stale, **kept}.items():
        with open(os.path.join(swap, f), "wb") as fh:
            fh.write(os.urandom(size))
    before = digest(swap)
    need = sum((b["bytes"] + BLOCK - 1) // BLOCK * BLOCK for b in run_estimate(args, 1, work, swap)["buffers"]
               if b["tier"] == "nvme")
    results = []
    for free in (need - 2 * MiB, 0):  # enough only with the stale files' 4 MiB; not enough at all
        os.environ["ZT_NVME_FREE_BYTES"] = str(max(free, 0))
        try:
            p = start(args, 1, work, swap, ["--set", "run.steps=2"])
            out = p.communicate(timeout=120)[0].decode(errors="replace")
        finally:
            del os.environ["ZT_NVME_FREE_BYTES"]
        results.append((p.returncode, out))
    after = digest(swap)
    errs = []
    (rc, out), (rc2, out2) = results
    lines = [l for l in out.splitlines() if "stale swap file" in l]
    if rc != 0 or len(lines) != 1 or not lines[0].startswith("offload.nvme_dir: removed 2 stale swap file(s) (4.00 MiB)") \
            or not all(f in lines[0] for f in stale):
        errs.append(f"expected exit 0 and one line 'offload.nvme_dir: removed 2 stale swap file(s) (4.00 MiB) ...' "
                    f"naming {sorted(stale)}; got exit {rc}, lines {lines}")
    if any(f in after for f in stale):
        errs.append(f"stale files still there: {sorted(set(stale) & set(after))}")
    if {f: h for f, h in before.items() if f in kept} != after:
        errs.append(f"files that are not stale swap files changed: {sorted(kept)} -> {sorted(after)}")
    err_lines = [l for l in out2.splitlines() if l.startswith("error:")]
    if rc2 == 0 or len(err_lines) != 1 or live not in err_lines[0] or "not removed" not in err_lines[0]:
        errs.append(f"too little space: expected one error line naming the live process's file {live}, got exit "
                    f"{rc2}: {err_lines}")
    print(("FAIL " if errs else "ok   ") + "stale swap files at start: 2 of dead processes removed in one line and "
          "counted free, 3 other files untouched, named when the space falls short" +
          "".join("\n     " + e for e in errs) + ("\n" + out[-800:] if errs else ""))
    fails += [f"stale swap files at start: {e}" for e in errs]


def run_estimate(args, n, work, swap, stage=2, offload_sets=None):
    sets = zm.plan_sets(stage, True, 1, work, 0.05) + (offload_sets if offload_sets is not None else nvme_sets(swap))
    p = subprocess.run([args.train, "estimate", "plans/default.json", "--world", str(n), "--json"] + sets, cwd=ROOT,
                       env=zm.env(), stdout=subprocess.PIPE, check=True, timeout=60)
    return json.loads(p.stdout)


def failed_mid_run(args, tmp, n, what, sets, expect, fails, params=False):
    """A run that fails in the middle: every rank's swap files are gone afterwards."""
    work = os.path.join(tmp, f"err_{n}_{what.split()[0]}_{params}")
    swap = os.path.join(work, "swap")
    p = start(args, n, work, swap, sets, 3 if params else 2, params_sets(swap) if params else None)
    out = p.communicate(timeout=120)[0].decode(errors="replace")
    left = wait_gone(swap)
    errs = []
    if p.returncode == 0 or expect not in out:
        errs.append(f"expected '{expect}' and a non-zero exit, got exit {p.returncode}")
    if left:
        errs.append(f"left behind: {left}")
    print(("FAIL " if errs else "ok   ") + f"cleanup after {what} at N={n}: exit {p.returncode}, no swap files left" +
          "".join("\n     " + e for e in errs) + ("\n" + out[-800:] if errs else ""))
    fails += [f"cleanup {what} N={n}: {e}" for e in errs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--only", choices=["parity", "rss", "cleanup", "params", "inside", "prss", "pcleanup"])
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="zt_offload_", dir=os.path.join(ROOT, "build") if os.path.isdir(
        os.path.join(ROOT, "build")) else None)  # on the disk, not a tmpfs /tmp
    fails = []
    try:
        if args.only in (None, "parity"):
            parity(args, tmp, fails)
            buffered(args, tmp, fails)
        if args.only in (None, "rss"):
            rss(args, tmp, fails)
        if args.only in (None, "cleanup"):
            for n, sig in ((1, signal.SIGTERM), (2, signal.SIGTERM), (1, signal.SIGINT), (1, signal.SIGHUP),
                           (1, signal.SIGQUIT), (1, signal.SIGKILL)):
                killed(args, tmp, n, sig, fails)
            for gap in (0.01, 0.05, 0.15):  # a double Ctrl-C while the first one's checkpoint is saved
                killed(args, tmp, 1, signal.SIGTERM, fails, then=[(gap, signal.SIGTERM)],
                       extra=["--set", f"checkpoint.dir={os.path.join(tmp, f'ckpt_{gap}')}"],
                       name=f"two SIGTERMs {gap} s apart with checkpoint.dir")
            signals_without_dir(args, tmp, fails)
            stale_at_start(args, tmp, fails)
            for n in (1, 3):  # every rank throws
                failed_mid_run(args, tmp, n, "a diverged loss", ["--set", "optim.lr=1e30"], "diverged", fails)
            # One rank skips a collective at step 2: the other times out and MPI_Abort ends the job.
            failed_mid_run(args, tmp, 2, "a hung collective", ["--set", "comm.timeout_s=2", "--set", "comm.fault_skip_rank=1",
                                                               "--set", "comm.fault_skip_step=2"], "did not complete within", fails)
        if args.only in (None, "params"):
            headline_plan(args, fails)
            params_parity(args, tmp, fails)
        if args.only in (None, "inside"):
            inside_backward(args, tmp, fails)
        if args.only in (None, "prss"):
            params_rss(args, tmp, fails)
        if args.only in (None, "pcleanup"):
            for n in (1, 2):
                killed(args, tmp, n, signal.SIGTERM, fails, params=True)
            failed_mid_run(args, tmp, 3, "a diverged loss", ["--set", "optim.lr=1e30"], "diverged", fails, params=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if fails:
        print(f"offload_equivalence: {len(fails)} failure(s)")
        sys.exit(1)
    print("offload_equivalence passed")


if __name__ == "__main__":
    main()
