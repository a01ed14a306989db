#!/usr/bin/env bash
# One GPU call for the decode GEMV work (issue 8): in the order that matters
# when time runs out,
#   1. test_gpu_ops (every op against the CPU; the copy-engine GEMV in each
#      configuration among them);
#   2. specd-bench-kernels --gemv-lab: the GEMV paths at both real-size
#      models' shapes and a whole Llama-3-8B-shaped step without attention,
#      programmatic dependent launch off and on (OUT/gemv-lab.json);
#   3. the random checkpoints (bench/gpu/env.sh), then a kernel-by-kernel
#      trace of batch-1 decode on both with Nsight Compute (each kernel's
#      own time, OUT/ncu-*.csv; tools/ncu_step.py sums one step up) when ncu
#      is there;
#   4. plain decode A/B on both models (bench/gpu/ab_launch.sh): the block
#      GEMV against the copy-engine GEMV in the configuration the lab's step
#      found fastest, each with SPECD_PDL off and on.
# usage: bench/gpu/lab_run.sh BIN_DIR OUT COMMIT
set -uo pipefail
B=${1:?bin}; FINAL=${2:?out}; C=${3:-unknown}
. bench/gpu/env.sh
export CKPT=${CKPT:-/dev/shm/specd-ckpt}
# everything is written to a work directory and packed into FINAL/lab.tgz
# after every phase (a call cut short still returns what ran)
OUT=$(mktemp -d)
mkdir -p "$FINAL"
save() { tar -C "$OUT" -czf "$FINAL/lab.tgz" . 2>/dev/null; }
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# the copy-engine GEMV's own test first: a wrong byte count would hang its
# barrier wait, and then nothing else that uses it is run
timeout 60 "$B/test_gpu_ops" copy_engine > "$OUT/gpu_ops_tma.txt" 2>&1
tma_ok=$?
el "test_gpu_ops copy_engine exit $tma_ok"; grep -E '^(FAIL|ok) ' "$OUT/gpu_ops_tma.txt" | head -5
tail -3 "$OUT/gpu_ops_tma.txt"
timeout ${OPS_S:-150} "$B/test_gpu_ops" > "$OUT/gpu_ops.txt" 2>&1
el "test_gpu_ops exit $?: $(grep -c '^ok ' "$OUT/gpu_ops.txt") ok, $(grep -c '^FAIL' "$OUT/gpu_ops.txt") FAIL"
grep -E '^FAIL' "$OUT/gpu_ops.txt" | head -5
save
if [ $tma_ok = 0 ]; then
    timeout ${LAB_S:-240} "$B/bench/specd-bench-kernels" --gemv-lab --commit "$C" --out "$OUT/gemv-lab.json" \
        > "$OUT/gemv-lab.txt" 2>&1
    el "gemv lab exit $?"
    grep -A40 "batch-1 step" "$OUT/gemv-lab.txt" | head -30
    save
fi
# the fastest copy-engine configuration of the step, with pdl on
best=$(python3 - "$OUT/gemv-lab.json" <<'PY'
import json, sys
try:
    rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r.get("op") == "l8b_step_no_attention"]
    t = {}
    for r in rows:
        if r["path"].startswith("tma") and not r["path"].endswith("h"):
            t.setdefault(r["path"], []).append(r["us_graph"])
    print(min(t, key=lambda p: min(t[p]))[3])
except Exception:
    print(1)
PY
)
el "best copy-engine configuration: $best"
random_ckpt l8b > "$OUT/ckpt.log" 2>&1; random_ckpt dsv2lite >> "$OUT/ckpt.log" 2>&1
el "checkpoints"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
if [ -n "$NCU" ] && [ "${SKIP_NCU:-0}" != 1 ]; then
    for m in l8b dsv2lite; do
        cfgs=0; [ $tma_ok = 0 ] && [ $m = l8b ] && cfgs="0 $best"
        for cfg in $cfgs; do
            SPECD_GEMV_TMA=$cfg timeout ${NCU_S:-90} "$NCU" --clock-control none --cache-control none \
                --metrics gpu__time_duration.sum --print-units base --csv --page raw --launch-count ${NCU_N:-2500} \
                --log-file "$OUT/ncu-$m-tma$cfg.csv" \
                "$B/bench/specd-bench-decode" --model "$CKPT/$m" --batch 1 --max-tokens 4 \
                --prompt-len 8 --warmup 1 --device cuda > "$OUT/ncu-$m-tma$cfg.txt" 2>&1
            el "ncu $m tma$cfg exit $?"
            python3 tools/ncu_step.py "$OUT/ncu-$m-tma$cfg.csv" --json "$OUT/ncu-$m-tma$cfg.json" 2>&1 |
                head -${NCU_TOP:-24}
            save
        done
    done
else
    el "no ncu ($NCU) or skipped"
fi
cf=(block="$B:SPECD_GEMV_TMA=0" block-pdl="$B:SPECD_GEMV_TMA=0:SPECD_PDL=1")
[ $tma_ok = 0 ] && cf+=(tma="$B:SPECD_GEMV_TMA=$best" tma-pdl="$B:SPECD_GEMV_TMA=$best:SPECD_PDL=1")
MODELS="l8b dsv2lite" ROUNDS=${ROUNDS:-1} BATCH=${BATCH:-1} MAXTOK=${MAXTOK:-96} \
    timeout ${AB_S:-240} bash bench/gpu/ab_launch.sh "$OUT/ab" "$C" "${cf[@]}" 2>&1 | tail -20
el "a/b done"
save
