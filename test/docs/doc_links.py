#!/usr/bin/env python3
"""The documentation points at things that exist: in README.md and docs/*.md, every relative
Markdown link (file, and #heading where given) and every backticked repository path (`src/...`,
`test/...`, `scripts/...`, `plans/...`, `docs/...`) or source file name (`gpt.cpp`, `ring.h`).
A file renamed or moved without its documentation fails here, naming the page and the path."""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
TOP = ("src/", "test/", "scripts/", "plans/", "docs/", ".ci/")
SOURCE = re.compile(r"^[A-Za-z0-9_\-]+\.(cpp|h|cu|cuh)$")


def tree():
    paths, names = set(), set()
    for d, subdirs, files in os.walk(ROOT):
        rel = os.path.relpath(d, ROOT)
        skip = (".git", "node_modules") + ((("build", "data", "runs")) if rel == "." else ())
        subdirs[:] = [s for s in subdirs if s not in skip]
        for f in files + subdirs:
            p = os.path.normpath(os.path.join(rel, f))
            paths.add(p)
            names.add(f)
    return paths, names


def slug(heading):  # GitHub's anchor of a heading
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def main():
    paths, names = tree()
    pages = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    bad = []
    for page in pages:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            rel = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if rel not in paths:
                bad.append(f"{page}: link ({target}): no file {rel}")
            elif frag and rel.endswith(".md"):
                heads = re.findall(r"^#+ (.*)$", open(os.path.join(ROOT, rel), encoding="utf-8").read(), re.M)
                if frag not in {slug(h) for h in heads}:
                    bad.append(f"{page}: link ({target}): no heading #{frag} in {rel}")
        for m in re.finditer(r"`([^`\s]+)`", text):
            tok = m.group(1).rstrip(".,:;")
            if tok.startswith(TOP):
                p = tok.rstrip("/")
                if "*" in p or "<" in p:  # a glob or a placeholder: its directory must exist
                    p = os.path.dirname(p.split("*")[0].split("<")[0].rstrip("/") + "x")
                if os.path.normpath(p) not in paths:
                    bad.append(f"{page}: `{tok}`: no such path")
            elif SOURCE.match(tok) and tok not in names:
                bad.append(f"{page}: `{tok}`: no such file anywhere in the tree")
    for b in bad:
        print(b)
    print(f"doc_links: {len(pages)} pages, {len(bad)} dangling")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
