#!/usr/bin/env python3
"""Random-weight Llama-family checkpoint at real sizes, for GPU benchmarks
without downloads: config.json + sharded bf16 safetensors with the tensor
names and shapes HF's LlamaForCausalLM uses. Weights are drawn on the GPU
when there is one (std 0.02; norms 1 + noise), so an 8B model takes seconds.

    python3 tools/random_ckpt/llama.py --preset llama3-8b --out /tmp/llama3-8b
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

PRESETS = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    c = dict(PRESETS[a.preset])
    c.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
             tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, torch_dtype="bfloat16")
    os.makedirs(a.out, exist_ok=True)
    json.dump(c, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)
    D, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    hd = D // H
    shapes = [("model.embed_tokens.weight", (V, D)), ("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes += [(p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,)),
                   (p + "self_attn.q_proj.weight", (H * hd, D)), (p + "self_attn.k_proj.weight", (KV * hd, D)),
                   (p + "self_attn.v_proj.weight", (KV * hd, D)), (p + "self_attn.o_proj.weight", (D, H * hd)),
                   (p + "mlp.gate_proj.weight", (I, D)), (p + "mlp.up_proj.weight", (I, D)),
                   (p + "mlp.down_proj.weight", (D, I))]
    limit = int(a.shard_gb * 1e9)
    shards, cur, size = [], {}, 0
    for name, shape in shapes:
        if len(shape) == 1:
            t = 1 + 0.05 * torch.randn(shape, generator=g, device=dev)
        else:
            t = 0.02 * torch.randn(shape, generator=g, device=dev)
        t = t.to(torch.bfloat16).cpu()
        if size and size + t.numel() * 2 > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += t.numel() * 2
    shards.append(cur)
    wmap, total = {}, 0
    for i, sh in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(a.out, fn), metadata={"format": "pt"})
        for k, v in sh.items():
            wmap[k] = fn
            total += v.numel() * 2
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
              open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=2)
    print(f"{a.preset}: {len(shapes)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards -> {a.out}")


if __name__ == "__main__":
    main()
