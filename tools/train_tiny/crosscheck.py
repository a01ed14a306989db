#!/usr/bin/env python3
"""Cross-check of specd against the PyTorch reference of the bundled models.

For held-out prompts (tokenized by `specd tokenize`, bos prepended) it
1. continues each prompt greedily with the PyTorch target (this folder's
   models.py, fp32 over the bf16 files) and with `specd generate` (CPU), and
   counts the tokens on which they agree;
2. measures greedy acceptance of the MTP layer, the EAGLE-3 head and the
   draft model with the reference's simulation (train.py's accept_stats) on
   those continuations, for k = 1..kmax.
Runs on CPU with any torch >= 1.13; writes JSON.

    python3 tools/train_tiny/crosscheck.py --specd build/specd --n 16 --gen 96 \
        --out bench/results/crosscheck-cpu.json
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export as X  # noqa: E402
from train import accept_stats, draft_unroll, eagle_unroll, mtp_unroll  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specd", default="build/specd")
    ap.add_argument("--models", default="models")
    ap.add_argument("--prompts", default="models/specd-tiny/heldout_prompts.jsonl")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--kmax", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tdir = os.path.join(a.models, "specd-tiny")
    cfg = json.load(open(os.path.join(tdir, "config.json")))
    bos = cfg["bos_token_id"]
    tm = X.load_target(tdir)
    head = X.load_eagle(os.path.join(a.models, "specd-tiny-eagle3"), cfg["hidden_size"])
    dm = X.load_draft(os.path.join(a.models, "specd-tiny-draft"))
    ecfg = json.load(open(os.path.join(a.models, "specd-tiny-eagle3", "config.json")))
    capture = [i + 1 for i in ecfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    prompts = [json.loads(l)["prompt"] for l in open(a.prompts)][: a.n]
    agree = total = 0
    acc = {p: {k: [] for k in range(1, a.kmax + 1)} for p in ("mtp", "eagle3", "draft")}
    per_prompt = []
    torch.set_grad_enabled(False)
    for i, text in enumerate(prompts):
        ids = json.loads(subprocess.check_output([a.specd, "tokenize", "--model", tdir, "--text", text]))
        ids = [bos] + ids
        got = subprocess.check_output([a.specd, "generate", "--model", tdir, "--ids", ",".join(map(str, ids)),
                                       "--max-tokens", str(a.gen), "--log-level", "error", "--threads", "2"],
                                      stderr=subprocess.DEVNULL)
        seq = torch.tensor([ids])
        for _ in range(a.gen):
            h, _ = tm.trunk(seq, use_sdpa=False)
            nxt = tm.lm_head(h[:, -1]).argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            if int(nxt) == cfg["eos_token_id"]:
                break
        ref = seq[0, len(ids):].tolist()
        # specd prints text; compare through its detokenized ids: re-tokenize is lossy, so
        # ask specd for ids instead (a tokenizer-less copy is not needed: compare text)
        ref_text = subprocess.check_output([a.specd, "detokenize", "--model", tdir, "--ids",
                                            ",".join(map(str, [t for t in ref if t != cfg["eos_token_id"]]))])
        same = got.rstrip(b"\n") == ref_text
        # token agreement: the longest common prefix of the texts, in reference tokens
        n_ok = len(ref)
        if not same:
            n_ok = 0
            for j in range(1, len(ref) + 1):
                t = subprocess.check_output([a.specd, "detokenize", "--model", tdir, "--ids",
                                             ",".join(map(str, ref[:j]))])
                if not got.startswith(t):
                    break
                n_ok = j
        agree += n_ok
        total += len(ref)
        # acceptance (reference simulation) on the reference continuation
        P, Lt = len(ids), seq.shape[1]
        h, aux = tm.trunk(seq, capture=capture, use_sdpa=False)
        toks = seq[:, 1:]
        fused = head.fc(torch.cat(aux, -1))[:, : Lt - 1]
        _, ep = eagle_unroll(head, tm.model.embed_tokens.weight, fused, toks, a.kmax, "pred", None, False)
        mp = mtp_unroll(tm, h[:, : Lt - 1], toks, a.kmax)
        dp = draft_unroll(dm, seq, a.kmax)
        s_np = seq.numpy()
        for name, preds in (("eagle3", ep), ("mtp", mp), ("draft", [p[:, 1:] for p in dp])):
            d = torch.stack(preds, -1).numpy()
            st, _ = accept_stats(d, s_np, P, a.kmax)
            for k in range(1, a.kmax + 1):
                acc[name][k].append((st[k]["mean_accepted_length"], st[k]["rounds"]))
        per_prompt.append({"prompt_tokens": P, "generated": len(ref), "specd_agrees_tokens": n_ok})
        print(f"prompt {i}: {P} tokens, specd == reference for {n_ok}/{len(ref)} tokens", flush=True)
    res = {"prompts": len(prompts), "gen": a.gen, "greedy_token_agreement": agree / max(total, 1),
           "agree_tokens": agree, "total_tokens": total, "per_prompt": per_prompt, "reference_acceptance": {}}
    for name in acc:
        res["reference_acceptance"][name] = {}
        for k in acc[name]:
            v = acc[name][k]
            rounds = sum(r for _, r in v)
            mean = sum(m * r for m, r in v) / max(rounds, 1)
            res["reference_acceptance"][name][k] = mean
    print(json.dumps({n: {k: round(x, 3) for k, x in d.items()} for n, d in res["reference_acceptance"].items()}))
    print(f"greedy agreement specd vs reference: {agree}/{total}")
    if a.out:
        json.dump(res, open(a.out, "w"), indent=2)


if __name__ == "__main__":
    main()
