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

FP8_BLOCK = 128


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


FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}


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
