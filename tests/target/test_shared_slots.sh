#!/usr/bin/env bash
# MoE shared experts as always-on slots of the expert bank (--moe-shared-slots):
# the logits equal the dense shared MLP's (bit for bit with one shared
# expert, within the order of sums with two), on one rank and over --tp 2.
# The DeepSeek-V3 fixture has one shared expert; a copy widened to two (the
# second one random) checks the slots past the first (rows and down columns
# of the shared weights' second half) and that they are used at all.
# usage: test_shared_slots.sh SPECD
set -euo pipefail
specd=$1
cd "${SD_SRCDIR:-.}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
fx=tests/golden/models/deepseek-v3
ids=1,5,9,77,300,2,41,8,19,250

logits() { # logits OUT MODEL ARGS...
    local out=$1 model=$2
    shift 2
    "$specd" logits --model "$model" --device cpu --threads 2 --ids "$ids" --out "$out" "$@" \
        > "$tmp/log" 2>&1 || { cat "$tmp/log"; fail "logits $model $*"; }
}

# compare A B TOL: max |a - b| <= TOL * max |a| (TOL 0: equal bits)
compare() {
    python3 - "$@" <<'PY' || fail "$*"
import array, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read())
b.frombytes(open(sys.argv[2], "rb").read())
tol = float(sys.argv[3])
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
d = max(abs(x - y) for x, y in zip(a, b))
s = max(abs(x) for x in a)
print(f"  {sys.argv[1].split('/')[-1]} vs {sys.argv[2].split('/')[-1]}: max|d| {d:.3g}, max|logit| {s:.3g}")
sys.exit(0 if d <= tol * s else 1)
PY
}

# one shared expert: the same sums in the same order
logits "$tmp/one.bin" "$fx" --no-moe-shared-slots
logits "$tmp/one-slots.bin" "$fx" --moe-shared-slots
compare "$tmp/one.bin" "$tmp/one-slots.bin" 0

# two shared experts: a copy of the fixture whose shared MLP is twice as wide
python3 - "$fx" "$tmp/two" <<'PY'
import json, os, shutil, struct, sys
src, dst = sys.argv[1:3]
os.makedirs(dst)
for f in os.listdir(src):
    if not f.endswith(".safetensors"):
        shutil.copy(os.path.join(src, f), dst)
cfg = json.load(open(os.path.join(src, "config.json")))
cfg["n_shared_experts"] = 2
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
seed = [12345]
def rnd_bf16(n):  # small deterministic values, bf16 = the top half of a float32
    out = bytearray()
    for _ in range(n):
        seed[0] = (seed[0] * 6364136223846793005 + 1442695040888963407) % 2**64
        v = ((seed[0] >> 40) / 2**24 - 0.5) * 0.2
        out += struct.pack("<f", v)[2:4]
    return bytes(out)
for f in os.listdir(src):
    if not f.endswith(".safetensors"):
        continue
    raw = open(os.path.join(src, f), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = head.pop("__metadata__", None)
    out_head, blobs, off = {}, [], 0
    for name in sorted(head, key=lambda k: head[k]["data_offsets"][0]):
        t = head[name]
        b = data[t["data_offsets"][0]:t["data_offsets"][1]]
        shape = list(t["shape"])
        if ".shared_experts." in name:
            assert t["dtype"] == "BF16", name
            r, c = shape
            if name.endswith("down_proj.weight"):  # [D, I] -> [D, 2I]: each row gets I more
                extra = rnd_bf16(r * c)
                b = b"".join(b[i * 2 * c:(i + 1) * 2 * c] + extra[i * 2 * c:(i + 1) * 2 * c]
                             for i in range(r))
                shape = [r, 2 * c]
            else:  # gate / up [I, D] -> [2I, D]: I more rows
                b = b + rnd_bf16(r * c)
                shape = [2 * r, c]
        out_head[name] = {"dtype": t["dtype"], "shape": shape,
                          "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta is not None:
        out_head["__metadata__"] = meta
    h = json.dumps(out_head).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(dst, f), "wb") as o:
        o.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
logits "$tmp/two.bin" "$tmp/two" --no-moe-shared-slots
logits "$tmp/two-slots.bin" "$tmp/two" --moe-shared-slots
logits "$tmp/two-slots-tp2.bin" "$tmp/two" --moe-shared-slots --tp 2
logits "$tmp/two-tp2.bin" "$tmp/two" --no-moe-shared-slots --tp 2
compare "$tmp/two.bin" "$tmp/two-slots.bin" 1e-5
compare "$tmp/two.bin" "$tmp/two-slots-tp2.bin" 1e-5
compare "$tmp/two-tp2.bin" "$tmp/two-slots-tp2.bin" 1e-5
# the second shared expert counts: the widened model is another model
python3 - "$tmp/one.bin" "$tmp/two.bin" <<'PY' || fail "the second shared expert changed nothing"
import array, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read())
b.frombytes(open(sys.argv[2], "rb").read())
sys.exit(0 if max(abs(x - y) for x, y in zip(a, b)) > 1e-3 else 1)
PY
# with --ep the option is ignored (the shared experts stay a dense MLP)
logits "$tmp/two-ep.bin" "$tmp/two" --moe-shared-slots --tp 2 --ep
compare "$tmp/two-tp2.bin" "$tmp/two-ep.bin" 1e-5
echo "shared slots: all checks passed"
