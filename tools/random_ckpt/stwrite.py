"""Streaming safetensors writer for the random checkpoints.

Shapes and dtypes are known before any weight exists, so each shard's header
is written first and every tensor is drawn, copied to the host and written
one at a time: the host never holds more than one tensor, and no package
beyond torch is needed. Format: u64 little-endian header length, the JSON
header (padded with spaces to 8 bytes), then the tensors' bytes in header
order (data_offsets relative to the end of the header).
"""
import json
import os
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch

# safetensors dtype name, bytes per element, torch dtype
DTYPES = {
    "bf16": ("BF16", 2, torch.bfloat16),
    "f32": ("F32", 4, torch.float32),
    "i64": ("I64", 8, torch.int64),
    "bool": ("BOOL", 1, torch.bool),
    "f8": ("F8_E4M3", 1, torch.float8_e4m3fn),
}


def nbytes(shape, dt):
    n = DTYPES[dt][1]
    for s in shape:
        n *= s
    return n


def _raw(t):
    """The tensor's bytes as a buffer (numpy has no bfloat16: viewed as int16)."""
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    return t.numpy().data


def write_checkpoint(out, specs, draw, shard_gb=4.0, single_name=None, workers=1):
    """specs: [(name, shape, dt)], dt a key of DTYPES; draw(name, shape, dt) -> tensor
    (thread-safe when workers > 1: shards are written by that many threads at once).
    Writes out/model-0000i-of-0000n.safetensors + model.safetensors.index.json, or
    out/<single_name> alone when given. Returns (total bytes, seconds)."""
    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    limit = int(shard_gb * 1e9)
    shards, cur, size = [], [], 0
    for sp in specs:
        b = nbytes(sp[1], sp[2])
        if cur and size + b > limit and single_name is None:
            shards.append(cur)
            cur, size = [], 0
        cur.append(sp)
        size += b
    shards.append(cur)
    wmap, total = {}, 0

    def write_shard(i):
        sh = shards[i]
        fn = single_name or f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        hdr, off = {}, 0
        for name, shape, dt in sh:
            b = nbytes(shape, dt)
            hdr[name] = {"dtype": DTYPES[dt][0], "shape": list(shape), "data_offsets": [off, off + b]}
            off += b
        hdr["__metadata__"] = {"format": "pt"}
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(out, fn), "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for name, shape, dt in sh:
                t = draw(name, shape, dt)
                assert tuple(t.shape) == tuple(shape) and t.dtype == DTYPES[dt][2], name
                f.write(_raw(t))
        return fn, off

    if workers > 1 and len(shards) > 1:
        with ThreadPoolExecutor(max_workers=workers) as ex:
            done = list(ex.map(write_shard, range(len(shards))))
    else:
        done = [write_shard(i) for i in range(len(shards))]
    for sh, (fn, size) in zip(shards, done):
        for name, _, _ in sh:
            wmap[name] = fn
        total += size
    if single_name is None:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    return total, time.time() - t0


def normal_draw(seed, dev):
    """Matrices ~ N(0, 0.02^2), norms 1 + N(0, 0.05^2) (bf16), f32 vectors ~ N(0, 0.01^2).
    Each tensor has its own generator, seeded by (seed, name): the weights do not
    depend on the order or the thread that draws them."""
    def draw(name, shape, dt):
        gen = torch.Generator(device=dev).manual_seed((seed << 32) ^ zlib.crc32(name.encode()))
        if dt == "f32":
            return (0.01 * torch.randn(shape, generator=gen, device=dev)).float()
        if len(shape) == 1:
            t = 1 + 0.05 * torch.randn(shape, generator=gen, device=dev)
        else:
            t = 0.02 * torch.randn(shape, generator=gen, device=dev)
        return t.to(torch.bfloat16)
    return draw


FP8_BLOCK = 128
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}


def fp8_specs(specs):
    """specs with every projection (a 2-D weight named *proj*.weight: attention,
    MLP, experts, eh_proj) as block-scaled FP8, DeepSeek-V3 / Qwen3 FP8's
    layout: E4M3 "<name>" and F32 "<name>_scale_inv" [ceil(R/128), ceil(C/128)];
    embeddings, heads, norms and routers stay as they were."""
    out = []
    for name, shape, dt in specs:
        if len(shape) == 2 and dt == "bf16" and "proj" in name and name.endswith(".weight"):
            out.append((name, shape, "f8"))
            out.append((name + "_scale_inv", tuple((n + FP8_BLOCK - 1) // FP8_BLOCK for n in shape),
                        "f32"))
        else:
            out.append((name, shape, dt))
    return out


def fp8_draw(draw):
    """draw, with E4M3 weights of the bf16 draw's spread: the N(0, 0.02^2) draw
    over a scale of 0.02 / 64 a block, clamped to +-448 (E4M3's largest)."""
    scale = 0.02 / 64

    def d(name, shape, dt):
        if dt == "f8":
            t = draw(name, shape, "bf16").float() / scale
            return t.clamp(-448, 448).to(torch.float8_e4m3fn)
        if name.endswith("_scale_inv"):
            return torch.full(shape, scale, dtype=torch.float32)
        return draw(name, shape, dt)
    return d
