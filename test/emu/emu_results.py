"""What the emulator scripts that compare a mesh with one rank (tensor_emu.sh, pipeline_emu.sh) read
back from their runs: each run NAME logged to WORK/NAME/metrics.jsonl (and NAME.est beside it)."""
import json
import math

import numpy as np


class Runs:
    def __init__(self, work):
        self.w = work

    def rows(self, name):
        return [json.loads(l) for l in open(f"{self.w}/{name}/metrics.jsonl")]

    def steps(self, name):
        return [r for r in self.rows(name) if "loss" in r and "step" in r]

    def summary(self, name):
        return next(r["summary"] for r in self.rows(name) if "summary" in r)

    def against(self, name, ref, bound, n=3):
        """Every step's loss and grad norm of `name` within `bound` relative of `ref`'s (n steps each):
        (ok, one line saying so)."""
        a, b = self.steps(name), self.steps(ref)
        err = max(max(abs(x[k] - y[k]) / abs(y[k]) for k in ("loss", "grad_norm")) for x, y in zip(a, b)) \
            if len(a) == len(b) == n else float("inf")
        good = err <= bound
        losses = " ".join("%.6f" % x["loss"] for x in a)
        return good, (f"{name:20s} vs {ref:7s}: losses {losses}  max rel err (loss, norm) "
                      f"{err:.2e} (bound {bound:g}) {'ok' if good else 'FAILED'}")

    def weights_rel_l2(self, name, ref):
        """Relative L2 distance of two runs' llm.c final weights (inf when the headers differ)."""
        def weights(path):
            raw = np.fromfile(path, dtype=np.uint8)
            return raw[:1024].view(np.int32)[:8].tolist(), raw[1024:].view(np.float32).astype(np.float64)
        (h, a), (hr, r) = weights(f"{self.w}/{name}/final.bin"), weights(f"{self.w}/{ref}/final.bin")
        return math.sqrt(float((a - r) @ (a - r)) / float(r @ r)) if h == hr and a.size == r.size else float("inf")
