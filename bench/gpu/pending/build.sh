#!/usr/bin/env bash
# Builds what a GPU call needs to try the waiting series (the *.patch files
# beside this script, written without a GPU): this tree as the base, and
# this tree with the series applied (git am in a worktree), both CUDA
# release builds, packed for the call (bench/gpu/pack.sh):
#   .carry/base-bin.txz   this checkout
#   .carry/new-bin.txz    this checkout + the series (all that lab_run.sh runs)
# Then, on the GPU machine (one call; the tree that travels is this one,
# whose bench/gpu/lab_run.sh is the same in both):
#   for t in new-bin base-bin; do bash bench/gpu/unpack.sh .carry/$t.txz .carry; done
#   ROUNDS=2 bash bench/gpu/lab_run.sh .carry/new-bin $OUT COMMIT .carry/base-bin
# with carry [".carry/new-bin.txz", ".carry/base-bin.txz"]. Land the series
# (git am) only if that validation passes.
# usage: bench/gpu/pending/build.sh   (from the repository root)
#   SKIP_PATCHES="NNNN ...": build the series without those patches
set -euo pipefail
root=$(pwd)
ls bench/gpu/pending/*.patch >/dev/null 2>&1 || { echo "no bench/gpu/pending/*.patch: nothing waits for a GPU"; exit 1; }
opts=(-Dcuda=enabled -Dgencode=arch=compute_90a,code=sm_90a --buildtype=release -Dstatic_deps=true)
mkdir -p .carry
[ -f .carry/build-base/build.ninja ] || meson setup .carry/build-base "${opts[@]}" >/dev/null
ninja -C .carry/build-base | { grep -iE "warning|error" || true; }
bash bench/gpu/pack.sh .carry/build-base .carry/base-bin
wt=$(mktemp -d)/series
git worktree add -q --detach "$wt" HEAD
trap 'git -C "$root" worktree remove --force "$wt"' EXIT
# SKIP_PATCHES="0003 0006": leave those patches out (by their numbers)
for p in "$root"/bench/gpu/pending/*.patch; do
    n=$(basename "$p" | cut -c1-4)
    if [[ " ${SKIP_PATCHES:-} " == *" $n "* ]]; then echo "left out: $(basename "$p")"; continue; fi
    git -C "$wt" am -q "$p"
done
rm -rf .carry/build-series # its sources are a new worktree each time
(cd "$wt" && meson setup "$root/.carry/build-series" "${opts[@]}" >/dev/null)
ninja -C .carry/build-series | { grep -iE "warning|error" || true; }
bash bench/gpu/pack.sh .carry/build-series .carry/new-bin
echo "series at $(git -C "$wt" rev-parse --short HEAD) on $(git rev-parse --short HEAD)"
