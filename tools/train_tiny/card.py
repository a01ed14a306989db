"""Writes the model card (models/specd-tiny/README.md) from the run's results.json.

Usage: python3 tools/train_tiny/card.py RESULTS.json OUT.md [NOTES.md]
"""
import json
import sys


def _f(x, n=4):
    return f"{x:.{n}f}" if isinstance(x, float) else str(x)


def write_card(R, path, notes=""):
    c = R.get("corpus", {})
    tk = R.get("tokens", {})
    tt = R.get("target_train", {})
    et = R.get("eagle_train", {})
    hl = R.get("heldout_loss", {})
    ng = hl.get("ngram_baseline", {})
    ac = R.get("acceptance", {})
    pm = R.get("params", {})
    hf = R.get("hf_check", {})
    mods = ac.get("models", {})
    kmax = max((int(k) for k in mods.get("eagle3", {}).get("by_k", {}) or [0]), default=0)

    def mal(name, k):
        return mods[name]["by_k"][str(k) if str(k) in mods[name]["by_k"] else k]["mean_accepted_length"]

    def pda(name, k):
        return mods[name]["by_k"][str(k) if str(k) in mods[name]["by_k"] else k]["per_draft_acceptance"]

    L = []
    w = L.append
    w("# specd-tiny")
    w("")
    w("The model `specd serve` runs when no `--model` is given, the model of the acceptance")
    w(f"benchmarks and of the CPU tests. A {pm.get('target_main', 0) / 1e6:.1f} M-parameter DeepSeek-V3-architecture model (MLA,")
    w("MoE with group-limited sigmoid routing, first layer dense) with one multi-token-prediction")
    w(f"(MTP) layer ({(pm.get('target_main', 0) + pm.get('target_mtp_module_unique', 0)) / 1e6:.1f} M trainable parameters with it), "
      "an EAGLE-3 head for it (`../specd-tiny-eagle3`) and a small Llama draft model")
    w("(`../specd-tiny-draft`), all trained from scratch on Python source code. It writes")
    w("plausible-looking Python, not good Python: it exists to exercise the serving stack and to")
    w("give speculative decoding a real (trained) distribution to predict.")
    w("")
    w("## Reproduce")
    w("")
    w("One command on a machine with one NVIDIA H200, PyTorch 2.x, `tokenizers`, `transformers`:")
    w("")
    w("```")
    w(R.get("command", ""))
    w("```")
    w("")
    tt0, et0 = R.get("target_train", {}), R.get("eagle_train", {})
    w(f"Step counts were fitted to the time budget on that machine ({tt0.get('steps', '-')} target steps, "
      f"{et0.get('steps', '-')} EAGLE-3 steps); `--target-steps {tt0.get('steps', 'N')} --eagle-steps {et0.get('steps', 'M')}` "
      "fixes them. `--models-dir`/`--out` only say where files go (default: `models/` and `build-train-tiny/`).")
    w("")
    w(f"Run: commit `{R.get('commit', '')}`, device {R.get('device', '')}, torch {R.get('torch', '')}, "
      f"transformers {hf.get('transformers', '-')}. Wall time {R.get('wall_s_total', '-')} s in all "
      f"(phases, s: {json.dumps(R.get('phases_s', {}))}). The corpus is whatever Python the machine has "
      "installed, so another image gives another (similar) model.")
    w("")
    w("## Corpus and split")
    w("")
    w(f"- Every `*.py` under the interpreter's import path (standard library + site-packages; "
      f"{c.get('files_listed', '-')} files listed, {c.get('files_unique', '-')} unique by content, "
      f"{c.get('bytes_unique', 0) / 1e6:.1f} MB; files over 1 MiB or not UTF-8 skipped).")
    hp = c.get("heldout_packages", {})
    w(f"- Held out by whole package (never by file): {', '.join(f'`{p}` ({b / 1e6:.2f} MB)' for p, b in hp.items())} "
      f"= {c.get('heldout_files', '-')} files, {c.get('heldout_bytes', 0) / 1e6:.2f} MB "
      f"({100 * c.get('heldout_fraction_of_bytes', 0):.2f} % of bytes).")
    w(f"- Training text used: {c.get('train_files_used', '-')} files, {c.get('train_bytes_used', 0) / 1e6:.1f} MB "
      f"(cap {c.get('max_train_bytes', 0) / 1e6:.0f} MB, files taken in content-hash order) = "
      f"{tk.get('train', '-')} tokens ({_f(tk.get('train_bytes_per_token', 0), 2)} bytes/token); "
      f"held-out stream {tk.get('heldout', '-')} tokens.")
    w("- Token stream: each file is one document, `<|begin_of_text|> ids <|end_of_text|>`; training "
      "windows are random slices of the concatenated stream.")
    w("")
    w("## Tokenizer")
    w("")
    w("Byte-level BPE trained with `tokenizers` (vocab 8192 including 5 special tokens; "
      f"trained on the first {R.get('tokenizer_sample_bytes', 0) / 1e6:.0f} MB of the training files). "
      "Pre-tokenizer: `Split` with the Qwen2 regex (isolated) then `ByteLevel(use_regex=False)`; "
      "decoder `ByteLevel`; post-processor prepends `<|begin_of_text|>`. Special tokens: "
      "0 `<|begin_of_text|>` (bos), 1 `<|end_of_text|>` (eos), 2 `<|im_start|>`, 3 `<|im_end|>`, 4 `<|pad|>`. "
      "`tokenizer_config.json` carries a ChatML chat template (`<|im_start|>role\\ncontent<|im_end|>\\n`, "
      "preceded by bos). `generation_config.json`: eos = [1, 3]. The model never saw chat text: the template "
      "exists for the server's code path.")
    w("")
    w("## Target: DeepseekV3ForCausalLM + MTP")
    w("")
    w("| | |")
    w("| --- | --- |")
    w("| layers | 4 (layer 0 dense MLP 512; layers 1-3 MoE) + 1 MTP layer (MoE) |")
    w("| hidden / vocab | 256 / 8192, untied `lm_head` |")
    w("| attention | MLA: 8 heads, q_lora_rank 128, kv_lora_rank 64, qk_nope 32, qk_rope 16, v 32; RoPE theta 1e4, no scaling, `rope_interleave` (rope dims rotated as adjacent pairs, as DeepSeek) |")
    w("| MoE | 8 routed experts (moe_intermediate_size 96) + 1 shared; sigmoid scores; `noaux_tc`: n_group 2, topk_group 1, top-2; norm_topk_prob; routed_scaling_factor 1.0 |")
    w(f"| parameters | main model {pm.get('target_main', 0):,} ({pm.get('target_active_per_token_main', 0):,} active per token); "
      f"MTP module {pm.get('target_mtp_module_unique', 0):,} unique + {pm.get('target_mtp_stored_copies', 0):,} stored copies "
      "(its embed_tokens and shared_head.head) |")
    w("")
    w("Routing, exactly as transformers 5.x and vLLM/SGLang: `s = sigmoid(x W_g^T)` (fp32); "
      "choice scores `s + e_score_correction_bias`; group score = sum of the top-2 choice scores "
      "in each of the 2 groups of 4 experts; keep the best group, set the others to -inf; top-2 "
      "of the choice scores; weights = the chosen `s` (no bias) / their sum, times 1.0. "
      "Balancing is DeepSeek-V3's auxiliary-loss-free one: after every step each expert's bias "
      f"moves by {tt.get('bias_gamma', '-')} x sign(mean load - its load). `e_score_correction_bias` "
      "is stored in F32 (as DeepSeek-V3 stores it); every other tensor is BF16.")
    loads = tt.get("last_batch_expert_load")
    if loads:
        w("")
        w("Expert load on the last training batch (share of routed slots, ideal 0.125), MoE layers 1, 2, 3 and MTP: "
          + "; ".join(f"{min(l):.3f}-{max(l):.3f}" for l in loads) + ".")
    w("")
    w("**MTP convention** (that of vLLM/SGLang DeepSeek MTP; the engine implements the same):")
    w("")
    w("- `h_i` = the target's final hidden state at position i, AFTER the final `model.norm`.")
    w("- MTP slot i takes token x_{i+1}, hidden h_i, rotary position i: "
      "`e = enorm(embed(x_{i+1}))` (embedding `model.layers.4.embed_tokens.weight`, a copy of the main one), "
      "`g = hnorm(h_i)`, `u = eh_proj(concat([e, g], -1))` (embedding half first), "
      "u -> one DeepSeek-V3 decoder layer (`model.layers.4.{input_layernorm, self_attn, "
      "post_attention_layernorm, mlp}`, MoE since 4 >= first_k_dense_replace) with causal attention "
      "over MTP slots 0..i; logits = `shared_head.head(shared_head.norm(out_i))` predict x_{i+2}.")
    w("- Chained drafting (k > 1): the MTP layer's output (before `shared_head.norm`) is the next "
      "hidden and the drafted token the next input, at slot i+1, position i+1.")
    w(f"- Training: DeepSeek-V3's MTP loss, total = CE(main) + lambda * CE(MTP), lambda = {tt.get('mtp_lambda', '-')} "
      "throughout; the MTP embedding and head are tied to the main ones while training "
      "(gradients flow into them and into the trunk through h) and stored as copies.")
    w("")
    w(f"Training: {tt.get('steps', '-')} steps x {tt.get('batch', '-')} x {tt.get('seq', '-')} tokens = "
      f"{tt.get('tokens_seen', 0) / 1e6:.0f} M tokens, {tt.get('wall_s', '-')} s "
      f"({tt.get('tokens_per_s', 0) / 1e6:.2f} M tokens/s), AdamW (0.9, 0.95, wd 0.1), peak lr "
      f"{tt.get('lr_peak', '-')}, warm-up then cosine to 10 %, clip 1.0, bf16 autocast with fp32 master weights.")
    w("")
    w("## EAGLE-3 head (`../specd-tiny-eagle3`)")
    w("")
    w("Layout of published EAGLE-3 heads, as SGLang and vLLM load them (`LlamaForCausalLMEagle3`): "
      "`fc.weight` [256, 768]; `midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight`; "
      "`midlayer.self_attn.{q,k,v}_proj.weight` taking 2*hidden input, "
      "`concat([input_layernorm(embed), hidden_norm(hidden)], -1)` (embedding half first, as SGLang's "
      "llama_eagle3.py); `midlayer.self_attn.o_proj.weight`; `midlayer.mlp.{gate,up,down}_proj.weight` "
      "(intermediate 512); `norm.weight`; `lm_head.weight` [2048, 256] over the draft vocabulary; "
      "`d2t` [2048] int64 (target_id = draft_id + d2t[draft_id]); `t2d` [8192] bool. No embedding: "
      "the target's `model.embed_tokens` is used. Attention: 4 heads of 64, 2 KV heads, standard "
      "Llama RoPE (rotate_half, theta 1e4).")
    w("")
    w(f"- Draft vocabulary: the 2048 most frequent tokens of the training stream (they cover "
      f"{100 * R.get('draft_vocab_coverage', 0):.1f} % of its tokens).")
    w("- Fused target states, config `eagle_config.eagle_aux_hidden_state_layer_ids = [0, 1, 2]`, "
      "SGLang convention: id l = the OUTPUT of decoder layer l = the residual stream at the INPUT of "
      "layer l+1 (after layers 0..l, before any norm). SGLang turns these ids into "
      "`layers_to_capture = [1, 2, 3]` and captures the input of those layers. fc input = "
      "concat(low, mid, high) in that order.")
    w("- One step: residual = hidden; x = concat(input_layernorm(embed(token)), hidden_norm(hidden)); "
      "h = residual + attn(x); out = h + mlp(post_attention_layernorm(h)); logits = lm_head(norm(out)). "
      "The first step at position i takes hidden = fc(states at i) and token x_{i+1}; step j of a chain "
      "takes the previous step's `out` (before `norm`) and the previous drafted token, at position i+j, "
      "and attends to the first-step keys at positions <= i plus its own chain.")
    w(f"- Training (target frozen): {et.get('steps', '-')} steps x {et.get('batch', '-')} sequences x "
      f"{et.get('seq', '-')} chain starts, {et.get('wall_s', '-')} s; training-time test unrolled "
      f"{et.get('ttt_steps', '-')} steps; step j is fed its own previous hidden and its own previous "
      f"prediction (`ttt_feed = {et.get('ttt_feed', '-')}`); loss = sum_j 0.8^j soft cross-entropy "
      "against the target's distribution restricted to the draft vocabulary (positions whose target "
      "argmax is outside it are masked, as EAGLE-3 does); for j >= 1 only chains whose earlier guesses "
      "all equal the sequence count (elsewhere the fed token is not the one the teacher saw). Half of "
      f"each batch is corpus text, half {et.get('generated_sequences', '-')} target-generated greedy "
      f"continuations of {et.get('generated_prompt_tokens', '-')}-token training prompts (on those, "
      "an accepted chain's tokens are exactly the sequence's).")
    w("")
    w("## Draft model (`../specd-tiny-draft`)")
    w("")
    w(f"LlamaForCausalLM, {pm.get('draft', 0):,} parameters: hidden 128, 2 layers, 4 heads of 32 "
      "(2 KV heads), intermediate 384, tied embeddings, RoPE theta 1e4; the same tokenizer files. "
      "Trained on the corpus alongside the target (same batches, cross-entropy), then distilled from "
      "the frozen target (soft cross-entropy on its full distribution) alongside the EAGLE-3 head.")
    w("")
    w("## Held-out results")
    w("")
    w(f"Cross-entropy in nats/token on {hl.get('windows', '-')} windows ({hl.get('tokens', '-')} tokens) "
      "of the held-out packages, computed by the reference code from the exported BF16 weights in fp32:")
    w("")
    w("| model | held-out loss |")
    w("| --- | --- |")
    w(f"| target (next token) | {_f(hl.get('target', float('nan')))} |")
    w(f"| target MTP (token after next) | {_f(hl.get('mtp', float('nan')))} |")
    w(f"| draft model (next token) | {_f(hl.get('draft', float('nan')))} |")
    w(f"| EAGLE-3 first step: soft CE vs the target over the draft vocab | {_f(hl.get('eagle_soft_ce', float('nan')))} "
      f"(top-1 agreement with the target {_f(hl.get('eagle_top1_agree', float('nan')), 3)}) |")
    if ng:
        lam = ng.get("lambdas_trigram_bigram_unigram")
        w(f"| n-gram baseline: interpolated trigram (weights {lam}) on {ng.get('train_tokens', 0) / 1e6:.0f} M train tokens | "
          f"{_f(ng.get('heldout_nll', float('nan')))} |")
    w("")
    w("Acceptance, greedy, measured by the PyTorch reference (`tools/train_tiny`) on "
      f"{ac.get('prompts', '-')} held-out prompts of {ac.get('prompt_len', '-')} tokens, each continued "
      f"{ac.get('gen_len', '-')} tokens by the target (greedy). Speculative decoding is simulated "
      "exactly: a round drafts k tokens from the last target-emitted token, accepts the leading ones "
      "equal to the target's greedy tokens, and emits accepted + 1 (the bonus token). Mean accepted "
      "length = tokens emitted per target forward, bonus included.")
    w("")
    if mods:
        w("| drafter | " + " | ".join(f"k={k}" for k in range(1, kmax + 1)) + " |")
        w("| --- |" + " --- |" * kmax)
        for name, label in (("eagle3", "EAGLE-3 head"), ("mtp", "MTP, chained"), ("draft", "draft model")):
            if name in mods:
                w(f"| {label} | " + " | ".join(f"{mal(name, k):.3f}" for k in range(1, kmax + 1)) + " |")
        w("")
        w(f"MTP first-draft acceptance (rounds at k = 1): **{_f(ac.get('mtp_first_draft_acceptance', float('nan')), 3)}**; "
          f"over every position: {_f(mods['mtp'].get('first_draft_acceptance_all_positions', float('nan')), 3)}. "
          "Per-draft acceptance (accepted / drafted) at k=1..5: "
          + "; ".join(f"{n} " + ", ".join(f"{pda(n, k):.3f}" for k in range(1, kmax + 1)) for n in ("eagle3", "mtp", "draft") if n in mods)
          + ".")
        w("")
        e4 = mal("eagle3", 4) if kmax >= 4 else float("nan")
        m1 = ac.get("mtp_first_draft_acceptance", 0)
        w(f"Quality bar (MTP first-draft acceptance >= 0.5; EAGLE-3 mean accepted length >= 2.0 at k = 4): "
          f"MTP {m1:.3f} -> {'met' if m1 >= 0.5 else 'NOT met'}; EAGLE-3 {e4:.3f} -> {'met' if e4 >= 2.0 else 'NOT met'}.")
        w("")
    if hf:
        w("## Standard-checkpoint check (transformers)")
        w("")
        w(f"`DeepseekV3ForCausalLM.from_pretrained` (transformers {hf.get('transformers')}, fp32, eager attention): "
          f"missing keys {hf.get('target_missing_keys')}; {hf.get('target_unexpected_keys_count')} unexpected keys, "
          f"all MTP (`model.layers.4.*`, which transformers does not use): {hf.get('target_unexpected_keys_are_mtp_only')}. "
          f"Logits vs the training code on held-out text: max |diff| {hf.get('target_logits_max_abs_diff', float('nan')):.2e}, "
          f"argmax agreement {hf.get('target_logits_argmax_agree')}. Greedy `generate` on {hf.get('greedy_prompts')} held-out "
          f"prompts: {hf.get('greedy_sequences_identical')}/{hf.get('greedy_prompts')} continuations identical to the training "
          f"code's ({hf.get('greedy_new_tokens_compared')} tokens compared, agreement {hf.get('greedy_token_agreement')}).")
        w(f"`LlamaForCausalLM.from_pretrained` on the draft: missing keys {hf.get('draft_missing_keys')}, logits max |diff| "
          f"{hf.get('draft_logits_max_abs_diff', float('nan')):.2e}. `AutoTokenizer` ({hf.get('tokenizer_class')}): ids equal "
          f"to `tokenizers`' {hf.get('tokenizer_ids_match')}, round trip {hf.get('tokenizer_roundtrip')}, special ids "
          f"{json.dumps(hf.get('special_ids'))}, chat template of one user turn + generation prompt -> {hf.get('chat_template_ids')}.")
        w("")
    w("## Files")
    w("")
    sz = R.get("sizes_bytes", {})
    tot = sum(sz.values())
    w(f"{len(sz)} files, {tot:,} bytes ({tot / 2**20:.2f} MiB) in all, model cards not counted:")
    w("")
    for k in sorted(sz):
        w(f"- `{k}` {sz[k]:,}")
    w("")
    if notes:
        w(notes.rstrip())
        w("")
    with open(path, "w") as f:
        f.write("\n".join(L))


if __name__ == "__main__":
    R = json.load(open(sys.argv[1]))
    notes = open(sys.argv[3]).read() if len(sys.argv) > 3 else ""
    write_card(R, sys.argv[2], notes)
