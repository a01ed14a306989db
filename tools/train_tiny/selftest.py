#!/usr/bin/env python3
"""CPU self-test of the trainer's model code (random tiny weights, fp64):

- chained drafting (EAGLE-3, MTP, draft model) computed for every start index at
  once with chain attention equals the same chains computed one start at a time
  with plain causal attention over an explicitly built sequence;
- export -> load round trips every tensor (names, shapes, bf16 values);
- the dense MoE equals a per-expert loop over the chosen experts.
Run: python3 tools/train_tiny/selftest.py
"""
import os
import sys
import tempfile
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export as X  # noqa: E402
from models import DeepSeekV3, Eagle3, Llama  # noqa: E402
from train import draft_unroll, eagle_unroll, mtp_unroll  # noqa: E402

torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
A = SimpleNamespace(
    smoke=True, vocab=64, hidden=32, layers=3, heads=2, q_lora=16, kv_lora=16, dense_inter=48, moe_inter=16,
    experts=4, routed_scale=1.5, draft_hidden=32, draft_layers=2, draft_heads=2, draft_inter=48, draft_vocab=24,
    eagle_heads=2, eagle_inter=40,
)
DEPTH = 4
B, S = 2, 11


def rnd(m):
    for n, p in m.named_parameters():
        torch.nn.init.normal_(p, 0, 0.3 if p.dim() > 1 else 0.2)
        if p.dim() == 1:
            p.data += 1.0
    return m.double().eval()


def check_moe(tm):
    moe = tm.model.layers[1].mlp
    moe.gate.e_score_correction_bias.normal_(0, 0.1)
    x = torch.randn(7, A.hidden, dtype=torch.float64)
    y = moe(x)
    idx, w = moe.route(x)
    ref = moe.shared_experts(x).clone()
    for t in range(7):
        for j in range(idx.shape[1]):
            e = idx[t, j]
            h = F.silu(x[t] @ moe.experts_gate[e].T) * (x[t] @ moe.experts_up[e].T)
            ref[t] += w[t, j] * (h @ moe.experts_down[e].T)
    assert torch.allclose(y, ref, atol=1e-10), (y - ref).abs().max()
    # group-limited: both chosen experts lie in one group of E/n_group
    g = idx // (A.experts // 2)
    assert (g[:, 0] == g[:, 1]).all()


def check_draft(dm):
    seq = torch.randint(0, A.vocab, (B, S))
    preds = draft_unroll(dm, seq, DEPTH)
    for b in range(B):
        for p in range(S):
            ctx = seq[b : b + 1, : p + 1]
            for j in range(DEPTH):
                lg, _ = dm(ctx, None, None, False)
                nxt = lg[0, -1].argmax()
                assert nxt == preds[j][b, p], ("draft", b, p, j)
                ctx = torch.cat([ctx, nxt.view(1, 1)], 1)


def check_mtp(tm):
    seq = torch.randint(0, A.vocab, (B, S + 1))
    with torch.no_grad():
        h, _ = tm.trunk(seq[:, :S], use_sdpa=False)
        preds = mtp_unroll(tm, h, seq[:, 1 : S + 1], DEPTH)
    E = tm.model.embed_tokens
    for b in range(B):
        for i in range(S):
            # explicit MTP sequence: slots 0..i from the target, then the chain's own slots
            toks = list(seq[b, 1 : i + 2])
            hid = [h[b, k] for k in range(i + 1)]
            for j in range(DEPTH):
                u = torch.stack(hid)[None]
                out, _ = tm.mtp.mtp(E(torch.stack(toks)[None]), u, torch.arange(len(toks)), None, False)
                d = tm.mtp_logits(out)[0, -1].argmax()
                assert d == preds[j][b, i], ("mtp", b, i, j)
                toks.append(d)
                hid.append(out[0, -1])


def check_eagle(tm, head):
    seq = torch.randint(0, A.vocab, (B, S + 1))
    L = tm.c["num_hidden_layers"]
    cap = [1, 2, 2][: 3] if L == 3 else None
    with torch.no_grad():
        h, aux = tm.trunk(seq[:, :S], capture=cap, use_sdpa=False)
        fused = head.fc(torch.cat(aux, -1))
        W = tm.model.embed_tokens.weight
        _, preds = eagle_unroll(head, W, fused, seq[:, 1 : S + 1], DEPTH, "pred", None, False)
    for b in range(B):
        for i in range(S):
            toks = list(seq[b, 1 : i + 2])
            hid = [fused[b, k] for k in range(i + 1)]
            for j in range(DEPTH):
                out, lg, _ = head.step(F.embedding(torch.stack(toks)[None], W), torch.stack(hid)[None], torch.arange(len(toks)), None, False)
                d = head.to_target(lg[0, -1].argmax())
                assert d == preds[j][b, i], ("eagle", b, i, j)
                toks.append(d)
                hid.append(out[0, -1])


def check_roundtrip(tm, dm, head):
    with tempfile.TemporaryDirectory() as d:
        for sub, fn, cfg in (("t", X.target_tensors, X.target_config(A)), ("d", X.draft_tensors, X.draft_config(A)),
                             ("e", X.eagle_tensors, X.eagle_config(A, [0, 1, 1]))):
            os.makedirs(os.path.join(d, sub))
            m = {"t": tm, "d": dm, "e": head}[sub]
            X.save_safetensors(fn(m), os.path.join(d, sub, "model.safetensors"))
            X.write_json(cfg, os.path.join(d, sub, "config.json"))
        names = set(X.load_safetensors(os.path.join(d, "t", "model.safetensors")))
        L = A.layers
        for n in ("model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.experts.3.down_proj.weight",
                  "model.layers.1.mlp.gate.e_score_correction_bias", f"model.layers.{L}.eh_proj.weight",
                  f"model.layers.{L}.enorm.weight", f"model.layers.{L}.hnorm.weight",
                  f"model.layers.{L}.shared_head.head.weight", f"model.layers.{L}.shared_head.norm.weight",
                  f"model.layers.{L}.embed_tokens.weight", f"model.layers.{L}.mlp.shared_experts.up_proj.weight",
                  "model.layers.2.self_attn.kv_a_proj_with_mqa.weight", "lm_head.weight", "model.norm.weight"):
            assert n in names, n
        t2 = X.load_target(os.path.join(d, "t"), torch.float64)
        for (n, p), (_, q) in zip(tm.state_dict().items(), t2.state_dict().items()):
            ref = p.float().double() if "e_score" in n else p.to(torch.bfloat16).double()
            assert torch.equal(ref, q), n
        d2 = X.load_draft(os.path.join(d, "d"), torch.float64)
        for (n, p), (_, q) in zip(dm.state_dict().items(), d2.state_dict().items()):
            assert torch.equal(p.to(torch.bfloat16).double(), q), n
        e2 = X.load_eagle(os.path.join(d, "e"), A.hidden, torch.float64)
        assert torch.equal(e2.d2t, head.d2t) and torch.equal(e2.t2d, head.t2d)
        assert set(X.load_safetensors(os.path.join(d, "e", "model.safetensors"))) >= {
            "fc.weight", "midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
        assert e2.midlayer.self_attn.q_proj.weight.shape[1] == 2 * A.hidden


def main():
    tm = rnd(DeepSeekV3(X.target_config(A)))
    for m in tm.moe_layers():
        m.gate.e_score_correction_bias.normal_(0, 0.05)
    dm = rnd(Llama(X.draft_config(A)))
    ec = X.eagle_config(A, [0, 1, 1])
    head = rnd(Eagle3(ec, A.hidden))
    top = torch.sort(torch.randperm(A.vocab)[: A.draft_vocab])[0]
    head.d2t.copy_(top - torch.arange(A.draft_vocab))
    head.t2d.zero_()
    head.t2d[top] = True
    check_moe(tm)
    check_draft(dm)
    check_mtp(tm)
    check_eagle(tm, head)
    check_roundtrip(tm, dm, head)
    print("selftest: ok")


if __name__ == "__main__":
    main()
