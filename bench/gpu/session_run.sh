#!/usr/bin/env bash
# One GPU call: the GPU validation (tests/gpu), the speculative speedup sweep
# of the bundled model (bench/gpu/accept_sweep.sh), and the HF transformers
# peer (tools/peer/hf_assisted.py). Everything lands in OUT/all.tar.
# usage: bench/gpu/session_run.sh BIN_DIR OUT COMMIT
set -uo pipefail
bin=$1; out=$2; commit=$3
w=$(mktemp -d)
. bench/gpu/env.sh
bash tests/gpu/validate.sh "$bin" "$w/validate" "$commit" 2>&1 | tail -20
bash bench/gpu/accept_sweep.sh "$bin" "$w" "$commit" > "$w/sweep.txt" 2>&1
tail -45 "$w/sweep.txt"
python3 tools/peer/hf_assisted.py --out "$w/peer-hf-assisted.json" 2>&1 | grep -v Warning | tail -5
tar -C "$w" -cf "$out/all.tar" .
