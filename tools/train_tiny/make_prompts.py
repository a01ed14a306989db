#!/usr/bin/env python3
"""Held-out code prompts for the acceptance benchmark (bench/accept).

Cuts prompts from the Python sources of the packages the bundled model never
saw in training (the held-out split named in models/specd-tiny/README.md:
networkx, pygments, rich, seaborn, sacrebleu), wherever they are installed.
Each prompt is a run of whole lines ending at a line break, about --chars
characters, taken at evenly spaced offsets of the concatenated sources (files
sorted by path), so the set is deterministic for a given set of installed
versions. Output: JSONL {"prompt": ..., "source": "pkg/path.py"}.

    python3 tools/train_tiny/make_prompts.py --out models/specd-tiny/heldout_prompts.jsonl
"""
import argparse
import importlib.util
import json
import os
import sys

HELDOUT = ["networkx", "pygments", "rich", "seaborn", "sacrebleu"]


def package_dir(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--chars", type=int, default=240)
    a = ap.parse_args()
    files = []
    for pkg in HELDOUT:
        d = package_dir(pkg)
        if not d:
            continue
        for root, _, names in os.walk(d):
            for n in names:
                if n.endswith(".py"):
                    files.append((pkg, os.path.join(root, n)))
    files.sort()
    if not files:
        sys.exit("none of the held-out packages is installed: " + ", ".join(HELDOUT))
    # whole lines of code, skipping blank-only regions
    texts = []
    for pkg, path in files:
        try:
            t = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if len(t) >= 4 * a.chars:
            texts.append((pkg + "/" + os.path.relpath(path, package_dir(pkg)), t))
    total = sum(len(t) for _, t in texts)
    step = total // a.n
    out, pos, i, acc = [], 0, 0, 0
    for k in range(a.n):
        target = k * step
        while acc + len(texts[i][1]) <= target:
            acc += len(texts[i][1])
            i += 1
        src, t = texts[i]
        start = t.rfind("\n", 0, max(target - acc, 1)) + 1
        end = t.find("\n", start + a.chars)
        if end < 0:
            end = len(t)
        out.append({"prompt": t[start:end + 1], "source": src})
    with open(a.out, "w", encoding="utf-8") as f:
        for r in out:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    pkgs = sorted({r["source"].split("/")[0] for r in out})
    print(f"{len(out)} prompts from {len(texts)} files of {', '.join(pkgs)} -> {a.out}")


if __name__ == "__main__":
    main()
