#!/usr/bin/env bash
# A bounded libFuzzer run of fuzz/fuzz_request.c (the request path: llhttp on a
# socketless connection, routing, the API key, JSON validation, the response
# builders; see the file) for CI: builds the target with clang
# (-fsanitize=fuzzer,address,undefined) and fuzzes for SD_FUZZ_SECONDS (default
# 20) from the seed corpus with the dictionary. Skips (77) with a reason when
# clang or its libFuzzer is missing; fails when the fuzzer did not run or
# found a crash.
# usage: test_fuzz_request.sh [SPECD_BINARY, unused]   (run from the source root)
set -u
root=${SD_SRCDIR:-.}
out=${SD_BUILDDIR:-/tmp}/fuzz-request
secs=${SD_FUZZ_SECONDS:-20}
cc=${SD_FUZZ_CC:-clang}
llhttp=/usr/share/llhttp

if ! command -v "$cc" > /dev/null; then
    echo "skipped: $cc not found (scripts/deps installs clang)" >&2
    exit 77
fi
mkdir -p "$out"
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    > "$out/probe.c"
if ! "$cc" -fsanitize=fuzzer "$out/probe.c" -o "$out/probe" 2> "$out/probe.log"; then
    echo "skipped: $cc cannot link -fsanitize=fuzzer (no libFuzzer runtime): $(head -2 "$out/probe.log")" >&2
    exit 77
fi
deps=$(pkg-config --cflags --libs libuv jansson libpcre2-8 libutf8proc) || { echo "FAIL: pkg-config libuv jansson libpcre2-8 libutf8proc" >&2; exit 1; }
# shellcheck disable=SC2086
if ! "$cc" -std=c11 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -D_GNU_SOURCE -I"$root/src" -I/usr/share/include/llhttp \
    "$root/fuzz/fuzz_request.c" "$root"/src/net/{buf,openai,metrics,http,router,toolcall,reasoning}.c \
    "$root"/src/core/{err,log,util,utf8,chat_template,tokenizer,tok_encode,tok_tiktoken}.c \
    "$root"/src/verify/{json_schema,json_regex,schema_cache}.c "$llhttp"/{api,http,llhttp}.c \
    $deps -lm -o "$out/fuzz_request" 2> "$out/build.log"; then
    echo "FAIL: building the fuzzer:" >&2
    tail -20 "$out/build.log" >&2
    exit 1
fi
rm -rf "$out/corpus" && mkdir -p "$out/corpus"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
    "$out/fuzz_request" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -max_len=8192 \
    -dict="$root/fuzz/request.dict" -print_final_stats=1 -artifact_prefix="$out/" \
    "$out/corpus" "$root/fuzz/corpus/request" > "$out/run.log" 2>&1
rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/run.log")
if ((rc != 0)); then
    echo "FAIL: the fuzzer stopped with status $rc; the input is in $out/crash-*:" >&2
    grep -v '^#' "$out/run.log" | tail -40 >&2
    exit 1
fi
if [[ -z $runs ]] || ((runs < 100)); then
    echo "FAIL: the fuzzer ran ${runs:-no} inputs" >&2
    tail -20 "$out/run.log" >&2
    exit 1
fi
echo "ok: $runs inputs in ${secs}s, no crash ($(ls "$root/fuzz/corpus/request" | wc -l) seeds, $(ls "$out/corpus" | wc -l) in the corpus now)"
