#!/usr/bin/env bash
# CLI contracts: --help lists every flag with its default; bad flags give one
# line and exit 2; `specd logits` writes [n_ids, vocab] float32 equal to the
# golden reference; a bad checkpoint gives one clear message and exit 1;
# `specd generate` prints the continuation and a JSON line of statistics.
set -u
SPECD=${1:?usage: test_cli.sh SPECD}
SRC=${SD_SRCDIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

# every option of a command appears in its --help with a default
for cmd in serve generate logits tokenize detokenize; do
    out=$("$SPECD" $cmd --help) || { bad "help_$cmd" "exit $?"; continue; }
    n_opts=$(grep -c -- '^  --' <<<"$out")
    n_def=$(grep -c -- '(default: ' <<<"$out")
    if ((n_opts > 3 && n_def == n_opts - 1)); then ok "help_$cmd lists $n_def flags with defaults"
    else bad "help_$cmd" "$n_opts flags, $n_def defaults"; fi
done
"$SPECD" --help | grep -q generate && ok "top_level_help" || bad top_level_help "no command list"

# usage errors: one line on stderr, exit 2
check_usage() {
    local name=$1; shift
    "$SPECD" "$@" >"$tmp/o" 2>"$tmp/e"
    local rc=$?
    local lines; lines=$(wc -l <"$tmp/e")
    if [[ $rc -eq 2 && $lines -eq 1 ]]; then ok "$name"
    else bad "$name" "exit $rc, $lines stderr lines: $(head -c 200 "$tmp/e")"; fi
}
check_usage unknown_flag_exits_2 generate --bogus 1
check_usage missing_value_exits_2 generate --max-tokens
check_usage bad_number_exits_2 generate --max-tokens 12x
check_usage out_of_range_exits_2 serve --port 70000
check_usage bad_choice_exits_2 generate --spec medusa
check_usage unknown_command_exits_2 frobnicate
check_usage positional_argument_exits_2 logits stray

# logits equal the golden reference (HF transformers, fp32)
fx="$SRC/tests/golden/models/llama"
ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$fx/golden.json'))['ids'])))")
if "$SPECD" logits --model "$fx" --ids "$ids" --out "$tmp/l.f32" --threads 2 2>"$tmp/e"; then
    if python3 - "$tmp/l.f32" "$fx/logits.f32" <<'PY'
import struct, sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read()
assert len(a) == len(b), (len(a), len(b))
x = struct.unpack('<%df' % (len(a) // 4), a); y = struct.unpack('<%df' % (len(b) // 4), b)
m = max(abs(v) for v in y); d = max(abs(p - q) for p, q in zip(x, y))
assert d <= 1e-4 * m, (d, m)
PY
    then ok "logits_file_equals_golden"; else bad logits_file_equals_golden "mismatch"; fi
else bad logits_file_equals_golden "$(cat "$tmp/e")"; fi

# a bad checkpoint: one message naming the file, exit 1
cp -r "$fx" "$tmp/bad"
truncate -s 1000 "$tmp/bad/model.safetensors"
"$SPECD" logits --model "$tmp/bad" --ids 1,2 --out "$tmp/x" 2>"$tmp/e"
rc=$?
if [[ $rc -eq 1 && $(wc -l <"$tmp/e") -eq 1 ]] && grep -q 'model.safetensors' "$tmp/e"; then
    ok "truncated_checkpoint_one_message_exit_1"
else bad truncated_checkpoint_one_message_exit_1 "exit $rc: $(cat "$tmp/e")"; fi
cp -r "$fx" "$tmp/bad2"
sed -i 's/"LlamaForCausalLM"/"GPT2LMHeadModel"/' "$tmp/bad2/config.json"
"$SPECD" logits --model "$tmp/bad2" --ids 1,2 --out "$tmp/x" 2>"$tmp/e"
rc=$?
if [[ $rc -eq 1 ]] && grep -q 'GPT2LMHeadModel' "$tmp/e" && grep -q 'config.json' "$tmp/e"; then
    ok "unsupported_architecture_named"
else bad unsupported_architecture_named "exit $rc: $(cat "$tmp/e")"; fi
"$SPECD" logits --model "$fx" --ids 1,99999 --out "$tmp/x" 2>"$tmp/e"
rc=$?
if [[ $rc -ne 0 ]] && grep -q 'out of range' "$tmp/e"; then ok "id_out_of_range_refused"
else bad id_out_of_range_refused "exit $rc: $(cat "$tmp/e")"; fi

# generate: the greedy continuation equals HF generate's (golden), stats JSON last on stderr
want=$(python3 -c "import json;print(','.join(map(str,json.load(open('$fx/golden.json'))['greedy'])))")
got=$("$SPECD" generate --model "$fx" --ids "$ids" --max-tokens 8 --spec ngram --spec-k 3 2>"$tmp/e")
if [[ "$got" == "$want" ]]; then ok "generate_greedy_equals_hf"; else bad generate_greedy_equals_hf "$got vs $want"; fi
if tail -1 "$tmp/e" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); assert 'mean_accepted_length' in d and 'acceptance_by_position' in d and d['completion_tokens']==8"; then
    ok "generate_prints_stats_json_last"
else bad generate_prints_stats_json_last "$(tail -1 "$tmp/e")"; fi

# --profile-ops: the same tokens, and a table of the ops with the matmuls by shape
got=$("$SPECD" generate --model "$fx" --ids "$ids" --max-tokens 8 --spec ngram --spec-k 3 \
    --profile-ops 2>"$tmp/e")
if [[ "$got" == "$want" ]] && grep -q '^op time' "$tmp/e" && grep -qE '^  matmul [0-9]+x[0-9]+ ' "$tmp/e" &&
    grep -qE '^  attn_gqa +[0-9]+ ' "$tmp/e"; then
    ok "profile_ops_same_tokens_and_a_table"
else bad profile_ops_same_tokens_and_a_table "$got; $(grep -A4 '^op time' "$tmp/e")"; fi

echo "$pass passed, $fail failed"
((fail == 0))
