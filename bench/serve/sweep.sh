#!/usr/bin/env bash
# The serving sweep in one command: build specd and specd-bench-serve
# (release), serve the model plain and with each proposer (one server each),
# sweep concurrency with specd-bench-serve, and plot.
#
#   bench/serve/sweep.sh [options] [-- specd-bench-serve options]
#
#   -n NAME     results are bench/results/serve-NAME-LABEL.json (default: cpu, or gpu
#               when specd was built with CUDA and a GPU is visible)
#   -p LIST     proposers to compare with plain decoding, comma-separated, each NAME
#               (--spec NAME, adaptive k) or NAME:K (--spec-k K, label NAME_kK); on the
#               bundled model eagle3 and draft get its EAGLE-3 head / draft model
#               (default: mtp,mtp:3)
#   -c LIST     concurrencies (default: 1,2,4,8,16,32,64,128,256)
#   -m TEXT     machine description for the JSON (default: from /proc/cpuinfo or nvidia-smi)
#   -b DIR      build folder (default: build-release)
#   -B DIR      prebuilt binaries instead of a build: DIR/specd and
#               DIR/bench/specd-bench-serve (bench/gpu/pack.sh's folder, on a machine
#               the build was carried to); with -1 nothing but python3 is needed
#               (no jq; the plot is left out where gnuplot or jq is missing)
#   -s "ARGS"   extra `specd serve` options (e.g. "--model /models/X --tp 8"); the servers
#               run with --no-prefix-cache unless ARGS name prefix-cache (the levels
#               send the same prompts again: cached, their prefill would be skipped)
#   -P PORT     first port for the servers (default 18123; one port per label)
#   -L DIR      keep each server's log as DIR/serve-LABEL.log (e.g. with -s "--log-level debug")
#   -1          one server at a time, each swept whole (for a GPU that holds one model);
#               by default every server is up at once and the levels interleave
#               (plain c=1, mtp c=1, plain c=2, ...), so a machine whose background
#               load drifts (a shared CPU) biases no label: an idle server costs nothing
#
# RESULTS=DIR writes there instead of bench/results.
# Bench options after `--` replace the defaults (the bundled model's held-out
# Python prompts that fit its 2048-token context, 128 tokens each, at least 32
# requests per level, 600 s per level at most).
set -euo pipefail
cd "$(dirname "$0")/../.."
invocation="bench/serve/sweep.sh $*"
name="" proposers=mtp,mtp:3 levels=1,2,4,8,16,32,64,128,256 machine="" build=build-release
serve_extra="" port=18123 serial=0 prebuilt="" logs=""
while getopts "n:p:c:m:b:B:s:P:L:1h" o; do
    case $o in
    n) name=$OPTARG ;; p) proposers=$OPTARG ;; c) levels=$OPTARG ;; m) machine=$OPTARG ;;
    b) build=$OPTARG ;; B) prebuilt=$OPTARG ;; s) serve_extra=$OPTARG ;; P) port=$OPTARG ;;
    L) logs=$OPTARG ;; 1) serial=1 ;;
    *) sed -n '2,32p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
bench_args=("$@")
if ((${#bench_args[@]} == 0)); then
    bench_args=(--prompts models/specd-tiny/heldout_prompts.jsonl --max-prompt-chars 4096
                --max-tokens 128 --num-requests 32 --duration-limit 600)
fi
results=${RESULTS:-bench/results}
mkdir -p "$results"

if [[ -n $prebuilt ]]; then
    build=$prebuilt
else
    [[ -f $build/build.ninja ]] || meson setup "$build" --buildtype=release >/dev/null
    ninja -C "$build" specd bench/specd-bench-serve >/dev/null
fi
bench=$build/bench/specd-bench-serve

gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 &&
   { [[ -n $prebuilt ]] || grep -q SD_HAVE_CUDA "$build/build.ninja"; }; then gpu=1; fi
[[ -n $name ]] || { ((gpu)) && name=gpu || name=cpu; }
if [[ -z $machine ]]; then
    if ((gpu)); then
        machine="$(nvidia-smi -L | wc -l) x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    else
        machine="CPU only: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
    fi
fi

tmp=$(mktemp -d)
declare -A pid=() url=()
cleanup() {
    for l in "${!pid[@]}"; do stop "$l"; done
    rm -rf "$tmp"
}
trap cleanup EXIT

start() { # label port
    local spec=() p=${1%_k*} k=""
    [[ $1 == *_k* ]] && k=${1##*_k}
    if [[ $p != plain ]]; then
        spec=(--spec "$p")
        [[ -n $k ]] && spec+=(--spec-k "$k")
        # the bundled model's head / draft model: with no --model, or --model
        # naming the bundled one (a build whose compiled-in path is gone)
        if [[ ($serve_extra != *--model* || " $serve_extra " == *" --model models/specd-tiny "*) &&
              $serve_extra != *--draft-model* && ($p == eagle3 || $p == draft) ]]; then
            spec+=(--draft-model "models/specd-tiny-$p")
        fi
    fi
    local cache=(--no-prefix-cache)
    [[ $serve_extra == *prefix-cache* ]] && cache=()
    # shellcheck disable=SC2086
    "$build/specd" serve --port "$2" "${spec[@]}" "${cache[@]}" $serve_extra >"$tmp/serve-$1.log" 2>&1 &
    pid[$1]=$!
    url[$1]=http://127.0.0.1:$2
    for _ in $(seq 1200); do
        grep -q 'ready: serving' "$tmp/serve-$1.log" && return 0
        kill -0 "${pid[$1]}" 2>/dev/null || break
        sleep 0.5
    done
    cat "$tmp/serve-$1.log" >&2
    echo "sweep.sh: specd serve ($1) did not get ready" >&2
    exit 1
}
stop() {
    kill "${pid[$1]}" 2>/dev/null || true
    wait "${pid[$1]}" 2>/dev/null || true
    unset "pid[$1]"
    [[ -z $logs ]] || { mkdir -p "$logs" && cp "$tmp/serve-$1.log" "$logs/serve-$1.log"; }
}

run_bench() { # label levels out
    local rc=0
    "$bench" --url "${url[$1]}" --sweep "$2" --label "$1" --machine "$machine" --out "$3" \
        "${bench_args[@]}" || rc=$?
    ((rc == 0 || rc == 3)) || exit $rc
}

# The layout specd-bench-serve writes: indented, one compact line per request record.
one_line_records() {
    local n i
    n=$(jq '.runs | length' "$1")
    for ((i = 0; i < n; i++)); do jq -c ".runs[$i].requests // [] | .[]" "$1" >"$tmp/req-$i"; done
    jq --indent 1 '.runs |= [range(0; length) as $i | .[$i] |
                   if has("requests") then .requests = "@@requests-\($i)@@" else . end]' "$1" |
        awk -v dir="$tmp" '
            match($0, /"@@requests-[0-9]+@@"/) {
                i = substr($0, RSTART + 12, RLENGTH - 15)
                printf "%s[", substr($0, 1, RSTART - 1)
                sep = ""
                while ((getline line < (dir "/req-" i)) > 0) { printf "%s\n  %s", sep, line; sep = "," }
                printf "\n  ]%s\n", substr($0, RSTART + RLENGTH)
                next
            }
            { print }'
}

labels=(plain)
for p in ${proposers//,/ }; do labels+=("${p/:/_k}"); done
if ((serial)); then
    for l in "${labels[@]}"; do
        start "$l" "$port"
        echo "sweep.sh: $l -> $results/serve-$name-$l.json" >&2
        run_bench "$l" "$levels" "$results/serve-$name-$l.json"
        stop "$l"
    done
else
    i=0
    for l in "${labels[@]}"; do start "$l" $((port + i)); i=$((i + 1)); done
    for c in ${levels//,/ }; do
        for l in "${labels[@]}"; do
            echo "sweep.sh: $l, concurrency $c" >&2
            run_bench "$l" "$c" "$tmp/$l-$c.json"
        done
    done
    # One file per label: the runs of its levels in order, each with the command,
    # time and machine load of its own invocation.
    for l in "${labels[@]}"; do
        files=()
        for c in ${levels//,/ }; do files+=("$tmp/$l-$c.json"); done
        # (each level's --out was a scratch file: the record names the result)
        jq -s --arg cmd "$invocation" --arg out "$results/serve-$name-$l.json" '.[0] + {
                command: $cmd, levels_interleaved: true,
                config: (.[0].config + {sweep: [.[].runs[].concurrency]}),
                runs: [.[] as $f | $f.runs[] + {command: ($f.command | sub(" --out [^ ]+"; " --out " + $out)),
                       timestamp: $f.timestamp,
                       loadavg_1m_before: $f.machine.loadavg_1m_before,
                       loadavg_1m_after: $f.machine.loadavg_1m_after}]}' \
            "${files[@]}" >"$tmp/$l.json"
        one_line_records "$tmp/$l.json" >"$results/serve-$name-$l.json"
        echo "sweep.sh: wrote $results/serve-$name-$l.json" >&2
    done
fi
if command -v gnuplot >/dev/null && command -v jq >/dev/null; then
    RESULTS=$results bench/plot/plot.sh "serve-$name"
else
    echo "sweep.sh: no gnuplot or jq here: bench/plot/plot.sh serve-$name makes the PNGs elsewhere" >&2
fi

# the short table, last: every label at every level
python3 - "$results" "$name" "${labels[@]}" <<'E'
import json, sys
results, name, labels = sys.argv[1], sys.argv[2], sys.argv[3:]
row = "%-7s %5s %5s %5s %8s %10s %12s %12s %11s %7s %7s"
print(row % ("label", "conc", "done", "fail", "req/s", "out tok/s", "TTFT p50 ms", "TPOT p50 ms",
             "ITL p50 ms", "accept", "acc len"))
num = lambda v: "-" if v is None else str(round(v, 2)) if isinstance(v, float) else str(v)
for l in labels:
    for r in json.load(open("%s/serve-%s-%s.json" % (results, name, l)))["runs"]:
        s, sp = r["summary"], r.get("server_speculative") or {}
        print(row % tuple(map(num, (l, r["concurrency"], s["completed"], s["failed"],
                                    s["request_throughput"], s["output_throughput"],
                                    s["median_ttft_ms"], s["median_tpot_ms"], s["median_itl_ms"],
                                    sp.get("acceptance_rate"), sp.get("mean_accepted_length")))))
E
