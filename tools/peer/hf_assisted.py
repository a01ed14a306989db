#!/usr/bin/env python3
"""A peer on the same machine and model: HF transformers' generate with
assisted decoding (the bundled draft model as the assistant), greedy, on the
same held-out prompts as bench/accept. Reports tokens/s of plain and assisted
generation and the accepted length (new tokens per target forward pass),
counted by a hook on the target's forward.

    python3 tools/peer/hf_assisted.py --out bench/results/peer-hf-assisted.json
"""
import argparse
import json
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="models")
    ap.add_argument("--prompts", default="models/specd-tiny/heldout_prompts.jsonl")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--assistant-tokens", type=int, default=4)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tdir = os.path.join(a.models, "specd-tiny")
    tok = AutoTokenizer.from_pretrained(tdir)
    tgt = AutoModelForCausalLM.from_pretrained(tdir, torch_dtype=torch.bfloat16).to(dev).eval()
    drf = AutoModelForCausalLM.from_pretrained(os.path.join(a.models, "specd-tiny-draft"),
                                               torch_dtype=torch.bfloat16).to(dev).eval()
    calls = {"n": 0}
    tgt.register_forward_pre_hook(lambda m, args: calls.__setitem__("n", calls["n"] + 1))
    prompts = [json.loads(l)["prompt"] for l in open(a.prompts)][: a.n]
    res = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
           "torch": torch.__version__, "transformers": __import__("transformers").__version__,
           "prompts": len(prompts), "max_new_tokens": a.max_new, "dtype": "bfloat16", "runs": {}}
    for mode in ("plain", "assisted"):
        kw = dict(max_new_tokens=a.max_new, do_sample=False, pad_token_id=tok.eos_token_id)
        if mode == "assisted":
            drf.generation_config.num_assistant_tokens = a.assistant_tokens
            drf.generation_config.num_assistant_tokens_schedule = "constant"
            kw["assistant_model"] = drf
        # warm-up
        x = tok(prompts[0], return_tensors="pt").to(dev)
        tgt.generate(**x, **kw)
        if dev == "cuda":
            torch.cuda.synchronize()
        calls["n"] = 0
        new = 0
        t0 = time.time()
        outs = []
        for p in prompts:
            x = tok(p, return_tensors="pt").to(dev)
            y = tgt.generate(**x, **kw)
            n = y.shape[1] - x["input_ids"].shape[1]
            new += n
            outs.append(y[0, x["input_ids"].shape[1]:].tolist())
        if dev == "cuda":
            torch.cuda.synchronize()
        wall = time.time() - t0
        r = {"new_tokens": new, "wall_s": wall, "tokens_per_s": new / wall,
             "target_forward_calls": calls["n"],
             "tokens_per_target_call": new / max(calls["n"], 1)}
        if mode == "assisted":
            r["assistant_tokens"] = a.assistant_tokens
            r["same_output_as_plain"] = outs == res["runs"]["plain"].pop("_outs")
        else:
            r["_outs"] = outs
        res["runs"][mode] = r
        print(mode, json.dumps({k: v for k, v in r.items() if k != "_outs"}), flush=True)
    res["speedup"] = res["runs"]["assisted"]["tokens_per_s"] / res["runs"]["plain"]["tokens_per_s"]
    print(f"assisted/plain speedup {res['speedup']:.3f}")
    if a.out:
        json.dump(res, open(a.out, "w"), indent=2)


if __name__ == "__main__":
    main()
