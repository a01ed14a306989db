#!/usr/bin/env bash
# What JSON mode costs when serving on a GPU: one server of the bundled
# model, loaded through the chat endpoint by specd-bench-serve with and
# without --json-object (response_format json_object on every request),
# the two alternating for ROUNDS rounds at a few concurrencies. Writes
# OUT/serve-json-{off,on}-rN.json (the bench's records) and prints their
# tables; TPOT p50 on against off is the masks' share of a token's time.
# Then "mix": the plain requests again while another client keeps 2 JSON
# requests in flight (OUT/serve-json-mix-rN.json): what a few JSON
# requests cost the others in their batch.
# usage: bench/gpu/json_call.sh OUT BIN_DIR [SPEC]
#   BIN_DIR: a bench/gpu/pack.sh folder (specd, bench/specd-bench-serve)
#   SPEC: --spec of the server (default none); LEVELS (1,16), REQUESTS (64),
#   ROUNDS (2), TOKENS (max_tokens, 64)
set -uo pipefail
. bench/gpu/env.sh
out=${1:?OUT}; bin=${2:?BIN_DIR}; spec=${3:-none}
levels=${LEVELS:-1,16} requests=${REQUESTS:-64} rounds=${ROUNDS:-2} tokens=${TOKENS:-64}
mkdir -p "$out"
port=18500
"$bin/specd" serve --port $port --spec "$spec" >"$out/serve.log" 2>&1 &
pid=$!
if ! serve_ready $port; then
    echo "json_call: the server did not get ready:"
    tail -5 "$out/serve.log"
else
    for r in $(seq 1 "$rounds"); do
        for mode in off on mix; do
            flag= side=
            [ "$mode" = on ] && flag=--json-object
            if [ "$mode" = mix ]; then
                "$bin/bench/specd-bench-serve" --url "http://127.0.0.1:$port" --endpoint chat \
                    --json-object --random-input-len 40 --max-tokens "$tokens" --num-requests 100000 \
                    --concurrency 2 --warmup 0 --duration-limit 120 --no-metrics --quiet \
                    >/dev/null 2>&1 &
                side=$!
                sleep 0.5
            fi
            echo "round $r, JSON mode $mode"
            "$bin/bench/specd-bench-serve" --url "http://127.0.0.1:$port" --endpoint chat $flag \
                --random-input-len 40 --max-tokens "$tokens" --num-requests "$requests" \
                --sweep "$levels" --label "json-$mode" --out "$out/serve-json-$mode-r$r.json" \
                --quiet 2>&1 | tail -3
            if [ -n "$side" ]; then kill -INT $side 2>/dev/null; wait $side 2>/dev/null; fi
        done
    done
fi
kill -TERM $pid 2>/dev/null
wait $pid 2>/dev/null
