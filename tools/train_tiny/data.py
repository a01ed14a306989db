"""Corpus (the Python source of the machine the trainer runs on), the byte-level
BPE tokenizer, token streams and the n-gram baseline."""
import concurrent.futures as cf
import hashlib
import json
import os
import sys
import sysconfig
import time

import numpy as np

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
BOS, EOS, IM_START, IM_END, PAD = 0, 1, 2, 3, 4

# Qwen2's pre-tokenizer split (the Llama-3 one differs only in \p{N}{1,3}).
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

MAX_FILE_BYTES = 1 << 20  # larger .py files are generated tables, not code


def python_roots(exclude):
    """Directories of the interpreter's import path (stdlib + site-packages), deepest last."""
    cands = [p for p in sys.path if p]
    paths = sysconfig.get_paths()
    for k in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(k):
            cands.append(paths[k])
    try:
        import site

        cands += site.getsitepackages()
    except Exception:
        pass
    ex = os.path.realpath(exclude)
    roots = []
    for p in cands:
        if not os.path.isdir(p) or p.endswith(".zip"):
            continue
        r = os.path.realpath(p)
        if r == ex or r.startswith(ex + os.sep):
            continue  # the project's own tools are not corpus
        if r not in roots:
            roots.append(r)
    return sorted(roots)


def list_py(roots, exclude="/nonexistent"):
    """[(path, root, package)] for every *.py under the roots; a file belongs to the
    deepest root holding it; package = first path component below that root
    ('stdlib' for the standard library)."""
    rootset = set(roots)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    out, seen = [], set()
    for root in roots:
        for d, dirs, files in os.walk(root):
            keep = []
            for sd in sorted(dirs):
                full = os.path.realpath(os.path.join(d, sd))
                if full in rootset or sd == "__pycache__":
                    continue
                if sd in ("site-packages", "dist-packages") and full not in rootset:
                    continue
                keep.append(sd)
            dirs[:] = keep
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                p = os.path.join(d, f)
                rp = os.path.realpath(p)
                if rp in seen or rp.startswith(exclude + os.sep):
                    continue
                seen.add(rp)
                rel = os.path.relpath(p, root)
                first = rel.split(os.sep)[0]
                pkg = "stdlib" if root == stdlib else (first[:-3] if first.endswith(".py") else first)
                out.append((p, root, pkg))
    return out


def _read(item):
    p = item[0]
    try:
        if os.path.getsize(p) > MAX_FILE_BYTES:
            return None
        b = open(p, "rb").read()
        t = b.decode("utf-8")
    except Exception:
        return None
    if not t.strip():
        return None
    return item, t, hashlib.sha1(b).hexdigest(), len(b)


def build_corpus(exclude, heldout_pkgs, max_train_bytes, log, smoke_roots=None):
    """Returns dict with train docs, held-out docs (lists of str, deterministic order)
    and statistics. Duplicate contents are kept once (first by path order)."""
    t0 = time.time()
    roots = smoke_roots or python_roots(exclude)
    items = list_py(roots, os.path.realpath(exclude))
    log(f"corpus: {len(roots)} roots, {len(items)} .py files listed")
    with cf.ThreadPoolExecutor(32) as ex:
        read = list(ex.map(_read, items, chunksize=64))
    byhash = {}
    for r in read:
        if r is None:
            continue
        item, t, h, n = r
        if h in byhash:
            continue
        byhash[h] = (item[2], t, n, item[0])
    heldout_pkgs = set(heldout_pkgs)
    # deterministic order: by content hash (mixes packages; independent of walk order)
    order = sorted(byhash)
    train, held, pkg_bytes = [], [], {}
    tot_bytes = 0
    for h in order:
        pkg, t, n, p = byhash[h]
        tot_bytes += n
        pkg_bytes[pkg] = pkg_bytes.get(pkg, 0) + n
        (held if pkg in heldout_pkgs else train).append((h, t, n))
    ho_bytes = sum(n for _, _, n in held)
    used, used_bytes = [], 0
    for h, t, n in train:
        if used_bytes + n > max_train_bytes:
            continue
        used.append(t)
        used_bytes += n
    top = sorted(pkg_bytes.items(), key=lambda kv: -kv[1])[:25]
    stats = {
        "roots": roots,
        "files_listed": len(items),
        "files_unique": len(byhash),
        "bytes_unique": tot_bytes,
        "packages": len(pkg_bytes),
        "heldout_packages": {p: pkg_bytes.get(p, 0) for p in sorted(heldout_pkgs)},
        "heldout_files": len(held),
        "heldout_bytes": ho_bytes,
        "heldout_fraction_of_bytes": ho_bytes / max(tot_bytes, 1),
        "train_files_available": len(train),
        "train_bytes_available": tot_bytes - ho_bytes,
        "train_files_used": len(used),
        "train_bytes_used": used_bytes,
        "max_train_bytes": max_train_bytes,
        "largest_packages": top,
        "seconds": round(time.time() - t0, 1),
    }
    log("corpus: " + json.dumps({k: v for k, v in stats.items() if k not in ("roots", "largest_packages")}))
    return {"train": used, "heldout": [t for _, t, _ in held], "stats": stats}


# ----------------------------------------------------------------------------- tokenizer


def train_bpe(texts, vocab_size, outdir):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    assert tok.get_vocab_size() <= vocab_size, tok.get_vocab_size()
    tok.add_special_tokens(SPECIALS)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIALS[BOS]} $A",
        pair=f"{SPECIALS[BOS]} $A {SPECIALS[BOS]} $B",
        special_tokens=[(SPECIALS[BOS], BOS)],
    )
    os.makedirs(outdir, exist_ok=True)
    tok.save(os.path.join(outdir, "tokenizer.json"), pretty=False)  # compact: half the bytes
    write_tokenizer_config(outdir)
    return tok


def write_tokenizer_config(outdir):
    added = {
        str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
        for i, s in enumerate(SPECIALS)
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIALS[BOS],
        "eos_token": SPECIALS[EOS],
        "pad_token": SPECIALS[PAD],
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "added_tokens_decoder": added,
        "additional_special_tokens": [SPECIALS[IM_START], SPECIALS[IM_END]],
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(outdir, "special_tokens_map.json"), "w") as f:
        json.dump(
            {
                "bos_token": SPECIALS[BOS],
                "eos_token": SPECIALS[EOS],
                "pad_token": SPECIALS[PAD],
                "additional_special_tokens": [SPECIALS[IM_START], SPECIALS[IM_END]],
            },
            f,
            indent=2,
        )
        f.write("\n")


def load_bpe(outdir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(outdir, "tokenizer.json"))


class WhitespaceTok:
    """Stand-in for the smoke test only (no tokenizers package on the CPU box):
    the most frequent whitespace-separated words, everything else one id."""

    def __init__(self, texts, vocab_size):
        from collections import Counter

        c = Counter(w for t in texts for w in t.split())
        self.words = {w: i + len(SPECIALS) + 1 for i, (w, _) in enumerate(c.most_common(vocab_size - len(SPECIALS) - 1))}
        self.unk = len(SPECIALS)

    def ids(self, t):
        return [self.words.get(w, self.unk) for w in t.split()]


def encode_docs(tok, texts, log, what):
    """Token stream: for every document [BOS] ids [EOS]. uint16."""
    t0 = time.time()
    parts = []
    ntok = 0
    B = 4096
    for s in range(0, len(texts), B):
        chunk = texts[s : s + B]
        if isinstance(tok, WhitespaceTok):
            encs = [tok.ids(t) for t in chunk]
        else:
            f = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
            encs = [e.ids for e in f(chunk, add_special_tokens=False)]
        for ids in encs:
            a = np.empty(len(ids) + 2, dtype=np.uint16)
            a[0] = BOS
            a[1:-1] = ids
            a[-1] = EOS
            parts.append(a)
            ntok += len(a)
    arr = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
    log(f"tokenize {what}: {len(texts)} docs -> {ntok} tokens in {time.time() - t0:.1f}s")
    return arr


# ----------------------------------------------------------------------------- n-gram baseline


def _lookup(u, n, keys):
    if len(u) == 0:
        return np.zeros(len(keys), np.int64)
    i = np.minimum(np.searchsorted(u, keys), len(u) - 1)
    return np.where(u[i] == keys, n[i], 0)


def ngram_baseline(train, windows, V, out_path, max_train_tokens):
    """Interpolated trigram/bigram/add-one-unigram LM (Jelinek-Mercer; weights picked
    on the last 1M train tokens). Writes {nll, ...} for the labels windows[:, 1:]
    with window-local context, the same positions the models are scored on."""
    t0 = time.time()
    a = np.asarray(train[:max_train_tokens], dtype=np.int64)
    ntune = min(1_000_000, len(a) // 10)
    tune, a = a[len(a) - ntune :], a[: len(a) - ntune]
    N = len(a)
    c1 = np.bincount(a, minlength=V).astype(np.int64)
    u2, n2 = np.unique(a[:-1] * V + a[1:], return_counts=True)
    u3, n3 = np.unique((a[:-2] * V + a[1:-1]) * V + a[2:], return_counts=True)
    ctx1 = np.bincount(a[:-1], minlength=V).astype(np.int64)

    def parts(x2, x1, y, has3):
        p1 = (c1[y] + 1.0) / (N + V)
        cb = ctx1[x1]
        p2 = _lookup(u2, n2, x1 * V + y) / np.maximum(cb, 1)
        m2 = (cb > 0).astype(np.float64)
        cab = _lookup(u2, n2, x2 * V + x1)
        p3 = _lookup(u3, n3, (x2 * V + x1) * V + y) / np.maximum(cab, 1)
        m3 = ((cab > 0) & has3).astype(np.float64)
        return p1, p2, m2, p3, m3

    def nll(pp, lam):
        p1, p2, m2, p3, m3 = pp
        l3, l2, l1 = lam
        p = (l3 * m3 * p3 + l2 * m2 * p2 + l1 * p1) / (l3 * m3 + l2 * m2 + l1)
        return float(-np.log(p).mean())

    tp = parts(tune[:-2], tune[1:-1], tune[2:], np.ones(len(tune) - 2, bool))
    best = None
    for l3 in (0.3, 0.45, 0.6, 0.75):
        for l2 in (0.15, 0.25, 0.35):
            l1 = 1.0 - l3 - l2
            if l1 <= 0.0:
                continue
            v = nll(tp, (l3, l2, l1))
            if best is None or v < best[0]:
                best = (v, (l3, l2, l1))
    w = np.asarray(windows, dtype=np.int64)
    S = w.shape[1] - 1
    # label t (1..S) has context w[t-1] and, for t >= 2, w[t-2]
    y = w[:, 1:].reshape(-1)
    x1 = w[:, :-1].reshape(-1)
    x2 = np.concatenate([np.zeros((w.shape[0], 1), np.int64), w[:, :-2]], 1).reshape(-1)
    has3 = np.tile(np.arange(S) >= 1, w.shape[0])
    res = {
        "model": "interpolated trigram (Jelinek-Mercer: trigram/bigram ML + add-one unigram)",
        "lambdas_trigram_bigram_unigram": best[1],
        "tune_nll": best[0],
        "train_tokens": int(N),
        "heldout_nll": nll(parts(x2, x1, y, has3), best[1]),
        "heldout_tokens": int(len(y)),
        "seconds": round(time.time() - t0, 1),
    }
    with open(out_path, "w") as f:
        json.dump(res, f)
    return res


if __name__ == "__main__":
    # background n-gram job: data.py ngram TRAIN.npy WINDOWS.npy V OUT.json MAX_TRAIN_TOKENS
    if len(sys.argv) == 7 and sys.argv[1] == "ngram":
        ngram_baseline(np.load(sys.argv[2], mmap_mode="r"), np.load(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
