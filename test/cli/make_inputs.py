#!/usr/bin/python3
"""Small, deliberately broken inputs for the CLI tests (standard library only).

  make_inputs.py shard PATH N_TOKENS [BAD_POS BAD_ID]   llm.c token shard; token BAD_POS set to BAD_ID
  make_inputs.py junk PATH N_BYTES                       a file that is not a shard
  make_inputs.py checkpoint PATH L NH C T [NAN]          llm.c fp32 checkpoint (vocab 50257); with NAN,
                                                         one NaN in layer 0's c_attn weight
"""
import array
import struct
import sys

V, VP = 50257, 50304


def shard(path, n, bad_pos=-1, bad_id=0):
    toks = array.array("H", ((i * 7919) % 50000 for i in range(n)))
    if bad_pos >= 0:
        toks[bad_pos] = bad_id
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(toks.tobytes())


def checkpoint(path, L, NH, C, T, nan):
    # llm.c order: wte, wpe, then each per-layer tensor for all layers, then ln_f.
    sizes = [("wte", VP * C), ("wpe", T * C)]
    for name, n in [("ln1w", C), ("ln1b", C), ("qkvw", 3 * C * C), ("qkvb", 3 * C), ("attprojw", C * C),
                    ("attprojb", C), ("ln2w", C), ("ln2b", C), ("fcw", 4 * C * C), ("fcb", 4 * C),
                    ("fcprojw", 4 * C * C), ("fcprojb", C)]:
        sizes.append((name, L * n))
    sizes += [("lnfw", C), ("lnfb", C)]
    body = array.array("f")
    for name, n in sizes:
        fill = 1.0 if name in ("ln1w", "ln2w", "lnfw") else 0.0
        start = len(body)
        body.extend(array.array("f", [fill]) * n)
        if nan and name == "qkvw":
            body[start + 5] = float("nan")
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240326, 3, T, V, L, NH, C, VP, *([0] * 248)))
        f.write(body.tobytes())


if __name__ == "__main__":
    kind, path, args = sys.argv[1], sys.argv[2], [int(a) for a in sys.argv[3:]]
    if kind == "shard":
        shard(path, *args)
    elif kind == "junk":
        with open(path, "wb") as f:
            f.write(b"not a token shard " * (args[0] // 18 + 1))
    elif kind == "checkpoint":
        checkpoint(path, *args[:4], nan=len(args) > 4 and args[4] != 0)
    else:
        sys.exit(f"unknown kind {kind}")
