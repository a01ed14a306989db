#!/usr/bin/env bash
# Turns recorded benchmark JSON into PNGs (gnuplot, jq).
#
#   bench/plot/plot.sh [PREFIX...]
#
# For each PREFIX (default: every one found), bench/results/PREFIX-LABEL.json
# files written by specd-bench-serve (one per label: plain, mtp, eagle3, ...)
# give PREFIX-throughput.png and PREFIX-latency.png, one line per label.
# bench/results/accept-*.json (specd-bench-accept: {"results": [{"proposer",
# "k", "acceptance_by_position", ...}]} or one such object) give
# accept-NAME-by-position.png each: per proposer, its largest fixed k at the
# lowest temperature. The serve files' server-side per-position counters
# (summed over the sweep) give PREFIX-acceptance.png.
# RESULTS=DIR reads and writes another folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=${RESULTS:-$here/../results}
for t in gnuplot jq; do
    command -v $t >/dev/null || { echo "plot.sh: needs $t (apt-get install gnuplot-nox jq)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shopt -s nullglob

prefixes=("$@")
if ((${#prefixes[@]} == 0)); then
    for f in "$results"/serve-*-*.json; do
        b=$(basename "$f" .json)
        prefixes+=("${b%-*}")
    done
    mapfile -t prefixes < <(printf '%s\n' "${prefixes[@]}" | sort -u)
fi

# One serve JSON -> columns: concurrency, out tok/s, req/s, TTFT p50 p99, TPOT p50 p99,
# ITL p50 p99 (ms). Levels without completed requests are left out.
serve_dat() {
    jq -r '.runs[] | select(.summary.completed > 0) |
        [(.concurrency // 0), .summary.output_throughput, .summary.request_throughput,
         .summary.median_ttft_ms, .summary.p99_ttft_ms, .summary.median_tpot_ms,
         .summary.p99_tpot_ms, .summary.median_itl_ms, .summary.p99_itl_ms] |
        map(. // "NaN") | @tsv' "$1"
}

for p in "${prefixes[@]}"; do
    files=() labels=()
    for f in "$results/$p"-*.json; do
        b=$(basename "$f" .json)
        [[ ${b%-*} == "$p" ]] || continue
        label=$(jq -r '.label // empty' "$f")
        label=${label:-${b##*-}}
        serve_dat "$f" >"$tmp/$b.dat"
        [[ -s $tmp/$b.dat ]] || { echo "plot.sh: $f: no completed run, skipped" >&2; continue; }
        files+=("$tmp/$b.dat")
        labels+=("$label")
    done
    ((${#files[@]})) || { echo "plot.sh: no $results/$p-*.json" >&2; continue; }
    first=$(ls "$results/$p"-*.json | head -1)
    desc=$(jq -r '[.server.model, (.machine.label // ((.machine.cores|tostring) + "-core " + (.machine.cpu // "machine"))),
                   ("commit " + .commit)] | join(", ")' "$first")
    gnuplot -e "files='${files[*]}'; labels='${labels[*]}'; out='$results/$p-throughput.png'; title='Serving throughput'; subtitle='$desc'" \
        "$here/serve_throughput.gp"
    gnuplot -e "files='${files[*]}'; labels='${labels[*]}'; out='$results/$p-latency.png'; title='Serving latency'; subtitle='$desc'" \
        "$here/serve_latency.gp"
    echo "plot.sh: wrote $results/$p-throughput.png $results/$p-latency.png" >&2

    # server-side acceptance by position of the labels that speculate
    afiles=() alabels=()
    for f in "$results/$p"-*.json; do
        b=$(basename "$f" .json)
        jq -r '[.runs[].server_speculative | select(. != null)] as $s |
               if ($s | length) == 0 then empty else
               ([$s[].proposed_by_position | length] | max) as $n |
               range(0; $n) as $i |
               ([$s[] | (.proposed_by_position[$i] // 0)] | add) as $prop |
               ([$s[] | ((.acceptance_by_position[$i] // 0) * (.proposed_by_position[$i] // 0))] | add) as $acc |
               select($prop > 0) | [$i + 1, $acc / $prop] | @tsv end' "$f" >"$tmp/acc-$b.dat"
        [[ -s $tmp/acc-$b.dat ]] || continue
        afiles+=("$tmp/acc-$b.dat")
        alabels+=("$(jq -r '.label // "spec"' "$f")")
    done
    if ((${#afiles[@]})); then
        gnuplot -e "files='${afiles[*]}'; labels='${alabels[*]}'; out='$results/$p-acceptance.png'; title='Acceptance by draft position (server counters, whole sweep)'; subtitle='$desc'" \
            "$here/accept_by_position.gp"
        echo "plot.sh: wrote $results/$p-acceptance.png" >&2
    fi
done

# acceptance by position per proposer, from specd-bench-accept: one PNG per file
for f in "$results"/accept-*.json; do
    b=$(basename "$f" .json)
    jq -c '(if has("results") then .results else [.] end)[] | select(.acceptance_by_position)' "$f" \
        >"$tmp/$b.rows" 2>/dev/null || { echo "plot.sh: $f: not JSON, skipped" >&2; continue; }
    desc=$(jq -r '[(.model // empty | split("/") | last), (.machine // empty),
                   (if .batch then "batch \(.batch)" else empty end), ("commit " + (.commit // "?"))] |
                   join(", ")' "$f")
    afiles=() alabels=()
    for prop in $(jq -r '.proposer' "$tmp/$b.rows" | sort -u); do
        # the lowest temperature, then the largest numeric k
        best='[.[] | select(.proposer == $p and (.k | type) == "number")] | sort_by([(.temperature // 0), -.k]) | .[0]'
        jq -s -r --arg p "$prop" "$best"' // empty | .acceptance_by_position | to_entries[] |
            [.key + 1, .value] | @tsv' "$tmp/$b.rows" >"$tmp/acc-$b-$prop.dat"
        [[ -s $tmp/acc-$b-$prop.dat ]] || continue
        afiles+=("$tmp/acc-$b-$prop.dat")
        alabels+=("$prop(k=$(jq -s -r --arg p "$prop" "$best"'.k' "$tmp/$b.rows"))")
    done
    ((${#afiles[@]})) || continue
    gnuplot -e "files='${afiles[*]}'; labels='${alabels[*]}'; out='$results/$b-by-position.png'; title='Acceptance by draft position ($b.json)'; subtitle='$desc'" \
        "$here/accept_by_position.gp"
    echo "plot.sh: wrote $results/$b-by-position.png" >&2
done
