#!/usr/bin/env bash
# What each small decode kernel costs inside the graph: plain batch-1 decode
# of the DeepSeek-V2-Lite-shaped random checkpoint with each kernel family
# left out in turn (SPECD_ABLATE, kernels/cuda/common.cuh: the outputs are
# then wrong, the timing is the point), interleaved over ROUNDS rounds with
# the full step, and a table of what each saves a step and a layer.
# A kernel's marginal cost is an upper bound on what fusing it away saves:
# a fused kernel that keeps its round trips to memory keeps most of it
# (bench/results/NOTES.md, session 12).
# usage: bench/gpu/ablate_run.sh BIN_DIR OUT COMMIT
#   ROUNDS (2), MODELS (dsv2lite), LAYERS (27: a V2-Lite step's layers),
#   KERNELS ("addnorm route router merge prep attn absorb")
set -uo pipefail
bin=${1:?BIN_DIR}; out=${2:?OUT}; commit=${3:-unknown}
mkdir -p "$out"
cfg=(base="$bin")
for k in ${KERNELS:-addnorm route router merge prep attn absorb}; do
    v=$k
    [ "$k" = router ] && v=route,router # the router GEMV without its routing: ids from the fixed kernel
    cfg+=("$k=$bin:SPECD_ABLATE=$v")
done
MODELS=${MODELS:-dsv2lite} BATCH=1 ROUNDS=${ROUNDS:-2} \
    bash bench/gpu/ab_launch.sh "$out" "$commit" "${cfg[@]}" > "$out/ab.txt" 2>&1
python3 - "$out/ab.json" "${LAYERS:-27}" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
layers = int(sys.argv[2])
by = {}
for r in runs:
    model, label, _ = r["label"].rsplit("-", 2)
    by.setdefault((model, label), []).append(r["step_ms"])
for model in sorted({m for m, _ in by}):
    base = sum(by[(model, "base")]) / len(by[(model, "base")])
    print(f"{model}: step {base:.4f} ms (base)")
    for (m, label), v in sorted(by.items()):
        if m != model or label == "base":
            continue
        saved = (base - sum(v) / len(v)) * 1e3
        print(f"  {label:10s} saves {saved:7.1f} us a step, {saved / layers:5.2f} us a layer")
PY
