#!/usr/bin/env bash
# The oracles that live on the GPU machine's Python (transformers, HF tokenizers),
# run for what this machine cannot check itself; no GPU is used:
#   - HF tokenizers' ids and decodes of the SentencePiece tokenizer.json fixtures
#     (tools/golden/spm.py --hf): OUT/spm_golden.json, to copy over
#     tests/golden/tokenizer/spm_golden.json;
#   - the transformers fixtures still missing (default: qwen3-moe,
#     tools/golden/models.py): OUT/fixtures.tar (models/NAME/...) and its log,
#     to unpack into tests/golden.
# usage: bench/gpu/golden_hf.sh OUT [FIXTURE...]       (from the repository root)
set -uo pipefail
OUT=${1:?out dir}
shift
fixtures=("$@")
((${#fixtures[@]})) || fixtures=(qwen3-moe)
mkdir -p "$OUT/tok"
python3 -c 'import tokenizers, transformers, torch; print("tokenizers", tokenizers.__version__, "transformers", transformers.__version__, "torch", torch.__version__)'
cp -r tests/golden/tokenizer/llama2ish tests/golden/tokenizer/mistralish tests/golden/tokenizer/spm_golden.json "$OUT/tok/"
python3 tools/golden/spm.py --hf --out "$OUT/tok" || echo "spm --hf FAILED"
mv "$OUT/tok/spm_golden.json" "$OUT/spm_golden.json" 2> /dev/null
rm -rf "$OUT/tok"
only=()
for f in "${fixtures[@]}"; do only+=(--only "$f"); done
(cd tools/golden && python3 models.py --out "$OUT/fixtures.tar" "${only[@]}") || echo "models.py FAILED (see fixtures.log)"
ls -la "$OUT"
