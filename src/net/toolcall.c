/* net/toolcall: tool calls out of the model's text (see toolcall.h). */
#include "net/toolcall.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/tokenizer.h"
#include "core/util.h"

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";
/* Kimi-K2's special tokens */
static const char K_SEC[] = "<|tool_calls_section_begin|>", K_SEC_END[] = "<|tool_calls_section_end|>",
                  K_CALL[] = "<|tool_call_begin|>", K_ARGS[] = "<|tool_call_argument_begin|>",
                  K_CALL_END[] = "<|tool_call_end|>";

void sd_tool_call_free(sd_tool_call *c)
{
    free(c->name);
    free(c->arguments);
    c->name = c->arguments = NULL;
}

void sd_tc_init(sd_tc_parser *p, sd_tool_format format, int max_calls, uint64_t id_key, sd_tc_emit emit,
                void *arg)
{
    memset(p, 0, sizeof *p);
    p->format = format;
    int kimi = format == SD_TOOLS_KIMI;
    p->open = kimi ? K_SEC : OPEN;
    p->close = kimi ? K_SEC_END : CLOSE;
    p->open_len = strlen(p->open);
    p->close_len = strlen(p->close);
    p->max_calls = max_calls;
    p->id_key = id_key;
    p->emit = emit;
    p->arg = arg;
}

void sd_tc_free(sd_tc_parser *p) { sd_buf_free(&p->hold); }

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static const char *skip_ws(const char *s, const char *end)
{
    while (s < end && is_ws(*s))
        s++;
    return s;
}

static int only_space(const char *s, size_t n) { return skip_ws(s, s + n) == s + n; }

/* The longest suffix of s[0..n) that begins tag (a tag split across feeds). */
static size_t partial_tag(const char *s, size_t n, const char *tag, size_t tl)
{
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

static int emit_text(sd_tc_parser *p, const char *s, size_t n)
{
    return n ? p->emit(p->arg, s, n, NULL) : 0;
}

/* A call: {"name": string, "arguments": object or JSON text} (Llama and some
 * others write "parameters"). 1 and c filled, 0 not a call, -1 no memory. */
static int call_of(const json_t *o, sd_tool_call *c)
{
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    int ok = json_is_object(o) && json_is_string(name) && json_string_length(name) > 0 &&
             strlen(json_string_value(name)) == json_string_length(name) &&
             (!args || json_is_object(args) || json_is_string(args));
    if (!ok)
        return 0;
    sd_sbuf a = {0};
    int rc = !args                   ? sd_sbuf_put(&a, "{}", 2)
             : json_is_string(args) ? sd_sbuf_put(&a, json_string_value(args), json_string_length(args))
                                    : sd_py_json_dumps(&a, args);
    c->name = rc ? NULL : strdup(json_string_value(name));
    c->arguments = rc ? NULL : sd_sbuf_take(&a, NULL);
    sd_sbuf_free(&a);
    if (!c->name || !c->arguments) {
        sd_tool_call_free(c);
        return -1;
    }
    return 1;
}

/* Gives c an id (where it has none of the model's) and emits it, or drops it
 * past max_calls. */
static int emit_call(sd_tc_parser *p, sd_tool_call *c)
{
    if (p->max_calls && p->n_calls >= p->max_calls)
        return 0;
    if (c->id[0]) {
        p->n_calls++;
        return p->emit(p->arg, NULL, 0, c);
    }
    static const char AL[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t h = sd_mix64(p->id_key ^ sd_mix64((uint64_t)p->n_calls + 1));
    memcpy(c->id, "call_", 5);
    for (int i = 0; i < 24; i++) {
        if (i % 10 == 0)
            h = sd_mix64(h + (uint64_t)i);
        c->id[5 + i] = AL[h % 62];
        h /= 62;
    }
    c->id[29] = 0;
    p->n_calls++;
    return p->emit(p->arg, NULL, 0, c);
}

/* Kimi-K2's section s[0..n): calls <|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>,
 * the name from the id (functions.NAME:I). 1 all read into c (*nc), 0 not
 * calls, -1 no memory. */
static int kimi_calls(const char *s, size_t n, sd_tool_call *c, int cap, int *nc)
{
    const char *p = s, *end = s + n;
    *nc = 0;
    for (;;) {
        p = skip_ws(p, end);
        if (p == end)
            return *nc > 0;
        size_t lc = strlen(K_CALL), la = strlen(K_ARGS), le = strlen(K_CALL_END);
        if ((size_t)(end - p) < lc || memcmp(p, K_CALL, lc) || *nc == cap)
            return 0;
        const char *id = p + lc, *a = memmem(id, (size_t)(end - id), K_ARGS, la);
        const char *ae = a ? memmem(a + la, (size_t)(end - a - la), K_CALL_END, le) : NULL;
        if (!ae)
            return 0;
        const char *ide = a;
        while (ide > id && is_ws(ide[-1]))
            ide--;
        id = skip_ws(id, ide);
        /* the name: past "functions.", before ":I" */
        const char *nm = (size_t)(ide - id) > 10 && !memcmp(id, "functions.", 10) ? id + 10 : id, *ne = ide;
        for (const char *q = ide; q > nm; q--)
            if (q[-1] == ':') {
                ne = q - 1;
                break;
            }
        if (ne == nm || (size_t)(ide - id) >= sizeof c[0].id || memchr(id, 0, (size_t)(ide - id)))
            return 0;
        json_error_t je;
        json_t *o = json_loadb(a + la, (size_t)(ae - a - la), JSON_REJECT_DUPLICATES, &je);
        sd_tool_call *k = &c[*nc];
        memset(k, 0, sizeof *k);
        int ok = json_is_object(o);
        sd_sbuf args = {0};
        if (ok && (sd_py_json_dumps(&args, o) || !(k->arguments = sd_sbuf_take(&args, NULL)) ||
                   !(k->name = strndup(nm, (size_t)(ne - nm))))) {
            json_decref(o);
            sd_sbuf_free(&args);
            sd_tool_call_free(k);
            return -1;
        }
        json_decref(o);
        sd_sbuf_free(&args);
        if (!ok)
            return 0;
        memcpy(k->id, id, (size_t)(ide - id));
        k->id[ide - id] = 0;
        (*nc)++;
        p = ae + le;
    }
}

/* The held text holds a whole body (a hermes call, or Kimi's calls) up to
 * the closing tag at k. */
static int close_call(sd_tc_parser *p, size_t k)
{
    sd_tool_call c[16];
    int nc = 0, r, rc = 0;
    memset(c, 0, sizeof c);
    if (p->format == SD_TOOLS_KIMI) {
        r = kimi_calls(p->hold.p, k, c, 16, &nc);
    } else {
        json_error_t je;
        json_t *o = json_loadb(p->hold.p, k, JSON_REJECT_DUPLICATES, &je);
        r = call_of(o, &c[0]);
        nc = r > 0;
        json_decref(o);
    }
    if (r < 0)
        rc = SD_ENOMEM;
    else if (r == 0 && !(rc = emit_text(p, p->open, p->open_len))) /* not calls: the block stays as written */
        rc = emit_text(p, p->hold.p, k + p->close_len);
    for (int i = 0; i < nc; i++) {
        if (!rc && r > 0)
            rc = emit_call(p, &c[i]);
        sd_tool_call_free(&c[i]);
    }
    if (rc)
        return rc;
    sd_buf_consume(&p->hold, k + p->close_len);
    p->in_call = 0;
    p->seg_text = 0; /* a new stretch between tags */
    return rc;
}

/* Works through what is held as far as it can be decided. */
static int advance(sd_tc_parser *p, int end)
{
    for (;;) {
        const char *h = p->hold.p ? p->hold.p : "";
        size_t n = p->hold.len;
        if (p->in_call) {
            const char *c = n ? memmem(h, n, p->close, p->close_len) : NULL;
            if (c) {
                int rc = close_call(p, (size_t)(c - h));
                if (rc)
                    return rc;
                continue;
            }
            if (!end)
                return 0;
            /* the output ended inside a call: it stays content */
            int rc = emit_text(p, p->open, p->open_len);
            if (!rc)
                rc = emit_text(p, h, n);
            sd_buf_clear(&p->hold);
            p->in_call = 0;
            return rc;
        }
        const char *o = n ? memmem(h, n, p->open, p->open_len) : NULL;
        size_t text = o ? (size_t)(o - h) : end ? n : n - partial_tag(h, n, p->open, p->open_len);
        /* after a call, a stretch between tags of whitespace alone is not
         * content (the newlines between calls): its whitespace is held until
         * something else comes in it, and dropped where it ends */
        int rc = 0;
        if (!(p->n_calls && !p->seg_text && only_space(h, text))) {
            rc = emit_text(p, h, text);
            p->seg_text |= text > 0;
        } else if (!o && !end) {
            return 0; /* keep the whitespace: text may follow */
        }
        if (rc)
            return rc;
        if (!o) {
            sd_buf_consume(&p->hold, text);
            if (end)
                sd_buf_clear(&p->hold);
            return 0;
        }
        sd_buf_consume(&p->hold, text + p->open_len);
        p->in_call = 1;
    }
}

/* json: the held reply, whole, as calls: *called 1 when it was (and they went
 * out); 0 or an error */
static int json_calls(sd_tc_parser *p, int *called)
{
    *called = 0;
    const char *s = p->hold.p;
    size_t n = p->hold.len, at = 0;
    sd_tool_call c[16];
    int nc = 0, r = 1;
    while (r > 0) {
        at = (size_t)(skip_ws(s + at, s + n) - s);
        if (at == n)
            break;
        if (nc && s[at] == ';') { /* calls joined by ";" */
            at++;
            continue;
        }
        if (nc == (int)(sizeof c / sizeof c[0])) { /* more calls than kept: the reply is content */
            r = 0;
            break;
        }
        json_error_t je;
        json_t *o = json_loadb(s + at, n - at, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &je);
        memset(&c[nc], 0, sizeof c[nc]);
        r = json_is_object(o) ? call_of(o, &c[nc]) : 0;
        json_decref(o);
        if (r > 0) {
            at += (size_t)je.position;
            nc++;
        }
    }
    int rc = r < 0 ? SD_ENOMEM : 0;
    *called = r > 0 && nc > 0;
    for (int i = 0; i < nc; i++) {
        if (!rc && *called)
            rc = emit_call(p, &c[i]);
        sd_tool_call_free(&c[i]);
    }
    return rc;
}

/* json: see toolcall.h */
static int advance_json(sd_tc_parser *p, int end)
{
    const char *h = p->hold.p ? p->hold.p : "";
    size_t n = p->hold.len;
    if (p->json_state == 0) {
        size_t k = (size_t)(skip_ws(h, h + n) - h);
        if (k < n)
            p->json_state = h[k] == '{' ? 2 : 1;
    }
    if (p->json_state == 1 || (end && p->json_state == 0)) {
        int rc = emit_text(p, h, n);
        sd_buf_clear(&p->hold);
        return rc;
    }
    if (!end)
        return 0; /* a reply that may be calls: held to its end */
    int called;
    int rc = json_calls(p, &called);
    if (!rc && !called)
        rc = emit_text(p, h, n); /* not calls: the reply is content, as written */
    sd_buf_clear(&p->hold);
    return rc;
}

int sd_tc_feed(sd_tc_parser *p, const char *text, size_t len)
{
    if (len && sd_buf_append(&p->hold, text, len))
        return SD_ENOMEM;
    return p->format == SD_TOOLS_JSON ? advance_json(p, 0) : advance(p, 0);
}

int sd_tc_end(sd_tc_parser *p) { return p->format == SD_TOOLS_JSON ? advance_json(p, 1) : advance(p, 1); }
