"""PyTorch reference of DeepSeek-V3's multi-token-prediction (MTP, "NextN") layer.

Hugging Face transformers has no implementation of it: DeepseekV3ForCausalLM
skips the weights stored at model.layers.{num_hidden_layers}.*. The definition
below is the one specd implements (the same as vLLM's and SGLang's DeepSeek MTP
drafters), from DeepSeek-V3's published description (technical report, sec. 2.2):

  h_i  = the target's final hidden state at position i, AFTER the final
         model.norm (model.model(ids).last_hidden_state)
  slot i in 0..n-2 takes input token x_{i+1}, hidden h_i, rotary position i:
  e    = enorm(embed_mtp(x_{i+1}))           [H]
  g    = hnorm(h_i)                           [H]
  u    = eh_proj(concat([e, g], -1))          [2H] -> [H]   (embedding half FIRST)
  out  = one DeepSeek-V3 decoder layer over u, causal over slots 0..i,
         positions 0..n-2
  logits_i = shared_head.head(shared_head.norm(out_i))   predicts x_{i+2}

The decoder layer is whatever callable the caller passes (transformers' own
DeepseekV3DecoderLayer in models.py); this module only does the parts around
it, so they can be checked without transformers (`python3 mtp_reference.py`).
Tensor names are those of published DeepSeek-V3 checkpoints.
"""

import math

import torch

# Suffixes under model.layers.{L}. that belong to the MTP block itself (the
# decoder layer's own tensors sit beside them under the same prefix).
MTP_OWN = {
    "embed": "embed_tokens.weight",  # [vocab, H]
    "enorm": "enorm.weight",  # [H]
    "hnorm": "hnorm.weight",  # [H]
    "eh_proj": "eh_proj.weight",  # [H, 2H]
    "head_norm": "shared_head.norm.weight",  # [H]
    "head": "shared_head.head.weight",  # [vocab, H]
}


def mtp_tensor_names(layer):
    """{role: full tensor name} of the MTP-only tensors of layer index `layer`."""
    return {k: "model.layers.%d.%s" % (layer, v) for k, v in MTP_OWN.items()}


def rms_norm(x, w, eps):
    """HF DeepseekV3RMSNorm in fp32: w * x / sqrt(mean(x^2) + eps) over the last dim."""
    x = x.float()
    var = x.pow(2).mean(-1, keepdim=True)
    return w.float() * (x * torch.rsqrt(var + eps))


def causal_mask(t, dtype=torch.float32):
    """Additive mask [1, 1, t, t]: 0 where key <= query, the dtype's min elsewhere
    (what HF's eager attention adds to the scores)."""
    m = torch.full((t, t), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return m[None, None]


def mtp_logits(hidden, ids, w, layer_call, eps):
    """MTP logits for every slot.

    hidden: [n, H] fp32, the target's final (normed) hidden states over ids
    ids:    [n] int64 token ids
    w:      {role: tensor} with the roles of MTP_OWN (any float dtype)
    layer_call(u [1, T, H], mask [1, 1, T, T], position_ids [1, T]) -> [1, T, H]
    returns [n-1, vocab] fp32; row i predicts ids[i+2] (the last row has no target)
    """
    n = ids.shape[0]
    if n < 2:
        raise ValueError("MTP needs at least 2 ids, got %d" % n)
    t = n - 1
    nxt = ids[1:]  # x_{i+1} for slot i
    e = rms_norm(w["embed"].float()[nxt], w["enorm"], eps)  # [T, H]
    g = rms_norm(hidden[:t].float(), w["hnorm"], eps)  # [T, H]
    u = torch.cat([e, g], dim=-1) @ w["eh_proj"].float().t()  # [T, H]
    pos = torch.arange(t, dtype=torch.long)[None]
    out = layer_call(u[None], causal_mask(t), pos)[0]  # [T, H]
    return rms_norm(out, w["head_norm"], eps) @ w["head"].float().t()


def hf_layer_call(layer, rotary_emb):
    """Wraps a transformers decoder layer (5.x: takes position_embeddings=(cos, sin)
    from the model's rotary_emb) as a layer_call for mtp_logits."""

    def call(u, mask, pos):
        cos, sin = rotary_emb(u, pos)
        out = layer(
            u,
            attention_mask=mask,
            position_ids=pos,
            position_embeddings=(cos, sin),
            use_cache=False,
        )
        if isinstance(out, tuple):  # 4.x layers return (hidden, ...)
            out = out[0]
        return out

    return call


# ---------------------------------------------------------------------------
# Self-test without transformers: the parts around the decoder layer.


class _CausalStandIn(torch.nn.Module):
    """A stand-in decoder layer: masked softmax attention with rotary-free
    scores plus a position-dependent term, so causality, mask use and the
    position ids all reach the output."""

    def __init__(self, h, gen):
        super().__init__()
        self.wq = torch.randn(h, h, generator=gen) / math.sqrt(h)
        self.wk = torch.randn(h, h, generator=gen) / math.sqrt(h)
        self.wv = torch.randn(h, h, generator=gen) / math.sqrt(h)
        self.pe = torch.randn(64, h, generator=gen) * 0.1

    def forward(self, u, mask, pos):
        x = u + self.pe[pos[0]][None]
        s = (x @ self.wq) @ (x @ self.wk).transpose(-1, -2) / math.sqrt(u.shape[-1])
        s = s + mask[0]
        return u + torch.softmax(s, -1) @ (x @ self.wv)


def _slotwise(hidden, ids, w, layer, eps):
    """The same definition written slot by slot: slot i runs the layer over
    slots 0..i only and keeps its last row. Independent of mtp_logits' batching."""
    n = ids.shape[0]
    h = hidden.shape[1]
    rows = []
    us = []
    for i in range(n - 1):
        x = w["embed"].double()[ids[i + 1]]
        e = x / torch.sqrt(x.pow(2).mean() + eps) * w["enorm"].double()
        y = hidden[i].double()
        g = y / torch.sqrt(y.pow(2).mean() + eps) * w["hnorm"].double()
        # eh_proj columns 0..H-1 multiply the embedding half, H..2H-1 the hidden half
        u = w["eh_proj"].double()[:, :h] @ e + w["eh_proj"].double()[:, h:] @ g
        us.append(u)
        t = i + 1
        o = layer(
            torch.stack(us).float()[None],
            torch.zeros(1, 1, t, t),  # a prefix needs no mask
            torch.arange(t)[None],
        )[0, -1].double()
        o = o / torch.sqrt(o.pow(2).mean() + eps) * w["head_norm"].double()
        rows.append(w["head"].double() @ o)
    return torch.stack(rows)


def selftest():
    gen = torch.Generator().manual_seed(1234)
    h, v, n, eps = 16, 40, 9, 1e-6
    w = {
        "embed": torch.randn(v, h, generator=gen),
        "enorm": 1 + 0.1 * torch.randn(h, generator=gen),
        "hnorm": 1 + 0.1 * torch.randn(h, generator=gen),
        "eh_proj": torch.randn(h, 2 * h, generator=gen) / math.sqrt(2 * h),
        "head_norm": 1 + 0.1 * torch.randn(h, generator=gen),
        "head": torch.randn(v, h, generator=gen) / math.sqrt(h),
    }
    hidden = torch.randn(n, h, generator=gen) * 3
    ids = torch.randint(0, v, (n,), generator=gen)
    layer = _CausalStandIn(h, gen)

    got = mtp_logits(hidden, ids, w, layer, eps)
    assert got.shape == (n - 1, v), got.shape
    want = _slotwise(hidden, ids, w, layer, eps)
    d = (got.double() - want).abs().max().item()
    assert d < 1e-4 * want.abs().max().item(), "batched vs slot-wise MTP: max|d| %g" % d

    # Slot i must not see x_{j} for j > i+1 nor h_j for j > i.
    ids2 = ids.clone()
    ids2[-1] = (ids2[-1] + 1) % v
    hidden2 = hidden.clone()
    hidden2[-2:] += 1.0
    got2 = mtp_logits(hidden2, ids2, w, layer, eps)
    assert torch.equal(got2[: n - 2], got[: n - 2]), "MTP slots see the future"
    assert not torch.allclose(got2[-1], got[-1]), "last slot ignores its inputs"

    # The embedding half comes first: swapping the halves of eh_proj changes the result.
    w2 = dict(w)
    w2["eh_proj"] = torch.cat([w["eh_proj"][:, h:], w["eh_proj"][:, :h]], dim=1)
    got3 = mtp_logits(hidden, ids, w2, layer, eps)
    assert not torch.allclose(got3, got), "eh_proj halves are interchangeable?"

    # The hidden state at position n-1 is never used (slot n-2 takes h_{n-2}).
    hidden3 = hidden.clone()
    hidden3[-1] = 100.0
    assert torch.equal(mtp_logits(hidden3, ids, w, layer, eps), got)

    m = causal_mask(4)
    assert m.shape == (1, 1, 4, 4) and m[0, 0, 1, 0] == 0 and m[0, 0, 0, 1] < -1e30
    names = mtp_tensor_names(61)
    assert names["eh_proj"] == "model.layers.61.eh_proj.weight"
    assert names["head"] == "model.layers.61.shared_head.head.weight"
    print("mtp_reference selftest: ok (batched vs slot-wise max|d| %.3g)" % d)


if __name__ == "__main__":
    selftest()
