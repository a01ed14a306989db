#!/usr/bin/env bash
# The chat renderers against Jinja on random conversations (roles in any
# order after a user's turn, text with the characters templates treat
# specially, tool calls with nested arguments, tools, chat_template_kwargs):
# tools/golden/chat_templates.py --random writes SD_CHAT_CASES (default 300)
# cases a published template, rendered by Jinja, and tests/core's chat
# template test renders them natively and compares. The seed is printed
# (SD_CHAT_SEED sets it) so that a failure can be run again. Skips (77)
# when no python3 has jinja2 (scripts/deps installs python3-jinja2).
# usage: test_chat_fuzz.sh SPECD_BINARY   (run from the source root; the test
#   binary is found beside it, in tests/)
set -u
root=${SD_SRCDIR:-.}
bin=$(dirname "${1:?specd binary}")/tests/test_core_chat_template
py=
for p in python3 /usr/bin/python3; do
    if command -v "$p" > /dev/null && "$p" -c 'import jinja2' 2> /dev/null; then
        py=$p
        break
    fi
done
if [ -z "$py" ]; then
    echo "skipped: no python3 with jinja2 (scripts/deps installs python3-jinja2)" >&2
    exit 77
fi
[ -x "$bin" ] || { echo "FAIL: $bin not built" >&2; exit 1; }
seed=${SD_CHAT_SEED:-$(( $(date +%s) % 1000000 ))}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "seed $seed ($("$py" -c 'import jinja2; print("jinja2", jinja2.__version__)'))"
"$py" "$root/tools/golden/chat_templates.py" --random "${SD_CHAT_CASES:-300}" --seed "$seed" \
    --out "$out/cases.json" || { echo "FAIL: the generator failed" >&2; exit 1; }
SD_CHAT_GOLDEN="$out/cases.json" SD_SRCDIR="$root" "$bin" > "$out/log" 2>&1
rc=$?
grep -E "renders checked|^  [a-z]" "$out/log" | cut -c1-400 | head -20
if [ $rc -ne 0 ]; then
    echo "FAIL: renders differ from Jinja (seed $seed; SD_CHAT_SEED=$seed runs it again)" >&2
    tail -5 "$out/log" >&2
    exit 1
fi
echo "ok"
