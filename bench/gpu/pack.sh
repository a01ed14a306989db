#!/usr/bin/env bash
# Packs what the GPU scripts run from a CUDA build: specd, the GPU test
# programs, the benches and the context test, into DIR (bench/ and tests/
# under it, as the scripts expect) and DIR.txz next to it, one file to
# carry to the GPU machine (unpack it there with bench/gpu/unpack.sh
# DIR.txz PARENT). xz with its large window: the binaries each hold the
# same ~14 MB of device code, which gzip's 32 KB window packs once per
# binary (21 MB) and xz once (2-3 MB).
# usage: bench/gpu/pack.sh BUILD_DIR DIR
set -euo pipefail
b=${1:?BUILD_DIR}; d=${2:?DIR}
rm -rf "$d"
mkdir -p "$d/bench" "$d/tests"
cp "$b/specd" "$b/tests/test_gpu_ops" "$b/tests/test_gpu_model" "$b/tests/test_gpu_comm" "$d/"
cp "$b/bench/specd-bench-decode" "$b/bench/specd-bench-allreduce" "$b/bench/specd-bench-kernels" \
    "$b/bench/specd-bench-serve" "$d/bench/"
[ -f "$b/bench/specd-bench-mask" ] && cp "$b/bench/specd-bench-mask" "$d/bench/"
cp "$b/tests/test_engine_context" "$d/tests/"
tar -C "$(dirname "$d")" -cf - "$(basename "$d")" | xz -9 -T0 > "$d.txz"
ls -la "$d.txz"
