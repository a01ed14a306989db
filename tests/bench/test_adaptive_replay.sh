#!/usr/bin/env bash
# specd-adaptive-replay: it reads the engine's own debug lines (a CPU run of
# specd-bench-decode with adaptive MTP: the formats of engine/plan.c and the
# replay agree), and on crafted logs it keeps drafting where drafting is cheap
# and the drafts good, and turns speculation off where verifying costs rows
# and the drafts are poor.
# usage: test_adaptive_replay.sh SPECD_ADAPTIVE_REPLAY SPECD_BENCH_DECODE
set -euo pipefail
replay=$1 bench=$2
cd "${SD_SRCDIR:-.}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# the engine's log
"$bench" --batch 1,2 --max-tokens 24 --warmup 1 --spec mtp --k auto --opt threads=2 \
    --opt log-level=debug --out "$tmp/run.json" > /dev/null 2> "$tmp/run.log" ||
    { tail -5 "$tmp/run.log"; fail "bench run"; }
"$replay" --quiet < "$tmp/run.log" > "$tmp/replay.txt" || fail "replay of the engine's log"
read -r nt nd < <(tail -1 "$tmp/replay.txt" | awk '{print $1, $4}')
n_log=$(grep -c 'adaptive k: target step: rows x batch' "$tmp/run.log")
[ "$nt" = "$n_log" ] || fail "replayed $nt target steps of the log's $n_log"
[ "$nd" -gt 0 ] || fail "no drafting phase replayed: $(tail -1 "$tmp/replay.txt")"

# crafted: batch 8, every shape's cost given each round (k = 0..4: 8..40 rows)
craft() { # craft MS_8 MS_16 MS_24 MS_32 MS_40 DRAFT_MS_PER_K
    for i in $(seq 1 60); do
        r=8
        for ms in "$1" "$2" "$3" "$4" "$5"; do
            echo "00:00:00.000 specd debug: adaptive k: target step: rows x batch $r x 8: $ms ms (step $i)"
            r=$((r + 8))
        done
        for k in 1 2 3 4; do
            echo "00:00:00.000 specd debug: adaptive k: drafting phase: requests x k 8 x $k: $(awk "BEGIN {print $6 * $k}") ms (step $i)"
        done
    done
}
craft 0.200 0.205 0.210 0.215 0.220 0.02 > "$tmp/cheap.log"
"$replay" --accept 0.9 --quiet < "$tmp/cheap.log" > "$tmp/cheap.txt"
grep -q 'speculation off 0 times' "$tmp/cheap.txt" || fail "cheap drafts turned off: $(cat "$tmp/cheap.txt")"
picks=$(tail -1 "$tmp/cheap.txt" | sed 's/.*picks by k: \([0-9 ]*\);.*/\1/')
set -- $picks
[ $(( $2 + $3 + $4 + $5 )) -gt $(( $1 * 4 )) ] || fail "cheap drafts: picks by k $picks"

craft 0.200 0.600 0.900 1.200 1.500 0.10 > "$tmp/dear.log"
"$replay" --accept 0.1 < "$tmp/dear.log" > "$tmp/dear.txt"
grep -q 'speculation off$' "$tmp/dear.txt" || fail "poor, dear drafts never turned off: $(tail -3 "$tmp/dear.txt")"

# crafted: one draft gains 4% over a plain step read one at a time, and
# queueing plain steps ahead would hide 0.04 of its 0.30 ms (the engine's
# "hidden by queueing ahead" lines): with --ahead (a GPU engine with launch
# ahead) plain decode wins
craft 0.300 0.330 0.450 0.600 0.750 0.03 |
    sed 's/^\(.*target step: rows x batch 8 x 8: .*(step \([0-9]*\))\)$/00:00:00.000 specd debug: adaptive k: hidden by queueing ahead: 1 x batch 1 x 8: 0.040 ms (step \2)\n\1/' \
    > "$tmp/tie.log"
[ "$(grep -c 'hidden by queueing ahead' "$tmp/tie.log")" = 60 ] || fail "crafted hidden lines"
"$replay" --accept 0.25 --quiet < "$tmp/tie.log" > "$tmp/tie.txt"
grep -q 'speculation off 0 times' "$tmp/tie.txt" || fail "a 4% draft turned off: $(cat "$tmp/tie.txt")"
"$replay" --accept 0.25 --ahead < "$tmp/tie.log" > "$tmp/tie-ahead.txt"
grep -q 'speculation off$' "$tmp/tie-ahead.txt" ||
    fail "plain launched ahead did not win: $(tail -3 "$tmp/tie-ahead.txt")"

# ... and where steps whose drafts stayed on the device took 0.300 ms (the
# engine's "draft-ahead step" lines: 0.06 of the 0.36 priced hidden) one
# draft at a better acceptance wins again (32.7 tokens a ms against 30.8)
# once the hide is trusted (its third time, from the third round on: the
# picks before it turn speculation off once), which without them it does
# not (30.0)
sed 's/^\(.*drafting phase: requests x k 8 x 4: .*(step \([0-9]*\))\)$/\1\n00:00:00.000 specd debug: adaptive k: draft-ahead step: drafting x batch 8 x 8, k 1: 0.300 ms (step \2)/' \
    "$tmp/tie.log" > "$tmp/hide.log"
[ "$(grep -c 'draft-ahead step' "$tmp/hide.log")" = 60 ] || fail "crafted draft-ahead lines"
"$replay" --accept 0.35 --ahead < "$tmp/tie.log" > "$tmp/tie35.txt"
grep -q 'speculation off$' "$tmp/tie35.txt" || fail "one draft at 0.35 won: $(tail -3 "$tmp/tie35.txt")"
"$replay" --accept 0.35 --ahead --quiet < "$tmp/hide.log" > "$tmp/hide.txt"
picks=$(tail -1 "$tmp/hide.txt" | sed 's/.*picks by k: \([0-9 ]*\);.*/\1/')
set -- $picks
[ "$2" -gt $(( 20 * $1 )) ] && grep -q 'speculation off 1 times' "$tmp/hide.txt" ||
    fail "the draft-ahead steps' price was not read: $(cat "$tmp/hide.txt")"
echo "ok"
