#!/usr/bin/env python3
"""Lists, for each CUDA kernel in a SASS listing (`cuobjdump -sass BINARY` or
`nvdisasm -c CUBIN`), the lines of its parameter bank that it first reads
after its programmatic-launch wait.

Every kernel here starts with SD_PDL_ENTER(its parameters) (kernels/cuda/
common.cuh): griddepcontrol.launch_dependents (SASS: PREEXIT), a read of
every 32-byte line of its parameters, then griddepcontrol.wait (ACQBULK). A
parameter line first read after the wait is a round trip to memory on the
decode step's critical path (bench/results/NOTES.md, session 24: V2-Lite's
step +1.8% once none was left). ptxas moves a read to its first use, so
whether the reads stayed before the wait is a question for the SASS.

The reads looked for are constant-bank operands with a fixed offset,
c[0x0][0x...]: the parameters (from 0x210) and the driver's words below them
(the block and grid dimensions at 0x0-0x1f, the global memory descriptor at
0x208). Reads at an index (c[0x0][R1+0x210]: a table in a parameter, read at
an index the kernel learns after the wait) are not counted. A kernel of
several paths that each end in an EXIT of their own and wait on their own
(mla_prep_absorb_kernel: the prep's blocks, the GEMV's) is read path by
path: a path's reads before its wait, and those of the kernel's first
instructions up to its first branch or wait (shared by every path), are
before; code after an EXIT that waits for nothing continues the path before.

usage: tools/sass_params.py SASS [--kernel REGEX]... [--line BYTES] [--check]
  prints one line a kernel: instructions, the first wait's index, and each
  parameter line first read after it (offset@instruction); --check exits 1
  when a kernel the regexes select reads a line first after its wait (or
  has no wait).
"""
import argparse
import re
import sys

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;\n]*)")
CONST = re.compile(r"c\[0x0\]\[(0x[0-9a-f]+)\]")


def functions(text):
    """(name, [instruction text...]) for each function of the listing"""
    parts = re.split(r"\n\s*Function : ", "\n" + text)
    for part in parts[1:]:
        name, _, body = part.partition("\n")
        yield name.strip(), [op for _, op in INSN.findall(body)]


def lines_read(op, line):
    return [int(m.group(1), 16) // line * line for m in CONST.finditer(op)]


def late_lines(insns, line=32):
    """(index of the first wait or None, {line offset: first index} of the
    lines some path first reads after its wait)"""
    prologue = set()  # read before the first branch and the first wait
    for op in insns:
        if "BRA " in op or op.strip().startswith("ACQBULK"):
            break
        prologue.update(lines_read(op, line))
    first_wait, late = None, {}
    before, waited = set(), False
    start = 0
    for end in [i for i, op in enumerate(insns) if op.strip() == "EXIT"] + [len(insns) - 1]:
        seg = range(start, end + 1)
        start = end + 1
        wait = next((i for i in seg if insns[i].strip().startswith("ACQBULK")), None)
        if wait is not None:  # a path of its own; else the code the path before branches to
            first_wait = wait if first_wait is None else first_wait
            before, waited = set(prologue), False
        for i in seg:
            waited = waited or i == wait
            for off in lines_read(insns[i], line):
                if not waited:
                    before.add(off)
                elif off not in before and off not in late:
                    late[off] = i
    return first_wait, late


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass")
    ap.add_argument("--kernel", action="append", default=[])
    ap.add_argument("--line", type=int, default=32)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    text = open(a.sass, errors="replace").read()
    pats = [re.compile(k) for k in a.kernel]
    bad = seen = 0
    done = set()
    for name, insns in functions(text):
        if pats and not any(p.search(name) for p in pats):
            continue
        if name in done:  # one listing a fatbin's copy of the same cubin
            continue
        done.add(name)
        seen += 1
        wait, late = late_lines(insns, a.line)
        where = " ".join("0x%x@%d" % (off, i) for off, i in sorted(late.items(), key=lambda x: x[1]))
        print("%s: %d instructions, wait at %s%s" % (name, len(insns), "none" if wait is None else wait,
                                                   ", first read after it: " + where if late else ""))
        if late or wait is None:
            bad += 1
    if a.check and (bad or seen == 0):
        print("sass_params: %d of %d kernels read a parameter line first after the wait%s"
              % (bad, seen, "" if seen else " (no kernel selected)"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
