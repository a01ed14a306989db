#!/usr/bin/env bash
# Issue 8's decode figures in one GPU call: writes the random Llama-3-8B-shaped
# checkpoint with an EAGLE-3 head and the DeepSeek-V2-Lite-shaped one with an
# MTP layer (tools/random_ckpt), measures the copy bandwidth
# (bench/decode/copy_bw.py), and runs specd-bench-decode on:
#   l8b       plain at batch 1 and 32, graphs on and off; EAGLE-3 (k = 3, and
#             k = 2) at synthetic acceptance
#   dsv2lite  plain at batch 1 and 32, graphs on and off, and with the SIMT
#             MLA/MoE kernels (SPECD_MLA_TC=0 SPECD_MOE_TC=0); MTP at synthetic
#             acceptance: k = 1 at 0.875 (DeepSeek-V3 reports 85-90% for the
#             second token), k = 2 at 0.77 then 0.48 (vLLM's 77% and 37% per
#             position for DeepSeek-V4 MTP: 0.37 / 0.77 given the first), k = 3
#             at 0.85, 0.75, 0.6
#   long      both at LONG_PLEN-token prompts (3968: the V2-Lite-shaped checkpoint's
#             context is 4096), batch 1 and 32, 128 tokens (at 32 the first
#             request must still decode after the last prompt is in): plain,
#             the 8B with SPECD_ATTN_SPLIT_ALL=2 too, V2-Lite with =0 too
#             (its latent kernel splits at the default level 1); V2-Lite's MTP
#             k = 3 at 3584-token prompts and 480 tokens, with =0 too
#   tiny      the bundled model on its held-out prompts at batch 1, 8 and 32:
#             plain, and each proposer at k = 3 and auto (real acceptance);
#             TINY_MAXTOK tokens a request (512), the median of TINY_REPEAT
#             runs (3)
# Everything lands in OUT: decode.json (bench/decode/merge.py: every run, the
# summary, the speedups over plain), summary.txt, logs.tar.gz.
#
# usage: bench/gpu/decode_run.sh BIN_DIR OUT COMMIT [PHASES]
#   BIN_DIR   a CUDA build (BIN_DIR/bench/specd-bench-decode)
#   PHASES    comma list of ckpt,bw,l8b,dsv2lite,long,tiny,fp8 (default: all but fp8),
#             or floor (both models' plain decode at batch 1 and 32 only)
# environment:
#   CKPT      where the checkpoints go (default /dev/shm/specd-ckpt when it has
#             60 GB free, else /tmp/specd-ckpt); a checkpoint already written
#             there by the same command (its .complete marker) is kept
#   QUICK=1   toy-size checkpoints and short runs: a check of this script
#   MAXTOK    tokens per request (default 128; QUICK 24); PLEN prompt tokens (64)
#   EXTRA     more specd-bench-decode arguments for every run (e.g. "--repeat 3")
#   NOGRAPHS=0  skip the graphs-off runs
#   COPY_BW_GBS  a copy bandwidth to use instead of measuring it (with no bw phase)
#   DEVICE    the engine's device (default cuda; cpu with QUICK=1 checks the script
#             on a machine without a GPU); PY: the python with torch (default python3)
#   BUDGET_S  seconds for the whole script: a run that would start past them
#             is skipped (noted in the output), so the merge still writes
#             decode.json when a machine's time is short (a call cut by its
#             limit before the merge leaves no JSON)
set -uo pipefail
bin=${1:?BIN_DIR}; out=${2:?OUT}; commit=${3:-unknown}
phases=${4:-ckpt,bw,l8b,dsv2lite,long,tiny}
bench=$bin/bench/specd-bench-decode
quick=${QUICK:-0}
maxtok=${MAXTOK:-$([ "$quick" = 1 ] && echo 24 || echo 128)}
plen=${PLEN:-64}
device=${DEVICE:-cuda}
py=${PY:-python3}
. bench/gpu/env.sh
has() { [[ ",$phases," == *",$1,"* ]]; }
w=$(mktemp -d)
mkdir -p "$out"
t_all=$(date +%s.%N)
since() { awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $1 }"; }
: > "$w/timings.txt"
dev=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
echo "device: $dev; phases $phases; quick $quick; max_tokens $maxtok"
[ -x "$bench" ] || { echo "no $bench"; exit 1; }

if [ -z "${CKPT:-}" ]; then
    shm=$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
    if [ "$quick" = 1 ]; then CKPT=/tmp/specd-ckpt-quick
    elif [ "${shm:-0}" -ge 60 ]; then CKPT=/dev/shm/specd-ckpt
    else CKPT=/tmp/specd-ckpt; fi
fi
echo "checkpoints in $CKPT ($(df -h --output=avail "$(dirname "$CKPT")" | tail -1 | tr -d ' ') free there)"
[ "$quick" = 1 ] && export CKPT_ARGS=--tiny

# ---- checkpoints
ckpt() { # ckpt NAME: random_ckpt (bench/gpu/env.sh), timed
    local t0; t0=$(date +%s.%N)
    random_ckpt "$1" && echo "write_$1 $(since "$t0")" | tee -a "$w/timings.txt"
}
if has ckpt; then
    ckpt l8b
    ckpt dsv2lite
    du -sh "$CKPT"/* 2>/dev/null
fi

# ---- copy bandwidth
bw=${COPY_BW_GBS:-}
if has bw || [ -z "$bw" ]; then
    "$py" bench/decode/copy_bw.py --out "$w/copy_bw.json" || echo "copy_bw.py failed"
    bw=$(python3 -c "import json; print(json.load(open('$w/copy_bw.json'))['copy_bw_gbs'])" 2>/dev/null)
fi
bw=${bw:-0}
echo "copy bandwidth: $bw GB/s"

# ---- runs
common=(--device "$device" --commit "$commit" --machine "$dev" --max-tokens "$maxtok" --prompt-len "$plen"
        --warmup 8)
[ "$bw" != 0 ] && common+=(--copy-bw-gbs "$bw")
# shellcheck disable=SC2206
extra=(${EXTRA:-})
run() { # run LABEL ARGS...
    local label=$1; shift
    if [ -n "${BUDGET_S:-}" ] && awk "BEGIN { exit !($(since "$t_all") > ${BUDGET_S}) }"; then
        echo "== $label: skipped (BUDGET_S=$BUDGET_S spent)"
        return 0
    fi
    local t0; t0=$(date +%s.%N)
    "$bench" "${common[@]}" "${extra[@]}" --label "$label" --out "$w/run-$label.json" "$@" \
        > "$w/$label.txt" 2> "$w/$label.log"
    local rc=$?
    echo "run_$label $(since "$t0")" >> "$w/timings.txt"
    if [ $rc -ne 0 ]; then echo "== $label: exit $rc"; tail -5 "$w/$label.log"; fi
    tail -n +2 "$w/$label.txt" | sed "s/^/$label: /"
}
A=0.85,0.75,0.6   # a good chain head, k = 3
DS=0.875          # DeepSeek-V3's MTP: 85-90% for the second token, k = 1
VL=0.77,0.48      # vLLM, DeepSeek-V4 MTP at k = 2: 77% and 37% unconditional
if has l8b; then
    m=(--model "$CKPT/l8b" --batch 1,32)
    e3=(--spec eagle3 --draft-model "$CKPT/l8b-eagle3")
    run l8b-plain "${m[@]}"
    [ "${NOGRAPHS:-1}" = 1 ] && run l8b-plain-nographs "${m[@]}" --graphs off
    run l8b-eagle3-k3 "${m[@]}" "${e3[@]}" --k 3 --synthetic-accept $A
    run l8b-eagle3-k2 "${m[@]}" "${e3[@]}" --k 2 --synthetic-accept $VL
fi
if has floor; then
    # the batch-1 / 32 plain decode of both models alone (their floors)
    run dsv2lite-plain --model "$CKPT/dsv2lite" --batch 1,32
    run l8b-plain --model "$CKPT/l8b" --batch 1,32
fi
if has dsv2lite; then
    m=(--model "$CKPT/dsv2lite" --batch 1,32)
    run dsv2lite-plain "${m[@]}"
    [ "${NOGRAPHS:-1}" = 1 ] && run dsv2lite-plain-nographs "${m[@]}" --graphs off
    # the same with MLA attention and MoE prefill/verify off tensor cores
    SPECD_MLA_TC=0 SPECD_MOE_TC=0 run dsv2lite-plain-simt "${m[@]}"
    run dsv2lite-mtp-k1 "${m[@]}" --spec mtp --k 1 --synthetic-accept $DS
    run dsv2lite-mtp-k2 "${m[@]}" --spec mtp --k 2 --synthetic-accept $VL
    run dsv2lite-mtp-k3 "${m[@]}" --spec mtp --k 3 --synthetic-accept $A
fi
if has fp8; then
    # block-scaled FP8 projections kept as FP8 (--fp8-weights fp8) against
    # the BF16 checkpoints of the same shapes, plain decode; each pair is
    # removed after its runs (the four together outgrow /dev/shm)
    for mdl in l8b dsv2lite; do
        ckpt $mdl
        ckpt $mdl-fp8
        m=(--batch 1,32)
        run $mdl-bf16-ref --model "$CKPT/$mdl" "${m[@]}"
        run $mdl-fp8 --model "$CKPT/$mdl-fp8" "${m[@]}" --opt fp8-weights=fp8
        [ "${KEEP_CKPT:-0}" = 1 ] || rm -rf "$CKPT/$mdl" "$CKPT/$mdl-eagle3" "$CKPT/$mdl-fp8"
    done
fi
if has long; then
    # long contexts (LONG_PLEN, 3968-token prompts): the step's attention
    # reads each request's context, so this is where it shows; the DeepSeek
    # latent kernel splits steps of 9+ tokens (a batch's decode, verify
    # steps) by default (=0: whole), the 128-dim GQA one with
    # SPECD_ATTN_SPLIT_ALL=2
    lp=(--prompt-len "${LONG_PLEN:-3968}" --max-tokens 128 --batch 1,32)
    run l8b-long "${lp[@]}" --model "$CKPT/l8b"
    SPECD_ATTN_SPLIT_ALL=2 run l8b-long-split2 "${lp[@]}" --model "$CKPT/l8b"
    run dsv2lite-long "${lp[@]}" --model "$CKPT/dsv2lite"
    SPECD_ATTN_SPLIT_ALL=0 run dsv2lite-long-split0 "${lp[@]}" --model "$CKPT/dsv2lite"
    # MTP at k = 3 takes ~2.9 tokens a step: 480 tokens keep the first
    # request decoding until the last one's prompt is in (128 did not)
    lm=(--prompt-len "${LONG_MTP_PLEN:-3584}" --max-tokens 480 --batch 1,32)
    run dsv2lite-long-mtp-k3 "${lm[@]}" --model "$CKPT/dsv2lite" --spec mtp --k 3 --synthetic-accept $A
    SPECD_ATTN_SPLIT_ALL=0 run dsv2lite-long-mtp-k3-split0 "${lm[@]}" --model "$CKPT/dsv2lite" \
        --spec mtp --k 3 --synthetic-accept $A
fi
if has tiny; then
    # long enough for adaptive k's exploration to be a small part, repeated
    # (the median): a 128-token request at batch 32 is ~60 ms of steps
    m=(--model models/specd-tiny --prompts models/specd-tiny/heldout_prompts.jsonl --batch 1,8,32)
    [ "$quick" = 1 ] || m+=(--max-tokens "${TINY_MAXTOK:-512}" --repeat "${TINY_REPEAT:-3}")
    run tiny-plain "${m[@]}"
    for p in mtp eagle3 draft ngram; do
        d=()
        [ $p = eagle3 ] && d=(--draft-model models/specd-tiny-eagle3)
        [ $p = draft ] && d=(--draft-model models/specd-tiny-draft)
        run tiny-$p-k3 "${m[@]}" --spec $p "${d[@]}" --k 3
        run tiny-$p-auto "${m[@]}" --spec $p "${d[@]}" --k auto
    done
fi
echo "total $(since "$t_all")" >> "$w/timings.txt"
cat "$w/timings.txt"
bwf=(); [ -f "$w/copy_bw.json" ] && bwf=(--copy-bw "$w/copy_bw.json")
note="bench/gpu/decode_run.sh phases $phases, quick $quick"
python3 bench/decode/merge.py --out "$out/decode.json" "${bwf[@]}" --timings "$w/timings.txt" \
    --note "$note" "$w"/run-*.json | tee "$out/summary.txt"
tar -C "$w" -czf "$out/logs.tar.gz" .
