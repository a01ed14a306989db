#!/usr/bin/env bash
# Serving A/B of builds under Poisson arrivals below capacity (the steady
# state; bench/serve/README.md): for each round, each build in turn serves
# the bundled model plain and with each proposer (one server at a time),
# at each LEVEL=RATE (concurrency cap = requests/s), 1024 requests of 128
# tokens, greedy. Writes OUT/summary.json (bench/serve/summarize.py, a group
# a round, build and level) and prints median TPOT per label, and each
# proposer's TPOT over the same round's plain.
# usage: bench/gpu/serve_ab.sh OUT LABEL=BIN_DIR...
#   ROUNDS (2), LEVELS ("16=350 64=650"), PROPOSERS (mtp,eagle3,draft), NREQ (1024),
#   DEADLINE (a time in seconds since the epoch: no sweep starts after it)
set -uo pipefail
out=${1:?OUT}
shift
[ $# -ge 1 ] || { echo "usage: $0 OUT LABEL=BIN_DIR..."; exit 2; }
mkdir -p "$out"
args=(--prompts models/specd-tiny/heldout_prompts.jsonl --max-prompt-chars 4096 --max-tokens 128
      --duration-limit 600 --no-requests --num-requests "${NREQ:-1024}")
groups=()
for r in $(seq 1 "${ROUNDS:-2}"); do
    for b in "$@"; do
        label=${b%%=*} dir=${b#*=}
        for lv in ${LEVELS:-16=350 64=650}; do
            if [ -n "${DEADLINE:-}" ] && [ "$(date +%s)" -ge "$DEADLINE" ]; then
                echo "== deadline"
                break 3
            fi
            c=${lv%%=*} rate=${lv#*=} d="$out/r$r-$label-c$c"
            RESULTS=$d bash bench/serve/sweep.sh -1 -B "$dir" -s "--model models/specd-tiny" \
                -p "${PROPOSERS:-mtp,eagle3,draft}" -c "$c" -n ab -- "${args[@]}" --rate "$rate" \
                >"$d.log" 2>&1 || { echo "== $d: sweep failed"; tail -5 "$d.log"; continue; }
            groups+=(--group "r$r $label c$c rate $rate" "$d"/serve-ab-*.json)
        done
    done
done
((${#groups[@]})) || exit 1
python3 bench/serve/summarize.py --sub "$out/=OUT/" "${groups[@]}" >"$out/summary.json"
python3 - "$out/summary.json" <<'E'
import json, sys
groups = json.load(open(sys.argv[1]))["groups"]
for g in groups:
    tp = {f["label"]: f["levels"][0]["tpot_p50_ms"] for f in g["files"] if f["levels"]}
    base = tp.get("plain")
    cells = ["%s %.3f%s" % (l, t, " (%.2fx)" % (t / base) if base and l != "plain" else "")
             for l, t in tp.items()]
    print("%-28s TPOT p50 ms: %s" % (g["name"], ", ".join(cells)))
# a speculative server's steps by k and those queued ahead (plain steps
# launched before the step before was read), and its drafting steps by why
# they drafted (with the requests of those steps that did not draft); every
# server's steps not queued ahead by cause
for g in groups:
    for f in g["files"]:
        for lv in f["levels"][:1]:
            why = {w: n for w, n in (lv.get("engine_drafting_steps_by_why") or {}).items() if n}
            cause = {c: int(n) for c, n in (lv.get("engine_not_ahead_steps_by_cause") or {}).items() if n}
            if cause:
                print("%-28s %-7s %d queued ahead; not by cause: %s" % (
                    g["name"], f["label"], int(lv.get("engine_launch_ahead_steps") or 0),
                    ", ".join("%s %d" % c for c in cause.items())))
            if not why and not lv.get("engine_steps_by_k"):
                continue
            idle = lv.get("engine_drafting_idle_by_why") or {}
            print("%-28s %-7s k %s, %d queued ahead, %d cohorts; drafting by why: %s" % (
                g["name"], f["label"], [int(x) for x in lv.get("engine_steps_by_k") or []],
                int(lv.get("engine_launch_ahead_steps") or 0), int(lv.get("engine_cohorts") or 0),
                ", ".join("%s %d (%d idle)" % (w, n, idle.get(w, 0)) for w, n in why.items())))
E
