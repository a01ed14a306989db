#!/usr/bin/env bash
# The serving sweep in one command: build specd and specd-bench-serve
# (release), serve the model plain and then with each proposer, sweep
# concurrency with specd-bench-serve against each, and plot.
#
#   bench/serve/sweep.sh [options] [-- specd-bench-serve options]
#
#   -n NAME     results are bench/results/serve-NAME-LABEL.json (default: cpu, or gpu
#               when specd was built with CUDA and a GPU is visible)
#   -p LIST     proposers to compare with plain decoding, comma-separated (default: mtp)
#   -c LIST     concurrencies (default: 1,2,4,8,16,32,64,128,256)
#   -m TEXT     machine description for the JSON (default: from /proc/cpuinfo or nvidia-smi)
#   -b DIR      build folder (default: build-release)
#   -s "ARGS"   extra `specd serve` options (e.g. "--model /models/X --tp 8")
#   -P PORT     port for the server (default 18123)
#
# RESULTS=DIR writes there instead of bench/results.
# Bench options after `--` replace the defaults (the bundled model's held-out
# Python prompts, 128 tokens each, at least 64 requests per level, 600 s per level).
set -euo pipefail
cd "$(dirname "$0")/../.."
name="" proposers=mtp levels=1,2,4,8,16,32,64,128,256 machine="" build=build-release
serve_extra="" port=18123
while getopts "n:p:c:m:b:s:P:h" o; do
    case $o in
    n) name=$OPTARG ;; p) proposers=$OPTARG ;; c) levels=$OPTARG ;; m) machine=$OPTARG ;;
    b) build=$OPTARG ;; s) serve_extra=$OPTARG ;; P) port=$OPTARG ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
bench_args=("$@")
if ((${#bench_args[@]} == 0)); then
    bench_args=(--prompts models/specd-tiny/heldout_prompts.jsonl --max-tokens 128
                --num-requests 64 --duration-limit 600)
fi

[[ -f $build/build.ninja ]] || meson setup "$build" --buildtype=release >/dev/null
ninja -C "$build" specd bench/specd-bench-serve >/dev/null

gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 &&
   grep -q SD_HAVE_CUDA "$build/build.ninja"; then gpu=1; fi
[[ -n $name ]] || { ((gpu)) && name=gpu || name=cpu; }
if [[ -z $machine ]]; then
    if ((gpu)); then
        machine="$(nvidia-smi -L | wc -l) x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    else
        machine="CPU only: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
    fi
fi

log=$(mktemp -d)
server=""
cleanup() { [[ -n $server ]] && kill "$server" 2>/dev/null; wait 2>/dev/null; rm -rf "$log"; }
trap cleanup EXIT

for label in plain ${proposers//,/ }; do
    spec=(); [[ $label == plain ]] || spec=(--spec "$label")
    # shellcheck disable=SC2086
    "$build/specd" serve --port "$port" "${spec[@]}" $serve_extra >"$log/serve-$label.log" 2>&1 &
    server=$!
    for _ in $(seq 600); do
        grep -q 'ready: serving' "$log/serve-$label.log" && break
        kill -0 "$server" 2>/dev/null || { cat "$log/serve-$label.log" >&2; exit 1; }
        sleep 0.5
    done
    grep -q 'ready: serving' "$log/serve-$label.log" || { echo "sweep.sh: specd serve not ready" >&2; exit 1; }
    out=${RESULTS:-bench/results}/serve-$name-$label.json
    echo "sweep.sh: $label -> $out" >&2
    rc=0
    "$build/bench/specd-bench-serve" --url "http://127.0.0.1:$port" --sweep "$levels" \
        --label "$label" --machine "$machine" --out "$out" "${bench_args[@]}" || rc=$?
    kill "$server"; wait "$server" 2>/dev/null || true; server=""
    ((rc == 0 || rc == 3)) || exit $rc
done
bench/plot/plot.sh "serve-$name"
