/* net/toolcall: tool calls out of the model's text (see toolcall.h). */
#include "net/toolcall.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/tokenizer.h"
#include "core/util.h"

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";

/* The formats whose calls come in a section of special tokens: the section's
 * tags, and each call's: CALL HEAD SEP BODY CALL_END. Kimi-K2: HEAD is the
 * id (functions.NAME:I), BODY the arguments; DeepSeek V3.1: HEAD the name,
 * BODY the arguments; DeepSeek V3 / R1: HEAD the type (function), BODY the
 * name, a newline and the arguments in a json fence. */
typedef struct section_fmt {
    const char *sec, *sec_end, *call, *sep, *call_end;
} section_fmt;
static const section_fmt KIMI = {SD_KIMI_CALLS, SD_KIMI_CALLS_END, SD_KIMI_CALL, SD_KIMI_ARGS, SD_KIMI_CALL_END};
static const section_fmt DEEPSEEK = {SD_DS_CALLS, SD_DS_CALLS_END, SD_DS_CALL, SD_DS_SEP, SD_DS_CALL_END};

static const section_fmt *section_of(sd_tool_format f)
{
    return f == SD_TOOLS_KIMI ? &KIMI : f == SD_TOOLS_DEEPSEEK3 || f == SD_TOOLS_DEEPSEEK31 ? &DEEPSEEK : NULL;
}

int sd_tc_keeps_special(sd_tool_format f) { return section_of(f) != NULL; }

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
    const section_fmt *sec = section_of(format);
    p->open = sec ? sec->sec : OPEN;
    p->close = sec ? sec->sec_end : CLOSE;
    p->open_len = strlen(p->open);
    p->close_len = strlen(p->close);
    p->max_calls = max_calls;
    p->id_key = id_key;
    p->emit = emit;
    p->arg = arg;
}

void sd_tc_init_forced(sd_tc_parser *p, const char *name, int max_calls, uint64_t id_key,
                       sd_tc_emit emit, void *arg)
{
    sd_tc_init(p, SD_TOOLS_JSON, max_calls, id_key, emit, arg);
    p->forced_list = !name;
    if (name)
        snprintf(p->forced_name, sizeof p->forced_name, "%s", name);
}

void sd_tc_free(sd_tc_parser *p) { sd_buf_free(&p->hold); }


static const char *skip_ws(const char *s, const char *end)
{
    while (s < end && sd_json_ws(*s))
        s++;
    return s;
}

static int only_space(const char *s, size_t n) { return skip_ws(s, s + n) == s + n; }

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

/* A call's arguments: the JSON object at s[0..n) (whitespace around it
 * aside) as json.dumps prints it into k->arguments. 1, 0 not an object, -1
 * no memory. */
static int args_of(const char *s, size_t n, sd_tool_call *k)
{
    json_error_t je;
    json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
    int ok = json_is_object(o);
    sd_sbuf b = {0};
    if (ok && (sd_py_json_dumps(&b, o) || !(k->arguments = sd_sbuf_take(&b, NULL))))
        ok = -1;
    json_decref(o);
    sd_sbuf_free(&b);
    return ok;
}

static const char *trim_end(const char *s, const char *e)
{
    while (e > s && sd_json_ws(e[-1]))
        e--;
    return e;
}

/* One call's head h[0..hn) and body b[0..bn) in format f into k (see
 * section_fmt): 1, 0 not a call, -1 no memory. */
static int section_call(sd_tool_format f, const char *h, size_t hn, const char *b, size_t bn, sd_tool_call *k)
{
    const char *he = trim_end(h, h + hn), *be = b + bn;
    h = skip_ws(h, he);
    const char *nm = h, *ne = he; /* the name */
    if (f == SD_TOOLS_KIMI) { /* functions.NAME:I, kept as the call's id */
        if ((size_t)(he - h) >= sizeof k->id)
            return 0;
        if ((size_t)(he - h) > 10 && !memcmp(h, "functions.", 10))
            nm = h + 10;
        for (const char *q = he; q > nm; q--)
            if (q[-1] == ':') {
                ne = q - 1;
                break;
            }
    } else if (f == SD_TOOLS_DEEPSEEK3) { /* the type, then the body: NAME\n```json\n{...}\n``` */
        nm = skip_ws(b, be);
        ne = nm;
        while (ne < be && *ne != '\n')
            ne++;
        b = skip_ws(ne, be);
        ne = trim_end(nm, ne);
        if ((size_t)(be - b) >= 3 && !memcmp(b, "```", 3)) { /* the fence, its language word */
            b += 3;
            while (b < be && !sd_json_ws(*b))
                b++;
            be = trim_end(b, be);
            if ((size_t)(be - b) < 3 || memcmp(be - 3, "```", 3))
                return 0;
            be -= 3;
        }
    }
    if (ne <= nm || he <= h || memchr(nm, 0, (size_t)(ne - nm)) || memchr(h, 0, (size_t)(he - h)))
        return 0;
    for (const char *q = nm; q < ne && f != SD_TOOLS_KIMI; q++)
        if (sd_json_ws(*q))
            return 0; /* a function's name has no spaces */
    int r = args_of(b, (size_t)(be - b), k);
    if (r <= 0)
        return r;
    if (!(k->name = strndup(nm, (size_t)(ne - nm)))) {
        sd_tool_call_free(k);
        return -1;
    }
    if (f == SD_TOOLS_KIMI) {
        memcpy(k->id, h, (size_t)(he - h));
        k->id[he - h] = 0;
    }
    return 1;
}

/* A section's body s[0..n): calls CALL HEAD SEP BODY CALL_END, whitespace
 * between them. 1 all read into c (*nc), 0 not calls, -1 no memory. */
static int section_calls(sd_tool_format f, const char *s, size_t n, sd_tool_call *c, int cap, int *nc)
{
    const section_fmt *sf = section_of(f);
    const size_t lc = strlen(sf->call), ls = strlen(sf->sep), le = strlen(sf->call_end);
    const char *p = s, *end = s + n;
    *nc = 0;
    for (;;) {
        p = skip_ws(p, end);
        if (p == end)
            return *nc > 0;
        if ((size_t)(end - p) < lc || memcmp(p, sf->call, lc) || *nc == cap)
            return 0;
        const char *h = p + lc, *sep = memmem(h, (size_t)(end - h), sf->sep, ls);
        const char *ce = sep ? memmem(sep + ls, (size_t)(end - sep - ls), sf->call_end, le) : NULL;
        if (!ce)
            return 0;
        sd_tool_call *k = &c[*nc];
        memset(k, 0, sizeof *k);
        int r = section_call(f, h, (size_t)(sep - h), sep + ls, (size_t)(ce - sep - ls), k);
        if (r <= 0)
            return r;
        (*nc)++;
        p = ce + le;
    }
}

/* The held text holds a whole body (a hermes call, or Kimi's calls) up to
 * the closing tag at k. */
static int close_call(sd_tc_parser *p, size_t k)
{
    sd_tool_call c[16];
    int nc = 0, r, rc = 0;
    memset(c, 0, sizeof c);
    if (section_of(p->format)) {
        r = section_calls(p->format, p->hold.p, k, c, 16, &nc);
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
        size_t text = o ? (size_t)(o - h) : end ? n : n - sd_tag_tail(h, n, p->open, p->open_len);
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

/* a forced call's reply, whole: its calls, or content where it is not one */
static int forced_calls(sd_tc_parser *p)
{
    const char *h = p->hold.p ? p->hold.p : "";
    const size_t n = p->hold.len;
    int rc = 0, called = 0;
    if (!p->forced_list) {
        sd_tool_call c;
        memset(&c, 0, sizeof c);
        int r = args_of(h, n, &c);
        if (r > 0 && !(c.name = strdup(p->forced_name)))
            r = -1;
        if (r < 0)
            rc = SD_ENOMEM;
        else if (r > 0 && !(rc = emit_call(p, &c)))
            called = 1;
        sd_tool_call_free(&c);
    } else {
        json_error_t je;
        json_t *a = json_loadb(h, n, JSON_REJECT_DUPLICATES, &je);
        const size_t k = json_array_size(a);
        sd_tool_call *c = k ? calloc(k, sizeof *c) : NULL;
        int r = json_is_array(a) && k > 0 ? (c ? 1 : -1) : 0;
        for (size_t i = 0; r > 0 && i < k; i++)
            r = call_of(json_array_get(a, i), &c[i]);
        if (r < 0)
            rc = SD_ENOMEM;
        for (size_t i = 0; r > 0 && !rc && i < k; i++)
            rc = emit_call(p, &c[i]);
        called = r > 0 && !rc;
        for (size_t i = 0; c && i < k; i++)
            sd_tool_call_free(&c[i]);
        free(c);
        json_decref(a);
    }
    if (!rc && !called)
        rc = emit_text(p, h, n); /* not the call forced: the reply is content */
    sd_buf_clear(&p->hold);
    return rc;
}

int sd_tc_feed(sd_tc_parser *p, const char *text, size_t len)
{
    if (len && sd_buf_append(&p->hold, text, len))
        return SD_ENOMEM;
    if (p->forced_name[0] || p->forced_list)
        return 0; /* held to the end */
    return p->format == SD_TOOLS_JSON ? advance_json(p, 0) : advance(p, 0);
}

int sd_tc_end(sd_tc_parser *p)
{
    if (p->forced_name[0] || p->forced_list)
        return forced_calls(p);
    return p->format == SD_TOOLS_JSON ? advance_json(p, 1) : advance(p, 1);
}
