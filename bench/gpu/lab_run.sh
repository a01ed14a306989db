#!/usr/bin/env bash
# One GPU call for decode-step work (issue 8), in the order that matters
# when time runs out:
#   1. tests/gpu/validate.sh on BIN (every op against the CPU, whole models,
#      graph replay, generate on cuda vs cpu: gpu-validate.json);
#   2. specd-bench-kernels --gemv-lab: the GEMV at both real-size models'
#      shapes, and a Llama-3-8B-shaped step without attention, PDL off and
#      on (gemv-lab.json);
#   3. the random checkpoints (bench/gpu/env.sh), then a kernel-by-kernel
#      trace of batch-1 decode steps of both with Nsight Compute (each
#      kernel's own time; tools/ncu_step.py sums the last step up) when ncu
#      is there;
#   4. plain decode A/B on both models (bench/gpu/ab_launch.sh, batch 1):
#      BASE_BIN (when given) against BIN with SPECD_PDL=0 and =1 (AB_EXTRA:
#      more LABEL=BIN[:VAR=VALUE] configurations, e.g. the kernel switches
#      of kernels/cuda/common.cuh off one at a time:
#      nopre=BIN:SPECD_PDL=1:SPECD_GEMV_PRE=0 nosilu=BIN:SPECD_PDL=1:SPECD_MATMUL_SILU=0
#      gate2=BIN:SPECD_PDL=1:SPECD_MOE_GATE=2 nowide=BIN:SPECD_GEMV_WIDE=0
#      (session 8's pending patches 0001-0006 are in git history at
#      ce784d6; 0005 landed as SPECD_GEMV_WIDE, the others lost:
#      bench/results/ab-series-194388f.json); engine options as bench
#      arguments: noslots=BIN:--opt=moe-shared-slots=false).
# Everything lands in a work directory packed into OUT/lab.tgz after every
# phase (a call cut short still returns what ran).
# usage: bench/gpu/lab_run.sh BIN_DIR OUT COMMIT [BASE_BIN_DIR]
#   SKIP_VALIDATE=1 SKIP_LAB=1 SKIP_NCU=1 SKIP_AB=1: leave a phase out
#   LAB_AB="VAR=VALUE ...": run the GEMV lab again under those switches
#   NCU_DEEP=1: stall reasons of the 8B's small kernels (after the trace)
#   AB_NOPDL=0: the A/B without the new build's SPECD_PDL=0 run
set -uo pipefail
B=${1:?bin}; FINAL=${2:?out}; C=${3:-unknown}; BASE=${4:-}
. bench/gpu/env.sh
export CKPT=${CKPT:-/dev/shm/specd-ckpt}
OUT=$(mktemp -d)
mkdir -p "$FINAL"
save() { tar -C "$OUT" -czf "$FINAL/lab.tgz" . 2>/dev/null; }
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "${SKIP_VALIDATE:-0}" != 1 ]; then
    timeout ${VALIDATE_S:-180} bash tests/gpu/validate.sh "$B" "$OUT/validate" "$C" > "$OUT/validate.txt" 2>&1
    el "validate exit $?"
    grep -E "^FAIL|passed|cuda|failed" "$OUT/validate.txt" | grep -v '^ok' | tail -12
    save
fi
# the paths an A/B switch leaves off by default, through the op tests too
if [ "${SKIP_VALIDATE:-0}" != 1 ]; then
    SPECD_GEMV_PRE=0 SPECD_MATMUL_SILU=0 SPECD_MOE_GATE=2 SPECD_GEMV_WIDE=0 SPECD_GEMV_FEW=0 \
        timeout 120 "$B/test_gpu_ops" \
        > "$OUT/gpu_ops_switches_off.txt" 2>&1
    el "test_gpu_ops with the switches off: exit $?, $(grep -c '^FAIL' "$OUT/gpu_ops_switches_off.txt") FAIL"
    save
fi
if [ "${SKIP_LAB:-0}" != 1 ]; then
    timeout ${LAB_S:-200} "$B/bench/specd-bench-kernels" --gemv-lab --commit "$C" --out "$OUT/gemv-lab.json" \
        > "$OUT/gemv-lab.txt" 2>&1
    el "gemv lab exit $?"
    grep -A12 "batch-1 step" "$OUT/gemv-lab.txt" | head -12
    save
    # LAB_AB="VAR=VALUE ...": the lab once more under those switches (gemv-lab-ab.json)
    if [ -n "${LAB_AB:-}" ]; then
        env $LAB_AB timeout ${LAB_S:-200} "$B/bench/specd-bench-kernels" --gemv-lab --commit "$C" \
            --out "$OUT/gemv-lab-ab.json" > "$OUT/gemv-lab-ab.txt" 2>&1
        el "gemv lab with $LAB_AB exit $?"
        # the n = 1 and 4 rows: us/graph here, then under the switches
        paste <(awk 'NF > 8 && ($(NF-5) == 4 || $(NF-5) == 1) {print $0}' "$OUT/gemv-lab.txt") \
            <(awk 'NF > 8 && ($(NF-5) == 4 || $(NF-5) == 1) {print $(NF-4)}' "$OUT/gemv-lab-ab.txt") | head -24
        save
    fi
fi
random_ckpt l8b > "$OUT/ckpt.log" 2>&1; random_ckpt dsv2lite >> "$OUT/ckpt.log" 2>&1
el "checkpoints"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
if [ -n "$NCU" ] && [ "${SKIP_NCU:-0}" != 1 ]; then
    # the first ~2300 launches are start-up and the prompt's steps: skipped
    # (run, not profiled); then enough for two complete decode steps
    for m in l8b dsv2lite; do
        timeout ${NCU_S:-90} "$NCU" --clock-control none --cache-control none \
            --metrics gpu__time_duration.sum --print-units base --csv --page raw \
            --launch-skip ${NCU_SKIP:-2300} --launch-count ${NCU_N:-1500} \
            --log-file "$OUT/ncu-$m.csv" \
            "$B/bench/specd-bench-decode" --model "$CKPT/$m" --batch 1 --max-tokens 8 \
            --prompt-len 8 --warmup 2 --device cuda > "$OUT/ncu-$m.txt" 2>&1
        el "ncu $m exit $?"
        python3 tools/ncu_step.py "$OUT/ncu-$m.csv" --json "$OUT/ncu-$m.json" 2>&1 | head -${NCU_TOP:-30}
        save
    done
else
    el "no ncu ($NCU) or skipped"
fi
# NCU_DEEP=1: the small kernels of the 8B's decode at batch 1 and 4 and of
# V2-Lite's at batch 1 with stall reasons, DRAM throughput and occupancy
# (tools/ncu_deep.py): where their microseconds go (the next step for
# attention, the few-row GEMV, the MLA and MoE kernels)
if [ -n "$NCU" ] && [ "${NCU_DEEP:-0}" = 1 ]; then
    base_m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size
    st=smsp__average_warps_issue_stalled_
    # every stall reason by a regex; if this ncu refuses it, the common ones by name
    for run in l8b:1 l8b:4 dsv2lite:1; do
        m=${run%%:*}; bt=${run#*:}; tag=$m-b$bt
        ks='attn_kernel|attn_merge_kernel|gemv_kernel|norm_kernel|rope_kv_kernel'
        [ $m = dsv2lite ] && ks='mla_tc_kernel|mla_prep_kernel|attn_merge_kernel|gemv_kernel|moe_.*|router_route_kernel|norm_kernel|add4_kernel'
        for mset in "regex:${st}.*_per_issue_active\\.ratio" \
            "$(for r in long_scoreboard short_scoreboard barrier wait mio_throttle lg_throttle not_selected math_pipe_throttle; do printf '%s%s_per_issue_active.ratio,' $st $r; done | sed 's/,$//')"; do
            timeout ${NCU_DEEP_S:-120} "$NCU" --clock-control none --cache-control none \
                --kernel-name "regex:$ks" \
                --launch-skip ${NCU_DEEP_SKIP:-700} --launch-count ${NCU_DEEP_N:-24} \
                --metrics "$base_m,$mset" \
                --print-units base --csv --page raw --log-file "$OUT/ncu-deep-$tag.csv" \
                "$B/bench/specd-bench-decode" --model "$CKPT/$m" --batch $bt --max-tokens 16 \
                --prompt-len 8 --warmup 2 --device cuda > "$OUT/ncu-deep-$tag.txt" 2>&1
            rc=$?
            el "ncu deep $tag exit $rc"
            grep -q '"ID"' "$OUT/ncu-deep-$tag.csv" 2>/dev/null && break
        done
        python3 tools/ncu_deep.py "$OUT/ncu-deep-$tag.csv" --json "$OUT/ncu-deep-$tag.json" 2>&1 | head -16
        save
    done
fi
if [ "${SKIP_AB:-0}" != 1 ]; then
    cf=()
    [ -n "$BASE" ] && cf+=(base="$BASE")
    [ "${AB_NOPDL:-1}" = 1 ] && cf+=(new-nopdl="$B:SPECD_PDL=0") # AB_NOPDL=0: PDL is settled
    cf+=(new-pdl="$B:SPECD_PDL=1" ${AB_EXTRA:-})
    MODELS="l8b dsv2lite" ROUNDS=${ROUNDS:-1} BATCH=${BATCH:-1} MAXTOK=${MAXTOK:-96} \
        timeout ${AB_S:-240} bash bench/gpu/ab_launch.sh "$OUT/ab" "$C" "${cf[@]}" 2>&1 | tail -20
    el "a/b done"
    save
fi
