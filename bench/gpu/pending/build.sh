#!/usr/bin/env bash
# Builds what a GPU call needs to try the waiting series (the *.patch files
# beside this script, written without a GPU) or the commits since a GPU
# last ran: a base and a new build, both CUDA release builds, packed for
# the call (bench/gpu/pack.sh):
#   .carry/base-bin.txz   this checkout, or BASE_REV's tree where that is set
#   .carry/new-bin.txz    this checkout + the series
# Then, on the GPU machine (one call, carry both archives and .carry/commit,
# which this script writes):
#   for t in base-bin new-bin; do bash bench/gpu/unpack.sh .carry/$t.txz .carry; done
#   ROUNDS=2 bash bench/gpu/serve_call.sh $OUT $(cat .carry/commit) .carry/base-bin .carry/new-bin
# (or bench/gpu/lab_run.sh, adaptive_run.sh for the decode bench's cells).
# Land the series (git am) only if its validation passes and it measures
# better.
# usage: bench/gpu/pending/build.sh   (from the repository root)
#   SKIP_PATCHES="NNNN ...": build the series without those patches
#   BASE_REV=REV: the base is REV (e.g. the last commit a GPU ran), the new
#   build this checkout (+ the series, if any)
set -euo pipefail
root=$(pwd)
have_patches=0
ls bench/gpu/pending/*.patch >/dev/null 2>&1 && have_patches=1
if [ -z "${BASE_REV:-}" ] && [ $have_patches = 0 ]; then
    echo "no bench/gpu/pending/*.patch and no BASE_REV: nothing to compare"
    exit 1
fi
opts=(-Dcuda=enabled -Dgencode=arch=compute_90a,code=sm_90a --buildtype=release -Dstatic_deps=true)
mkdir -p .carry
tmp=$(mktemp -d)
wts=()
cleanup() { for w in "${wts[@]}"; do git -C "$root" worktree remove --force "$w"; done; rm -rf "$tmp"; }
trap cleanup EXIT
# build DIR SRC: a CUDA release build of the tree SRC in DIR (a fresh setup
# where SRC is a new worktree: a build folder remembers its sources)
build() {
    if [ "$2" != "$root" ]; then
        rm -rf "$1"
        (cd "$2" && meson setup "$1" "${opts[@]}" >/dev/null)
    elif [ ! -f "$1/build.ninja" ]; then
        meson setup "$1" "${opts[@]}" >/dev/null
    fi
    ninja -C "$1" | { grep -iE "warning|error" || true; }
}
if [ -n "${BASE_REV:-}" ]; then
    wts+=("$tmp/base")
    git worktree add -q --detach "$tmp/base" "$BASE_REV"
    build "$root/.carry/build-rev" "$tmp/base"
    bash bench/gpu/pack.sh .carry/build-rev .carry/base-bin
    echo "base at $(git -C "$tmp/base" rev-parse --short HEAD)"
else
    build "$root/.carry/build-base" "$root"
    bash bench/gpu/pack.sh .carry/build-base .carry/base-bin
fi
if [ $have_patches = 0 ]; then
    build "$root/.carry/build-base" "$root"
    bash bench/gpu/pack.sh .carry/build-base .carry/new-bin
    echo "new at $(git rev-parse --short HEAD)"
else
    wts+=("$tmp/series")
    git worktree add -q --detach "$tmp/series" HEAD
    for p in "$root"/bench/gpu/pending/*.patch; do
        n=$(basename "$p" | cut -c1-4)
        if [[ " ${SKIP_PATCHES:-} " == *" $n "* ]]; then echo "left out: $(basename "$p")"; continue; fi
        git -C "$tmp/series" am -q "$p"
    done
    build "$root/.carry/build-series" "$tmp/series"
    bash bench/gpu/pack.sh .carry/build-series .carry/new-bin
    echo "series at $(git -C "$tmp/series" rev-parse --short HEAD) on $(git rev-parse --short HEAD)"
fi
git rev-parse --short HEAD > .carry/commit
