#!/usr/bin/env bash
# specd builds and links with clang too, warning-free at the project's
# warning level (-Wall -Wextra): a CPU-only debug build of the binary from
# this source tree in a build folder of its own. A gcc build says nothing of
# clang's: clang 14 named an exported target_clones function's dispatcher
# NAME.ifunc, and the binary did not link. Skips (77) without clang.
# usage: test_clang.sh [SPECD_BINARY, unused]   (run from the source root)
set -u
root=${SD_SRCDIR:-.}
out=${SD_BUILDDIR:-/tmp}/clang-build
cc=${SD_CLANG:-clang}
if ! command -v "$cc" > /dev/null; then
    echo "skipped: $cc not found (scripts/deps installs clang)" >&2
    exit 77
fi
rm -rf "$out" && mkdir -p "$(dirname "$out")"
if ! CC=$cc meson setup "$out" "$root" -Dcuda=disabled -Dtests=false -Dfuzz=false \
    --buildtype=debug -Dwerror=true > "$out.setup.log" 2>&1; then
    echo "FAIL: meson setup with CC=$cc:" >&2
    tail -20 "$out.setup.log" >&2
    exit 1
fi
if ! ninja -C "$out" specd > "$out.build.log" 2>&1; then
    echo "FAIL: building specd with $cc:" >&2
    grep -E "error|warning" "$out.build.log" | head -20 >&2
    tail -5 "$out.build.log" >&2
    exit 1
fi
if ! "$out/specd" --help > /dev/null 2>&1; then
    echo "FAIL: the $cc build's specd --help" >&2
    exit 1
fi
echo "specd built and linked with $($cc --version | head -1)"
rm -rf "$out" "$out.setup.log" "$out.build.log"
