#!/usr/bin/env bash
# A/B of programmatic dependent launch on one GPU: plain decode at batch 1
# on the random Llama-3-8B-shaped and DeepSeek-V2-Lite-shaped checkpoints
# with SPECD_PDL on and off, interleaved over ROUNDS rounds (machines
# drift: compare within a round). (bench/results/ab-launch.json also has a
# GEMV L2 weight prefetch, measured 3-14% slower and removed.) Writes OUT/ab.json (every run) and prints a table.
# usage: bench/gpu/ab_launch.sh BIN_DIR OUT COMMIT
set -uo pipefail
bin=${1:?BIN_DIR}; out=${2:?OUT}; commit=${3:-unknown}
rounds=${ROUNDS:-2}
CK=${CKPT:-/dev/shm/specd-ckpt}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p "$out" "$CK"
w=$(mktemp -d)
[ -f "$CK/l8b/.complete" ] || { python3 tools/random_ckpt/llama.py --preset llama3-8b --out "$CK/l8b" \
    > "$w/ckpt.log" 2>&1 && touch "$CK/l8b/.complete"; }
[ -f "$CK/dsv2lite/.complete" ] || { python3 tools/random_ckpt/deepseek.py --preset v2-lite \
    --out "$CK/dsv2lite" >> "$w/ckpt.log" 2>&1 && touch "$CK/dsv2lite/.complete"; }
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
for r in $(seq 1 "$rounds"); do
    for m in l8b dsv2lite; do
        for pdl in 1 0; do
            l=$m-pdl$pdl-r$r
            SPECD_PDL=$pdl "$bin/bench/specd-bench-decode" \
                --model "$CK/$m" --batch 1 --max-tokens "${MAXTOK:-128}" --prompt-len 64 \
                --warmup 8 --device cuda --commit "$commit" --machine "$dev" --label "$l" \
                --out "$w/$l.json" > "$w/$l.txt" 2> "$w/$l.log" || tail -3 "$w/$l.log"
        done
    done
done
python3 - "$w" "$out/ab.json" "$commit" "$dev" <<'PY'
import glob, json, sys
w, out, commit, dev = sys.argv[1:5]
runs = []
for p in sorted(glob.glob(f"{w}/*.json")):
    d = json.load(open(p))
    x = d["results"][0]
    runs.append(dict(label=d["label"], decode_tokens_per_s=x["decode_tokens_per_s"],
                     step_ms=x["step_ms"]))
json.dump(dict(benchmark="bench/gpu/ab_launch.sh", commit=commit, machine=dev, runs=runs),
          open(out, "w"), indent=1)
for r in runs:
    print(f"{r['label']:28s} {r['decode_tokens_per_s']:8.1f} tok/s  {r['step_ms']:.3f} ms/step")
PY
tar -C "$w" -czf "$out/ab-runs.tgz" .
