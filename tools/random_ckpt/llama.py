#!/usr/bin/env python3
"""Random-weight Llama-family checkpoint at real sizes, for GPU benchmarks
without downloads: config.json + sharded bf16 safetensors with the tensor
names and shapes HF's LlamaForCausalLM uses. Weights are drawn on the GPU
when there is one (std 0.02; norms 1 + noise) and streamed to disk one
tensor at a time (stwrite.py).

--eagle3 DIR also writes a random EAGLE-3 head for it, in the layout of the
published heads (e.g. EAGLE3-LLaMA3.1-Instruct-8B) that specd loads
(src/draft/eagle3.c): fc over the 3 aux layers' states (D x 3D), one decoder
layer ("midlayer") whose attention takes [embedding, hidden] (2D wide),
hidden_norm / input_layernorm / post_attention_layernorm, the final norm, and
lm_head over a draft vocabulary of 32000 tokens with d2t (draft id -> target
id offset, int64) and t2d (bool over the target vocabulary); aux layer ids
[1, L/2 - 1, L - 4] in eagle_config. Its embedding is the target's.

--tiny writes the same layout at a toy size (vocab 512, hidden 64, 8
layers), for checks on the CPU.

    python3 tools/random_ckpt/llama.py --preset llama3-8b --out /tmp/l8b --eagle3 /tmp/l8b-eagle3
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stwrite import FP8_CONFIG, fp8_draw, fp8_specs, normal_draw, write_checkpoint  # noqa: E402

PRESETS = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5),
}
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rope_theta=500000.0, rms_norm_eps=1e-5)
DRAFT_VOCAB = {"llama3-8b": 32000, "tiny": 256}


def target_specs(c):
    D, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    hd = D // H
    s = [("model.embed_tokens.weight", (V, D), "bf16"), ("model.norm.weight", (D,), "bf16"),
         ("lm_head.weight", (V, D), "bf16")]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s += [(p + "input_layernorm.weight", (D,), "bf16"),
              (p + "post_attention_layernorm.weight", (D,), "bf16"),
              (p + "self_attn.q_proj.weight", (H * hd, D), "bf16"),
              (p + "self_attn.k_proj.weight", (KV * hd, D), "bf16"),
              (p + "self_attn.v_proj.weight", (KV * hd, D), "bf16"),
              (p + "self_attn.o_proj.weight", (D, H * hd), "bf16"),
              (p + "mlp.gate_proj.weight", (I, D), "bf16"), (p + "mlp.up_proj.weight", (I, D), "bf16"),
              (p + "mlp.down_proj.weight", (D, I), "bf16")]
    return s


def write_eagle3(out, c, draft_vocab, seed, dev):
    D, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    hd, L = D // H, c["num_hidden_layers"]
    aux = [1, L // 2 - 1, L - 4]
    cfg = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=V,
               draft_vocab_size=draft_vocab, hidden_size=D, target_hidden_size=D,
               intermediate_size=I, num_hidden_layers=1, num_attention_heads=H,
               num_key_value_heads=KV, head_dim=hd, hidden_act="silu",
               max_position_embeddings=c["max_position_embeddings"], rms_norm_eps=c["rms_norm_eps"],
               rope_theta=c["rope_theta"], rope_scaling=None, attention_bias=False, mlp_bias=False,
               tie_word_embeddings=False, torch_dtype="bfloat16",
               eagle_config=dict(eagle_aux_hidden_state_layer_ids=aux, use_aux_hidden_state=True))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    m = "midlayer."
    specs = [("d2t", (draft_vocab,), "i64"), ("t2d", (V,), "bool"), ("fc.weight", (D, 3 * D), "bf16"),
             (m + "hidden_norm.weight", (D,), "bf16"), (m + "input_layernorm.weight", (D,), "bf16"),
             (m + "self_attn.q_proj.weight", (H * hd, 2 * D), "bf16"),
             (m + "self_attn.k_proj.weight", (KV * hd, 2 * D), "bf16"),
             (m + "self_attn.v_proj.weight", (KV * hd, 2 * D), "bf16"),
             (m + "self_attn.o_proj.weight", (D, H * hd), "bf16"),
             (m + "post_attention_layernorm.weight", (D,), "bf16"),
             (m + "mlp.gate_proj.weight", (I, D), "bf16"), (m + "mlp.up_proj.weight", (I, D), "bf16"),
             (m + "mlp.down_proj.weight", (D, I), "bf16"), ("norm.weight", (D,), "bf16"),
             ("lm_head.weight", (draft_vocab, D), "bf16")]
    # the draft vocabulary: a random sorted subset of the target's ids
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(1))[:draft_vocab].sort().values
    weights = normal_draw(seed + 1, dev)

    def draw(name, shape, dt):
        if name == "d2t":
            return ids - torch.arange(draft_vocab)
        if name == "t2d":
            t = torch.zeros(V, dtype=torch.bool)
            t[ids] = True
            return t
        return weights(name, shape, dt)
    return write_checkpoint(out, specs, draw, single_name="model.safetensors")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    ap.add_argument("--tiny", action="store_true", help="toy shapes (CPU checks)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--eagle3", metavar="DIR", help="also write a random EAGLE-3 head here")
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0, help="shards written at once (0: 4 on a GPU, else 1)")
    ap.add_argument("--fp8", action="store_true",
                    help="projections as block-scaled FP8 (E4M3, 128 x 128 scales), as FP8 releases ship")
    a = ap.parse_args()
    c = dict(TINY if a.tiny else PRESETS[a.preset])
    c.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
             tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, torch_dtype="bfloat16")
    if a.fp8:
        c["quantization_config"] = FP8_CONFIG
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    workers = a.workers or (4 if dev == "cuda" else 1)
    specs = fp8_specs(target_specs(c)) if a.fp8 else target_specs(c)
    draw = fp8_draw(normal_draw(a.seed, dev)) if a.fp8 else normal_draw(a.seed, dev)
    total, secs = write_checkpoint(a.out, specs, draw, a.shard_gb, workers=workers)
    name = "tiny" if a.tiny else a.preset
    print(f"{name}: {len(specs)} tensors, {total / 1e9:.2f} GB in {secs:.1f} s -> {a.out}")
    if a.eagle3:
        total, secs = write_eagle3(a.eagle3, c, DRAFT_VOCAB[name], a.seed, dev)
        print(f"{name} EAGLE-3 head: {total / 1e9:.2f} GB in {secs:.1f} s -> {a.eagle3}")


if __name__ == "__main__":
    main()
