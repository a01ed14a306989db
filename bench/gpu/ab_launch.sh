#!/usr/bin/env bash
# A/B of builds and switches on one GPU: plain decode (batch 1 and 32 by
# default) on the random Llama-3-8B-shaped and DeepSeek-V2-Lite-shaped
# checkpoints, for each configuration, interleaved over ROUNDS rounds
# (machines drift between calls and within one: compare within a round).
# A configuration is LABEL=BIN_DIR[:VAR=VALUE...], e.g. main=.carry/a
# merge=.carry/b pdl=.carry/a:SPECD_PDL=1; a part that starts with -- is an
# argument of specd-bench-decode instead (slots=.carry/a:--opt=moe-shared-slots=true
# passes --opt moe-shared-slots=true). Writes OUT/ab.json (every run)
# and OUT/ab-runs.tgz; prints a table.
# (bench/results/ab-launch.json is this script's first use: SPECD_PDL on
# and off, and a GEMV L2 weight prefetch, measured slower and removed.)
# usage: bench/gpu/ab_launch.sh OUT COMMIT CONFIG...
#   ROUNDS (2), BATCH (1,32), MODELS (l8b dsv2lite), MAXTOK (128), PLEN (64: prompt tokens), CKPT
set -uo pipefail
out=${1:?OUT}; commit=${2:-unknown}; shift 2
[ $# -ge 1 ] || { echo "usage: $0 OUT COMMIT LABEL=BIN_DIR[:VAR=VALUE...]..."; exit 2; }
rounds=${ROUNDS:-2}
CK=${CKPT:-/dev/shm/specd-ckpt}
. bench/gpu/env.sh
mkdir -p "$out" "$CK"
w=$(mktemp -d)
for m in ${MODELS:-l8b dsv2lite}; do CKPT=$CK random_ckpt "$m" >> "$w/ckpt.log"; done
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
configs="$*"
merge() {
python3 - "$w" "$out/ab.json" "$commit" "$dev" "$configs" "$1" <<'PY'
import glob, json, sys
w, out, commit, dev, configs, quiet = sys.argv[1:7]
runs = []
for p in sorted(glob.glob(f"{w}/*.json")):
    d = json.load(open(p))
    for x in d["results"]:
        runs.append(dict(label=d["label"], batch=x["batch"],
                         decode_tokens_per_s=x["decode_tokens_per_s"], step_ms=x["step_ms"]))
json.dump(dict(benchmark="bench/gpu/ab_launch.sh", commit=commit, machine=dev, configs=configs,
               runs=runs), open(out, "w"), indent=1)
for r in runs if quiet != "1" else []:
    print(f"{r['label']:32s} b{r['batch']:<3d} {r['decode_tokens_per_s']:9.1f} tok/s  {r['step_ms']:.3f} ms/step")
PY
}
for r in $(seq 1 "$rounds"); do
    for m in ${MODELS:-l8b dsv2lite}; do
        for cfg in "$@"; do
            parse_config "$cfg"
            l=$m-$cfg_label-r$r
            env "${cfg_env[@]}" "$cfg_bin/bench/specd-bench-decode" "${cfg_args[@]}" \
                --model "$CK/$m" --batch "${BATCH:-1,32}" --max-tokens "${MAXTOK:-128}" \
                --prompt-len "${PLEN:-64}" --warmup 8 --device cuda --commit "$commit" --machine "$dev" \
                --label "$l" --out "$w/$l.json" > "$w/$l.txt" 2> "$w/$l.log" || tail -3 "$w/$l.log"
            merge 1 # ab.json holds every finished run, should a time limit stop the rest
        done
    done
done
merge 0
tar -C "$w" -czf "$out/ab-runs.tgz" .
