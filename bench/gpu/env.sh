# Sourced by every GPU script (run from the repository root): the environment
# a run on a GPU host needs, and the random-checkpoint cache.
# NVLink multicast stays off: the custom all-reduce never uses it, and NCCL
# must not either on a shared host.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 SD_SRCDIR=$PWD
# a build from another checkout names that checkout's bundled model: use this tree's
export SPECD_BUNDLED_MODEL=${SPECD_BUNDLED_MODEL:-$PWD/models/specd-tiny}

# random_ckpt NAME: the random-weight checkpoint NAME under $CKPT, written once
#   l8b       Llama-3-8B-shaped, with its EAGLE-3 head in $CKPT/l8b-eagle3
#   dsv2lite  DeepSeek-V2-Lite-shaped, with an MTP layer
#   l8b-fp8, dsv2lite-fp8  the same shapes with block-scaled FP8 projections
# One command line per NAME for every script; a directory is reused only when
# its .complete marker holds that same command line (a checkpoint written with
# other options is rewritten). PY: the python with torch (python3);
# CKPT_ARGS: more arguments (e.g. --tiny for toy sizes).
random_ckpt() {
    local name=$1 cmd
    case $name in
    l8b) cmd=("${PY:-python3}" tools/random_ckpt/llama.py ${CKPT_ARGS:-} --preset llama3-8b
              --out "$CKPT/l8b" --eagle3 "$CKPT/l8b-eagle3") ;;
    dsv2lite) cmd=("${PY:-python3}" tools/random_ckpt/deepseek.py ${CKPT_ARGS:-} --preset v2-lite
              --mtp --out "$CKPT/dsv2lite") ;;
    l8b-fp8) cmd=("${PY:-python3}" tools/random_ckpt/llama.py ${CKPT_ARGS:-} --preset llama3-8b
              --fp8 --out "$CKPT/l8b-fp8") ;;
    dsv2lite-fp8) cmd=("${PY:-python3}" tools/random_ckpt/deepseek.py ${CKPT_ARGS:-} --preset v2-lite
              --mtp --fp8 --out "$CKPT/dsv2lite-fp8") ;;
    *) echo "random_ckpt: unknown $name"; return 2 ;;
    esac
    if [ -f "$CKPT/$name/.complete" ] && [ "$(cat "$CKPT/$name/.complete")" = "${cmd[*]}" ]; then
        echo "$name: already written"; return 0
    fi
    mkdir -p "$CKPT"
    "${cmd[@]}" 2>&1 | tail -3
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "$name: writing failed"; return 1; }
    printf '%s' "${cmd[*]}" > "$CKPT/$name/.complete"
}

# parse_config LABEL=BIN_DIR[:VAR=VALUE...][:--opt=VALUE...]: a benchmark
# configuration of the A/B scripts into cfg_label, cfg_bin, cfg_env (the
# VAR=VALUE parts, for env) and cfg_args (a --opt=VALUE part as two
# arguments of specd-bench-decode: --opt VALUE)
parse_config() {
    cfg_label=${1%%=*}
    local parts p
    IFS=: read -r -a parts <<< "${1#*=}"
    cfg_bin=${parts[0]}; cfg_env=(); cfg_args=()
    for p in "${parts[@]:1}"; do
        if [[ $p == --*=* ]]; then cfg_args+=("${p%%=*}" "${p#*=}"); else cfg_env+=("$p"); fi
    done
}

# serve_ready PORT: waits (up to 120 s) for a server's /health on PORT;
# 0 once it answers
serve_ready() {
    for _ in $(seq 1 240); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}
