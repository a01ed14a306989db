#!/usr/bin/env bash
# specd-bench-decode end to end on the CPU: plain and speculative runs of the
# bundled model (the JSON's figures checked against each other: window,
# floor, fraction, synthetic acceptance), option errors, and, where torch is
# at hand (/usr/bin/python3), the random-checkpoint tools' toy Llama +
# EAGLE-3 head and DeepSeek + MTP layer through the benchmark.
# usage: test_decode_cli.sh SPECD_BENCH_DECODE
set -euo pipefail
bench=$1
cd "${SD_SRCDIR:-.}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

check() { # check FILE PYTHON-ASSERTIONS (d: the JSON, r: its results)
    python3 - "$1" "$2" <<'PY' || fail "$1: $2"
import json, sys
d = json.load(open(sys.argv[1]))
r = d["results"]
exec(sys.argv[2])
PY
}

# plain decode, batch 1 and 3
"$bench" --batch 1,3 --max-tokens 12 --warmup 2 --copy-bw-gbs 10 --opt threads=2 \
    --out "$tmp/plain.json" > "$tmp/plain.txt" 2> "$tmp/plain.err" || { cat "$tmp/plain.err"; fail "plain run"; }
grep -q '^batch ' "$tmp/plain.txt" || fail "no table"
check "$tmp/plain.json" '
assert d["benchmark"] == "decode" and d["commit"] and d["command"][1:3] == ["--batch", "1,3"]
assert d["engine_opts"] == {"threads": "2"} and d["spec"] == "none" and d["copy_bw_gbs"] == 10
assert [x["batch"] for x in r] == [1, 3]
b = d["bytes"]
# the bundled model: DeepSeek-V3 layout, 8 experts top-2, an MTP layer (not read)
assert b["n_routed_experts"] == 8 and b["top_k"] == 2 and b["embed_row_bytes"] > 0 and b["mtp_gb"] > 0
for x in r:
    assert x["decode_tokens_per_s"] > 0 and x["per_request_tokens_per_s"] > 0 and x["engine_steps"] > 0
    assert x["window_tokens"] <= x["batch"] * 11
    assert abs(x["decode_tokens_per_s"] - x["window_tokens"] / x["window_s"]) < 1e-6 * x["decode_tokens_per_s"]
    B, E = x["batch"], 8
    sb = b["dense_gb"] * 1e9 + B * b["embed_row_bytes"] + b["routed_experts_gb"] * 1e9 * (1 - (1 - 2 / E) ** B)
    assert abs(x["step_bytes_gb"] * 1e9 - sb) < 1e-3
    assert abs(x["floor_tokens_per_s"] - x["batch"] * 10e9 / sb) < 1e-6 * x["floor_tokens_per_s"]
    assert abs(x["fraction_of_floor"] - x["decode_tokens_per_s"] / x["floor_tokens_per_s"]) < 1e-9
    assert x["floor_with_kv_tokens_per_s"] < x["floor_tokens_per_s"]
    assert x["mean_accepted_length"] == 1 and x["acceptance_by_position"] == []
    assert abs(x["step_ms"] - 1e3 * x["window_s"] / x["window_steps"]) < 1e-6 * x["step_ms"]
    assert x["second_token_s"] > 0
# batch 1: every token after the second is inside the window, one step each
assert r[0]["window_tokens"] == 10 and r[0]["window_steps"] == 10, r[0]
# the statistics cover the window'"'"'s steps: one engine step per output
assert r[0]["engine_steps"] == r[0]["window_steps"], r[0]
'

# MTP drafts, every one accepted (synthetic 1.0), no graphs, real prompts
"$bench" --batch 2 --max-tokens 16 --warmup 0 --spec mtp --k 2 --synthetic-accept 1 --graphs off \
    --prompts models/specd-tiny/heldout_prompts.jsonl --prompt-len 24 --copy-bw-gbs 10 \
    --opt threads=2 --out "$tmp/mtp.json" > /dev/null 2> "$tmp/mtp.err" || { cat "$tmp/mtp.err"; fail "mtp run"; }
check "$tmp/mtp.json" '
assert d["spec"] == "mtp" and d["k"] == 2 and d["graphs"] == "off" and d["synthetic_accept"] == "1"
assert d["synthetic_expected_mean_len"] == 3
x = r[0]
assert x["acceptance_by_position"] == [1.0, 1.0], x["acceptance_by_position"]
assert 2.5 < x["mean_accepted_length"] <= 3, x["mean_accepted_length"]
assert x["draft_ms_per_step"] > 0 and x["verify_ms_per_step"] > 0
'

# tensor parallel on CPU ranks: the collectives per decode step. A target
# pass makes one all-reduce for the vocab-sharded embedding, two residual
# steps (all-reduce + add + RMSNorm) per layer and one all-gather of the
# logits' vocab shards (src/target/model.c); every message is B x hidden.
"$bench" --batch 1,3 --max-tokens 12 --warmup 2 --copy-bw-gbs 10 --opt threads=2 --opt tp=2 \
    --out "$tmp/tp2.json" > "$tmp/tp2.txt" 2> "$tmp/tp2.err" || { cat "$tmp/tp2.err"; fail "tp 2 run"; }
grep -q '^collectives per engine step at tp 2; est_ms: all-reduce time ESTIMATED' "$tmp/tp2.txt" \
    || fail "no collectives table: $(cat "$tmp/tp2.txt")"
check "$tmp/tp2.json" '
cfg = json.load(open("models/specd-tiny/config.json"))
L, D = cfg["num_hidden_layers"], cfg["hidden_size"]
assert [x["batch"] for x in r] == [1, 3]
for x in r:
    a = x["allreduce"]
    assert a["tp"] == 2 and x["engine_steps"] > 0
    assert a["calls_per_step"] == 2 * L + 1, a
    assert a["residual_calls_per_step"] == 2 * L and a["allgather_calls_per_step"] == 1, a
    assert a["floats_per_call"] == x["batch"] * D, a
    # CPU ranks: no paths, no start-up timings, so no estimate
    assert a["calls_per_step_by_path"] == {"nccl": 0, "oneshot": 0, "twoshot": 0, "fused": 0}
    assert a["est_ms_per_step"] is None and a["est_share_of_step"] is None and a["est_calls_covered"] == 0
    assert a["unrecorded_graph_replays_per_step"] == 0
'
check "$tmp/plain.json" 'assert all("allreduce" not in x for x in r)'

# errors: one line naming the flag, exit 2
if "$bench" --synthetic-accept 1.5 2> "$tmp/e1"; then fail "bad --synthetic-accept accepted"; fi
grep -q -- "--synthetic-accept: value 1 ('1.5')" "$tmp/e1" || fail "message: $(cat "$tmp/e1")"
if "$bench" --batch 0 2> "$tmp/e2"; then fail "--batch 0 accepted"; fi
grep -q -- "--batch" "$tmp/e2" || fail "message: $(cat "$tmp/e2")"
if "$bench" --opt nonsense 2> "$tmp/e3"; then fail "--opt without = accepted"; fi
if "$bench" --opt no-such-option=1 --max-tokens 4 2> "$tmp/e4"; then fail "unknown --opt accepted"; fi
grep -q "unknown option --no-such-option" "$tmp/e4" || fail "message: $(cat "$tmp/e4")"

# the random-checkpoint tools at toy size (needs torch)
if /usr/bin/python3 -c 'import torch' 2> /dev/null; then
    /usr/bin/python3 tools/random_ckpt/llama.py --tiny --out "$tmp/l" --eagle3 "$tmp/l-e3" > /dev/null
    /usr/bin/python3 tools/random_ckpt/deepseek.py --tiny --mtp --out "$tmp/ds" > /dev/null
    "$bench" --model "$tmp/l" --spec eagle3 --draft-model "$tmp/l-e3" --k 3 --synthetic-accept 1 \
        --batch 2 --max-tokens 12 --warmup 0 --copy-bw-gbs 10 --opt threads=2 \
        --out "$tmp/e3.json" > /dev/null 2> "$tmp/e3.err" || { cat "$tmp/e3.err"; fail "eagle3 run"; }
    check "$tmp/e3.json" 'assert r[0]["acceptance_by_position"] == [1.0, 1.0, 1.0]; assert d["bytes"]["mtp_gb"] == 0'
    "$bench" --model "$tmp/ds" --spec mtp --k 2 --synthetic-accept 0,1 --batch 1,4 --max-tokens 12 \
        --warmup 0 --copy-bw-gbs 10 --opt threads=2 \
        --out "$tmp/ds.json" > /dev/null 2> "$tmp/ds.err" || { cat "$tmp/ds.err"; fail "deepseek mtp run"; }
    check "$tmp/ds.json" '
b = d["bytes"]
assert b["n_routed_experts"] == 8 and b["top_k"] == 2 and b["moe_layers"] == 2 and b["mtp_gb"] > 0
assert abs(r[0]["expected_routed_experts"] - 2) < 1e-12
assert abs(r[1]["expected_routed_experts"] - 8 * (1 - 0.75 ** 4)) < 1e-12
for x in r:
    assert x["acceptance_by_position"] == [0.0, 0.0] and x["mean_accepted_length"] == 1
'
else
    echo "torch not found at /usr/bin/python3: the random-checkpoint tools are not checked" >&2
fi
echo "specd-bench-decode: all checks passed"
