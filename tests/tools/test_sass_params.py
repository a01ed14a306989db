#!/usr/bin/env python3
"""tools/sass_params.py on synthetic SASS listings in cuobjdump's layout:
which parameter lines a kernel first reads after its wait (ACQBULK), path
by path, and --check's exit status."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "sass_params.py")


def listing(funcs):
    out = []
    for name, ops in funcs:
        out.append("\t\tFunction : %s" % name)
        out.append('\t.headerflags\t@"EF_CUDA_SM90"')
        for i, op in enumerate(ops):
            out.append("        /*%04x*/                   %s ;   /* 0x000000 */" % (16 * i, op))
            out.append("                                                   /* 0x000f00 */")
    return "\n".join(out) + "\n"


CLEAN = ("_Z5cleanPfi", ["LDC R1, c[0x0][0x28]", "ULDC UR4, c[0x0][0x218]", "PREEXIT",
                         "STS [UR5], R2", "ACQBULK", "LDC.64 R2, c[0x0][0x210]",
                         "LDG.E R3, desc[UR6][R2.64]", "EXIT", "BRA 0x80"])
# eps (0x240) first read long after the wait; a table read at an index is no line
LATE = ("_Z4lateiiif", ["LDC R1, c[0x0][0x28]", "ULDC UR4, c[0x0][0x220]", "PREEXIT", "ACQBULK",
                        "LDC.64 R10, c[0x0][R12+0x210]", "FADD R3, R3, R3",
                        "ULDC UR7, c[0x0][0x240]", "EXIT"])
# two paths (blocks of two kinds): the second reads 0x240 before its own wait
TWO = ("_Z3twoPfi", ["LDC R1, c[0x0][0x28]", "S2R R0, SR_CTAID.X", "ISETP.GE P0, PT, R0, 0x1",
                     "@P0 BRA 0xa0", "ULDC UR4, c[0x0][0x210]", "PREEXIT", "STS [UR5], R4",
                     "ACQBULK", "LDG.E R3, desc[UR6][R2.64]", "EXIT",
                     "LDC R8, c[0x0][0x240]", "PREEXIT", "STS [UR5], R8", "ACQBULK",
                     "ULDC UR6, c[0x0][0x244]", "ULDC UR7, c[0x0][0x20c]", "EXIT"])
# code after an EXIT that waits for nothing continues the path before: late
TAIL = ("_Z4tailPf", ["LDC R1, c[0x0][0x28]", "PREEXIT", "ACQBULK", "@P0 BRA 0x50", "EXIT",
                      "ULDC UR4, c[0x0][0x2c0]", "EXIT"])
NOWAIT = ("_Z6nowaitPf", ["LDC R1, c[0x0][0x28]", "ULDC UR4, c[0x0][0x210]", "EXIT"])


def run(funcs, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".sass", delete=False) as f:
        f.write(listing(funcs))
    try:
        p = subprocess.run([sys.executable, TOOL, f.name] + list(args), capture_output=True,
                           text=True)
    finally:
        os.unlink(f.name)
    return p.returncode, p.stdout, p.stderr


def line_of(out, name):
    return next(l for l in out.splitlines() if l.startswith(name + ":"))


def main():
    fails = 0

    def check(cond, what):
        nonlocal fails
        print(("ok   " if cond else "FAIL ") + what)
        fails += not cond

    rc, out, _ = run([CLEAN, LATE, TWO, TAIL, NOWAIT])
    check(rc == 0, "without --check the exit status is 0")
    check("after it" not in line_of(out, CLEAN[0]) and "wait at 4" in line_of(out, CLEAN[0]),
          "a kernel that reads every line before its wait: nothing listed")
    check(line_of(out, LATE[0]).endswith("first read after it: 0x240@6"),
          "a line first read after the wait is listed with its instruction; an indexed read is not")
    check(line_of(out, TWO[0]).endswith("first read after it: 0x200@15"),
          "two paths, each with its own wait: each path's reads before its own wait count, "
          "the other path's do not")
    check(line_of(out, TAIL[0]).endswith("first read after it: 0x2c0@5"),
          "code after an EXIT that waits for nothing is after the wait")
    check("wait at none" in line_of(out, NOWAIT[0]), "a kernel without a wait says so")
    rc, _, err = run([CLEAN], "--check")
    check(rc == 0, "--check on a clean kernel: 0")
    rc, out, err = run([CLEAN, LATE, TWO], "--check", "--kernel", "late|clean")
    check(rc == 1 and "1 of 2 kernels" in err and TWO[0] not in out,
          "--check with --kernel: only the selected kernels, 1 when one reads late")
    rc, _, err = run([NOWAIT], "--check")
    check(rc == 1, "--check: a kernel without a wait fails")
    rc, _, err = run([CLEAN], "--check", "--kernel", "nothing")
    check(rc == 1 and "no kernel selected" in err, "--check selecting no kernel fails")
    rc, out, _ = run([LATE], "--line", "64")
    check(line_of(out, LATE[0]).endswith("0x240@6"), "--line 64 groups by 64 bytes")
    print("%d failed" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
