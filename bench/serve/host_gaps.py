#!/usr/bin/env python3
"""Where a server's host time between steps goes, from its debug log
(`specd serve --log-level debug`; xz-compressed logs are read as they are).

For each target step the log's "target step:" line gives its upload,
launch, wait (run) and download times; the host gap before a step is the
log time since the last step was read less those four. Gaps are grouped
by the step's kind (ahead: queued before the last was read; graph; eager)
and by the other log lines written in the gap (numbers blanked), so a gap
that follows an event (e.g. "speculation off") shows as its own row. The
first step's gap (start-up) is left out. Log times have millisecond
resolution: single gaps are coarse, sums over many steps are not.

usage: bench/serve/host_gaps.py LOG... [--top N]
"""
import collections
import lzma
import re
import sys

STEP = re.compile(r"target step: (\d+) rows of (\d+) requests \((ahead|graph|eager) \d+\): "
                  r"upload ([\d.]+), launch ([\d.]+), run ([\d.]+), download ([\d.]+) ms")
TIME = re.compile(r"^(\d+):(\d+):([\d.]+) ")
SKIP = ("request N:", "finish=")


def read(path):
    op = lzma.open if path.endswith(".xz") else open
    with op(path, "rt", errors="replace") as f:
        yield from f


def main(argv):
    top = 14
    if "--top" in argv:
        i = argv.index("--top")
        top = int(argv[i + 1])
        del argv[i:i + 2]
    for path in argv:
        prev = None
        between = []
        groups = collections.defaultdict(lambda: [0, 0.0])
        kinds = collections.defaultdict(lambda: [0, 0.0, 0.0])
        total = 0.0
        first = True
        for line in read(path):
            mt = TIME.match(line)
            if not mt:
                continue
            t = int(mt[1]) * 3600 + int(mt[2]) * 60 + float(mt[3])
            m = STEP.search(line)
            if not m:
                text = re.sub(r"[\d.]+", "N", line[mt.end():].strip())[:70]
                if not any(s in text for s in SKIP):
                    between.append(text)
                continue
            own = sum(float(m[i]) for i in range(4, 8)) * 1e-3
            kinds[m[3]][0] += 1
            kinds[m[3]][1] += float(m[6]) * 1e-3
            if prev is not None:
                gap = t - prev - own
                if first:
                    first = False
                else:
                    key = (m[3],) + tuple(sorted(set(between)))
                    groups[key][0] += 1
                    groups[key][1] += gap
                    kinds[m[3]][2] += gap
                    total += gap
            prev = t
            between = []
        steps = sum(v[0] for v in kinds.values())
        print("%s: %d steps, host gaps %.1f ms" % (path, steps, total * 1e3))
        for k, (n, run, gap) in sorted(kinds.items()):
            print("  %-6s %5d steps, waits %.1f ms, gaps %.1f ms (%.0f us a step)"
                  % (k, n, run * 1e3, gap * 1e3, gap / n * 1e6 if n else 0))
        for key, (n, gap) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]:
            print("  %7.1f ms %5d x %4.0f us  %s" % (gap * 1e3, n, gap / n * 1e6, " | ".join(key)[:200]))


if __name__ == "__main__":
    main(sys.argv[1:])
