#!/usr/bin/env python3
"""Random-weight DeepseekV3ForCausalLM checkpoint at real sizes (MLA + MoE),
for GPU benchmarks without downloads: config.json (4.x layout, as published
DeepSeek checkpoints) + sharded bf16 safetensors with the published tensor
names (experts one per expert). Weights are drawn on the GPU when there is
one. The v2-lite preset has DeepSeek-V2-Lite's shapes in the V3 architecture
(sigmoid routing with the correction bias; no q LoRA).

    python3 tools/random_ckpt/deepseek.py --preset v2-lite --out /tmp/dsv2lite
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), default="v2-lite")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    c = dict(PRESETS[a.preset])
    c.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_act="silu",
             scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1, rope_scaling=None,
             rope_interleave=True, attention_bias=False, tie_word_embeddings=False,
             num_nextn_predict_layers=0, bos_token_id=None, eos_token_id=None, torch_dtype="bfloat16")
    os.makedirs(a.out, exist_ok=True)
    json.dump(c, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)
    D, V, H = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    C, R, N, Vh = c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
    E, I, Im = c["n_routed_experts"], c["intermediate_size"], c["moe_intermediate_size"]
    shapes = [("model.embed_tokens.weight", (V, D)), ("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes += [(p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,)),
                   (p + "self_attn.q_proj.weight", (H * (N + R), D)),
                   (p + "self_attn.kv_a_proj_with_mqa.weight", (C + R, D)),
                   (p + "self_attn.kv_a_layernorm.weight", (C,)),
                   (p + "self_attn.kv_b_proj.weight", (H * (N + Vh), C)),
                   (p + "self_attn.o_proj.weight", (D, H * Vh))]
        if l < c["first_k_dense_replace"]:
            shapes += [(p + "mlp.gate_proj.weight", (I, D)), (p + "mlp.up_proj.weight", (I, D)),
                       (p + "mlp.down_proj.weight", (D, I))]
            continue
        shapes += [(p + "mlp.gate.weight", (E, D)), (p + "mlp.gate.e_score_correction_bias", (E, "f32"))]
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            shapes += [(q + "gate_proj.weight", (Im, D)), (q + "up_proj.weight", (Im, D)),
                       (q + "down_proj.weight", (D, Im))]
        Is = Im * c["n_shared_experts"]
        shapes += [(p + "mlp.shared_experts.gate_proj.weight", (Is, D)),
                   (p + "mlp.shared_experts.up_proj.weight", (Is, D)),
                   (p + "mlp.shared_experts.down_proj.weight", (D, Is))]
    limit = int(a.shard_gb * 1e9)
    shards, cur, size = [], {}, 0
    for name, shape in shapes:
        if len(shape) == 2 and shape[1] == "f32":
            t = (0.01 * torch.randn((shape[0],), generator=g, device=dev)).float().cpu()
        elif len(shape) == 1:
            t = (1 + 0.05 * torch.randn(shape, generator=g, device=dev)).to(torch.bfloat16).cpu()
        else:
            t = (0.02 * torch.randn(shape, generator=g, device=dev)).to(torch.bfloat16).cpu()
        if size and size + t.numel() * t.element_size() > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += t.numel() * t.element_size()
    shards.append(cur)
    wmap, total = {}, 0
    for i, sh in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(a.out, fn), metadata={"format": "pt"})
        for k, v in sh.items():
            wmap[k] = fn
            total += v.numel() * v.element_size()
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
              open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=2)
    active = total - (c["num_hidden_layers"] - c["first_k_dense_replace"]) * (E - c["num_experts_per_tok"]) * 3 * Im * D * 2
    print(f"{a.preset}: {len(shapes)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards, "
          f"{active / 1e9:.2f} GB read per token at batch 1 -> {a.out}")


if __name__ == "__main__":
    main()
