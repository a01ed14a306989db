#!/usr/bin/env bash
# One GPU call that checks a build and traces why its speculative servers
# explore under Poisson arrivals, in the order that matters when time runs
# out:
#   1. tests/gpu/validate.sh on BIN_DIR: OUT/validate.tgz (gpu-validate.json
#      inside), unless SKIP_VALIDATE=1;
#   2. bench/gpu/golden_hf.sh (HF tokenizers and transformers fixtures) where
#      GOLDEN=1: OUT/g;
#   3. each of PROPOSERS (default mtp,eagle3,draft) and plain served at
#      LEVEL=RATE (default 64=650) with --log-level debug, NREQ (1024)
#      requests of 128 tokens: the servers' logs and results in
#      OUT/trace.tgz, and the counts of each exploration's cause
#      (adaptive k's "exploring at batch" lines) and where each server's host
#      time between steps went (bench/serve/host_gaps.py) in OUT/summary.txt.
# No sweep starts past DEADLINE (BUDGET_S, default 520 s, after the start).
# usage: bench/gpu/trace_call.sh OUT COMMIT BIN_DIR
set -uo pipefail
out=${1:?OUT}; commit=${2:?COMMIT}; bin=${3:?BIN_DIR}
mkdir -p "$out"
t0=$(date +%s)
w=$(mktemp -d)
log() { echo "$*" | tee -a "$out/summary.txt"; }
if [ -z "${SKIP_VALIDATE:-}" ]; then
    timeout 220 bash tests/gpu/validate.sh "$bin" "$w/validate" "$commit" >"$w/validate.txt" 2>&1
    log "validate: rc $? in $(($(date +%s) - t0)) s: $(grep -E '^passed' "$w/validate.txt" | tail -1)"
    grep -E '^FAIL' "$w/validate.txt" | head -5 | tee -a "$out/summary.txt"
    mv "$w/validate.txt" "$w/validate/"
    tar -C "$w" -czf "$out/validate.tgz" validate
fi
if [ -n "${GOLDEN:-}" ]; then
    timeout 150 bash bench/gpu/golden_hf.sh "$out/g" >"$out/golden.txt" 2>&1
    log "golden_hf: rc $? in $(($(date +%s) - t0)) s"
fi
lv=${LEVEL:-64=650}
c=${lv%%=*} rate=${lv#*=}
deadline=$((t0 + ${BUDGET_S:-520}))
for p in ${PROPOSERS:-mtp eagle3 draft}; do
    [ "$(date +%s)" -ge "$deadline" ] && { log "== deadline"; break; }
    d="$w/trace/$p"
    mkdir -p "$d"
    RESULTS=$d bash bench/serve/sweep.sh -1 -B "$bin" -s "--model models/specd-tiny --log-level debug" \
        -p "$p" -c "$c" -n trace -L "$d" -- --prompts models/specd-tiny/heldout_prompts.jsonl \
        --max-prompt-chars 4096 --max-tokens 128 --duration-limit 600 --no-requests \
        --num-requests "${NREQ:-1024}" --rate "$rate" >"$d/sweep.log" 2>&1 || log "== $p: sweep failed"
    python3 - "$d" "$p" <<'P' | tee -a "$out/summary.txt"
import glob, json, re, sys, collections
d, p = sys.argv[1], sys.argv[2]
tp = {}
for f in glob.glob(d + "/serve-trace-*.json"):
    j = json.load(open(f))
    for r in j.get("runs", [])[:1]:
        tp[j["label"]] = r["summary"]["median_tpot_ms"]
        sp = r.get("server_speculative") or {}
        if sp.get("engine_drafting_steps_by_why"):
            bywhy = sp["engine_drafting_steps_by_why"]
line = ", ".join("%s %.3f" % kv for kv in sorted(tp.items()))
if "plain" in tp and p in tp:
    line += " (%.3fx)" % (tp[p] / tp["plain"])
print("%s: TPOT p50 ms: %s" % (p, line))
if "bywhy" in dir():
    print("  drafting steps by why: %s" % ", ".join("%s %d" % (k, v) for k, v in bywhy.items() if v))
why = collections.Counter()
n = 0
for f in glob.glob(d + "/serve-*.log"):
    for l in open(f, errors="replace"):
        m = re.search(r"adaptive k: exploring at batch \d+, \d+ drafting \(step \d+\)(.*)", l)
        if not m:
            continue
        n += 1
        for part in m.group(1).split(";")[1:]:
            part = re.sub(r"\d+ steps", "N steps", part.strip())
            part = re.sub(r"\d+ rows of batch \d+", "R rows of batch B", part)
            part = re.sub(r"draft of \d+ requests", "draft of D requests", part)
            part = re.sub(r"no curve of batch \d+", "no curve of batch B", part)
            why[part] += 1
        if "prices measured again" in l:
            pass
print("  explorations %d; causes: %s" % (n, "; ".join("%s x%d" % kv for kv in why.most_common())))
ref = collections.Counter()
for f in glob.glob(d + "/serve-*.log"):
    for l in open(f, errors="replace"):
        m = re.search(r"prices measured again at batch \d+ \(step \d+\): (.*)", l)
        if m:
            ref[m.group(1).strip()] += 1
print("  refreshes: %s" % "; ".join("%s x%d" % kv for kv in ref.most_common()))
# the verdicts in order: cohorts (begun, ended), demand picks that changed,
# speculation turned off for the running requests (the first 24)
ev = []
for f in sorted(glob.glob(d + "/serve-*.log")):
    for l in open(f, errors="replace"):
        m = re.search(r"adaptive k: (a cohort at batch \d+ \(step \d+\).*|the cohort ends.*|"
                      r"demand pick .*|0 for \d+ steps: speculation off for the \d+ running.*)", l)
        if not m:
            continue
        e = "%s: %s" % (f.rsplit("/", 1)[-1], m.group(1).strip())
        # a run of lines alike but for their numbers: the first, counted
        if ev and re.sub(r"\d+", "N", ev[-1][0]) == re.sub(r"\d+", "N", e):
            ev[-1][1] += 1
        else:
            ev.append([e, 1])
print("  verdicts: %s" % "".join("\n    %s%s" % (e, " (x%d alike)" % n if n > 1 else "")
                                 for e, n in ev[:24]))
P
    # where each server's host time between steps went (the largest four)
    python3 bench/serve/host_gaps.py --top 4 "$d"/serve-*.log 2>&1 | sed "s|$d/||" | tee -a "$out/summary.txt"
    for f in "$d"/serve-*.log; do [ -f "$f" ] && xz -T0 "$f"; done
done
tar -C "$w" -czf "$out/trace.tgz" trace 2>/dev/null
log "total $(($(date +%s) - t0)) s"
rm -rf "$w"
