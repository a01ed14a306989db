#!/usr/bin/env bash
# Unpacks a bench/gpu/pack.sh archive (DIR.txz) under PARENT: tar with xz
# where the machine has xz, else Python's lzma (the standard library).
# usage: bench/gpu/unpack.sh FILE.txz PARENT
set -euo pipefail
f=${1:?FILE.txz}; p=${2:?PARENT}
mkdir -p "$p"
if command -v xz >/dev/null; then
    tar -xJf "$f" -C "$p"
else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$f" "$p"
fi
