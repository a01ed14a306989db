#!/usr/bin/env bash
# The GEMV's warp shapes at 3, 4 and 8 rows (specd-bench-kernels
# --gemv-sweep: gemv-sweep.json, a table in gemv-sweep.txt), and for each
# shape the op test that a row's bits do not depend on the batch, run with
# that shape forced (SPECD_GEMV_SHAPE). One GPU call's worth: ~1 minute.
# usage: bench/gpu/gemv_sweep.sh BIN_DIR OUT COMMIT
set -uo pipefail
B=${1:?bin}; OUT=${2:?out}; C=${3:-unknown}
mkdir -p "$OUT"
timeout ${SWEEP_S:-90} "$B/bench/specd-bench-kernels" --gemv-sweep --commit "$C" \
    --out "$OUT/gemv-sweep.json" > "$OUT/gemv-sweep.txt" 2>&1
echo "gemv sweep exit $?"
for s in 42 22 24 41 21 14 18 142 124 128 118; do
    SPECD_GEMV_SHAPE=$s timeout 60 "$B/test_gpu_ops" matmul_gemv_rows > "$OUT/bits-$s.txt" 2>&1
    echo "shape $s: matmul_gemv_rows exit $? ($(grep -c '^ok' "$OUT/bits-$s.txt") ok, $(grep -c '^FAIL' "$OUT/bits-$s.txt") FAIL)"
done
# the best shape at each (op, n) against the default (0), and the 8B
# step's GEMVs (32 x (qkv + o + gate/up + down) + lm_head) per shape
python3 - "$OUT/gemv-sweep.json" "$OUT/best-shape" <<'PY' | tee "$OUT/gemv-sweep-best.txt"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
t = {}
for r in rows:
    t.setdefault((r["name"], r["n"]), {})[r["gemv_shape"]] = r["us_graph"]
for (name, n), ts in t.items():
    s = min(ts, key=ts.get)
    print(f"{name:22s} n={n}  default {ts.get(0, 0):8.2f} us  best s{s:03d} {ts[s]:8.2f} us  ({ts.get(0, 0) / ts[s]:.2f}x)")
layer = ["llama8b qkv", "llama8b o", "llama8b gate+up", "llama8b down"]
best = 0
for n in (3, 4, 8):
    shapes = set.intersection(*[set(t.get((o, n), {})) for o in layer + ["llama8b lm_head"]])
    step = {s: 32 * sum(t[(o, n)][s] for o in layer) + t[("llama8b lm_head", n)][s] for s in shapes}
    if not step:
        continue
    s = min(step, key=step.get)
    print(f"8B step's GEMVs at n={n}: default {step.get(0, 0):9.1f} us, best s{s:03d} {step[s]:9.1f} us")
    if n == 4:
        best = s
open(sys.argv[2], "w").write(str(best))
PY
if [ -n "${CKPT:-}" ] && [ -f "$CKPT/l8b/.complete" ]; then
    s=$(cat "$OUT/best-shape")
    for cfg in 0 $s; do
        SPECD_GEMV_SHAPE=$cfg timeout 60 "$B/bench/specd-bench-decode" --device cuda --model "$CKPT/l8b" \
            --max-tokens 64 --prompt-len 64 --warmup 8 --batch 1,4,8 --commit "$C" --label "shape-$cfg" \
            --out "$OUT/decode-shape-$cfg.json" > "$OUT/decode-shape-$cfg.txt" 2>&1
        tail -n +2 "$OUT/decode-shape-$cfg.txt" | grep -v "^specd\|^ " | awk -v s=$cfg '{print "shape " s ": batch " $1 " " $6 " tok/s, step " $8 " ms"}'
    done | tee "$OUT/gemv-shape-ab.txt"
fi
