"""Standard checkpoint files: safetensors (written here, no package needed),
config.json for each model, and the mapping between the training modules and
the published tensor names."""
import json
import os
import struct

import numpy as np
import torch

from models import DeepSeekV3, Eagle3, Llama

_DT = {
    torch.bfloat16: ("BF16", torch.int16),
    torch.float32: ("F32", None),
    torch.int64: ("I64", None),
    torch.bool: ("BOOL", None),
    torch.float16: ("F16", None),
}
_NP = {"BF16": np.int16, "F32": np.float32, "I64": np.int64, "BOOL": np.bool_, "F16": np.float16}


def save_safetensors(tensors, path, metadata=None):
    """tensors: {name: torch.Tensor}; written in sorted name order, 8-byte aligned header."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        code, view = _DT[t.dtype]
        a = (t.view(view) if view is not None else t).numpy()
        b = a.tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, m in header.items():
        if name == "__metadata__":
            continue
        a, b = m["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=_NP[m["dtype"]]).reshape(m["shape"]).copy()
        t = torch.from_numpy(arr)
        if m["dtype"] == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t
    return out


def write_json(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


# ----------------------------------------------------------------------------- configs


def target_config(a):
    """DeepseekV3ForCausalLM config in the layout published DeepSeek-V3 checkpoints use."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": a.vocab,
        "hidden_size": a.hidden,
        "intermediate_size": a.dense_inter,
        "moe_intermediate_size": a.moe_inter,
        "num_hidden_layers": a.layers,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads,
        "n_shared_experts": 1,
        "n_routed_experts": a.experts,
        "num_experts_per_tok": 2,
        "routed_scaling_factor": a.routed_scale,
        "kv_lora_rank": a.kv_lora,
        "q_lora_rank": a.q_lora,
        "qk_rope_head_dim": 16 if not a.smoke else 8,
        "qk_nope_head_dim": 32 if not a.smoke else 8,
        "v_head_dim": 32 if not a.smoke else 8,
        "topk_method": "noaux_tc",
        "n_group": 2,
        "topk_group": 1,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "aux_loss_alpha": 0.0,
        "seq_aux": True,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "ep_size": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rope_interleave": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 4,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }


def draft_config(a):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": a.vocab,
        "hidden_size": a.draft_hidden,
        "intermediate_size": a.draft_inter,
        "num_hidden_layers": a.draft_layers,
        "num_attention_heads": a.draft_heads,
        "num_key_value_heads": a.draft_heads // 2,
        "head_dim": a.draft_hidden // a.draft_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 4,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }


def eagle_config(a, layer_ids):
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": a.vocab,
        "draft_vocab_size": a.draft_vocab,
        "hidden_size": a.hidden,
        "target_hidden_size": a.hidden,
        "intermediate_size": a.eagle_inter,
        "num_hidden_layers": 1,
        "num_attention_heads": a.eagle_heads,
        "num_key_value_heads": a.eagle_heads // 2,
        "head_dim": a.hidden // a.eagle_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 4,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
    }


# ----------------------------------------------------------------------------- name mapping


def _bf16(t):
    return t.detach().to(torch.bfloat16)


def target_tensors(m: DeepSeekV3):
    """Training module -> DeepSeek-V3 checkpoint names (bf16; e_score_correction_bias f32 as DeepSeek stores it)."""
    L = m.c["num_hidden_layers"]
    out = {}
    for n, p in list(m.named_parameters()) + list(m.named_buffers()):
        if n.startswith("mtp."):
            n = f"model.layers.{L}." + n[4:]
        if n.endswith("e_score_correction_bias"):
            out[n] = p.detach().float()
            continue
        for kind, short in (("experts_gate", "gate_proj"), ("experts_up", "up_proj"), ("experts_down", "down_proj")):
            if n.endswith("mlp." + kind):
                base = n[: -len(kind)]
                for e in range(p.shape[0]):
                    out[f"{base}experts.{e}.{short}.weight"] = _bf16(p[e])
                break
        else:
            out[n] = _bf16(p)
    out[f"model.layers.{L}.embed_tokens.weight"] = _bf16(m.model.embed_tokens.weight)
    out[f"model.layers.{L}.shared_head.head.weight"] = _bf16(m.lm_head.weight)
    return out


def load_target(d, dtype=torch.float32, device="cpu"):
    c = json.load(open(os.path.join(d, "config.json")))
    m = DeepSeekV3(c)
    L = c["num_hidden_layers"]
    st = load_safetensors(os.path.join(d, "model.safetensors"))
    sd = {}
    experts = {}
    for n, t in st.items():
        if n in (f"model.layers.{L}.embed_tokens.weight", f"model.layers.{L}.shared_head.head.weight"):
            continue  # copies of the shared embedding / head (checked below)
        if n.startswith(f"model.layers.{L}."):
            n = "mtp." + n[len(f"model.layers.{L}.") :]
        if ".mlp.experts." in n:
            base, rest = n.split(".mlp.experts.")
            e, short, _ = rest.split(".")
            experts.setdefault(base, {}).setdefault(short, {})[int(e)] = t
            continue
        sd[n] = t
    for base, d3 in experts.items():
        for short, kind in (("gate_proj", "experts_gate"), ("up_proj", "experts_up"), ("down_proj", "experts_down")):
            sd[f"{base}.mlp.{kind}"] = torch.stack([d3[short][e] for e in sorted(d3[short])])
    missing, unexpected = m.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    assert torch.equal(st[f"model.layers.{L}.embed_tokens.weight"], st["model.embed_tokens.weight"])
    assert torch.equal(st[f"model.layers.{L}.shared_head.head.weight"], st["lm_head.weight"])
    return m.to(device=device, dtype=dtype).eval()


def draft_tensors(m: Llama):
    return {n: _bf16(p) for n, p in m.named_parameters()}


def load_draft(d, dtype=torch.float32, device="cpu"):
    c = json.load(open(os.path.join(d, "config.json")))
    m = Llama(c)
    st = load_safetensors(os.path.join(d, "model.safetensors"))
    m.load_state_dict({k: v.float() for k, v in st.items() if k != "lm_head.weight"}, strict=True)
    return m.to(device=device, dtype=dtype).eval()


def eagle_tensors(m: Eagle3):
    out = {n: _bf16(p) for n, p in m.named_parameters()}
    out["d2t"] = m.d2t.detach().to(torch.int64)
    out["t2d"] = m.t2d.detach().to(torch.bool)
    return out


def load_eagle(d, target_hidden, dtype=torch.float32, device="cpu"):
    c = json.load(open(os.path.join(d, "config.json")))
    m = Eagle3(c, target_hidden)
    st = load_safetensors(os.path.join(d, "model.safetensors"))
    sd = {k: (v.float() if v.dtype == torch.bfloat16 else v) for k, v in st.items()}
    m.load_state_dict(sd, strict=True)
    m = m.to(device=device)
    for n, p in m.named_parameters():
        p.data = p.data.to(dtype)
    return m.eval()
