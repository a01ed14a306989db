#!/usr/bin/env python3
"""Golden fixtures for specd's SentencePiece-style BPE tokenizer.json (Llama-2, Mistral,
Mixtral, Yi: a SentencePiece BPE model with byte fallback, converted to tokenizer.json),
with SentencePiece itself as the oracle.

Trains one small SentencePiece BPE model (byte_fallback, split_digits, identity
normalization, the dummy prefix) on this machine's Python standard library sources plus
the edge-case corpus of tokenizers.py, and writes it as tokenizer.json in the two forms
transformers' LlamaConverter writes:

  llama2ish   legacy: normalizer Sequence[Prepend "▁", Replace " " -> "▁"], no
              pre-tokenizer (Llama-2, Mistral-7B v0.1, Mixtral)
  mistralish  non-legacy: no normalizer, pre-tokenizer Metaspace(replacement "▁",
              prepend_scheme "first", split false) (files written by newer transformers)

Both: model BPE (unk "<unk>", fuse_unk, byte_fallback; merges from the vocabulary, as
SentencePieceExtractor makes them: every split of a piece into two pieces, ordered by
the piece's score), decoder Sequence[Replace "▁" -> " ", ByteFallback, Fuse, Strip(" ",
start 1)], TemplateProcessing with <s>, added tokens <unk> <s> </s>.

Oracle: SentencePiece's encode and decode of the same model. For mistralish's
Metaspace (no prefix where the text starts with a space or "▁") the oracle is the
encode of the text without that first character (a lone one: the piece "▁"). Corpus strings that hold an added
token's text are left out (SentencePiece reads "<s>" in text as characters).

  /usr/bin/python3 tools/golden/spm.py --out tests/golden/tokenizer   (Debian:
                                                       python3-sentencepiece)
  python3 tools/golden/spm.py --hf --out tests/golden/tokenizer        (HF tokenizers, no
                                                       SentencePiece needed)

--hf adds HF tokenizers' own ids and decodes of the written tokenizer.json files to
spm_golden.json ("hf": the corpus, and texts with <s> / </s> inside, where the
legacy and the Metaspace form differ), for the C test to check against the library
whose behaviour the files describe.

Writes DIR/<name>/tokenizer.json, DIR/<name>/tokenizer_config.json and
DIR/spm_golden.json.
"""
import argparse
import importlib.util
import io
import json
import os
import random
import sys
import time

try:
    import sentencepiece as spm
except ImportError:  # --hf needs only HF tokenizers
    spm = None

_HERE = os.path.dirname(os.path.abspath(__file__))
# tokenizers.py beside this file is ours: keep the folder off the import path so
# that `import tokenizers` (--hf) finds HF's library
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
_spec = importlib.util.spec_from_file_location("golden_corpus", os.path.join(_HERE, "tokenizers.py"))
G = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(G)

SPACE = "\u2581"
SPECIALS = ["<unk>", "<s>", "</s>"]


def train(vocab):
    docs, total = G.train_corpus()
    lines = [ln for d in docs for ln in d.split("\n") if ln.strip()]
    random.Random(7).shuffle(lines)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=vocab,
        byte_fallback=True, split_digits=True, character_coverage=0.995, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentence_length=8192, num_threads=2,
        minloglevel=2)
    return model.getvalue(), len(lines), total


def merges_of(sp):
    """SentencePieceExtractor: every split of a piece into two pieces, by score."""
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    scores = {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())}
    merges = G.split_merges(scores.items(), vocab)
    merges.sort(key=lambda x: x[2], reverse=True)  # stable: the piece order within a score
    return vocab, [[l, r] for l, r, _ in merges]


def tokenizer_json(vocab, merges, legacy):
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    if legacy:
        normalizer = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]}
        pre = None
    else:
        normalizer = None
        pre = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first", "split": False}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in enumerate(SPECIALS)],
        "normalizer": normalizer, "pre_tokenizer": pre,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def oracle_ids(sp, text, legacy):
    """SentencePiece puts "▁" before any text; Metaspace (first) only before one that
    does not start with it (a space becomes it): the text less that character, with
    SentencePiece's "▁" in its place (alone: just "▁", SentencePiece encodes "" as [])."""
    if not legacy and text[:1] in (" ", SPACE):
        return sp.encode(text[1:]) if text[1:] else [sp.piece_to_id(SPACE)]
    return sp.encode(text)


# texts with added tokens inside: <s> starts or splits the text, spaces around it
ADDED_CASES = ["<s>Hello world", "Hello<s>world", "Hello <s> world", "<s> x", "a</s>", "</s>\nnext",
               "<s><s>two", " <s>lead", "Hi <unk> there"]


def hf_add(out):
    import tokenizers
    from tokenizers import Tokenizer

    path = os.path.join(out, "spm_golden.json")
    with open(path, encoding="utf-8") as f:
        golden = json.load(f)
    golden["hf_tokenizers_version"] = tokenizers.__version__
    for g in golden["tokenizers"]:
        tok = Tokenizer.from_file(os.path.join(out, g["name"], "tokenizer.json"))
        hf = []
        texts = [c["text"] for c in g["cases"]] + ADDED_CASES
        for text in texts:
            e = tok.encode(text, add_special_tokens=False)
            ids = list(e.ids)
            hf.append({"text": text, "ids": ids, "ids_special": list(tok.encode(text).ids),
                       "decode": tok.decode(ids, skip_special_tokens=False),
                       "decode_skip": tok.decode(ids, skip_special_tokens=True)})
        g["hf"] = hf
        g["hf_random_decode"] = [tok.decode(c["ids"], skip_special_tokens=False) for c in g["decode"]]
        agree = sum(h["ids"] == c["ids"] for h, c in zip(hf, g["cases"]))
        print(f"{g['name']}: HF agrees with SentencePiece on {agree}/{len(g['cases'])} corpus strings")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/tokenizer")
    ap.add_argument("--vocab", type=int, default=3000)
    ap.add_argument("--hf", action="store_true", help="add HF tokenizers' ids and decodes to spm_golden.json")
    a = ap.parse_args()
    if a.hf:
        hf_add(a.out)
        return
    t0 = time.time()
    model, n_lines, total = train(a.vocab)
    sp = spm.SentencePieceProcessor(model_proto=model)
    vocab, merges = merges_of(sp)
    print(f"trained on {n_lines} lines ({total} chars): {sp.get_piece_size()} pieces, {len(merges)} merges")
    golden = {"format": 1, "sentencepiece_version": spm.__version__, "python": sys.version.split()[0],
              "made_by": "tools/golden/spm.py", "tokenizers": []}
    corpus = [c for c in G.CORPUS if not any(s in c for s in SPECIALS)]
    for name, legacy in (("llama2ish", True), ("mistralish", False)):
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_json(vocab, merges, legacy), f, ensure_ascii=False)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "legacy": legacy,
                       "add_bos_token": True, "tokenizer_class": "LlamaTokenizer"}, f, indent=1)
        g = {"name": name, "legacy": legacy, "vocab_size": sp.get_piece_size(), "cases": [], "invalid": [],
             "decode": []}
        for text in corpus:
            ids = oracle_ids(sp, text, legacy)
            g["cases"].append({"text": text, "ids": ids, "ids_special": [1] + ids, "decode": sp.decode(ids)})
        for b in G.INVALID:
            s = b.decode("utf-8", "replace")
            g["invalid"].append({"hex": b.hex(), "ids": oracle_ids(sp, s, legacy)})
        rnd = random.Random(1234)
        for k in range(40):
            ids = [rnd.randrange(3, sp.get_piece_size()) for _ in range(rnd.randint(1, 40))]
            if k % 4 == 0:  # byte pieces, whose concatenations are often not UTF-8
                ids = [rnd.randrange(3, 3 + 256) for _ in ids]
            g["decode"].append({"ids": ids, "text": sp.decode(ids)})
        lt = G.long_text()
        g["long"] = {"text": lt, "ids": oracle_ids(sp, lt, legacy)}
        golden["tokenizers"].append(g)
        print(f"{name}: {len(g['cases'])} corpus strings ({len(G.CORPUS) - len(corpus)} with added tokens left out)")
    with open(os.path.join(a.out, "spm_golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=0)
    print(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
