#!/usr/bin/env bash
# SASS of one kernels/cuda/*.cu file without a GPU machine: nvcc (this
# project's flags, sm_90a) to a cubin, then nvdisasm. This toolkit ships no
# disassembler; Debian's nvidia-cuda-toolkit 11.8 (non-free) has nvdisasm,
# which reads a newer toolkit's sm_90a cubin once the ELF header says what
# it expects (ABI version 7, the old flags word for sm_90); only the
# header changes, the code is disassembled as is. Used with
# tools/sass_params.py (bench/results/NOTES.md, session 24).
#
# usage: tools/sass_local.sh kernels/cuda/FILE.cu OUT.sass
#   NVCC (nvcc), NVDISASM (nvdisasm: e.g. extracted from the .deb with
#   `apt-get download nvidia-cuda-toolkit && dpkg-deb -x ...`)
set -euo pipefail
src=${1:?kernels/cuda/FILE.cu}
out=${2:?OUT.sass}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
nvdisasm=${NVDISASM:-nvdisasm}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
"$nvcc" -gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr -O3 \
    -D_GNU_SOURCE -DSD_HAVE_CUDA=1 -DSD_HAVE_NCCL=1 -Isrc -Ikernels -I. -cubin -o "$w/a.cubin" "$src"
python3 - "$w/a.cubin" "$w/b.cubin" <<'EOF'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
b[8] = 7                                  # EI_ABIVERSION
struct.pack_into("<I", b, 0x30, 0x005a055a)  # e_flags: sm_90, virtual sm_90, 64-bit
open(sys.argv[2], "wb").write(b)
EOF
# cuobjdump's layout, which tools/sass_params.py reads
"$nvdisasm" -c "$w/b.cubin" | grep -E '^\s+/\*[0-9a-f]{4}\*/|^_Z' |
    sed -e 's/^\(_Z.*\):$/\t\tFunction : \1/' > "$out"
echo "$out: $(grep -c 'Function : ' "$out") kernels"
