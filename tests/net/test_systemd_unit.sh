#!/usr/bin/env bash
# etc/specd.service: `systemd-analyze verify` accepts it without a single
# warning (ExecStart pointed at the built binary, since verify checks that the
# command exists), it has the hardening the service promises, and its
# command line parses with the sample config. Skips (77) without
# systemd-analyze.
# usage: test_systemd_unit.sh SPECD_BINARY   (run from the source root)
set -u
bin=${1:?usage: test_systemd_unit.sh SPECD_BINARY}
root=${SD_SRCDIR:-.}
unit=$root/etc/specd.service
fail() { echo "FAIL: $*" >&2; exit 1; }

for want in '^Type=notify$' '^NotifyAccess=main$' '^WatchdogSec=[1-9]' '^DynamicUser=yes$' \
    '^User=specd$' '^NoNewPrivileges=yes$' '^ProtectSystem=strict$' '^ProtectHome=yes$' \
    '^PrivateTmp=yes$' '^CapabilityBoundingSet=$' '^ExecStart=/usr/local/bin/specd serve '; do
    grep -Eq "$want" "$unit" || fail "etc/specd.service lacks a line matching $want"
done

# The command line systemd would run parses (with the sample config in place of
# /etc/specd/specd.conf).
args=$(sed -n 's|^ExecStart=/usr/local/bin/specd ||p' "$unit" | sed "s|/etc/specd/specd.conf|$root/etc/specd.conf|")
# shellcheck disable=SC2086
"$bin" $args --help > /dev/null || fail "specd $args --help failed"

if ! command -v systemd-analyze > /dev/null; then
    echo "skipped: systemd-analyze not found (Debian package systemd)" >&2
    exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed "s|^ExecStart=/usr/local/bin/specd|ExecStart=$(realpath "$bin")|" "$unit" > "$dir/specd.service"
out=$(systemd-analyze verify --man=no "$dir/specd.service" 2>&1)
rc=$?
((rc == 0)) || fail "systemd-analyze verify exited $rc: $out"
[[ -z $out ]] || fail "systemd-analyze verify warned: $out"
echo "ok: systemd-analyze verify accepts etc/specd.service"
