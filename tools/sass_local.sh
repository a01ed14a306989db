#!/usr/bin/env bash
# SASS of one kernels/cuda/*.cu file without a GPU machine: the build's own
# nvcc command for it (from BUILD/build.ninja, a -Dcuda=enabled build) made
# to write a cubin, then nvdisasm. This toolkit ships no disassembler;
# Debian's nvidia-cuda-toolkit 11.8 (non-free) has nvdisasm, which reads a
# newer toolkit's sm_90a cubin once the ELF header says what it expects
# (ABI version 7, the old flags word for sm_90); only the header changes,
# the code is disassembled as is. Used with tools/sass_params.py
# (bench/results/NOTES.md, session 24).
#
# usage: tools/sass_local.sh BUILD kernels/cuda/FILE.cu OUT.sass
#   NVDISASM (nvdisasm: e.g. extracted from the .deb with
#   `apt-get download nvidia-cuda-toolkit && dpkg-deb -x ...`)
set -euo pipefail
build=${1:?BUILD}
src=${2:?kernels/cuda/FILE.cu}
out=$(realpath -m "${3:?OUT.sass}")
nvdisasm=${NVDISASM:-nvdisasm}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
# the COMMAND of the object built from FILE.cu, with -c ... -o OBJ and its
# depfile replaced by a cubin (run in BUILD: its paths are relative to it)
cmd=$(python3 - "$build/build.ninja" "$(basename "$src")" "$w/a.cubin" <<'EOF'
import re, sys
ninja, name, cubin = sys.argv[1:4]
lines = open(ninja).read().split("\n")
for i, l in enumerate(lines):
    if l.startswith("build ") and re.search(r"\S*/" + re.escape(name) + r"( |$)", l):
        for c in lines[i + 1:i + 12]:
            if c.strip().startswith("COMMAND = "):
                c = c.strip()[len("COMMAND = "):]
                c = re.sub(r" -MD -MF \S+", "", c)
                c = re.sub(r" -c (\S+) -o \S+", r" -cubin -o " + cubin + r" \1", c)
                print(c)
                sys.exit(0)
sys.exit("sass_local: no nvcc command for %s in %s" % (name, ninja))
EOF
)
(cd "$build" && eval "$cmd")
python3 - "$w/a.cubin" "$w/b.cubin" <<'EOF'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
b[8] = 7                                     # EI_ABIVERSION
struct.pack_into("<I", b, 0x30, 0x005a055a)  # e_flags: sm_90, virtual sm_90, 64-bit
open(sys.argv[2], "wb").write(b)
EOF
# cuobjdump's layout, which tools/sass_params.py reads
"$nvdisasm" -c "$w/b.cubin" | grep -E '^\s+/\*[0-9a-f]{4}\*/|^_Z' |
    sed -e 's/^\(_Z.*\):$/\t\tFunction : \1/' > "$out"
echo "$out: $(grep -c 'Function : ' "$out") kernels"
