#!/usr/bin/env bash
# The tensor-parallel options together (--tp, --nnodes, --node-rank,
# --dist-init-addr, --allreduce): an inconsistent set is refused with one line
# naming the flag and exit 2 (from flags or from --config); a consistent set
# that cannot run on these ranks is refused with one line and exit 1, never
# ignored; a set that runs, runs (several nodes: test_nodes.sh); --help
# documents the options.
set -u
SPECD=${1:?usage: test_comm_opts.sh SPECD}
SRC=${SD_SRCDIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

# refused: exit code, one stderr line, the line holds the phrase
refused() {
    local name=$1 want_rc=$2 phrase=$3; shift 3
    "$SPECD" "$@" >"$tmp/o" 2>"$tmp/e"
    local rc=$? lines; lines=$(wc -l <"$tmp/e")
    if [[ $rc -eq $want_rc && $lines -eq 1 ]] && grep -qF -- "$phrase" "$tmp/e"; then ok "$name"
    else bad "$name" "exit $rc (want $want_rc), $lines lines: $(head -c 300 "$tmp/e")"; fi
}

fx="$SRC/tests/golden/models/llama"
refused node_rank_not_below_nnodes 2 "--node-rank 2: not in 0..1 (--nnodes 2)" \
    generate --nnodes 2 --node-rank 2 --dist-init-addr 10.0.0.1:29500 --prompt hi
refused node_rank_on_one_node 2 "--node-rank 1: not in 0..0 (--nnodes 1)" \
    logits --node-rank 1 --ids 1 --out "$tmp/x"
refused nnodes_without_address 2 "--nnodes 2: --dist-init-addr HOST:PORT is required" \
    serve --nnodes 2 --tp 2
refused address_without_port 2 "--dist-init-addr 'node0': expected HOST:PORT" \
    generate --nnodes 2 --tp 2 --dist-init-addr node0 --prompt hi
refused address_port_out_of_range 2 "--dist-init-addr 'node0:65536'" \
    generate --nnodes 2 --tp 2 --dist-init-addr node0:65536 --prompt hi
refused address_without_host 2 "--dist-init-addr ':29500'" \
    generate --dist-init-addr :29500 --prompt hi
refused address_port_zero_across_nodes 2 "port 0 (any free port)" \
    generate --nnodes 2 --tp 2 --dist-init-addr node0:0 --prompt hi
refused tp_not_split_over_nodes 2 "--tp 3: not a multiple of --nnodes 2" \
    serve --nnodes 2 --tp 3 --dist-init-addr node0:29500
refused unknown_allreduce 2 "--allreduce: 'threeshot' is not one of auto|nccl|oneshot|twoshot" \
    generate --allreduce threeshot --prompt hi
printf 'nnodes = 2\nnode-rank = 5\ndist-init-addr = "node0:29500"\n' >"$tmp/c.conf"
refused config_file_node_rank 2 "--node-rank 5: not in 0..1 (--nnodes 2)" \
    generate --config "$tmp/c.conf" --prompt hi

# consistent, but not for the CPU ranks: said so, exit 1
refused allreduce_on_cpu_ranks 1 "--allreduce oneshot: a GPU all-reduce" \
    logits --model "$fx" --tp 2 --device cpu --allreduce oneshot --ids 1,2 --out "$tmp/x"
refused generate_allreduce_on_cpu_ranks 1 "--allreduce twoshot: a GPU all-reduce" \
    generate --model "$fx" --tp 2 --device cpu --allreduce twoshot --ids 1,2 --max-tokens 1

# the engine runs tensor parallel: --tp 2 generates what one rank does
if "$SPECD" generate --model "$fx" --tp 2 --device cpu --threads 2 --ids 1,2,3 --max-tokens 12 \
    >"$tmp/g2" 2>"$tmp/e" && "$SPECD" generate --model "$fx" --device cpu --threads 2 \
    --ids 1,2,3 --max-tokens 12 >"$tmp/g1" 2>/dev/null && [[ -s "$tmp/g2" ]] &&
    cmp -s <(head -1 "$tmp/g1") <(head -1 "$tmp/g2"); then ok generate_tp2_equals_tp1
else bad generate_tp2_equals_tp1 "$(head -c 300 "$tmp/e")"; fi

# a consistent one-node set runs: the address is HOST:PORT and node 0 of 1
if "$SPECD" logits --model "$fx" --tp 2 --device cpu --threads 2 --nnodes 1 --node-rank 0 \
    --dist-init-addr 127.0.0.1:29500 --allreduce auto --ids 1,2,3 --out "$tmp/l.f32" 2>"$tmp/e" &&
    [[ $(stat -c %s "$tmp/l.f32") -gt 0 ]]; then ok one_node_set_runs
else bad one_node_set_runs "$(head -c 300 "$tmp/e")"; fi

# --help documents them
for cmd in serve generate logits; do
    h=$("$SPECD" $cmd --help)
    n=0
    for f in --nnodes --node-rank --dist-init-addr --allreduce; do
        grep -q -- "^  $f .*(default: " <<<"$h" && n=$((n + 1))
    done
    if ((n == 4)); then ok "help_${cmd}_lists_the_tp_options"
    else bad "help_${cmd}_lists_the_tp_options" "$n of 4"; fi
done
grep -q '^# dist-init-addr = ""' "$SRC/etc/specd.conf" && ok sample_config_has_dist_init_addr ||
    bad sample_config_has_dist_init_addr "etc/specd.conf lacks it"

echo "$pass passed, $fail failed"
((fail == 0))
