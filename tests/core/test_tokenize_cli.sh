#!/usr/bin/env bash
# specd tokenize / detokenize: ids as one JSON array, text byte for byte, clear errors.
# usage: test_tokenize_cli.sh SPECD_BINARY   (run from the source root)
set -u
specd=${1:?specd binary}
root=${SD_SRCDIR:-.}
gold=$root/tests/golden/tokenizer
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The HF ids of some golden corpus strings, read once from golden.json:
# lines "tokenizer<TAB>case index<TAB>[ids]".
texts=("Hello, world!" "I'm you're they've she'll he'd it's don't won't" "<|begin_of_text|>Hello<|eot_id|>" "")
declare -A want
while IFS=$'\t' read -r tk i ids; do
    want[$tk/$i]=$ids
done < <(python3 - "$gold/golden.json" "${texts[@]}" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
for t in g["tokenizers"]:
    for i, text in enumerate(sys.argv[2:]):
        c = [c for c in t["cases"] if c["text"] == text][0]
        print(t["name"], i, json.dumps(c["ids"], separators=(",", ":")), sep="\t")
PY
)
((${#want[@]} == 16)) || fail "golden.json gave ${#want[@]} expectations, want 16"
for tk in llama3ish deepseekish gpt2ish kimiish; do
    for i in "${!texts[@]}"; do
        got=$("$specd" tokenize --tokenizer "$gold/$tk" --text "${texts[$i]}") || fail "$tk tokenize '${texts[$i]}' exited $?"
        [[ $got == "${want[$tk/$i]:-missing}" ]] || fail "$tk '${texts[$i]}': got $got, want ${want[$tk/$i]:-missing}"
    done
done

# --tokenizer may name the file; --model the folder
a=$("$specd" tokenize --tokenizer "$gold/llama3ish/tokenizer.json" --text "naïve café 日本語 😀")
b=$("$specd" tokenize --model "$gold/llama3ish" --text "naïve café 日本語 😀")
[[ -n $a && $a == "$b" ]] || fail "file and folder disagree: $a vs $b"

# detokenize writes exactly the decoded bytes: no newline of its own, a decoded one kept
for text in "ending with newline"$'\n' "no newline" $'\ttabs\r\n\r\n' "  spaces  " "😀 e"$'\u0301'; do
    ids=$("$specd" tokenize --tokenizer "$gold/kimiish" --text "$text" | tr -d '[]')
    "$specd" detokenize --tokenizer "$gold/kimiish" --ids "$ids" > "$tmp/out" || fail "detokenize exited $?"
    printf '%s' "$text" > "$tmp/want"
    cmp -s "$tmp/out" "$tmp/want" || fail "round trip of $(printf '%q' "$text"): got $(od -c "$tmp/out" | head -2)"
done
"$specd" detokenize --tokenizer "$gold/kimiish" --ids "" > "$tmp/out" && [[ ! -s $tmp/out ]] || fail "empty ids"

# invalid UTF-8 in --text: each ill-formed part is U+FFFD, as HF sees bytes.decode('utf-8', 'replace')
a=$("$specd" tokenize --tokenizer "$gold/llama3ish" --text $'ab\xffcd\xe2\x82')
b=$("$specd" tokenize --tokenizer "$gold/llama3ish" --text $'ab\uFFFDcd\uFFFD')
[[ -n $a && $a == "$b" ]] || fail "invalid UTF-8: $a vs $b"

# errors: exit status and a message naming the problem
expect_err() { # want_status needle cmd...
    local want=$1 needle=$2
    shift 2
    "$@" > "$tmp/o" 2> "$tmp/e"
    local rc=$?
    [[ $rc == "$want" ]] || fail "$* exited $rc, want $want"
    grep -q -- "$needle" "$tmp/e" || fail "$*: stderr lacks '$needle': $(cat "$tmp/e")"
}
expect_err 1 "out of range" "$specd" detokenize --tokenizer "$gold/llama3ish" --ids 1,99999
expect_err 2 "--ids" "$specd" detokenize --tokenizer "$gold/llama3ish" --ids 1,,2
expect_err 1 "no such tokenizer.json or folder" "$specd" tokenize --tokenizer "$tmp/nowhere" --text hi
mkdir -p "$tmp/empty"
expect_err 1 "no tokenizer.json (nor tiktoken.model) in this folder" "$specd" tokenize --tokenizer "$tmp/empty" --text hi
printf '{"model": {"type": "Unigram", "vocab": []}}' > "$tmp/uni.json"
expect_err 1 "model type Unigram" "$specd" tokenize --tokenizer "$tmp/uni.json" --text hi
printf '{"model": ' > "$tmp/bad.json"
expect_err 1 "malformed JSON" "$specd" tokenize --tokenizer "$tmp/bad.json" --text hi
SPECD_BUNDLED_MODEL=$tmp/no-bundled expect_err 1 "bundled model folder" "$specd" tokenize --text hi

if ((fails)); then
    echo "$fails failure(s)" >&2
    exit 1
fi
echo "ok"
