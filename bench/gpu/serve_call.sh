#!/usr/bin/env bash
# One GPU call for serving work, in the order that matters when time runs
# out, everything it writes packed into at most five files in OUT:
#   1. tests/gpu/validate.sh on NEW (and on BASE with VALIDATE_BASE=1):
#      OUT/validate-new.tgz (validate-base.tgz), the gpu-validate.json
#      bench/results keeps is inside;
#   2. the Poisson A/B of BASE against NEW (bench/gpu/serve_ab.sh: rounds
#      alternate the builds; each speculative server's drafting steps by
#      why they drafted printed under the TPOT table): OUT/ab.tgz;
#   3. OUT/summary.txt: what was printed.
# The A/B starts no level past DEADLINE (default: 500 s after the start,
# under a call's 600), so a call's time limit never takes what already ran.
# usage: bench/gpu/serve_call.sh OUT COMMIT BASE_DIR NEW_DIR
#   (the DIRs: bench/gpu/pack.sh folders, e.g. bench/gpu/pending/build.sh's
#   .carry/base-bin and .carry/new-bin once unpacked)
#   VALIDATE_BASE=1 (its record says COMMIT: for a BASE of COMMIT's tree only),
#   SKIP_VALIDATE=1; ROUNDS, LEVELS, PROPOSERS, NREQ as
#   serve_ab.sh takes them; BUDGET_S (500): seconds from the start to the
#   A/B's deadline
set -uo pipefail
out=${1:?OUT}; commit=${2:?COMMIT}; base=${3:?BASE_DIR}; new=${4:?NEW_DIR}
mkdir -p "$out"
t0=$(date +%s)
w=$(mktemp -d)
log() { echo "$*" | tee -a "$out/summary.txt"; }
validate() { # LABEL BIN_DIR COMMIT
    local d="$w/validate-$1"
    timeout 200 bash tests/gpu/validate.sh "$2" "$d" "$3" >"$d.txt" 2>&1
    log "validate $1: rc $? in $(($(date +%s) - t0)) s: $(grep -E '^passed' "$d.txt" | tail -1)"
    grep -E '^FAIL' "$d.txt" | head -5 | tee -a "$out/summary.txt"
    mv "$d.txt" "$d/"
    tar -C "$w" -czf "$out/validate-$1.tgz" "validate-$1"
}
if [ -z "${SKIP_VALIDATE:-}" ]; then
    # NEW is COMMIT's tree, plus the pending series where one waits
    series=$(ls bench/gpu/pending/*.patch >/dev/null 2>&1 && echo +pending)
    validate new "$new" "$commit$series"
    [ -n "${VALIDATE_BASE:-}" ] && validate base "$base" "$commit"
fi
DEADLINE=$((t0 + ${BUDGET_S:-500})) bash bench/gpu/serve_ab.sh "$w/ab" base="$base" new="$new" 2>&1 |
    tee -a "$out/summary.txt"
tar -C "$w" -czf "$out/ab.tgz" ab
log "total $(($(date +%s) - t0)) s"
rm -rf "$w"
