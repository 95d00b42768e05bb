#!/usr/bin/env python3
"""Who may include whom (docs/design.md §2), checked on the `#include "..."` lines of src/.

Each folder of src/ is a layer; a file may include headers of the layers its own layer lists
below, nothing else. Angle-bracket includes (system and third-party headers) are not checked.
Exit 0 when every include points an allowed way, 1 with one line per violation otherwise.

  python3 test/docs/include_rules.py [SOURCE_DIR]        (default: the repository of this file)
"""
import os
import re
import sys

# layer -> layers it may include (itself included). Kept in sync with docs/design.md §2.
ALLOWED = {
    "runtime": {"runtime"},                                   # the ground: includes nothing else
    "kernels": {"kernels", "runtime"},                        # leaves: no model, ZeRO, comm, loop, plan, backend
    "backend": {"backend", "kernels", "runtime"},             # op tables over the kernels
    "model":   {"model", "backend", "kernels", "runtime"},    # no communication, sharding or loop
    "comm":    {"comm", "runtime"},                           # knows no ZeRO, model or loop
    "data":    {"data", "runtime"},
    "plan":    {"plan", "runtime"},                           # plain data
    "offload": {"offload", "runtime"},                        # swap files and their I/O: no ZeRO, model or plan
    "tensor":  {"tensor", "comm", "model", "runtime"},        # the tensor group over a Comm (the split rules are the model's)
    "pipeline": {"pipeline", "comm", "runtime"},              # the schedules' tables and the runner moving their messages
    "zero":    {"zero", "pipeline", "offload", "comm", "model", "backend", "kernels", "plan", "runtime"},  # no loop (the stage split is the pipeline's)
    "checkpoint": {"checkpoint", "zero", "offload", "comm", "model", "backend", "kernels", "plan", "runtime"},  # files, no loop
    "train":   {"train", "pipeline", "tensor", "checkpoint", "zero", "offload", "comm", "model", "backend", "kernels", "plan", "data", "runtime"},
    # the planner: measures the kernels, links and disk, sizes plans by the estimate, runs candidates
    "autoplan": {"autoplan", "train", "pipeline", "tensor", "checkpoint", "zero", "offload", "comm", "model", "backend", "kernels", "plan",
                 "data", "runtime"},
}

# Departures still present, each (file, included header): reported, not failed. Remove an entry
# when it is fixed (the test says so when an entry no longer matches anything).
KNOWN_DEPARTURES = {}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def layer_of(rel_path):
    parts = rel_path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "src" else None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    src = os.path.join(root, "src")
    errors, seen_departures, files = [], set(), 0
    for dirpath, _, names in os.walk(src):
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            layer = layer_of(rel)
            if layer is None:
                continue
            files += 1
            if layer not in ALLOWED:
                errors.append(f"{rel}: folder src/{layer} has no include rule in {__file__} (add one)")
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    # "x.h" (no folder) is relative to the including file; "kernels/x.h" is src/kernels/x.h.
                    target = inc.split("/")[0] if "/" in inc else layer
                    if os.path.normpath(inc).startswith(".."):
                        errors.append(f"{rel}:{lineno}: #include \"{inc}\": name headers from src/, not with ../")
                        continue
                    if target in ALLOWED[layer]:
                        continue
                    if (rel, inc) in KNOWN_DEPARTURES:
                        seen_departures.add((rel, inc))
                        continue
                    allowed = ", ".join(sorted(ALLOWED[layer]))
                    errors.append(f"{rel}:{lineno}: src/{layer} may not include \"{inc}\" "
                                  f"(src/{layer} may include: {allowed}; docs/design.md §2)")
    for key, why in sorted(KNOWN_DEPARTURES.items()):
        if key in seen_departures:
            print(f"known departure: {key[0]} includes \"{key[1]}\" ({why})")
        else:
            print(f"note: known departure {key[0]} -> \"{key[1]}\" no longer present: remove it from "
                  f"KNOWN_DEPARTURES in test/docs/include_rules.py and docs/design.md §2")
    if files == 0:
        errors.append(f"no source files under {src}")
    for e in errors:
        print("FAIL " + e)
    if errors:
        print(f"include_rules: {len(errors)} forbidden include(s) in {files} files")
        return 1
    print(f"include_rules: ok ({files} files under src/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
