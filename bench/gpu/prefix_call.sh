#!/usr/bin/env bash
# The prefix cache's gain when serving on a GPU: the bundled model served
# with --prefix-cache and with --no-prefix-cache, one server at a time, each
# loaded by specd-bench-serve with one shared system text before every
# prompt (--shared-prefix-words), at a few concurrencies. Writes
# OUT/serve-prefix-{on,off}.json (the bench's records) and prints their
# tables.
# usage: bench/gpu/prefix_call.sh OUT BIN_DIR [SPEC]
#   BIN_DIR: a bench/gpu/pack.sh folder (specd, bench/specd-bench-serve)
#   SPEC: --spec of both servers (default none); WORDS, LEVELS, REQUESTS
#   override the shared words (600), the concurrencies (1,16) and requests
#   per level (64)
set -uo pipefail
. bench/gpu/env.sh
out=${1:?OUT}; bin=${2:?BIN_DIR}; spec=${3:-none}
words=${WORDS:-600} levels=${LEVELS:-1,16} requests=${REQUESTS:-64}
mkdir -p "$out"
port=18400
for mode in on off; do
    flag=--prefix-cache
    [ "$mode" = off ] && flag=--no-prefix-cache
    "$bin/specd" serve --port $port --spec "$spec" $flag >"$out/serve-$mode.log" 2>&1 &
    pid=$!
    if serve_ready $port; then
        "$bin/bench/specd-bench-serve" --url "http://127.0.0.1:$port" --shared-prefix-words "$words" \
            --random-input-len 40 --random-output-len 64 --num-requests "$requests" \
            --sweep "$levels" --label "prefix-cache-$mode" --out "$out/serve-prefix-$mode.json" \
            --quiet 2>&1 | tail -4
    else
        echo "prefix_call: the $mode server did not get ready:"
        tail -5 "$out/serve-$mode.log"
    fi
    kill -TERM $pid 2>/dev/null
    wait $pid 2>/dev/null
    port=$((port + 1))
done
