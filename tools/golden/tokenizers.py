#!/usr/bin/env python3
"""Golden fixtures for specd's tokenizer (tests/golden/tokenizer/), with HF `tokenizers`
as the oracle.

Builds four small byte-level BPE tokenizers in the styles found in the wild, trained
on this machine's Python standard library sources plus the edge-case corpus below
(vocab ~3000, so each tokenizer.json stays ~200 KB):

  llama3ish    Llama-3 / Qwen2: Split(Llama-3 regex, Isolated) + ByteLevel(no prefix
               space, no regex); merges saved as [a, b] pairs; ignore_merges; special
               tokens after the vocabulary; non-special added tokens with lstrip/rstrip
               and single_word/normalized; TemplateProcessing with <|begin_of_text|>.
  deepseekish  DeepSeek-V3: Sequence of three Split regexes (digits, CJK, the main one)
               + ByteLevel; NFC normalizer; merges as "a b" strings; <think> tokens
               non-special and normalized.
  gpt2ish      GPT-2 / RoBERTa: ByteLevel(add_prefix_space=True, use_regex=True) alone;
               NFKC + Lowercase normalizers; "a b" merges; <|endoftext|>.
  kimiish      Kimi-K2: a tiktoken rank file (here made from a BPE trained with Kimi's
               pattern, since no tiktoken encoding can be downloaded on this machine)
               converted to tokenizer.json the way transformers' TikTokenConverter does;
               Kimi's pattern uses class intersections ([A&&[^B]]). tiktoken's own ids
               are recorded beside HF's for comparison.

For each: the ids of every corpus string (add_special_tokens False and True), the
decoded text (skip_special_tokens False and True), invalid-UTF-8 byte strings
(encoded as HF sees bytes.decode('utf-8', 'replace')), random id sequences decoded,
and one long mixed text.

  python3 tools/golden/tokenizers.py --out DIR      (needs tokenizers; tiktoken optional)
  python3 tools/golden/tokenizers.py --dry          (corpus and converter self-check only)

Writes DIR/<name>/tokenizer.json, DIR/golden.json and DIR/log.txt.
"""
import argparse
import base64
import json
import os
import random
import sys
import time

# This file is named like the package it tests: keep its folder off the import path
# so that `import tokenizers` finds HF's library.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek-V3's tokenizer.json: three isolating Splits before ByteLevel.
DS_PATS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
# Kimi-K2's tokenization_kimi.py pattern.
KIMI_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<|reserved_special_token_0|>"]
DS_SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
              "<｜tool▁calls▁begin｜>"]
KIMI_SPECIAL = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                "<|im_middle|>"]

# The test corpus: every string is encoded by HF and by specd.
CORPUS = [
    "",
    "Hello, world!",
    "hello world HELLO WORLD Hello World",
    "  leading spaces",
    "trailing spaces   ",
    "multiple   spaces    inside  text",
    " ",
    "\t",
    "\ttabs\tand\t\ttabs \t mixed\t",
    "line1\nline2\r\nline3\rline4\n\n\nend",
    "\r\n\r\n\r\n",
    "crlf line\r\n  indented after crlf\r\n",
    "\n",
    "\n\n \n\t\n",
    "I'm you're they've she'll he'd it's don't won't",
    "I'M YOU'RE THEY'VE SHE'LL HE'D IT'S DON'T",
    "rock'n'roll O'Neil's 'quoted' ''double'' '",
    "\u017f's 'S 'Ll tho\u017fe",  # long s folds to s under (?i)
    "1234567890",
    "3.14159 2,718 1e10 0x1F -42 +7 1_000_000",
    "x" + "9" * 100,
    "12 345 6789 00000 0",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \uff11\uff12\uff13 \u2460\u2461 \u00bd \u2167",
    "a" * 2000,
    " " * 500,
    "!" * 300,
    "\n" * 50,
    "ab" * 300,
    "\u00e9" * 200,
    "\U0001F600" * 50,
    "naive na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u0153uvre",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b5\u03af\u03bc\u03b5\u03bd\u03bf",
    "\u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442, \u041f\u0440\u0438\u0432\u0435\u0442!",
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0641\u0627\u0631\u0633\u06cc",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u0e44\u0e17\u0e22 \ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u4e2d\u6587\u7684\u53e5\u5b50\uff0c\u8fd8\u6709\u6807\u70b9\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca\u3001\u3072\u3089\u304c\u306a\u3002",
    "\u6f22\u5b57\u304b\u306a\u30ab\u30ca\u6f22\u5b57 \u300c\u5f15\u7528\u300d\u3001\u3002 \u9fa5\u9fa6 \U00020000\U0002A6D6",
    "mixed\u4e2d\u6587English\u65e5\u672cWords123\u6570\u5b57",
    "\U0001F600 \U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 "
    "\U0001F3F3\ufe0f\u200d\U0001F308 \u2764\ufe0f \U0001F1FA\U0001F1F8 \U0001F1EF\U0001F1F5",
    "I \u2764 NY and \U0001F355 pizza\U0001F355\U0001F355!",
    "e\u0301 a\u0308 n\u0303 o\u0302 Ame\u0301lie vs Am\u00e9lie",
    "Z\u0334\u031d\u030aa\u0336\u0327\u034bl\u0335\u0348\u0302g\u0338\u035a\u0308o\u0335\u0324\u035d",
    "\u0301 leading combining mark, \u0308\u0308 two",
    "\u00a0nbsp\u2009thin\u3000ideographic\u200bzwsp\u180emvs\u2028ls\u2029ps\u0085nel\x0bvt\x0cff",
    "\x00\x01\x02 nul and controls \x7f\x1b[31m",
    "\x1c\x1d\x1e\x1f separators",
    "\ufffd replacement \ufeff bom \uffff nonchar \ue000 private \U0010fffd",
    "<|begin_of_text|>Hello<|eot_id|>",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|eot_id|>text<|eot_id|><|eot_id|>",
    "partial <|eot_id and <|im_start| and <|eot_id|",
    "<<|eot_id|>> [<|im_end|>] <|<|im_start|>|>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>You are helpful.<\uff5cUser\uff5c>2+2?<\uff5cAssistant\uff5c>"
    "<think>\nadd\n</think>4<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<think></think><think>x</think>",
    "[BOS]<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>",
    "<|endoftext|>one<|endoftext|> two <|endoftext|>",
    "a <mask> b",
    "x<mask>y",
    "  <mask>  \t<mask>\n",
    "custom_word custom_words mycustom_word custom_word. (custom_word)",
    "Custom_Word CUSTOM_WORD",
    "def f(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "https://example.com/path/to?q=1&b=two#frag user@example.org",
    "The year 2024 had 366 days; \u03c0\u22483.14159, \u221a2\u22481.414 \u2014 \u201cquotes\u201d "
    "\u2018single\u2019 \u00abguillemets\u00bb \u2026",
    "\u2200x\u2208\u211d: x\u00b2\u22650 \u2295 \u2297 \u222e \u250c\u2500\u2510\u2502\u2514\u2518",
    "\u24b6\u24b7\u24b8 \uff21\uff22\uff23 \ufb01 \u2126 \u212b \u00c5",
    "\u0130stanbul I\u0307 \u01c5 \u039f\u0394\u039f\u03a3 \u1e9e \u00df",
    "tab\tafter word\t\t\tand\u3000ideographic space\u3000\u3000end",
    "!!!???...,,,;;;:::---___***",
    "   \n   \n\t\t\n",
    "ending with newline\n",
    "ending with spaces and newline   \n",
]

INVALID = [
    b"abc\xff def",
    b"\xe2\x82 x",
    b"\xed\xa0\x80 surrogate",
    b"emoji cut \xf0\x9f\x98",
    b"a\x80\x80b",
    b"\xc0\xaf overlong",
    b"ok\xf4\x90\x80\x80 too big",
    b"\xe0\x80\x80 zz",
    b"trail\xe2",
    b"\xfe\xfe\xff\xff",
    b"mixed \xc3\xa9 \xc3 \xa9 end",
]


def log(*a):
    print(*a, flush=True)


def train_corpus():
    """Python standard library sources (up to ~3 MB) and the edge corpus."""
    docs = []
    lib = os.path.dirname(os.__file__)
    total = 0
    for root, _, files in sorted(os.walk(lib)):
        if "site-packages" in root or "test" in root.split(os.sep):
            continue
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            try:
                with open(os.path.join(root, f), encoding="utf-8") as fh:
                    s = fh.read()
            except (OSError, UnicodeDecodeError):
                continue
            docs.append(s)
            total += len(s)
            if total > 3_000_000:
                break
        if total > 3_000_000:
            break
    multilingual = [c for c in CORPUS if c and not c.startswith(("a" * 10, " " * 10, "!" * 10))]
    docs.extend(multilingual * 20)
    return docs, total


def long_text():
    rnd = random.Random(7)
    lib = os.path.dirname(os.__file__)
    with open(os.path.join(lib, "argparse.py"), encoding="utf-8") as fh:
        src = fh.read()[:20000]
    parts = [src]
    for _ in range(200):
        parts.append(rnd.choice(CORPUS[1:]))
    return "\n".join(parts)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def tok_str(b):
    return "".join(B2U[x] for x in b)


def split_merges(pieces, index):
    """transformers' converters' merges: every split of a piece (pieces: (piece, key)
    pairs) into two pieces of index, each piece's splits in their halves' index
    order, as (left, right, key); the caller orders them by key (stably)."""
    merges = []
    for piece, key in pieces:
        local = [(piece[:i], piece[i:], key) for i in range(1, len(piece))
                 if piece[:i] in index and piece[i:] in index]
        local.sort(key=lambda x: (index[x[0]], index[x[1]]))
        merges.extend(local)
    return merges


def tiktoken_to_hf(ranks):
    """A rank file -> (vocab, merges), as transformers' TikTokenConverter does: every
    split of a token into two ranked tokens is a merge, ordered by the token's rank."""
    vocab = {tok_str(token): rank for token, rank in ranks.items()}
    merges = split_merges(ranks.items(), ranks)
    merges.sort(key=lambda x: x[2])
    return vocab, [[tok_str(l), tok_str(r)] for l, r, _ in merges]


def check_converter():
    ranks = {bytes([b]): b for b in range(256)}
    for w in [b"ab", b"abc", b"bc", b"abcd"]:
        ranks[w] = len(ranks)
    vocab, merges = tiktoken_to_hf(ranks)
    assert vocab[tok_str(b"abcd")] == ranks[b"abcd"]
    assert merges[0] == ["a", "b"] and ["ab", "c"] in merges and ["a", "bc"] in merges, merges
    log("converter self-check ok:", merges)


def record(tok, name, kind, extra=None):
    """The golden entries of one tokenizer."""
    g = {"name": name, "kind": kind, "vocab_size": tok.get_vocab_size(with_added_tokens=True), "cases": [],
         "invalid": [], "decode": []}
    for text in CORPUS:
        e = tok.encode(text, add_special_tokens=False)
        es = tok.encode(text, add_special_tokens=True)
        ids = list(e.ids)
        g["cases"].append({"text": text, "ids": ids, "ids_special": list(es.ids),
                           "decode": tok.decode(ids, skip_special_tokens=False),
                           "decode_skip": tok.decode(ids, skip_special_tokens=True)})
    for b in INVALID:
        s = b.decode("utf-8", "replace")
        g["invalid"].append({"hex": b.hex(), "ids": list(tok.encode(s, add_special_tokens=False).ids)})
    rnd = random.Random(1234)
    n = tok.get_vocab_size(with_added_tokens=True)
    for k in range(40):
        ids = [rnd.randrange(n) for _ in range(rnd.randint(1, 40))]
        if k % 4 == 0:  # bias towards byte tokens, whose concatenations are often not UTF-8
            ids = [rnd.randrange(256) for _ in ids]
        g["decode"].append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                            "text_skip": tok.decode(ids, skip_special_tokens=True)})
    lt = long_text()
    g["long"] = {"text": lt, "ids": list(tok.encode(lt, add_special_tokens=False).ids)}
    big = (lt + "\n") * (1_100_000 // (len(lt) + 1) + 1)  # > 1 MB, one encode call
    t0 = time.perf_counter()
    n_ids = len(tok.encode(big, add_special_tokens=False).ids)
    dt = time.perf_counter() - t0
    nb = len(big.encode("utf-8"))
    g["hf_encode_throughput"] = {"bytes": nb, "ids": n_ids, "seconds": dt, "mb_per_s": nb / dt / 1e6}
    log(f"{name}: HF encodes {nb} bytes in {dt:.3f} s ({nb / dt / 1e6:.1f} MB/s)")
    if extra:
        g.update(extra)
    return g


def build(out, name, js, log_f):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(js, f, ensure_ascii=False)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)  # exactly what specd reads
    log_f(f"{name}: {os.path.getsize(path)} bytes, vocab {tok.get_vocab_size(with_added_tokens=True)}")
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/tokenizer")
    ap.add_argument("--vocab", type=int, default=3000)
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args()
    docs, total = train_corpus()
    log(f"training corpus: {len(docs)} docs, {total} chars of stdlib, {len(CORPUS)} test strings")
    check_converter()
    if a.dry:
        for c in CORPUS:
            c.encode("utf-8")
        log("long text:", len(long_text()))
        return
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    import tokenizers
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers
    golden = {"format": 1, "tokenizers_version": tokenizers.__version__, "python": sys.version.split()[0],
              "made_by": "tools/golden/tokenizers.py", "tokenizers": []}
    logf = open(os.path.join(a.out, "log.txt"), "w")

    def L(*x):
        log(*x)
        print(*x, file=logf, flush=True)

    L("tokenizers", tokenizers.__version__)

    def train(pre, norm=None):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre
        if norm is not None:
            tok.normalizer = norm
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
        tok.train_from_iterator(docs, trainer=tr)
        return tok

    def save_golden():
        with open(os.path.join(a.out, "golden.json"), "w") as f:
            json.dump(golden, f, ensure_ascii=True)

    # ---- llama3ish
    try:
        tok = train(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]))
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in LLAMA3_SPECIAL])
        tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False, special=False),
                        AddedToken("custom_word", single_word=True, normalized=True, special=False)])
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", bos)])
        js = json.loads(tok.to_str())
        js["model"]["ignore_merges"] = True
        assert isinstance(js["model"]["merges"][0], list), "expected [a, b] merges"
        t = build(a.out, "llama3ish", js, L)
        golden["tokenizers"].append(record(t, "llama3ish", "llama3"))
        save_golden()
    except Exception as e:  # keep going: the other tokenizers are still useful
        L("llama3ish FAILED:", repr(e))

    # ---- deepseekish
    try:
        tok = train(pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DS_PATS] +
            [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]),
            normalizers.NFC())
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in DS_SPECIAL])
        tok.add_tokens([AddedToken("<think>", normalized=True, special=False),
                        AddedToken("</think>", normalized=True, special=False)])
        bos = tok.token_to_id(DS_SPECIAL[0])
        tok.post_processor = processors.TemplateProcessing(single=DS_SPECIAL[0] + " $A",
                                                           special_tokens=[(DS_SPECIAL[0], bos)])
        js = json.loads(tok.to_str())
        js["model"]["merges"] = [m if isinstance(m, str) else m[0] + " " + m[1] for m in js["model"]["merges"]]
        t = build(a.out, "deepseekish", js, L)
        golden["tokenizers"].append(record(t, "deepseekish", "deepseek3"))
        save_golden()
    except Exception as e:
        L("deepseekish FAILED:", repr(e))

    # ---- gpt2ish
    try:
        tok = train(pre_tokenizers.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True),
                    normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]))
        tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
        js = json.loads(tok.to_str())
        js["model"]["merges"] = [m if isinstance(m, str) else m[0] + " " + m[1] for m in js["model"]["merges"]]
        t = build(a.out, "gpt2ish", js, L)
        golden["tokenizers"].append(record(t, "gpt2ish", "gpt2"))
        save_golden()
    except Exception as e:
        L("gpt2ish FAILED:", repr(e))

    # ---- kimiish: rank file -> tokenizer.json
    try:
        tok = train(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(KIMI_PAT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]))
        # rank = id: the trainer numbers tokens in merge order after the alphabet
        ranks = {bytes(U2B[c] for c in s): i for s, i in tok.get_vocab().items()}
        rank_file = "".join(f"{base64.b64encode(k).decode()} {v}\n" for k, v in sorted(ranks.items(), key=lambda x: x[1]))
        vocab, merges = tiktoken_to_hf(ranks)
        nr = len(ranks)
        special = {s: nr + i for i, s in enumerate(KIMI_SPECIAL)}
        js = {"version": "1.0", "truncation": None, "padding": None,
              "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": True} for s, i in special.items()],
              "normalizer": None,
              "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                  {"type": "Split", "pattern": {"Regex": KIMI_PAT}, "behavior": "Isolated", "invert": False},
                  {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
              "post_processor": None,
              "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
              "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                        "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                        "ignore_merges": True, "vocab": vocab, "merges": merges}}
        t = build(a.out, "kimiish", js, L)
        with open(os.path.join(a.out, "kimiish", "tiktoken.model"), "w") as f:
            f.write(rank_file)
        extra = {}
        try:
            import tiktoken
            enc = tiktoken.Encoding(name="kimiish", pat_str=KIMI_PAT, mergeable_ranks=ranks, special_tokens=special)
            agree = 0
            tk_ids = []
            for text in CORPUS:
                ids_tk = enc.encode(text, allowed_special="all")
                tk_ids.append(ids_tk)
                agree += ids_tk == t.encode(text, add_special_tokens=False).ids
            extra = {"tiktoken_ids": tk_ids, "tiktoken_agree": agree}
            L(f"kimiish: tiktoken and HF agree on {agree}/{len(CORPUS)} corpus strings")
        except Exception as e:
            L("kimiish: tiktoken comparison skipped:", repr(e))
        golden["tokenizers"].append(record(t, "kimiish", "kimi", extra))
        save_golden()
    except Exception as e:
        L("kimiish FAILED:", repr(e))

    # tiktoken's published encodings need a download; look for a cached one only.
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", os.path.join("/tmp", "data-gym-cache"))
    L("tiktoken cache", cache, "has", os.listdir(cache) if os.path.isdir(cache) else "nothing",
      "(published encodings are not converted: none can be downloaded here)")
    L(f"done in {time.time() - t0:.1f} s: {[g['name'] for g in golden['tokenizers']]}")


if __name__ == "__main__":
    main()
