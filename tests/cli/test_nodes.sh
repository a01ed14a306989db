#!/usr/bin/env bash
# Several nodes on one machine (two processes on localhost, CPU ranks): node 0
# and node 1 run the same command with their --node-rank; node 0 prints what
# one process with all the ranks prints, bit for bit (the node comm sums in
# global rank order like the thread comm, and node 1 follows node 0's step
# plans): greedy with each proposer, sampled, 4 ranks over 2 nodes, logits on
# both nodes, `specd serve` answering on node 0 while node 1 follows (a
# request with logits processors and logprobs too), SIGTERM
# on node 0 stopping both cleanly, node 1 speaking systemd's notify protocol
# (ready, watchdog pings, stopping). A node
# that dies makes node 0 fail requests (and /health) with a message, not
# hang; nodes with different settings are refused at start.
# usage: test_nodes.sh SPECD   (run from the source root)
set -u
SPECD=${1:?usage: test_nodes.sh SPECD}
tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
port() { # a random port nothing listens on yet
    local p
    for _ in 1 2 3 4 5 6 7 8; do
        p=$((20000 + (RANDOM * 7 + $$) % 12000)) # below the ephemeral ports (32768-60999)
        { exec 9<>"/dev/tcp/127.0.0.1/$p"; } 2>/dev/null || break
        exec 9<&-
    done
    echo "$p"
}
cpu=(--device cpu --log-level warn)

# two_nodes NAME TP ARGS...: node 1 in the background, node 0 in front;
# outputs in $tmp/NAME.{0,1}.{out,err}, exit codes in $tmp/NAME.{0,1}.rc
two_nodes() {
    local name=$1 tp=$2; shift 2
    local p; p=$(port)
    local common=(--tp "$tp" --threads $((tp / 2)) --nnodes 2 --dist-init-addr "127.0.0.1:$p")
    (timeout 300 "$SPECD" "$@" "${cpu[@]}" "${common[@]}" --node-rank 1 \
        >"$tmp/$name.1.out" 2>"$tmp/$name.1.err"; echo $? >"$tmp/$name.1.rc") &
    local bg=$!
    timeout 300 "$SPECD" "$@" "${cpu[@]}" "${common[@]}" --node-rank 0 \
        >"$tmp/$name.0.out" 2>"$tmp/$name.0.err"
    echo $? >"$tmp/$name.0.rc"
    wait $bg
}
# same_as_one_process NAME TP ARGS...: node 0's stdout == one process's
same_as_one_process() {
    local name=$1 tp=$2; shift 2
    timeout 300 "$SPECD" "$@" "${cpu[@]}" --tp "$tp" --threads "$tp" >"$tmp/$name.ref" \
        2>"$tmp/$name.ref.err"
    two_nodes "$name" "$tp" "$@"
    if [[ $(cat "$tmp/$name.0.rc") == 0 && $(cat "$tmp/$name.1.rc") == 0 && -s "$tmp/$name.ref" ]] &&
        cmp -s "$tmp/$name.ref" "$tmp/$name.0.out" && [[ ! -s "$tmp/$name.1.out" ]]; then
        ok "$name"
    else
        bad "$name" "rc $(cat "$tmp/$name.0.rc")/$(cat "$tmp/$name.1.rc"): $(head -c 300 "$tmp/$name.0.err") | $(head -c 300 "$tmp/$name.1.err")"
    fi
}

prompt='def fibonacci(n):'
for spec in none mtp eagle3; do
    d=()
    [[ $spec == eagle3 ]] && d=(--draft-model models/specd-tiny-eagle3)
    same_as_one_process "greedy_${spec}_two_nodes_equal_one_process" 2 generate --spec $spec \
        "${d[@]}" --prompt "$prompt" --max-tokens 24
done
# sampled: a fixed k (adaptive k follows each process's measured times, and
# the tokens a seed gives depend on k)
same_as_one_process sampled_mtp_two_nodes_equal_one_process 2 generate --spec mtp --spec-k 3 \
    --temperature 0.8 --seed 7 --prompt "$prompt" --max-tokens 24
same_as_one_process four_ranks_on_two_nodes_equal_one_process 4 generate --spec ngram \
    --prompt "$prompt" --max-tokens 16

# logits: both nodes write the one-process file
"$SPECD" logits "${cpu[@]}" --tp 2 --threads 2 --ids 1,450,1200,77,3021 --out "$tmp/l.ref" \
    2>/dev/null
p=$(port)
("$SPECD" logits "${cpu[@]}" --tp 2 --threads 1 --nnodes 2 --node-rank 1 \
    --dist-init-addr 127.0.0.1:$p --ids 1,450,1200,77,3021 --out "$tmp/l.1" 2>/dev/null) &
bg=$!
"$SPECD" logits "${cpu[@]}" --tp 2 --threads 1 --nnodes 2 --node-rank 0 \
    --dist-init-addr 127.0.0.1:$p --ids 1,450,1200,77,3021 --out "$tmp/l.0" 2>"$tmp/l.err"
wait $bg
if [[ -s "$tmp/l.ref" ]] && cmp -s "$tmp/l.ref" "$tmp/l.0" && cmp -s "$tmp/l.ref" "$tmp/l.1"; then
    ok logits_on_two_nodes_equal_one_process
else bad logits_on_two_nodes_equal_one_process "$(head -c 300 "$tmp/l.err")"; fi

# serve: node 0 answers, node 1 follows. Then node 1 dies: node 0 stays up,
# fails the next request with an error instead of hanging, and /health says
# 503; SIGTERM stops node 0.
http() { # http PORT METHOD PATH [BODY] -> the whole response on stdout
    local body=${4:-}
    { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
    printf '%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
        "$2" "$3" "${#body}" "$body" >&3
    timeout 60 cat <&3
    exec 3<&-
}
body='{"model": "specd-tiny", "prompt": "def fibonacci(n):", "max_tokens": 12, "temperature": 0}'
serve_pair() { # node 1 and node 0 in the background; waits for node 0's first answer
    p=$(port)
    hp=$(port)
    env "${n1env[@]}" "$SPECD" serve "${cpu[@]}" --tp 2 --threads 1 --nnodes 2 --node-rank 1 \
        --dist-init-addr 127.0.0.1:$p >/dev/null 2>"$tmp/s1.err" &
    s1=$!
    "$SPECD" serve "${cpu[@]}" --tp 2 --threads 1 --nnodes 2 --node-rank 0 \
        --dist-init-addr 127.0.0.1:$p --host 127.0.0.1 --port "$hp" >/dev/null 2>"$tmp/s0.err" &
    s0=$!
    pids=("$s0" "$s1")
    answer=""
    for _ in $(seq 1 240); do
        answer=$(http "$hp" POST /v1/completions "$body")
        [[ $answer == *'"text"'* ]] && break
        sleep 0.5
    done
}
# node 1 under systemd's protocol: a listener on its NOTIFY_SOCKET
n1env=()
if command -v python3 >/dev/null; then
    python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
while True:
    print(s.recv(4096).decode().replace("\n", "|"), flush=True)
' "$tmp/notify.sock" >"$tmp/notify.log" &
    listener=$!
    for _ in $(seq 1 50); do [[ -S "$tmp/notify.sock" ]] && break; sleep 0.1; done
    n1env=(NOTIFY_SOCKET="$tmp/notify.sock" WATCHDOG_USEC=200000)
fi
serve_pair
if [[ $answer == *'HTTP/1.1 200'* && $answer == *'"text"'* ]]; then
    ok serve_on_two_nodes_answers
else bad serve_on_two_nodes_answers "answer: ${answer:0:200} | $(tail -c 300 "$tmp/s0.err") | $(tail -c 300 "$tmp/s1.err")"; fi
# a request with logits processors and logprobs: node 1 takes them from the
# plan (else its tokens, and so the sums, would part from node 0's): the
# text and logprobs of one process (the prompt's too: echo). The bias is on a token of node 1's
# embedding rows (the upper half of the vocabulary): a node's token
# reaches the sums through its own rows only.
procs='{"model": "specd-tiny", "prompt": "def fibonacci(n):", "max_tokens": 12, "temperature": 0, "frequency_penalty": 1.5, "presence_penalty": 0.5, "logit_bias": {"8000": 100}, "logprobs": 2, "echo": true}'
pick() { python3 -c 'import json, sys; t = sys.stdin.read(); c = json.loads(t[t.index("{"):])["choices"][0]; print(json.dumps([c["text"], c["logprobs"]]))'; }
procs2=$(http "$hp" POST /v1/completions "$procs" | pick 2>/dev/null)
# and a JSON schema's mask (the plan carries the schema's text)
schema='{"model": "specd-tiny", "messages": [{"role": "user", "content": "a pet"}], "max_tokens": 40, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "ok": {"type": "boolean"}}, "required": ["kind", "ok"]}}}}'
content() { python3 -c 'import json, sys; t = sys.stdin.read(); print(json.dumps(json.loads(t[t.index("{"):])["choices"][0]["message"]["content"]))'; }
schema2=$(http "$hp" POST /v1/chat/completions "$schema" | content 2>/dev/null)
# SIGTERM on node 0: it drains, tells node 1, and both exit 0
kill -TERM "$s0"
timeout 60 tail --pid="$s0" -f /dev/null
wait "$s0"; rc0=$?
timeout 60 tail --pid="$s1" -f /dev/null
wait "$s1"; rc1=$?
pids=()
[[ $rc0 == 0 && $rc1 == 0 ]] && ok sigterm_on_node_0_stops_both_nodes_cleanly ||
    bad sigterm_on_node_0_stops_both_nodes_cleanly "rc $rc0/$rc1: $(tail -c 300 "$tmp/s1.err")"
if ((${#n1env[@]})); then
    kill "$listener" 2>/dev/null
    n=$(grep -c 'WATCHDOG=1' "$tmp/notify.log")
    r=$(grep -n 'READY=1' "$tmp/notify.log" | head -1 | cut -d: -f1)
    x=$(grep -n 'STOPPING=1' "$tmp/notify.log" | tail -1 | cut -d: -f1)
    if [[ -n $r && -n $x && $r -lt $x && $n -ge 3 ]]; then ok node_1_speaks_systemd_ready_watchdog_stopping
    else bad node_1_speaks_systemd_ready_watchdog_stopping "$n pings: $(head -c 300 "$tmp/notify.log")"; fi
    n1env=()
else
    echo "skip node_1_speaks_systemd_ready_watchdog_stopping (no python3)"
fi
# the same request to one process of both ranks
hp1=$(port)
"$SPECD" serve "${cpu[@]}" --tp 2 --threads 2 --host 127.0.0.1 --port "$hp1" >/dev/null 2>"$tmp/one.err" &
one=$!
pids=("$one")
procs1=""
for _ in $(seq 1 240); do
    procs1=$(http "$hp1" POST /v1/completions "$procs" | pick 2>/dev/null) && [[ -n $procs1 ]] && break
    sleep 0.5
done
schema1=$(http "$hp1" POST /v1/chat/completions "$schema" | content 2>/dev/null)
kill -TERM "$one"
wait "$one" 2>/dev/null
pids=()
if [[ -n $procs1 && $procs1 == "$procs2" ]]; then
    ok logits_processors_on_two_nodes_equal_one_process
else bad logits_processors_on_two_nodes_equal_one_process "one: ${procs1:0:200} | two: ${procs2:0:200}"; fi
if [[ $schema1 == '"{'* && $schema1 == "$schema2" ]]; then
    ok json_schema_on_two_nodes_equals_one_process
else bad json_schema_on_two_nodes_equals_one_process "one: ${schema1:0:200} | two: ${schema2:0:200}"; fi
# again, then node 1 dies
serve_pair
kill -KILL "$s1"
wait "$s1" 2>/dev/null
sleep 1
after=$(http "$hp" POST /v1/completions "$body")
health=$(http "$hp" GET /health)
echo "after the loss: $(head -1 <<<"$after") ... $(tail -c 200 <<<"$after")"
echo "health: $(head -1 <<<"$health") ... $(tail -c 200 <<<"$health")"
if [[ $after == *'"error"'* && $after == *'node group'* ]] &&
    [[ $health == *'HTTP/1.1 503'* ]] && kill -0 "$s0" 2>/dev/null; then
    ok a_dead_node_fails_requests_and_health_not_a_hang
else bad a_dead_node_fails_requests_and_health_not_a_hang "after: ${after:0:300} | health: ${health:0:200}"; fi
kill -TERM "$s0"
timeout 60 tail --pid="$s0" -f /dev/null
wait "$s0"; rc0=$?
pids=()
grep -q "node group" "$tmp/s0.err" && ok node_0_logs_the_lost_node ||
    bad node_0_logs_the_lost_node "$(tail -c 300 "$tmp/s0.err")"
[[ $rc0 != 137 ]] && ok node_0_stops_on_sigterm_after_the_loss || bad node_0_stops_on_sigterm_after_the_loss "rc $rc0"

# different settings: refused at start, naming the problem
p=$(port)
("$SPECD" generate "${cpu[@]}" --tp 2 --threads 1 --nnodes 2 --node-rank 1 --max-batch 4 \
    --dist-init-addr 127.0.0.1:$p --prompt x >/dev/null 2>"$tmp/m1.err"; echo $? >"$tmp/m1.rc") &
bg=$!
timeout 120 "$SPECD" generate "${cpu[@]}" --tp 2 --threads 1 --nnodes 2 --node-rank 0 \
    --dist-init-addr 127.0.0.1:$p --prompt x --max-tokens 4 >/dev/null 2>"$tmp/m0.err"
wait $bg
if [[ $(cat "$tmp/m1.rc") == 1 ]] && grep -q "runs other settings" "$tmp/m1.err"; then
    ok different_settings_are_refused
else bad different_settings_are_refused "rc $(cat "$tmp/m1.rc"): $(head -c 300 "$tmp/m1.err")"; fi

echo "$pass passed, $fail failed"
((fail == 0))
