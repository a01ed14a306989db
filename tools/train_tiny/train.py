#!/usr/bin/env python3
"""Builds the bundled tiny models from scratch, in one run:

  corpus (this machine's Python source) -> byte-level BPE tokenizer ->
  DeepSeek-V3 target + MTP (joint) and the Llama draft model (jointly, on the corpus) ->
  EAGLE-3 head (frozen target, training-time test) + draft distillation ->
  export (bf16 safetensors, standard configs) -> held-out losses, n-gram baseline,
  acceptance (greedy) -> Hugging Face transformers load/greedy checks -> model card.

Every phase that finishes is written under --models-dir; --resume reuses the
exported target (and draft) and continues with the phases after them.
`--smoke` runs the whole pipeline on CPU with tiny sizes and a whitespace
tokenizer stand-in (no tokenizers/transformers needed); its output is not a model.
"""
import argparse
import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
REPO = os.path.dirname(os.path.dirname(HERE))

import data as D  # noqa: E402
import export as X  # noqa: E402
from models import DeepSeekV3, Eagle3, Llama, param_count  # noqa: E402

T0 = time.time()
LOG = []
STATE = "train-state.json"  # finished-phase records kept beside the models until the run ends (for --resume)


def log(msg):
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models-dir", default=os.path.join(REPO, "models"))
    p.add_argument("--out", default=os.path.join(REPO, "build-train-tiny"), help="logs, results.json, packaged models")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--resume", action="store_true", help="reuse exported target/draft in --models-dir")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--budget-s", type=float, default=525.0, help="wall-clock budget for the whole run")
    p.add_argument("--eagle-s", type=float, default=95.0, help="seconds reserved for EAGLE-3 training")
    p.add_argument("--eval-s", type=float, default=75.0, help="seconds reserved for eval + checks")
    p.add_argument("--target-steps", type=int, default=0, help="0: as many as the budget allows")
    p.add_argument("--eagle-steps", type=int, default=0)
    # corpus / tokenizer
    p.add_argument("--heldout", default="networkx,pygments,rich,seaborn,sacrebleu")
    p.add_argument("--max-train-mb", type=float, default=800.0)
    p.add_argument("--bpe-sample-mb", type=float, default=48.0)
    p.add_argument("--vocab", type=int, default=8192)
    # target
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--q-lora", type=int, default=128)
    p.add_argument("--kv-lora", type=int, default=64)
    p.add_argument("--dense-inter", type=int, default=512)
    p.add_argument("--moe-inter", type=int, default=96)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--routed-scale", type=float, default=1.0)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--mtp-lambda", type=float, default=0.3)
    p.add_argument("--bias-gamma", type=float, default=1e-3, help="aux-loss-free balancing bias update speed")
    # draft model
    p.add_argument("--draft-hidden", type=int, default=128)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--draft-heads", type=int, default=4)
    p.add_argument("--draft-inter", type=int, default=384)
    p.add_argument("--draft-lr", type=float, default=3e-3)
    # eagle
    p.add_argument("--draft-vocab", type=int, default=2048)
    p.add_argument("--eagle-heads", type=int, default=4)
    p.add_argument("--eagle-inter", type=int, default=512)
    p.add_argument("--eagle-seq", type=int, default=256)
    p.add_argument("--eagle-batch", type=int, default=128)
    p.add_argument("--eagle-lr", type=float, default=2e-3)
    p.add_argument("--ttt-steps", type=int, default=4, help="training-time-test unroll depth")
    p.add_argument("--ttt-feed", choices=["pred", "true"], default="pred")
    p.add_argument("--eagle-gen", type=int, default=2048, help="target-generated sequences mixed into EAGLE data")
    # eval
    p.add_argument("--eval-windows", type=int, default=128)
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--kmax", type=int, default=5)
    p.add_argument("--hf-prompts", type=int, default=16)
    p.add_argument("--hf-new", type=int, default=48)
    p.add_argument("--no-preflight", action="store_true")
    p.add_argument("--commit", default="")
    p.add_argument("--device-name", default="")
    a = p.parse_args()
    if a.smoke:
        a.vocab, a.hidden, a.layers, a.heads, a.q_lora, a.kv_lora = 512, 32, 3, 2, 16, 16
        a.dense_inter, a.moe_inter, a.experts = 64, 16, 4
        a.seq, a.batch = 64, 8
        a.draft_hidden, a.draft_layers, a.draft_heads, a.draft_inter = 32, 1, 2, 64
        a.draft_vocab, a.eagle_heads, a.eagle_inter, a.eagle_seq, a.eagle_batch, a.eagle_gen = 128, 2, 64, 32, 8, 8
        a.eval_windows, a.prompts, a.prompt_len, a.gen_len = 8, 4, 16, 24
        a.target_steps = a.target_steps or 30
        a.eagle_steps = a.eagle_steps or 12
        a.max_train_mb, a.bpe_sample_mb = 3.0, 1.0
        a.heldout = "yaml"
    return a


# ----------------------------------------------------------------------------- utilities


def amp(dev):
    if dev == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def adamw(params, lr, dev):
    kw = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    decay = [p for p in params if p.dim() >= 2]
    no = [p for p in params if p.dim() < 2]
    groups = [{"params": decay}, {"params": no, "weight_decay": 0.0}]
    if dev == "cuda":
        try:
            return torch.optim.AdamW(groups, fused=True, **kw)
        except (TypeError, RuntimeError):
            pass
    return torch.optim.AdamW(groups, **kw)


def lr_at(step, total, peak, warm):
    if step < warm:
        return peak * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def set_lr(opt, lr):
    for g in opt.param_groups:
        g["lr"] = lr


def windows(tokens, n, L, gen):
    """n random windows of L tokens from a 1-D token tensor (on its device)."""
    off = torch.randint(0, len(tokens) - L, (n,), generator=gen, device="cpu").to(tokens.device)
    return tokens[off[:, None] + torch.arange(L, device=tokens.device)[None]].long()


def even_windows(arr, n, L):
    """n windows of L tokens at evenly spaced offsets over a numpy stream (deterministic)."""
    n = max(1, min(n, (len(arr) - L) // L))
    offs = np.linspace(0, len(arr) - L - 1, n).astype(np.int64)
    return np.stack([arr[o : o + L] for o in offs]).astype(np.int64)


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def calibrate_steps(step_fn, budget_s, dev, fixed, name):
    """Runs warm-up steps, times a few, returns the step count that fits budget_s."""
    if fixed:
        return fixed, 0
    for _ in range(3):
        step_fn(0, 10**9, warm=True)
    sync(dev)
    t = time.time()
    n = 8
    for _ in range(n):
        step_fn(0, 10**9, warm=True)
    sync(dev)
    dt = (time.time() - t) / n
    steps = max(20, int(budget_s / dt))
    log(f"{name}: {dt * 1000:.1f} ms/step -> {steps} steps for {budget_s:.0f}s")
    return steps, 3 + n


# ----------------------------------------------------------------------------- drafting chains


def eagle_unroll(head, embed_w, fused, toks, depth, feed="pred", true_next=None, use_sdpa=True):
    """EAGLE-3 chains at every index i: step 0 takes (fc(target states at i), x_{i+1}) at
    position i; step j takes the previous step's pre-norm output and a token, at position i+j,
    attending to the step-0 keys at <= i and to its own chain. Returns per-step logits
    (draft vocab) and predicted target ids."""
    S = fused.shape[1]
    pos = torch.arange(S, device=fused.device)
    out, lg, kv0 = head.step(F.embedding(toks, embed_w), fused, pos, None, use_sdpa)
    logits, preds, chain = [lg], [head.to_target(lg.argmax(-1))], []
    for j in range(1, depth):
        t = preds[-1] if feed == "pred" else true_next[j - 1]
        out, lg, kv = head.step(F.embedding(t, embed_w), out, pos + j, (kv0[0], kv0[1], chain), use_sdpa)
        chain.append(kv)
        logits.append(lg)
        preds.append(head.to_target(lg.argmax(-1)))
    return logits, preds


def mtp_unroll(tm, h, toks, depth):
    """DeepSeek MTP chains: slot i takes (x_{i+1}, h_i) at position i; step j feeds the MTP
    layer's output (before shared_head.norm) and the drafted token, at position i+j."""
    S = h.shape[1]
    pos = torch.arange(S, device=h.device)
    E = tm.model.embed_tokens
    out, kv0 = tm.mtp.mtp(E(toks), h, pos, None, False)
    preds, chain = [tm.mtp_logits(out).argmax(-1)], []
    for j in range(1, depth):
        out, kv = tm.mtp.mtp(E(preds[-1]), out, pos + j, (kv0[0], kv0[1], chain), False)
        chain.append(kv)
        preds.append(tm.mtp_logits(out).argmax(-1))
    return preds


def draft_unroll(dm, seq, depth):
    """Draft model chains from every position p (context seq[:p+1]), greedy."""
    S = seq.shape[1]
    pos = torch.arange(S, device=seq.device)
    lg, kvs = dm(seq, pos, None, False)
    preds = [lg.argmax(-1)]
    chains = [[] for _ in kvs]
    for j in range(1, depth):
        ctx = [(kv[0], kv[1], chains[i]) for i, kv in enumerate(kvs)]
        lg, new = dm(preds[-1], pos + j, ctx, False)
        for i, kv in enumerate(new):
            chains[i].append(kv)
        preds.append(lg.argmax(-1))
    return preds


def accept_stats(d, s, P, kmax):
    """d [B, Ltot-1, kmax]: target ids drafted by the chain at index i (step j guesses s[i+2+j]);
    s [B, Ltot]: prompt (P tokens) + the target's greedy continuation. Simulates greedy
    speculative decoding: a round starts after the target emitted s[c]; the chain at c-1
    drafts k tokens; accepted a = leading matches; the round emits a+1 tokens."""
    B, Lt = s.shape
    m = np.zeros((B, Lt - 1), np.int64)
    alive = np.ones((B, Lt - 1), bool)
    for j in range(kmax):
        tgt = np.full((B, Lt - 1), -1, np.int64)
        n = Lt - 2 - j
        if n > 0:
            tgt[:, :n] = s[:, 2 + j :]
        alive &= d[:, :, j] == tgt
        m += alive
    res = {}
    for k in range(1, kmax + 1):
        rounds = []
        for b in range(B):
            c = P
            while c + k <= Lt - 1:
                a = min(k, int(m[b, c - 1]))
                rounds.append(a + 1)
                c += a + 1
        r = np.asarray(rounds)
        res[k] = {
            "mean_accepted_length": float(r.mean()),
            "per_draft_acceptance": float((r - 1).sum() / (k * len(r))),
            "rounds": int(len(r)),
        }
    first = (d[:, P - 1 : Lt - 2, 0] == s[:, P + 1 :]).mean()
    return res, float(first)


# ----------------------------------------------------------------------------- main


def main():
    a = parse()
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = a.out
    os.makedirs(out, exist_ok=True)
    tdir = os.path.join(a.models_dir, "specd-tiny")
    edir = os.path.join(a.models_dir, "specd-tiny-eagle3")
    ddir = os.path.join(a.models_dir, "specd-tiny-draft")
    for d in (tdir, edir, ddir):
        os.makedirs(d, exist_ok=True)
    R = {"command": "python3 " + " ".join([os.path.relpath(os.path.abspath(sys.argv[0]), REPO)] + sys.argv[1:])}
    R["commit"] = a.commit
    R["torch"] = torch.__version__
    R["phases_s"] = {}
    state_path = os.path.join(a.models_dir, STATE)
    state = json.load(open(state_path)) if a.resume and os.path.exists(state_path) else {}
    if not a.smoke and not a.no_preflight:
        R["preflight"] = preflight(a, dev, os.path.join(out, "preflight"))
        shutil.rmtree(os.path.join(out, "preflight"), ignore_errors=True)

    # ---------------------------------------------------------------- corpus + tokenizer
    t = time.time()
    smoke_roots = ["/usr/lib/python3/dist-packages"] if a.smoke else None
    C = D.build_corpus(REPO, a.heldout.split(","), int(a.max_train_mb * 1e6), log, smoke_roots)
    R["corpus"] = C["stats"]
    have_tok = "tokenizer_sample_bytes" in state
    if a.smoke:
        tok = D.WhitespaceTok(C["train"], a.vocab)
    elif have_tok:
        tok = D.load_bpe(tdir)
        R["tokenizer_sample_bytes"] = state["tokenizer_sample_bytes"]
        log("tokenizer: reused " + tdir)
    else:
        sample, nb = [], 0
        for txt in C["train"]:
            if nb > a.bpe_sample_mb * 1e6:
                break
            sample.append(txt)
            nb += len(txt)
        tb = time.time()
        tok = D.train_bpe(sample, a.vocab, tdir)
        log(f"tokenizer: BPE {tok.get_vocab_size()} trained on {nb / 1e6:.1f} MB in {time.time() - tb:.1f}s")
        R["tokenizer_sample_bytes"] = nb
    train_np = D.encode_docs(tok, C["train"], log, "train")
    held_np = D.encode_docs(tok, C["heldout"], log, "heldout")
    R["tokens"] = {
        "train": int(len(train_np)),
        "heldout": int(len(held_np)),
        "train_bytes_per_token": C["stats"]["train_bytes_used"] / max(1, len(train_np)),
    }
    del C
    R["phases_s"]["data"] = round(time.time() - t, 1)
    V = a.vocab

    # held-out evaluation material (deterministic)
    S = a.seq
    ev_win = even_windows(held_np, a.eval_windows, S + 2)
    pr_win = even_windows(held_np[len(held_np) // (2 * a.prompts) :], a.prompts, a.prompt_len)

    # n-gram baseline in a background process (numpy only, CPU)
    ng_path = os.path.join(out, "ngram.json")
    ng_max = 20_000_000 if a.smoke else 120_000_000
    np.save(os.path.join(out, "ngram-train.npy"), train_np[:ng_max])
    np.save(os.path.join(out, "ngram-windows.npy"), ev_win[:, : S + 1])
    ng = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "data.py"), "ngram", os.path.join(out, "ngram-train.npy"),
         os.path.join(out, "ngram-windows.npy"), str(V), ng_path, str(ng_max)]
    )
    R["device"] = a.device_name or (torch.cuda.get_device_name(0) if dev == "cuda" else "cpu")
    log(f"device {R['device']}, torch {torch.__version__}, smoke={a.smoke}")

    # draft vocabulary for EAGLE-3: the most frequent target tokens of the training stream
    freq = np.bincount(train_np.astype(np.int64), minlength=V)
    top = np.sort(np.argsort(-freq, kind="stable")[: a.draft_vocab])
    R["draft_vocab_coverage"] = float(freq[top].sum() / freq.sum())
    d2t = torch.tensor(top - np.arange(len(top)), dtype=torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.from_numpy(top)] = True

    gen = torch.Generator().manual_seed(a.seed)
    train_t = torch.from_numpy(train_np.astype(np.int32)).to(dev)

    tcfg, dcfg = X.target_config(a), X.draft_config(a)
    L = tcfg["num_hidden_layers"]
    eagle_ids = [0, (L - 1) // 2, L - 2]
    capture = [i + 1 for i in eagle_ids]  # SGLang: id l -> input of layer l+1 (= output of layer l)
    ecfg = X.eagle_config(a, eagle_ids)

    # ---------------------------------------------------------------- phase 1: target + MTP, draft on corpus
    t = time.time()
    if "target_train" in state:
        log("target: reused " + tdir)
        R["target_train"] = state["target_train"]
    else:
        tm = DeepSeekV3(tcfg)
        tm.init_weights()
        tm.to(dev).train()
        dm = Llama(dcfg)
        dm.init_weights()
        dm.to(dev).train()
        opt = adamw(list(tm.parameters()), a.lr, dev)
        dopt = adamw(list(dm.parameters()), a.draft_lr, dev)
        moes = tm.moe_layers()
        pos = torch.arange(S, device=dev)
        stats = {"loss": 0.0, "mtp": 0.0, "draft": 0.0, "n": 0}

        def step(i, total, warm=False):
            b = windows(train_t, a.batch, S + 2, gen)
            x, y, y2 = b[:, :S], b[:, 1 : S + 1], b[:, 2 : S + 2]
            lr = lr_at(i, total, a.lr, max(50, total // 30))
            set_lr(opt, lr)
            set_lr(dopt, lr_at(i, total, a.draft_lr, max(50, total // 30)))
            with amp(dev):
                h, _ = tm.trunk(x, pos)
                loss = F.cross_entropy(tm.lm_head(h).view(-1, V).float(), y.reshape(-1))
                mo, _ = tm.mtp.mtp(tm.model.embed_tokens(y), h, pos)
                lm = F.cross_entropy(tm.mtp_logits(mo).view(-1, V).float(), y2.reshape(-1))
                tot = loss + a.mtp_lambda * lm
                dl = F.cross_entropy(dm(x, pos)[0].view(-1, V).float(), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            dopt.zero_grad(set_to_none=True)
            (tot + dl).backward()
            torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
            torch.nn.utils.clip_grad_norm_(dm.parameters(), 1.0)
            if not warm:
                opt.step()
                dopt.step()
                with torch.no_grad():  # DeepSeek-V3 aux-loss-free balancing
                    for m in moes:
                        ld = m.last_load.float()
                        m.gate.e_score_correction_bias += a.bias_gamma * torch.sign(ld.mean() - ld)
                stats["loss"] += loss.detach()
                stats["mtp"] += lm.detach()
                stats["draft"] += dl.detach()
                stats["n"] += 1

        remaining = a.budget_s - (time.time() - T0) - a.eagle_s - a.eval_s
        total, _ = calibrate_steps(step, max(10.0, remaining - 5), dev, a.target_steps, "target")
        tt = time.time()
        every = max(1, total // 25)
        for i in range(total):
            step(i, total)
            if (i + 1) % every == 0 or i == total - 1:
                n = stats["n"]
                el = time.time() - tt
                log(
                    f"target step {i + 1}/{total} loss {float(stats['loss']) / n:.4f} mtp {float(stats['mtp']) / n:.4f} "
                    f"draft {float(stats['draft']) / n:.4f} | {(i + 1) * a.batch * S / el / 1e6:.2f} Mtok/s"
                )
                stats = {"loss": 0.0, "mtp": 0.0, "draft": 0.0, "n": 0}
        sync(dev)
        wall = time.time() - tt
        loads = [(m.last_load.float() / m.last_load.sum()).tolist() for m in moes]
        R["target_train"] = {
            "steps": total,
            "batch": a.batch,
            "seq": S,
            "tokens_seen": total * a.batch * S,
            "wall_s": round(wall, 1),
            "tokens_per_s": round(total * a.batch * S / wall),
            "lr_peak": a.lr,
            "mtp_lambda": a.mtp_lambda,
            "bias_gamma": a.bias_gamma,
            "last_batch_expert_load": loads,
            "e_score_correction_bias": [m.gate.e_score_correction_bias.tolist() for m in moes],
            "draft_lr_peak": a.draft_lr,
        }
        X.save_safetensors(X.target_tensors(tm), os.path.join(tdir, "model.safetensors"))
        X.write_json(tcfg, os.path.join(tdir, "config.json"))
        X.write_json({"bos_token_id": D.BOS, "eos_token_id": [D.EOS, D.IM_END], "pad_token_id": D.PAD, "do_sample": False},
                     os.path.join(tdir, "generation_config.json"))
        X.save_safetensors(X.draft_tensors(dm), os.path.join(ddir, "model.safetensors"))
        X.write_json(dcfg, os.path.join(ddir, "config.json"))
        X.write_json({"bos_token_id": D.BOS, "eos_token_id": [D.EOS, D.IM_END], "pad_token_id": D.PAD, "do_sample": False},
                     os.path.join(ddir, "generation_config.json"))
        if not a.smoke:
            for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                shutil.copyfile(os.path.join(tdir, f), os.path.join(ddir, f))
        state.update(target_train=R["target_train"], tokenizer_sample_bytes=R.get("tokenizer_sample_bytes", 0))
        X.write_json(state, state_path)
        del tm, dm, opt, dopt
        if dev == "cuda":
            torch.cuda.empty_cache()
        package(a, out, R)
    R["phases_s"]["target"] = round(time.time() - t, 1)

    # ---------------------------------------------------------------- phase 2: EAGLE-3 head (+ draft distillation)
    t = time.time()
    if "eagle_train" in state:
        log("eagle: reused " + edir)
        R["eagle_train"] = state["eagle_train"]
    else:
        phase2(a, R, dev, tdir, edir, ddir, train_t, gen, capture, ecfg, top, d2t, t2d)
        state["eagle_train"] = R["eagle_train"]
        X.write_json(state, state_path)
        package(a, out, R)
    R["phases_s"]["eagle"] = round(time.time() - t, 1)

    # ---------------------------------------------------------------- phase 3: evaluation from the exported files
    t = time.time()
    if dev == "cuda":
        torch.cuda.empty_cache()
    tm = X.load_target(tdir, torch.float32, dev)
    dm = X.load_draft(ddir, torch.float32, dev)
    head = X.load_eagle(edir, a.hidden, torch.float32, dev)
    draft_ids = torch.from_numpy(top).to(dev)
    Rl = {}
    with torch.no_grad():
        sums = {"target": 0.0, "mtp": 0.0, "draft": 0.0, "eagle_soft_ce": 0.0, "eagle_top1_agree": 0.0}
        ew = torch.from_numpy(ev_win).to(dev)
        nchunk = 0
        for s0 in range(0, len(ew), 16):
            b = ew[s0 : s0 + 16]
            x, y, y2 = b[:, :S], b[:, 1 : S + 1], b[:, 2 : S + 2]
            h, aux = tm.trunk(x, capture=capture, use_sdpa=False)
            lg = tm.lm_head(h)
            sums["target"] += F.cross_entropy(lg.reshape(-1, V), y.reshape(-1)).item()
            mo, _ = tm.mtp.mtp(tm.model.embed_tokens(y), h, torch.arange(S, device=dev), None, False)
            sums["mtp"] += F.cross_entropy(tm.mtp_logits(mo).reshape(-1, V), y2.reshape(-1)).item()
            sums["draft"] += F.cross_entropy(dm(x, None, None, False)[0].reshape(-1, V), y.reshape(-1)).item()
            # EAGLE-3 step 0 at indices 0..S-2 vs the target distribution at 1..S-1
            fused = head.fc(torch.cat(aux, -1))[:, : S - 1]
            _, elg, _ = head.step(tm.model.embed_tokens(y[:, : S - 1]), fused, torch.arange(S - 1, device=dev), None, False)
            tpd = torch.softmax(lg[:, 1:, :][..., draft_ids], -1)
            sums["eagle_soft_ce"] += (-(tpd * torch.log_softmax(elg, -1)).sum(-1)).mean().item()
            sums["eagle_top1_agree"] += (head.to_target(elg.argmax(-1)) == lg[:, 1:].argmax(-1)).float().mean().item()
            nchunk += 1
        Rl = {k: v / nchunk for k, v in sums.items()}
        Rl["tokens"] = int(ev_win.shape[0] * S)
        Rl["windows"] = int(ev_win.shape[0])
        Rl["note"] = "mean cross-entropy in nats per token on held-out windows; mtp predicts x_{i+2}"

        # greedy continuations of held-out prompts (reference: this code, fp32, exported weights)
        pr = torch.from_numpy(pr_win).to(dev)
        seq = pr
        for _ in range(a.gen_len):
            h, _ = tm.trunk(seq, use_sdpa=False)
            seq = torch.cat([seq, tm.lm_head(h[:, -1]).argmax(-1, keepdim=True)], 1)
        h, aux = tm.trunk(seq, capture=capture, use_sdpa=False)
        lg = tm.lm_head(h)
        P, Lt = a.prompt_len, seq.shape[1]
        consistent = (lg[:, P - 1 : Lt - 1].argmax(-1) == seq[:, P:]).float().mean().item()
        kmax = a.kmax
        toks = seq[:, 1:]
        fused = head.fc(torch.cat(aux, -1))[:, : Lt - 1]
        _, ep = eagle_unroll(head, tm.model.embed_tokens.weight, fused, toks, kmax, "pred", None, False)
        mp_ = mtp_unroll(tm, h[:, : Lt - 1], toks, kmax)
        dp = draft_unroll(dm, seq, kmax)
        s_np = seq.cpu().numpy()
        acc = {}
        for name, preds in (("eagle3", ep), ("mtp", mp_), ("draft", [p[:, 1:] for p in dp])):
            d = torch.stack(preds, -1).cpu().numpy()
            st, first = accept_stats(d, s_np, P, kmax)
            acc[name] = {"by_k": st, "first_draft_acceptance_all_positions": first}
            log(f"acceptance {name}: first-draft {first:.3f}; mean accepted length k=1..{kmax}: "
                + " ".join(f"{st[k]['mean_accepted_length']:.3f}" for k in range(1, kmax + 1)))
        R["acceptance"] = {
            "prompts": int(pr.shape[0]),
            "prompt_len": P,
            "gen_len": a.gen_len,
            "greedy_self_consistency": consistent,
            "models": acc,
            "mtp_first_draft_acceptance": acc["mtp"]["by_k"][1]["per_draft_acceptance"],
        }
        log(f"held-out losses: {json.dumps(Rl)}")
    R["heldout_loss"] = Rl
    try:
        ng.wait(timeout=max(1.0, a.budget_s - (time.time() - T0)))
    except subprocess.TimeoutExpired:
        ng.kill()
    for f in ("ngram-train.npy", "ngram-windows.npy"):
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    if os.path.exists(ng_path):
        R["heldout_loss"]["ngram_baseline"] = json.load(open(ng_path))
        log(f"n-gram baseline: {json.dumps(R['heldout_loss']['ngram_baseline'])}")
    else:
        log("n-gram baseline: not finished")
    R["params"] = {
        "target_main": param_count(tm, skip=("mtp.",)),
        "target_mtp_module_unique": param_count(tm.mtp),
        "target_mtp_stored_copies": 2 * a.vocab * a.hidden,
        "target_active_per_token_main": active_params(tm, tcfg),
        "eagle3": param_count(head),
        "draft": param_count(dm),
    }
    R["phases_s"]["eval"] = round(time.time() - t, 1)

    # ---------------------------------------------------------------- phase 4: transformers checks
    t = time.time()
    if not a.smoke:
        try:
            R["hf_check"] = hf_check(a, tm, dm, tdir, ddir, pr[: a.hf_prompts], seq[: a.hf_prompts, : P + a.hf_new], dev)
        except Exception as e:  # keep the measured numbers even if the check itself breaks
            import traceback

            R["hf_check"] = {"error": traceback.format_exc()}
            log("hf check FAILED: " + repr(e))
    R["phases_s"]["hf_check"] = round(time.time() - t, 1)
    R["sizes_bytes"] = {
        os.path.relpath(os.path.join(dp_, f), a.models_dir): os.path.getsize(os.path.join(dp_, f))
        for d in (tdir, edir, ddir)
        for dp_, _, fs in os.walk(d)
        for f in fs
    }
    R["wall_s_total"] = round(time.time() - T0, 1)
    package(a, out, R, final=True)
    log("done")


def phase2(a, R, dev, tdir, edir, ddir, train_t, gen, capture, ecfg, top, d2t, t2d):
    """EAGLE-3 head on the frozen exported target (training-time test), draft distillation."""
    tm = X.load_target(tdir, torch.float32, dev)
    for p in tm.parameters():
        p.requires_grad_(False)
    dm = X.load_draft(ddir, torch.float32, dev).train()
    head = Eagle3(ecfg, a.hidden)
    head.init_weights()
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    head.to(dev).train()
    K, SE = a.ttt_steps, a.eagle_seq
    W = SE + K  # target positions needed by K chained steps from SE chain indices
    draft_ids = torch.from_numpy(top).to(dev)

    # target-generated (greedy) continuations of train-split prompts: on them an accepted
    # chain's tokens are exactly the sequence tokens
    tg = time.time()
    gen_rows = []
    P0 = 32 if not a.smoke else 8
    with torch.no_grad(), amp(dev):
        for s0 in range(0, a.eagle_gen, 1024):
            seq = windows(train_t, min(1024, a.eagle_gen - s0), P0, gen)
            for _ in range(W + 1 - P0):
                h, _ = tm.trunk(seq)
                seq = torch.cat([seq, tm.lm_head(h[:, -1]).argmax(-1, keepdim=True)], 1)
            gen_rows.append(seq)
    gen_data = torch.cat(gen_rows) if gen_rows else None
    log(f"eagle: generated {0 if gen_data is None else gen_data.shape[0]} target sequences in {time.time() - tg:.1f}s")
    eopt = adamw(list(head.parameters()), a.eagle_lr, dev)
    dopt = adamw(list(dm.parameters()), a.draft_lr * 0.3, dev)
    est = {"loss": 0.0, "dl": 0.0, "acc": torch.zeros(K, device=dev), "n": 0}

    def estep(i, total, warm=False):
        nb = a.eagle_batch
        ng_rows = nb // 2 if gen_data is not None else 0
        rows = [windows(train_t, nb - ng_rows, W + 1, gen)]
        if ng_rows:
            idx = torch.randint(0, gen_data.shape[0], (ng_rows,), generator=gen).to(dev)
            rows.append(gen_data[idx])
        x = torch.cat(rows)  # [B, W+1]
        set_lr(eopt, lr_at(i, total, a.eagle_lr, max(30, total // 30)))
        set_lr(dopt, lr_at(i, total, a.draft_lr * 0.3, max(30, total // 30)))
        with torch.no_grad(), amp(dev):
            h, aux = tm.trunk(x[:, :W], capture=capture)
            tl = tm.lm_head(h).float()  # [B, W, V]: position t predicts x[t+1]
            tp = torch.softmax(tl[..., draft_ids], -1)
            targ = tl.argmax(-1)
            in_dv = t2d.to(dev)[targ]
            aux = torch.cat(aux, -1)
        with amp(dev):
            fused = head.fc(aux[:, :SE])
            true_next = [x[:, 1 + j : SE + 1 + j] for j in range(1, K)]
            logits, preds = eagle_unroll(head, tm.model.embed_tokens.weight, fused, x[:, 1 : SE + 1], K, a.ttt_feed, true_next)
            loss = 0.0
            alive = torch.ones_like(in_dv[:, :SE])
            for j in range(K):
                sl = slice(1 + j, SE + 1 + j)
                mask = alive & in_dv[:, sl]
                lp = torch.log_softmax(logits[j].float(), -1)
                lj = -((tp[:, sl] * lp).sum(-1) * mask).sum() / mask.numel()
                loss = loss + (0.8**j) * lj
                with torch.no_grad():
                    est["acc"][j] += (preds[j] == targ[:, sl]).float().mean()
                    if a.ttt_feed == "pred":  # later steps count only where the chain is still right
                        alive = alive & (preds[j] == x[:, 2 + j : SE + 2 + j])
            dlog = dm(x[:, :W])[0].float()
            dl = -(torch.softmax(tl, -1) * torch.log_softmax(dlog, -1)).sum(-1).mean()
        eopt.zero_grad(set_to_none=True)
        dopt.zero_grad(set_to_none=True)
        (loss + dl).backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        torch.nn.utils.clip_grad_norm_(dm.parameters(), 1.0)
        if not warm:
            eopt.step()
            dopt.step()
            est["loss"] += loss.detach()
            est["dl"] += dl.detach()
            est["n"] += 1

    remaining = a.budget_s - (time.time() - T0) - a.eval_s
    etotal, _ = calibrate_steps(estep, max(10.0, remaining - 3), dev, a.eagle_steps, "eagle")
    te = time.time()
    every = max(1, etotal // 15)
    for i in range(etotal):
        estep(i, etotal)
        if (i + 1) % every == 0 or i == etotal - 1:
            n = est["n"]
            acc = " ".join(f"{float(v) / n:.3f}" for v in est["acc"])
            log(f"eagle step {i + 1}/{etotal} loss {float(est['loss']) / n:.4f} top1-agree/step [{acc}] draft-distill {float(est['dl']) / n:.4f}")
            est = {"loss": 0.0, "dl": 0.0, "acc": torch.zeros(K, device=dev), "n": 0}
    sync(dev)
    R["eagle_train"] = {
        "steps": etotal,
        "batch": a.eagle_batch,
        "seq": SE,
        "ttt_steps": K,
        "ttt_feed": a.ttt_feed,
        "step_loss_weights": [0.8**j for j in range(K)],
        "generated_sequences": 0 if gen_data is None else int(gen_data.shape[0]),
        "generated_prompt_tokens": P0,
        "lr_peak": a.eagle_lr,
        "wall_s": round(time.time() - te, 1),
        "draft_distill_lr_peak": a.draft_lr * 0.3,
    }
    X.save_safetensors(X.eagle_tensors(head), os.path.join(edir, "model.safetensors"))
    X.write_json(ecfg, os.path.join(edir, "config.json"))
    X.save_safetensors(X.draft_tensors(dm), os.path.join(ddir, "model.safetensors"))


def active_params(tm, c):
    """Per-token active parameters of the main model (2 of E routed experts + shared)."""
    tot = param_count(tm, skip=("mtp.",))
    E, k = c["n_routed_experts"], c["num_experts_per_tok"]
    per_exp = 3 * c["hidden_size"] * c["moe_intermediate_size"]
    n_moe = c["num_hidden_layers"] - c["first_k_dense_replace"]
    return tot - n_moe * (E - k) * per_exp


def hf_load(cls, d):
    try:
        return cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    except TypeError:
        return cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager", output_loading_info=True)


def compare_greedy(g_new, our_new):
    """Rows of new tokens; generation stops at an end token, so compare up to and including
    our first one. Returns (identical rows, agreeing tokens, compared tokens)."""
    same, agree, total = 0, 0, 0
    for hrow, orow in zip(g_new, our_new):
        n = len(orow)
        for j, tkn in enumerate(orow):
            if tkn in (D.EOS, D.IM_END):
                n = j + 1
                break
        hrow = (list(hrow) + [None] * n)[:n]
        ok = [hrow[j] == orow[j] for j in range(n)]
        same += all(ok)
        agree += sum(ok)
        total += n
    return same, agree, total


def target_vs_hf(hm, tm, x, prompts, n_new):
    """Logits on x and greedy continuations of prompts: transformers model hm vs ours tm."""
    r = {}
    with torch.no_grad():
        hl = hm(input_ids=x).logits
        h, _ = tm.trunk(x, use_sdpa=False)
        ml = tm.lm_head(h)
        r["logits_max_abs_diff"] = float((hl - ml).abs().max())
        r["logits_argmax_agree"] = float((hl.argmax(-1) == ml.argmax(-1)).float().mean())
        g = hm.generate(
            input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=n_new, do_sample=False,
            eos_token_id=None, pad_token_id=D.PAD,
        )
        seq = prompts
        for _ in range(n_new):
            h, _ = tm.trunk(seq, use_sdpa=False)
            seq = torch.cat([seq, tm.lm_head(h[:, -1]).argmax(-1, keepdim=True)], 1)
    P = prompts.shape[1]
    same, agree, total = compare_greedy(g[:, P:].cpu().tolist(), seq[:, P:].cpu().tolist())
    r.update(greedy_prompts=int(prompts.shape[0]), greedy_new_tokens_compared=int(total),
             greedy_sequences_identical=int(same), greedy_token_agreement=agree / max(1, total))
    return r


def preflight(a, dev, tmp):
    """Before any training: random (but not small) weights exported by this code must give
    transformers the same logits and greedy tokens as this code. Stops the run otherwise."""
    from transformers import DeepseekV3ForCausalLM, LlamaForCausalLM

    g = torch.Generator().manual_seed(7)
    tm = DeepSeekV3(X.target_config(a))
    dm = Llama(X.draft_config(a))
    for m in (tm, dm):
        for n, p in m.named_parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * (0.15 if p.dim() > 1 else 0.2) + (1.0 if p.dim() == 1 else 0.0))
    for moe in tm.moe_layers():
        moe.gate.e_score_correction_bias.copy_(torch.randn(moe.E, generator=g) * 0.05)
    td, dd = os.path.join(tmp, "t"), os.path.join(tmp, "d")
    for d in (td, dd):
        os.makedirs(d, exist_ok=True)
    X.save_safetensors(X.target_tensors(tm), os.path.join(td, "model.safetensors"))
    X.write_json(X.target_config(a), os.path.join(td, "config.json"))
    X.save_safetensors(X.draft_tensors(dm), os.path.join(dd, "model.safetensors"))
    X.write_json(X.draft_config(a), os.path.join(dd, "config.json"))
    tm = X.load_target(td, torch.float32, dev)
    dm = X.load_draft(dd, torch.float32, dev)
    hm, info = hf_load(DeepseekV3ForCausalLM, td)
    hm = hm.to(dev).eval()
    x = torch.randint(5, a.vocab, (4, 64), generator=g).to(dev)
    r = target_vs_hf(hm, tm, x, x[:, :16], 24)
    r["missing"] = sorted(info.get("missing_keys", []))
    r["unexpected"] = len(info.get("unexpected_keys", []))
    dh, dinfo = hf_load(LlamaForCausalLM, dd)
    dh = dh.to(dev).eval()
    with torch.no_grad():
        r["draft_logits_max_abs_diff"] = float((dh(input_ids=x).logits - dm(x, None, None, False)[0]).abs().max())
    r["draft_missing"] = sorted(dinfo.get("missing_keys", []))
    log("preflight (random weights, transformers vs this code): " + json.dumps(r))
    ok = (not r["missing"] and not r["draft_missing"] and r["logits_max_abs_diff"] < 1e-3
          and r["draft_logits_max_abs_diff"] < 1e-3 and r["greedy_sequences_identical"] == r["greedy_prompts"])
    if not ok:
        raise SystemExit("preflight failed: the exported files do not reproduce this code in transformers")
    return r


def hf_check(a, tm, dm, tdir, ddir, prompts, ours, dev):
    """Loads the exported files with transformers and compares logits and greedy continuations."""
    import transformers
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM, LlamaForCausalLM

    res = {"transformers": transformers.__version__}
    hm, info = hf_load(DeepseekV3ForCausalLM, tdir)
    hm = hm.to(dev).eval()
    res["target_missing_keys"] = sorted(info.get("missing_keys", []))
    res["target_unexpected_keys_count"] = len(info.get("unexpected_keys", []))
    res["target_unexpected_keys_are_mtp_only"] = all(
        k.startswith(f"model.layers.{tm.c['num_hidden_layers']}.") for k in info.get("unexpected_keys", [])
    )
    r = target_vs_hf(hm, tm, ours, prompts, a.hf_new)
    res["target_logits_max_abs_diff"] = r["logits_max_abs_diff"]
    res["target_logits_argmax_agree"] = r["logits_argmax_agree"]
    for k in ("greedy_prompts", "greedy_new_tokens_compared", "greedy_sequences_identical", "greedy_token_agreement"):
        res[k] = r[k]
    log(f"hf target: {json.dumps(res)}")
    del hm
    dmh, dinfo = hf_load(LlamaForCausalLM, ddir)
    dmh = dmh.to(dev).eval()
    with torch.no_grad():
        res["draft_missing_keys"] = sorted(dinfo.get("missing_keys", []))
        res["draft_logits_max_abs_diff"] = float((dmh(input_ids=ours).logits - dm(ours, None, None, False)[0]).abs().max())
    tok = AutoTokenizer.from_pretrained(tdir)
    sample = "def add(a, b):\n    return a + b\n"
    fast = D.load_bpe(tdir).encode(sample).ids
    res["tokenizer_class"] = type(tok).__name__
    res["tokenizer_ids_match"] = tok(sample)["input_ids"] == fast
    res["tokenizer_roundtrip"] = tok.decode(tok(sample)["input_ids"], skip_special_tokens=True) == sample
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    res["chat_template_text"] = chat
    res["chat_template_ids"] = tok(chat, add_special_tokens=False)["input_ids"]
    res["special_ids"] = {s: tok.convert_tokens_to_ids(s) for s in D.SPECIALS}
    log(f"hf checks: {json.dumps({k: v for k, v in res.items() if k != 'chat_template_ids'})}")
    return res


def package(a, out, R, final=False):
    """Results JSON, the log, and the models tree as a tar split into <= 15 MiB parts."""
    if final:
        from card import write_card

        p1 = os.path.join(a.models_dir, STATE)
        if os.path.exists(p1):
            os.remove(p1)
        write_card(R, os.path.join(a.models_dir, "specd-tiny", "README.md"))
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(R, f, indent=1, default=str)
    with open(os.path.join(out, "train.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(a.models_dir, arcname="models")
    data = buf.getvalue()
    for f in os.listdir(out):
        if f.startswith("models.tar.part"):
            os.remove(os.path.join(out, f))
    part = 15 << 20
    for i in range(0, len(data), part):
        with open(os.path.join(out, f"models.tar.part{i // part}"), "wb") as f:
            f.write(data[i : i + part])


if __name__ == "__main__":
    main()
