"""Training-side PyTorch implementations of the three bundled models.

- DeepSeekV3: DeepseekV3ForCausalLM (MLA with q LoRA, sigmoid-scored MoE with
  group-limited top-k routing and a shared expert, first layer dense) plus one
  MTP module laid out as DeepSeek-V3 checkpoints store it.
- Eagle3: an EAGLE-3 draft head in the layout SGLang/vLLM load
  (LlamaForCausalLMEagle3).
- Llama: a plain LlamaForCausalLM (the small draft model).

Numerics follow Hugging Face transformers so that exported weights give the
same greedy continuation there: RMSNorm normalises in fp32 and multiplies the
weight after casting back; RoPE cos/sin are computed in fp32; DeepSeek rope
dims are rotated as adjacent pairs (rope_interleave), Llama/EAGLE ones as
halves (rotate_half).

Every attention here can also run in "chain" mode, used by EAGLE-3's
training-time test and by the acceptance measurement: the sequence's own keys
are visible causally, and each query additionally sees a list of extra keys at
its own index only (the earlier steps of a drafting chain that starts there).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_norm(x, w, eps):
    dt = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(dt)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(pos, dim, theta):
    """pos: int tensor [..., S]; returns cos, sin [..., S, dim] (fp32), HF layout cat(freqs, freqs)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=pos.device, dtype=torch.int64).float() / dim))
    f = pos.float()[..., None] * inv
    emb = torch.cat([f, f], -1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def apply_rope(x, cos, sin):
    """x [B, h, S, d]; cos/sin [B, S, d] or [S, d]."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


def deinterleave(x):
    """DeepSeek rope_interleave: (x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...), as HF does before rotate_half."""
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(x.shape)


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def attend(q, k, v, chain=None, use_sdpa=True):
    """Causal attention, optionally with chain keys.

    q, k: [B, h, S, dq]; v: [B, h, S, dv]. Query i sees k[:, :, :i+1].
    chain: list of (k_m, v_m), each [B, h, S, d*]; query i also sees k_m[:, :, i]
    (and only that index) for every m. Returns [B, h, S, dv].
    """
    S = q.shape[-2]
    scale = q.shape[-1] ** -0.5
    if not chain:
        if use_sdpa and has_sdpa() and q.is_cuda:
            dq, dv = q.shape[-1], v.shape[-1]
            vv = F.pad(v, [0, dq - dv]) if dv < dq else v
            o = F.scaled_dot_product_attention(q, k, vv, is_causal=True)
            return o[..., :dv] if dv < dq else o
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s.float(), -1).to(v.dtype)
        return torch.matmul(p, v)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    diag = torch.stack([(q * km).sum(-1) for km, _ in chain], -1) * scale  # [B, h, S, M]
    p = torch.softmax(torch.cat([s, diag], -1).float(), -1).to(v.dtype)
    o = torch.matmul(p[..., :S], v)
    for m, (_, vm) in enumerate(chain):
        o = o + p[..., S + m, None] * vm
    return o


def chain_ctx_attend(q, k, v, ctx, use_sdpa=True):
    """ctx None: plain causal. ctx = (base_k, base_v, chain_list): queries (the current
    chain step, one per index) see base keys causally plus the chain keys and themselves."""
    if ctx is None:
        return attend(q, k, v, None, use_sdpa)
    bk, bv, chain = ctx
    return attend(q, bk, bv, list(chain) + [(k, v)], use_sdpa)


class MLP(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ----------------------------------------------------------------------------- DeepSeek-V3


class MLA(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.nope, self.rope, self.vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.kv_lora = c["kv_lora_rank"]
        self.theta = c["rope_theta"]
        eps = c["rms_norm_eps"]
        self.q_a_proj = nn.Linear(H, c["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], eps)
        self.q_b_proj = nn.Linear(c["q_lora_rank"], self.nh * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, eps)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(self.nh * self.vd, H, bias=False)

    def forward(self, x, pos, ctx=None, use_sdpa=True):
        B, S, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, S, self.nh, -1).transpose(1, 2)
        q_nope, q_pe = q.split([self.nope, self.rope], -1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope], -1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(B, S, self.nh, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], -1)
        k_pe = k_pe.reshape(B, 1, S, self.rope)
        cos, sin = rope_cos_sin(pos, self.rope, self.theta)
        q_pe = apply_rope(deinterleave(q_pe), cos, sin)
        k_pe = apply_rope(deinterleave(k_pe), cos, sin)
        q = torch.cat([q_nope, q_pe.to(q_nope.dtype)], -1)
        k = torch.cat([k_nope, k_pe.to(k_nope.dtype).expand(B, self.nh, S, self.rope)], -1)
        o = chain_ctx_attend(q, k, v, ctx, use_sdpa)
        o = o.transpose(1, 2).reshape(B, S, self.nh * self.vd)
        return self.o_proj(o), (k, v)


class Router(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.E = c["n_routed_experts"]
        self.weight = nn.Parameter(torch.empty(self.E, c["hidden_size"]))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.E))


class MoE(nn.Module):
    """Routed experts are computed densely (every token through every expert,
    weighted by a [T, E] matrix that is zero outside the chosen top-k): two GEMMs
    instead of a gather/scatter loop. Identical in value to sparse dispatch, and
    unchosen experts get zero gradient."""

    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["moe_intermediate_size"]
        self.E, self.I, self.H = c["n_routed_experts"], I, H
        self.k = c["num_experts_per_tok"]
        self.G, self.kg = c["n_group"], c["topk_group"]
        self.norm_topk = c["norm_topk_prob"]
        self.scale = c["routed_scaling_factor"]
        self.gate = Router(c)
        self.experts_gate = nn.Parameter(torch.empty(self.E, I, H))
        self.experts_up = nn.Parameter(torch.empty(self.E, I, H))
        self.experts_down = nn.Parameter(torch.empty(self.E, H, I))
        self.shared_experts = MLP(H, I * c["n_shared_experts"])
        self.last_load = None

    def route(self, x2):
        """x2 [T, H] -> (idx [T, k], w [T, k] fp32), as transformers 5.x DeepseekV3MoE."""
        dev = x2.device.type
        with torch.autocast(device_type=dev, enabled=False) if dev == "cuda" else _null():
            logits = F.linear(x2.float(), self.gate.weight.float())
        scores = logits.sigmoid()
        with torch.no_grad():
            sfc = scores + self.gate.e_score_correction_bias[None]
            T = sfc.shape[0]
            gs = sfc.view(T, self.G, self.E // self.G).topk(2, dim=-1)[0].sum(-1)
            gidx = torch.topk(gs, k=self.kg, dim=-1, sorted=False)[1]
            gmask = torch.zeros_like(gs).scatter_(1, gidx, 1.0)
            smask = gmask.unsqueeze(-1).expand(T, self.G, self.E // self.G).reshape(T, self.E)
            sfc = sfc.masked_fill(~smask.bool(), float("-inf"))
            idx = torch.topk(sfc, k=self.k, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        if self.norm_topk:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.scale

    def forward(self, x):
        shp = x.shape
        x2 = x.reshape(-1, shp[-1])
        idx, w = self.route(x2)
        if self.training:
            self.last_load = torch.bincount(idx.flatten(), minlength=self.E)
        T = x2.shape[0]
        dense_w = torch.zeros(T, self.E, device=x.device, dtype=w.dtype).scatter(1, idx, w)
        W1 = torch.cat([self.experts_gate, self.experts_up], 1).reshape(self.E * 2 * self.I, self.H)
        h = F.linear(x2, W1).view(T, self.E, 2, self.I)
        a = F.silu(h[:, :, 0]) * h[:, :, 1]
        a = a * dense_w.unsqueeze(-1).to(a.dtype)
        W2 = self.experts_down.permute(1, 0, 2).reshape(self.H, self.E * self.I)
        y = F.linear(a.reshape(T, self.E * self.I), W2)
        y = y.to(x.dtype) + self.shared_experts(x2)
        return y.view(shp)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class DSLayer(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        eps = c["rms_norm_eps"]
        self.input_layernorm = RMSNorm(c["hidden_size"], eps)
        self.self_attn = MLA(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], eps)
        self.mlp = MoE(c) if moe else MLP(c["hidden_size"], c["intermediate_size"])

    def forward(self, x, pos, ctx=None, use_sdpa=True):
        a, kv = self.self_attn(self.input_layernorm(x), pos, ctx, use_sdpa)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, kv


class SharedHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class MTPLayer(DSLayer):
    """DeepSeek-V3 MTP module: e = enorm(embed(x_{i+1})), g = hnorm(h_i),
    u = eh_proj([e; g]) -> one decoder layer -> shared_head.norm -> head.
    Embedding and head are shared with the main model while training and
    stored as copies (model.layers.L.embed_tokens, .shared_head.head)."""

    def __init__(self, c):
        super().__init__(c, moe=c["num_hidden_layers"] >= c["first_k_dense_replace"])
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.enorm = RMSNorm(H, eps)
        self.hnorm = RMSNorm(H, eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.shared_head = SharedHead(c)

    def mtp(self, emb, h, pos, ctx=None, use_sdpa=True):
        u = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h)], -1))
        return self.forward(u, pos, ctx, use_sdpa)


class DSModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(
            [DSLayer(c, moe=i >= c["first_k_dense_replace"]) for i in range(c["num_hidden_layers"])]
        )
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class DeepSeekV3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = DSModel(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.mtp = MTPLayer(c)

    def init_weights(self, std=0.02):
        L = self.c["num_hidden_layers"] + 1
        for n, p in self.named_parameters():
            if p.dim() == 1:
                continue
            s = std
            if n.endswith("o_proj.weight") or n.endswith("down_proj.weight") or n.endswith("experts_down"):
                s = std / math.sqrt(2 * L)
            nn.init.normal_(p, 0.0, s)

    def moe_layers(self):
        return [m for m in self.modules() if isinstance(m, MoE)]

    def trunk(self, ids, pos=None, capture=(), use_sdpa=True):
        """Returns (final normed hidden h [B,S,H], [residual stream at the INPUT of each layer in capture])."""
        B, S = ids.shape
        if pos is None:
            pos = torch.arange(S, device=ids.device)
        x = self.model.embed_tokens(ids)
        seen = {}
        for i, layer in enumerate(self.model.layers):
            if i in capture:
                seen[i] = x
            x, _ = layer(x, pos, None, use_sdpa)
        return self.model.norm(x), [seen[i] for i in capture]

    def mtp_logits(self, out):
        return self.lm_head(self.mtp.shared_head.norm(out))


# ----------------------------------------------------------------------------- Llama


def repeat_kv(x, n):
    if n == 1:
        return x
    B, h, S, d = x.shape
    return x[:, :, None].expand(B, h, n, S, d).reshape(B, h * n, S, d)


class LlamaAttn(nn.Module):
    def __init__(self, c, in_dim=None):
        super().__init__()
        H = c["hidden_size"]
        in_dim = in_dim or H
        self.nh, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or H // self.nh
        self.theta = c["rope_theta"]
        self.q_proj = nn.Linear(in_dim, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(in_dim, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(in_dim, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)

    def forward(self, x, pos, ctx=None, use_sdpa=True):
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.nkv, self.hd).transpose(1, 2)
        cos, sin = rope_cos_sin(pos, self.hd, self.theta)
        q = apply_rope(q, cos, sin).to(v.dtype)
        k = apply_rope(k, cos, sin).to(v.dtype)
        r = self.nh // self.nkv
        k, v = repeat_kv(k, r), repeat_kv(v, r)
        o = chain_ctx_attend(q, k, v, ctx, use_sdpa)
        return self.o_proj(o.transpose(1, 2).reshape(B, S, -1)), (k, v)


class LlamaLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c["rms_norm_eps"]
        self.input_layernorm = RMSNorm(c["hidden_size"], eps)
        self.self_attn = LlamaAttn(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], eps)
        self.mlp = MLP(c["hidden_size"], c["intermediate_size"])

    def forward(self, x, pos, ctx=None, use_sdpa=True):
        a, kv = self.self_attn(self.input_layernorm(x), pos, ctx, use_sdpa)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class LlamaInner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([LlamaLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Llama(nn.Module):
    """LlamaForCausalLM with tied embeddings."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = LlamaInner(c)

    def init_weights(self, std=0.02):
        L = self.c["num_hidden_layers"]
        for n, p in self.named_parameters():
            if p.dim() == 1:
                continue
            s = std / math.sqrt(2 * L) if (n.endswith("o_proj.weight") or n.endswith("down_proj.weight")) else std
            nn.init.normal_(p, 0.0, s)

    def forward(self, ids, pos=None, ctx=None, use_sdpa=True):
        """ctx: None, or per-layer (base_k, base_v, chain) for chain mode. Returns logits, per-layer kv."""
        B, S = ids.shape
        if pos is None:
            pos = torch.arange(S, device=ids.device)
        x = self.model.embed_tokens(ids)
        kvs = []
        for i, layer in enumerate(self.model.layers):
            x, kv = layer(x, pos, None if ctx is None else ctx[i], use_sdpa)
            kvs.append(kv)
        x = self.model.norm(x)
        return F.linear(x, self.model.embed_tokens.weight), kvs


# ----------------------------------------------------------------------------- EAGLE-3


class Eagle3Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm = RMSNorm(H, eps)
        self.hidden_norm = RMSNorm(H, eps)
        self.self_attn = LlamaAttn(c, in_dim=2 * H)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MLP(H, c["intermediate_size"])


class Eagle3(nn.Module):
    """EAGLE-3 head. One step: residual = hidden; x = [input_layernorm(embed); hidden_norm(hidden)];
    h = residual + attn(x); out = h + mlp(post_attention_layernorm(h)); logits = lm_head(norm(out)).
    `out` (before norm) is the hidden fed to the next chained step (SGLang's hidden_states_to_aux)."""

    def __init__(self, c, target_hidden):
        super().__init__()
        self.c = c
        H = c["hidden_size"]
        self.fc = nn.Linear(3 * target_hidden, H, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        self.lm_head = nn.Linear(H, c["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(c["draft_vocab_size"], dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(c["vocab_size"], dtype=torch.bool))

    def init_weights(self, std=0.02):
        for n, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, std / math.sqrt(2) if n.endswith(("o_proj.weight", "down_proj.weight")) else std)

    def step(self, emb, hidden, pos, ctx=None, use_sdpa=True):
        m = self.midlayer
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(hidden)], -1)
        a, kv = m.self_attn(x, pos, ctx, use_sdpa)
        h = hidden + a
        out = h + m.mlp(m.post_attention_layernorm(h))
        return out, self.lm_head(self.norm(out)), kv

    def to_target(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]


def param_count(m, skip=()):
    return sum(p.numel() for n, p in m.named_parameters() if not any(n.startswith(s) for s in skip))
