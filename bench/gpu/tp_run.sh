#!/usr/bin/env bash
# Tensor parallelism on a machine with 2+ GPUs, in one call:
#   topo       nvidia-smi topo -m and the GPUs
#   comm       tests/gpu/test_comm (NCCL and the custom all-reduce over P2P)
#   logits     `specd logits --device cuda --tp N` against --tp 1 on every
#              golden model, the bundled model and a random-weight
#              DeepSeek-V2-Lite-shaped checkpoint (relative to max |logit|;
#              the random model's logits also checked finite and spread)
#   generate   greedy `specd generate --tp N` equals --tp 1 on the bundled
#              model for every proposer, with --allreduce auto, nccl, oneshot
#   speed      specd-bench-decode at tp 1 and tp N: the Llama-3-8B-shaped and
#              DeepSeek-V2-Lite-shaped random models, plain and speculative
#              (synthetic acceptance), batch 1 and 32; at tp N also the
#              collectives per step and the all-reduce time per step
#              ESTIMATED from the engine's start-up autotune timings, with
#              its share of the measured step time
#   allreduce  specd-bench-allreduce --gpus N: latency per size of NCCL,
#              one-shot, two-shot and the fused all-reduce + add + RMSNorm
#              (runs after generate)
# The random checkpoints go to $CKPT (default /dev/shm/specd-ckpt with 60+ GB
# free there, else /tmp/specd-ckpt), written once (the DeepSeek one before
# the logits phase) and reused.
# OUT receives tp.json (every check and figure), summary.txt and logs.tgz.
#
# usage: bench/gpu/tp_run.sh BIN_DIR OUT COMMIT [TP] [PHASES]
#   BIN_DIR  a CUDA build: specd, test_gpu_comm, bench/specd-bench-allreduce,
#            bench/specd-bench-decode
#   TP       ranks to compare with 1 (default: every visible GPU)
#   PHASES   comma list of topo,comm,allreduce,logits,generate,speed (default all)
# environment: SPEED_TPS the rank counts the speed phase runs (default "1 TP")
set -uo pipefail
B=${1:?BIN_DIR}; OUT=${2:?OUT}; C=${3:-unknown}
. bench/gpu/env.sh
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
TP=${4:-$ngpu}
phases=${5:-topo,comm,allreduce,logits,generate,speed}
has() { [[ ",$phases," == *",$1,"* ]]; }
w=$(mktemp -d)
# the logs so far, after each phase (a call cut short still returns them)
save() { tar -C "$w" -czf "$OUT/logs.tgz" . 2>/dev/null; }
mkdir -p "$OUT"
: > "$w/checks.jsonl"
check() { # check NAME ERROR BOUND PASSED
    echo "{\"test\": \"$1\", \"error\": $2, \"bound\": $3, \"passed\": $4}" >> "$w/checks.jsonl"
    printf '%-72s %10s %8s %s\n' "$1" "$2" "$3" "$([ "$4" = true ] && echo ok || echo FAIL)"
}
dev=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
echo "device: $ngpu x $dev; tp $TP; phases $phases"
[ "$TP" -ge 2 ] || { echo "needs 2+ GPUs"; exit 1; }

if has topo; then
    nvidia-smi topo -m | tee "$w/topo.txt"
    nvidia-smi nvlink -s 2>/dev/null | head -20 > "$w/nvlink.txt"
fi

if has comm; then
    t0=$(date +%s)
    timeout 120 "$B/test_gpu_comm" > "$w/comm.stdout" 2> "$w/comm.log"
    rc=$?
    grep -E '^(FAIL|ok|skip) |passed,' "$w/comm.log"
    grep '^RESULT ' "$w/comm.stdout" | sed 's/^RESULT //' > "$w/comm.jsonl"
    echo "test_gpu_comm: exit $rc in $(( $(date +%s) - t0 )) s"
    check "test_gpu_comm on $ngpu GPUs exits 0" "$rc" 0 "$([ $rc = 0 ] && echo true || echo false)"
fi

# ---- random-weight checkpoints at real size (the logits and speed phases)
shm=$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
CKPT=${CKPT:-$([ "${shm:-0}" -ge 60 ] && echo /dev/shm/specd-ckpt || echo /tmp/specd-ckpt)}

# ---- logits: tp N vs tp 1 on the GPU (and tp 1 GPU vs the golden file)
save
if has logits; then
    random_ckpt dsv2lite
    for m in tests/golden/models/* models/specd-tiny "$CKPT/dsv2lite"; do
        name=$(basename "$m")
        if [ -f "$m/golden.json" ]; then
            ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$m/golden.json")
        else
            ids=1,450,1200,77,3021,15,9,610,2048,33,4000,5,12,700,88,1500
        fi
        for tp in 1 "$TP"; do
            # the real-size random model loads ~31 GB a run
            timeout $([ "$name" = dsv2lite ] && echo 240 || echo 60) "$B/specd" logits \
                --device cuda --tp "$tp" --model "$m" --ids "$ids" \
                --out "$w/logits-$name-tp$tp.f32" --log-level warn 2> "$w/logits-$name-tp$tp.log"
            rc=$?
            echo "logits $name tp$tp: exit $rc"
            [ $rc = 0 ] || tail -3 "$w/logits-$name-tp$tp.log"
        done
        # line 1: max |tp N - tp 1| / max |logit|; line 2: the smallest spread
        # (max - min) of a row of either run over its max |logit|. "NaN" (as
        # JSON reads it) when a value is not finite or a file is missing/short.
        python3 - "$w/logits-$name-tp1.f32" "$w/logits-$name-tp$TP.f32" "$m/config.json" \
            > "$w/cmp-$name.txt" <<'EOF'
import json, sys, numpy as np
try:
    a = np.fromfile(sys.argv[1], dtype=np.float32); b = np.fromfile(sys.argv[2], dtype=np.float32)
    V = json.load(open(sys.argv[3]))["vocab_size"]
    if a.size == 0 or a.size != b.size or a.size % V:
        print("NaN\nNaN")
    else:
        e = float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))
        print(e if np.isfinite(e) else "NaN")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            print("NaN")
        else:
            print(min(float(np.ptp(r) / max(np.abs(r).max(), 1e-30))
                      for x in (a, b) for r in x.reshape(-1, V)))
except Exception:
    print("NaN\nNaN")
EOF
        e=$(sed -n 1p "$w/cmp-$name.txt"); spread=$(sed -n 2p "$w/cmp-$name.txt")
        # bf16 rounding of partial sums in another order: relative 1e-2
        ok=$(python3 -c "import math,sys; e=float(sys.argv[1]); print('true' if not math.isnan(e) and e <= 1e-2 else 'false')" "$e")
        check "logits $name: cuda tp$TP vs tp1 (rel. to max|logit|)" "$e" 1e-2 "$ok"
        if [ "$name" = dsv2lite ]; then
            # random weights: a broken path could agree with itself on constant
            # or non-finite logits; every row of both runs must be finite and
            # spread (max - min) by at least 1e-3 of its max |logit|
            ok=$(python3 -c "import math,sys; s=float(sys.argv[1]); print('true' if not math.isnan(s) and s >= 1e-3 else 'false')" "$spread")
            check "logits $name: tp1, tp$TP finite; min row spread/max|logit| (>= bound)" "$spread" 1e-3 "$ok"
        fi
    done
fi

# ---- greedy generation: tp N equals tp 1
save
if has generate; then
    prompt='def fibonacci(n):'
    for spec in none mtp eagle3 draft ngram; do
        d=()
        [ $spec = eagle3 ] && d=(--draft-model models/specd-tiny-eagle3)
        [ $spec = draft ] && d=(--draft-model models/specd-tiny-draft)
        timeout 45 "$B/specd" generate --device cuda --tp 1 --spec $spec "${d[@]}" --prompt "$prompt" \
            --max-tokens 64 > "$w/gen-$spec-tp1.txt" 2> "$w/gen-$spec-tp1.log"
        for ar in auto nccl oneshot; do
            [ $spec != none ] && [ $ar != auto ] && continue
            timeout 45 "$B/specd" generate --device cuda --tp "$TP" --allreduce $ar --spec $spec "${d[@]}" \
                --prompt "$prompt" --max-tokens 64 --log-level info \
                > "$w/gen-$spec-tp$TP-$ar.txt" 2> "$w/gen-$spec-tp$TP-$ar.log"
            rc=$?
            same=false
            [ $rc = 0 ] && [ -s "$w/gen-$spec-tp1.txt" ] && cmp -s "$w/gen-$spec-tp1.txt" "$w/gen-$spec-tp$TP-$ar.txt" && same=true
            check "generate --spec $spec --allreduce $ar: tp$TP == tp1 (64 greedy tokens)" "$rc" 0 $same
            [ $rc = 0 ] || tail -3 "$w/gen-$spec-tp$TP-$ar.log"
        done
    done
    # the start-up printout of the auto run: topology, autotune table, memory plan
    grep -iE 'topo|allreduce|all-reduce|nvlink|p2p|memory|kv' "$w/gen-none-tp$TP-auto.log" | head -40
fi

save
if has allreduce; then
    timeout 120 "$B/bench/specd-bench-allreduce" --gpus "$TP" --out "$w/allreduce.json" \
        > "$w/allreduce.txt" 2>&1
    echo "specd-bench-allreduce: exit $?"
    cat "$w/allreduce.txt"
fi

# ---- speed: tp 1 vs tp N on real-size random models
save
if has speed; then
    mkdir -p "$CKPT"
    random_ckpt l8b
    random_ckpt dsv2lite
    common=(--device cuda --commit "$C" --machine "$ngpu x $dev" --max-tokens ${MAXTOK:-128}
            --prompt-len 64 --warmup 8 --batch 1,32)
    run() { # run LABEL TP ARGS...
        local label=$1 tp=$2; shift 2
        timeout 150 "$B/bench/specd-bench-decode" "${common[@]}" --opt tp=$tp --label "$label-tp$tp" \
            --out "$w/run-$label-tp$tp.json" "$@" > "$w/$label-tp$tp.txt" 2> "$w/$label-tp$tp.log"
        local rc=$?
        [ $rc = 0 ] || { echo "== $label tp$tp: exit $rc"; tail -4 "$w/$label-tp$tp.log"; }
        tail -n +2 "$w/$label-tp$tp.txt" | sed "s/^/$label-tp$tp: /"
    }
    for tp in ${SPEED_TPS:-1 $TP}; do
        run l8b-plain $tp --model "$CKPT/l8b"
        run l8b-eagle3-k3 $tp --model "$CKPT/l8b" --spec eagle3 --draft-model "$CKPT/l8b-eagle3" \
            --k 3 --synthetic-accept 0.85,0.75,0.6
        run dsv2lite-plain $tp --model "$CKPT/dsv2lite"
        run dsv2lite-mtp-k1 $tp --model "$CKPT/dsv2lite" --spec mtp --k 1 --synthetic-accept 0.875
    done
    # the all-reduce's share of a step at tp > 1: counted calls, and time
    # ESTIMATED from the start-up autotune (not measured inside the steps)
    python3 - "$w" <<'EOF' | tee "$w/allreduce-share.txt"
import glob, json, os, sys
print("all-reduce per engine step at tp > 1 (est_ms: ESTIMATED from the start-up autotune's "
      "timings, not measured; share: of the measured step_ms)")
print(f"{'run':<24} {'batch':>5} {'step_ms':>8} {'ar/step':>8} {'resid':>6} {'gather':>6} "
      f"{'KB/call':>8} {'nccl':>6} {'1shot':>6} {'2shot':>6} {'fused':>6} {'est_ms':>7} "
      f"{'share':>6} {'unrec':>6}")
for f in sorted(glob.glob(f"{sys.argv[1]}/run-*.json")):
    try:
        d = json.load(open(f))
    except Exception:
        continue
    for x in d.get("results", []):
        a = x.get("allreduce")
        if not a:
            continue
        p, est, sh = a["calls_per_step_by_path"], a["est_ms_per_step"], a["est_share_of_step"]
        est = "-" if est is None else f"{est:.3f}"
        sh = "-" if sh is None else f"{sh:.3f}"
        print(f"{os.path.basename(f)[4:-5]:<24} {x['batch']:>5} {x['step_ms']:>8.3f} "
              f"{a['calls_per_step']:>8.2f} {a['residual_calls_per_step']:>6.2f} "
              f"{a['allgather_calls_per_step']:>6.2f} {a['floats_per_call'] * 4 / 1024:>8.1f} "
              f"{p['nccl']:>6.2f} {p['oneshot']:>6.2f} {p['twoshot']:>6.2f} {p['fused']:>6.2f} "
              f"{est:>7} {sh:>6} {a['unrecorded_graph_replays_per_step']:>6.2f}")
EOF
fi

save
python3 - "$w" "$C" "$ngpu x $dev" "$TP" "$OUT" <<'EOF'
import json, sys, glob, os, datetime
w, commit, device, tp, out = sys.argv[1:6]
checks = [json.loads(l) for l in open(f"{w}/checks.jsonl") if l.strip()]
comm = [json.loads(l) for l in open(f"{w}/comm.jsonl")] if os.path.exists(f"{w}/comm.jsonl") else []
runs = {}
for f in sorted(glob.glob(f"{w}/run-*.json")):
    try:
        runs[os.path.basename(f)[4:-5]] = json.load(open(f))
    except Exception as e:
        runs[os.path.basename(f)[4:-5]] = {"error": str(e)}
ar = json.load(open(f"{w}/allreduce.json")) if os.path.exists(f"{w}/allreduce.json") else None
topo = open(f"{w}/topo.txt").read() if os.path.exists(f"{w}/topo.txt") else ""
# the all-reduce's estimated share of each tp > 1 decode result (from "decode")
share = [{"run": k, "batch": x["batch"], "step_ms": x["step_ms"],
          "calls_per_step": x["allreduce"]["calls_per_step"],
          "est_ms_per_step": x["allreduce"]["est_ms_per_step"],
          "est_share_of_step": x["allreduce"]["est_share_of_step"]}
         for k, r in runs.items() for x in r.get("results", []) if x.get("allreduce")]
rec = {"benchmark": "tensor parallelism on GPUs", "commit": commit, "device": device, "tp": int(tp),
       "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
       "command": f"bench/gpu/tp_run.sh BIN_DIR OUT COMMIT {tp}",
       "topology": topo, "checks": checks, "comm_tests": comm, "allreduce": ar, "decode": runs,
       "allreduce_share_estimated": {"note": "est_ms_per_step: the sum over a step's all-reduces "
                                     "of the start-up autotune's time for that size and path; "
                                     "an estimate from start-up timings, not measured in the "
                                     "steps", "runs": share},
       "passed": sum(c["passed"] for c in checks) + sum(bool(c.get("passed")) for c in comm),
       "failed": sum(not c["passed"] for c in checks) + sum(not c.get("passed", True) for c in comm)}
json.dump(rec, open(f"{out}/tp.json", "w"), indent=1)
print(f"passed {rec['passed']}, failed {rec['failed']}")
EOF
tar -C "$w" -czf "$OUT/logs.tgz" . 2>/dev/null
