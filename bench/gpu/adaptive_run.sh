#!/usr/bin/env bash
# Adaptive k on the bundled model, each configuration in ROUNDS fresh
# engines (a run's outcome is bimodal: it drafts deep, or speculation goes
# off in its first steps; one run per build cannot tell two builds apart):
# plain and --k auto for mtp, eagle3 and draft at batch 1, 8 and 32, 512
# tokens a request, 3 repeats an engine (the bench's median), for each
# build given, the builds interleaved round by round. Writes OUT/adaptive.json
# (every run: speedup over the same round's plain, steps by k, requests
# not drafting, proposer passes run eagerly and those the graph cache
# turned away), OUT/summary.txt (min / median / max a cell and build) and
# OUT/runs.tgz (the bench's JSON and logs): three files, whatever the count
# of runs.
# usage: bench/gpu/adaptive_run.sh OUT COMMIT LABEL=BIN_DIR[:VAR=VALUE...][:--opt=VALUE...]...
#   (e.g. new=.carry/a pin0=.carry/a:SPECD_PINNED=0: the same build, a switch off)
#   ROUNDS (3), BATCH (1,8,32), SPECS ("mtp eagle3 draft"), MAXTOK (512),
#   DEADLINE (a time in seconds since the epoch: no round starts after it,
#   so a call's time limit never takes the rounds already run with it)
set -uo pipefail
out=${1:?OUT}; commit=${2:-unknown}; shift 2
[ $# -ge 1 ] || { echo "usage: $0 OUT COMMIT LABEL=BIN_DIR[:VAR=VALUE...]..."; exit 2; }
mkdir -p "$out"
. bench/gpu/env.sh
w=$(mktemp -d)
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
m=(--model models/specd-tiny --prompts models/specd-tiny/heldout_prompts.jsonl
   --batch "${BATCH:-1,8,32}" --max-tokens "${MAXTOK:-512}" --repeat 3 --device "${DEVICE:-cuda}"
   --commit "$commit" --machine "${dev:-unknown}")
for r in $(seq 1 "${ROUNDS:-3}"); do
    if [ -n "${DEADLINE:-}" ] && [ "$(date +%s)" -ge "$DEADLINE" ]; then
        echo "== deadline: $((r - 1)) rounds run"; break
    fi
    for cfg in "$@"; do
        parse_config "$cfg"
        for spec in none ${SPECS:-mtp eagle3 draft}; do
            d=()
            [ "$spec" = eagle3 ] && d=(--draft-model models/specd-tiny-eagle3)
            [ "$spec" = draft ] && d=(--draft-model models/specd-tiny-draft)
            k=(--k auto); [ "$spec" = none ] && k=()
            tag=$cfg_label-$spec-r$r
            env "${cfg_env[@]}" timeout 120 "$cfg_bin/bench/specd-bench-decode" "${m[@]}" "${cfg_args[@]}" \
                --spec "$spec" "${d[@]}" "${k[@]}" \
                --label "$tag" --out "$w/$tag.json" > "$w/$tag.txt" 2>&1 ||
                echo "== $tag: exit $?"
        done
    done
done
python3 bench/gpu/adaptive_merge.py "$w" "$out" "$commit" "${dev:-unknown}" "$*"
tar -C "$w" -czf "$out/runs.tgz" .
