#!/usr/bin/env python3
"""Random-weight DeepseekV3ForCausalLM checkpoint at real sizes (MLA + MoE),
for GPU benchmarks without downloads: config.json (4.x layout, as published
DeepSeek checkpoints) + sharded bf16 safetensors with the published tensor
names (experts one per expert). Weights are drawn on the GPU when there is
one and streamed to disk one tensor at a time (stwrite.py). The v2-lite
preset has DeepSeek-V2-Lite's shapes in the V3 architecture (sigmoid routing
with the correction bias; no q LoRA).

--mtp adds one MTP (NextN) layer as DeepSeek-V3 ships it: config
num_nextn_predict_layers = 1 and, at layer index num_hidden_layers, a full
decoder layer (MLA + MoE) plus enorm, hnorm, eh_proj (D x 2D),
shared_head.norm, shared_head.head (V x D) and embed_tokens (V x D).

--tiny writes the same layout at a toy size (vocab 512, hidden 64, 3 layers,
8 experts top-2), for checks on the CPU.

    python3 tools/random_ckpt/deepseek.py --preset v2-lite --mtp --out /tmp/dsv2lite
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stwrite import FP8_CONFIG, fp8_draw, fp8_specs, normal_draw, write_checkpoint  # noqa: E402

PRESETS = {
    "v2-lite": dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                    moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
                    num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512,
                    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                    n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
                    first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=1.0,
                    norm_topk_prob=False, max_position_embeddings=4096, rope_theta=10000.0,
                    rms_norm_eps=1e-6),
}
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
            kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
            n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
            max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6)


def layer_specs(c, l):
    D, H = c["hidden_size"], c["num_attention_heads"]
    C, R, N, Vh = c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
    E, I, Im = c["n_routed_experts"], c["intermediate_size"], c["moe_intermediate_size"]
    p = f"model.layers.{l}."
    s = [(p + "input_layernorm.weight", (D,), "bf16"),
         (p + "post_attention_layernorm.weight", (D,), "bf16"),
         (p + "self_attn.q_proj.weight", (H * (N + R), D), "bf16"),
         (p + "self_attn.kv_a_proj_with_mqa.weight", (C + R, D), "bf16"),
         (p + "self_attn.kv_a_layernorm.weight", (C,), "bf16"),
         (p + "self_attn.kv_b_proj.weight", (H * (N + Vh), C), "bf16"),
         (p + "self_attn.o_proj.weight", (D, H * Vh), "bf16")]
    if l < c["first_k_dense_replace"]:
        return s + [(p + "mlp.gate_proj.weight", (I, D), "bf16"), (p + "mlp.up_proj.weight", (I, D), "bf16"),
                    (p + "mlp.down_proj.weight", (D, I), "bf16")]
    s += [(p + "mlp.gate.weight", (E, D), "bf16"), (p + "mlp.gate.e_score_correction_bias", (E,), "f32")]
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        s += [(q + "gate_proj.weight", (Im, D), "bf16"), (q + "up_proj.weight", (Im, D), "bf16"),
              (q + "down_proj.weight", (D, Im), "bf16")]
    Is = Im * c["n_shared_experts"]
    return s + [(p + "mlp.shared_experts.gate_proj.weight", (Is, D), "bf16"),
                (p + "mlp.shared_experts.up_proj.weight", (Is, D), "bf16"),
                (p + "mlp.shared_experts.down_proj.weight", (D, Is), "bf16")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), default="v2-lite")
    ap.add_argument("--tiny", action="store_true", help="toy shapes (CPU checks)")
    ap.add_argument("--mtp", action="store_true", help="add one MTP (NextN) layer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0, help="shards written at once (0: 4 on a GPU, else 1)")
    ap.add_argument("--fp8", action="store_true",
                    help="projections as block-scaled FP8 (E4M3, 128 x 128 scales), as FP8 releases ship")
    a = ap.parse_args()
    c = dict(TINY if a.tiny else PRESETS[a.preset])
    c.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_act="silu",
             scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1, rope_scaling=None,
             rope_interleave=True, attention_bias=False, tie_word_embeddings=False,
             num_nextn_predict_layers=1 if a.mtp else 0, bos_token_id=None, eos_token_id=None,
             torch_dtype="bfloat16")
    if a.fp8:
        c["quantization_config"] = FP8_CONFIG
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    workers = a.workers or (4 if dev == "cuda" else 1)
    D, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    specs = [("model.embed_tokens.weight", (V, D), "bf16"), ("model.norm.weight", (D,), "bf16"),
             ("lm_head.weight", (V, D), "bf16")]
    for l in range(L):
        specs += layer_specs(c, l)
    if a.mtp:
        p = f"model.layers.{L}."
        specs += layer_specs(c, L) + [
            (p + "enorm.weight", (D,), "bf16"), (p + "hnorm.weight", (D,), "bf16"),
            (p + "eh_proj.weight", (D, 2 * D), "bf16"), (p + "shared_head.norm.weight", (D,), "bf16"),
            (p + "shared_head.head.weight", (V, D), "bf16"), (p + "embed_tokens.weight", (V, D), "bf16")]
    if a.fp8:
        specs = fp8_specs(specs)
    draw = fp8_draw(normal_draw(a.seed, dev)) if a.fp8 else normal_draw(a.seed, dev)
    total, secs = write_checkpoint(a.out, specs, draw, a.shard_gb, workers=workers)
    E, k, Im = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    n_moe = L - c["first_k_dense_replace"]
    active = total - n_moe * (E - k) * 3 * Im * D * (1 if a.fp8 else 2)
    name = "tiny" if a.tiny else a.preset
    print(f"{name}{' + MTP' if a.mtp else ''}: {len(specs)} tensors, {total / 1e9:.2f} GB in "
          f"{secs:.1f} s -> {a.out} (batch 1 reads ~{active / 1e9:.2f} GB a token"
          f"{', MTP layer included' if a.mtp else ''})")


if __name__ == "__main__":
    main()
