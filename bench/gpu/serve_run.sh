#!/usr/bin/env bash
# The serving sweep on a machine that has the binaries but no build tools
# beyond them (the GPU machine: no jq, no gnuplot): `specd serve` on the
# bundled model plain and with each proposer, one server at a time, and
# specd-bench-serve against each over a sweep of concurrencies. The sweep
# starts with concurrency 1 twice: the first run meets each prompt length
# for the first time (a prefill of a new row count runs cuBLASLt's timed
# trial of its GEMM shapes), the second the same prompts again, so their
# TTFT apart is what a server pays the first time it sees a length.
#
# usage: bench/gpu/serve_run.sh BIN_DIR OUT NAME
#   BIN_DIR holds specd and bench/specd-bench-serve (bench/gpu/pack.sh);
#   OUT receives serve-NAME-LABEL.json (specd-bench-serve's own JSON, as
#   bench/serve/sweep.sh writes it: bench/plot/plot.sh reads them) and the
#   servers' logs; a table at the end.
#   LABELS ("plain mtp eagle3 draft"), LEVELS (1,1,4,16,64), DEVICE (cuda),
#   PORT (18123), SERVE ("": more `specd serve` options), BENCH ("": more
#   specd-bench-serve options), NREQ (32: requests a level), MAXTOK (128),
#   TEMP (0)
set -uo pipefail
bin=${1:?BIN_DIR}; out=${2:?OUT}; name=${3:?NAME}
mkdir -p "$out"
labels=${LABELS:-plain mtp eagle3 draft}
levels=${LEVELS:-1,1,4,16,64}
port=${PORT:-18123}
machine=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[ -n "$machine" ] || machine="CPU only: $(nproc) cores"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT

for l in $labels; do
    spec=()
    case $l in
    plain) ;;
    eagle3 | draft) spec=(--spec "$l" --draft-model "models/specd-tiny-$l") ;;
    *) spec=(--spec "$l") ;;
    esac
    log=$out/serve-$name-$l.log
    # shellcheck disable=SC2086
    "$bin/specd" serve --port "$port" --device "${DEVICE:-cuda}" "${spec[@]}" ${SERVE:-} > "$log" 2>&1 &
    pid=$!
    ready=0
    for _ in $(seq 600); do
        grep -q 'ready: serving' "$log" && { ready=1; break; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if [ $ready = 0 ]; then
        echo "serve_run.sh: specd serve ($l) did not get ready:" >&2
        tail -5 "$log" >&2
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""
        continue
    fi
    # shellcheck disable=SC2086
    "$bin/bench/specd-bench-serve" --url "http://127.0.0.1:$port" \
        --prompts models/specd-tiny/heldout_prompts.jsonl --max-prompt-chars 4096 \
        --max-tokens "${MAXTOK:-128}" --num-requests "${NREQ:-32}" --duration-limit 300 \
        --temperature "${TEMP:-0}" --sweep "$levels" --label "$l" --machine "$machine" \
        --quiet --out "$out/serve-$name-$l.json" ${BENCH:-} > "$out/bench-$name-$l.txt" 2>&1 ||
        echo "serve_run.sh: specd-bench-serve ($l) exit $?" >&2
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=""
    port=$((port + 1))
done

python3 - "$out" "$name" $labels <<'E'
import json, os, sys
out, name, labels = sys.argv[1], sys.argv[2], sys.argv[3:]
print("%-7s %5s %5s %4s %9s %11s %11s %11s %7s %7s" % ("label", "conc", "done", "fail", "out tok/s",
      "TTFT p50 ms", "TPOT p50 ms", "ITL p50 ms", "accept", "acc len"))
for l in labels:
    f = os.path.join(out, "serve-%s-%s.json" % (name, l))
    if not os.path.exists(f):
        print("%-7s (no results)" % l)
        continue
    for r in json.load(open(f))["runs"]:
        s, sp = r["summary"], r.get("server_speculative") or {}
        num = lambda v: "-" if v is None else ("%.2f" % v if isinstance(v, float) else str(v))
        print("%-7s %5s %5s %4s %9s %11s %11s %11s %7s %7s" % (l, r["concurrency"], s["completed"],
              s["failed"], num(s["output_throughput"]), num(s["median_ttft_ms"]),
              num(s["median_tpot_ms"]), num(s["median_itl_ms"]), num(sp.get("acceptance_rate")),
              num(sp.get("mean_accepted_length"))))
E
