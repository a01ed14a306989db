/* libFuzzer target over the tokenizer and the chat templates.
 *
 * The first input byte picks a mode; the rest is the text (or ids):
 *   0  kimiish (no normalizer): decode(encode(s)) == s with ill-formed UTF-8 repaired
 *   1  deepseekish (NFC, several Split regexes): encode; stream decode == decode
 *   2  gpt2ish (NFKC + Lowercase, ByteLevel prefix space and regex): encode, decode
 *   3  the bytes as little-endian u16 ids (some out of range): decode == streamed
 *      decode in chunks picked by the data; out of range is SD_ERANGE, never a crash
 *   4  llama3ish chat render of messages split at NUL bytes, then encode
 *   5  the text as a tokenization_*.py: the tiktoken split pattern read from it
 *      (a hand-written parser of Python literals); found, it is a string of at
 *      most the source's bytes plus what escapes add
 *   6  mistralish (SentencePiece BPE: Metaspace, byte fallback, the Strip decoder): encode;
 *      stream decode == decode
 *   7  llama2ish (the same model, Prepend + Replace normalizers): as 6
 *   8  Mistral's [INST] chat render (v0.3's form, by name) of messages split at
 *      NUL bytes, mostly in turn (a content starting with '!' takes the role
 *      out of turn), then mistralish encode; a refusal (SD_EINVAL /
 *      SD_ENOTSUP) is an answer, anything else an error
 *   9  the same with Llama 2's template and llama2ish
 * A broken property aborts, which libFuzzer reports with the input.
 *
 * Build: meson setup build-fuzz -Dfuzz=true (CC=clang), or directly with clang as
 * tests/core/test_fuzz_tokenizer.sh does. SD_FUZZ_SRCDIR locates the fixtures. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tok_internal.h"
#include "core/tokenizer.h"
#include "core/utf8.h"

#ifndef SD_FUZZ_SRCDIR
#define SD_FUZZ_SRCDIR "."
#endif

static const char *const NAMES[] = {"kimiish", "deepseekish", "gpt2ish", "llama3ish", "mistralish", "llama2ish"};

/* Loaded once for the whole run (a harness, not library code). */
static sd_tokenizer *tok[6];
static sd_chat_template *chat, *chat_inst[2]; /* llama3ish; mistral, llama2 */

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, msg);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *src = getenv("SD_SRCDIR") ? getenv("SD_SRCDIR") : SD_FUZZ_SRCDIR;
    for (int i = 0; i < 6; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/golden/tokenizer/%s", src, NAMES[i]);
        sd_err err = {0};
        if (sd_tok_load(&tok[i], path, &err))
            die(path, err.msg);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/tokenizer/llama3ish", src);
    sd_err err = {0};
    if (sd_chat_template_load(&chat, path, "auto", &err))
        die(path, err.msg);
    if (sd_chat_template_load(&chat_inst[0], NULL, "mistral", &err) ||
        sd_chat_template_load(&chat_inst[1], NULL, "llama2", &err))
        die("[INST] templates", err.msg);
    return 0;
}

/* decode(ids) pushed in chunks of sizes taken from sizes[] must equal the full decode. */
static void check_stream(const sd_tokenizer *t, const int32_t *ids, int n, int skip, const uint8_t *sizes, size_t ns)
{
    sd_err err = {0};
    char *full;
    size_t flen;
    if (sd_tok_decode(t, ids, n, skip, &full, &flen, &err))
        die("decode", err.msg);
    sd_detok *d;
    if (sd_detok_new(&d, t, skip, &err))
        die("detok_new", err.msg);
    sd_sbuf acc = {0};
    size_t k = 0;
    for (int i = 0; i < n;) {
        int c = 1 + (ns ? sizes[k++ % ns] % 5 : 0);
        if (c > n - i)
            c = n - i;
        char *s;
        size_t l;
        if (sd_detok_push(d, ids + i, c, &s, &l, &err))
            die("detok_push", err.msg);
        if (!sd_utf8_valid(s, l))
            die("detok_push", "emitted ill-formed UTF-8");
        sd_sbuf_put(&acc, s, l);
        free(s);
        i += c;
    }
    char *s;
    size_t l;
    if (sd_detok_flush(d, &s, &l))
        die("detok_flush", "failed");
    sd_sbuf_put(&acc, s, l);
    free(s);
    if (acc.len != flen || (flen && memcmp(acc.p, full, flen)))
        die("stream", "streamed decode differs from the full decode");
    sd_sbuf_free(&acc);
    sd_detok_free(d);
    free(full);
}

static void encode_checks(const sd_tokenizer *t, const char *text, size_t len, int roundtrip, const uint8_t *data,
                          size_t size)
{
    sd_err err = {0};
    int32_t *ids;
    int n;
    if (sd_tok_encode(t, text, len, 0, &ids, &n, &err))
        die("encode", err.msg);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= sd_tok_vocab_size(t))
            die("encode", "id out of range");
    if (roundtrip) {
        char *back;
        size_t blen;
        if (sd_tok_decode(t, ids, n, 0, &back, &blen, &err))
            die("decode", err.msg);
        sd_sbuf want = {0};
        sd_utf8_repair(&want, text, len, 1);
        if (blen != want.len || (blen && memcmp(back, want.p, blen)))
            die("roundtrip", "decode(encode(s)) != s");
        sd_sbuf_free(&want);
        free(back);
    }
    check_stream(t, ids, n, (int)(size & 1), data, size);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int mode = data[0] % 10;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    switch (mode) {
    case 0:
    case 1:
    case 2:
        encode_checks(tok[mode], text, len, mode == 0, data, size);
        break;
    case 3: {
        int n = (int)(len / 2);
        int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
        int vs = sd_tok_vocab_size(tok[3]), in_range = 1;
        for (int i = 0; i < n; i++) {
            ids[i] = (int32_t)(data[1 + 2 * i] | data[2 + 2 * i] << 8) % (vs + 8);
            in_range &= ids[i] < vs;
        }
        sd_err err = {0};
        char *s = NULL;
        size_t l;
        int rc = sd_tok_decode(tok[3], ids, n, 0, &s, &l, &err);
        if (in_range ? rc != 0 : rc != SD_ERANGE)
            die("decode", in_range ? err.msg : "an out-of-range id was not refused");
        if (!rc && !sd_utf8_valid(s, l))
            die("decode", "ill-formed UTF-8 out");
        free(s);
        if (in_range)
            check_stream(tok[3], ids, n, data[0] & 1, data, size);
        free(ids);
        break;
    }
    case 4: {
        /* messages: NUL-separated contents, roles cycling system/user/assistant/tool */
        static const char *const roles[] = {"system", "user", "assistant", "tool"};
        sd_chat_msg m[8];
        char *copy = malloc(len + 1);
        memcpy(copy, text, len);
        copy[len] = 0;
        int n = 0;
        for (char *p = copy; n < 8 && p <= copy + len; p += strlen(p) + 1) {
            m[n] = (sd_chat_msg){.role = roles[(n + data[0]) % 4], .content = p};
            n++;
        }
        sd_err err = {0};
        char *out;
        size_t olen;
        if (sd_chat_render(chat, m, n, data[0] & 1, &out, &olen, &err))
            die("chat_render", err.msg);
        encode_checks(tok[3], out, olen, 0, data, size);
        free(out);
        free(copy);
        break;
    }
    case 6:
    case 7:
        encode_checks(tok[mode - 2], text, len, 0, data, size);
        break;
    case 8:
    case 9: {
        /* an optional system message, then user / assistant in turn; '!'
         * first: the role after the one in turn (tool after assistant) */
        static const char *const roles[] = {"user", "assistant", "tool"};
        sd_chat_msg m[8];
        char *copy = malloc(len + 1);
        memcpy(copy, text, len);
        copy[len] = 0;
        int n = 0, turn = 0;
        for (char *p = copy; n < 8 && p <= copy + len; p += strlen(p) + 1) {
            const char *role = n == 0 && (data[0] & 16) ? "system" : roles[turn % 2 + (*p == '!')];
            if (strcmp(role, "system"))
                turn++;
            m[n++] = (sd_chat_msg){.role = role, .content = p};
        }
        sd_err err = {0};
        char *out;
        size_t olen;
        int rc = sd_chat_render(chat_inst[mode - 8], m, n, data[0] & 1, &out, &olen, &err);
        if (rc && rc != SD_EINVAL && rc != SD_ENOTSUP)
            die("chat_render [INST]", err.msg);
        if (!rc) {
            if (olen != strlen(out))
                die("chat_render [INST]", "length");
            encode_checks(tok[mode - 4], out, olen, 0, data, size);
            free(out);
        }
        free(copy);
        break;
    }
    case 5: {
        sd_sbuf pat = {0};
        int r = sd__tiktoken_pattern_of_source(text, len, &pat);
        /* an escape makes at most 4 bytes of 6 or more (\UXXXXXXXX), 1 of 2 else */
        if (r < 0 || (r == 1 && pat.len > len))
            die("tiktoken pattern", r < 0 ? "out of memory" : "longer than its source");
        sd_sbuf_free(&pat);
        break;
    }
    }
    return 0;
}
