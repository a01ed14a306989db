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
# the best shape at each (op, n), against the default (0)
python3 - "$OUT/gemv-sweep.json" <<'PY' | tee "$OUT/gemv-sweep-best.txt"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
best = {}
for r in rows:
    key = (r["name"], r["n"])
    best.setdefault(key, {})[r["gemv_shape"]] = r["us_graph"]
for (name, n), t in best.items():
    s = min(t, key=t.get)
    print(f"{name:22s} n={n}  default {t.get(0, 0):8.2f} us  best s{s:03d} {t[s]:8.2f} us  ({t.get(0, 0) / t[s]:.2f}x)")
PY
