#!/usr/bin/env bash
# Packs what the GPU scripts run from a CUDA build: specd, the GPU test
# programs, the benches and the context test, into DIR (bench/ and tests/
# under it, as the scripts expect) and DIR.tgz next to it, one file to
# carry to the GPU machine (untar it there with `tar -xzf DIR.tgz -C PARENT`).
# usage: bench/gpu/pack.sh BUILD_DIR DIR
set -euo pipefail
b=${1:?BUILD_DIR}; d=${2:?DIR}
rm -rf "$d"
mkdir -p "$d/bench" "$d/tests"
cp "$b/specd" "$b/tests/test_gpu_ops" "$b/tests/test_gpu_model" "$b/tests/test_gpu_comm" "$d/"
cp "$b/bench/specd-bench-decode" "$b/bench/specd-bench-allreduce" "$b/bench/specd-bench-kernels" "$d/bench/"
cp "$b/tests/test_engine_context" "$d/tests/"
tar -C "$(dirname "$d")" -czf "$d.tgz" "$(basename "$d")"
ls -la "$d.tgz"
