/* core/chat_template: the published Jinja chat templates of the families specd
 * serves, written out in C for text messages (no images); tools and tool calls
 * for the templates whose tool format is written out (Qwen2.5's and Qwen3's
 * chatml, Llama 3.1's and 3.2's, DeepSeek's, Kimi-K2's; sd_chat_render_kw), the
 * templates' tojson as Python's json.dumps.
 * Each renderer follows its template statement by statement; the golden test
 * (tests/core/test_chat_template.c) compares them with Jinja's output on the
 * real templates (tests/golden/tokenizer/chat/). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/tokenizer.h"
#include "core/utf8.h"
#include "core/util.h"

typedef enum { FAM_LLAMA3, FAM_CHATML, FAM_DEEPSEEK3, FAM_KIMI, FAM_MISTRAL, FAM_LLAMA2, N_FAMILIES } family;

enum {
    /* llama3 */
    LL_30 = 0, /* Llama-3 (3.0): bos on the first message only */
    LL_31,     /* 3.1 / 3.3: system block with a fixed "Today Date: 26 Jul 2024" */
    LL_32,     /* 3.2: the same block with today's date */
    /* deepseek3 */
    DS_V3 = 0, /* V3 / R1 */
    DS_V31,    /* V3.1: </think> after <｜Assistant｜> (thinking off) */
    /* kimi-k2 */
    KM_K2 = 0,   /* Kimi-K2-Instruct */
    KM_THINKING, /* Kimi-K2-Thinking: <think></think> before assistant text */
};

/* mistral: [INST] turns after one bos. Its published templates differ in
 * the pieces below (read from the checkpoint's template: inst_read), e.g.
 * Mistral-7B-Instruct v0.1 "[INST] " " [/INST]" "" "</s> " no system;
 * Mixtral-8x7B-Instruct v0.1 the same with "</s>"; v0.2 (2024) " [INST] "
 * " [/INST]" " " the system prompt in the first user turn; v0.3 "[INST] "
 * "[/INST]" " " trimmed, first; Nemo-2407 "[INST]" "[/INST]" "" last. */
typedef struct inst_form {
    const char *open, *close; /* around a user turn */
    const char *asst, *eos;   /* before and after an assistant turn */
    int trim;                 /* the assistant text |trim'd */
    int sys;   /* a first system message: 0 not taken, 1 before the first user turn, 2 the last */
    int tools; /* the template has a tool format (tool results: refused as not written here) */
} inst_form;
static const inst_form INST_DEFAULT = {"[INST] ", "[/INST]", " ", "</s>", 1, 1, 1}; /* v0.3's */

struct sd_chat_template {
    family fam;
    int variant;
    char *bos;             /* BOS text (llama3, deepseek3) */
    char *default_system;  /* chatml / kimi: printed when the first message is not a system one */
    int qwen3;             /* chatml: Qwen3's <think> handling */
    int qwen_tools;        /* chatml: role "tool" wrapped in <tool_response> (Qwen2.5 / Qwen3) */
    int think_strip;       /* deepseek3 (R1): assistant text after the last </think> */
    int join_systems;      /* deepseek3: all system messages joined by "\n\n" (else the last) */
    const char *gen_extra; /* deepseek3 V3/R1: text after <｜Assistant｜> in the generation prompt */
    const char *date;      /* llama3.2: pinned date, NULL = today */
    inst_form inst;        /* mistral */
};

static const char *const FAMILY_NAME[N_FAMILIES] = {"llama3", "chatml", "deepseek3", "kimi-k2", "mistral",
                                                    "llama2"};
static const char *const FAMILY_STOP[N_FAMILIES] = {"<|eot_id|>", "<|im_end|>", "<｜end▁of▁sentence｜>", "<|im_end|>",
                                                    "</s>", "</s>"};

/* ---- template inspection -------------------------------------------------------- */

/* A Jinja string literal's text starting at s, up to the first occurrence of end;
 * NULL when the stretch is not plain literal text (quotes, braces, plus signs).
 * Jinja escapes (\n, \t, \', \", \\) are resolved. */
static char *literal_until(const char *s, const char *end)
{
    const char *e = strstr(s, end);
    if (!e || e == s)
        return NULL;
    for (const char *p = s; p < e; p++)
        if (*p == '\'' || *p == '"' || *p == '{' || *p == '}' || *p == '+')
            return NULL;
    sd_sbuf b = {0};
    for (const char *p = s; p < e; p++) {
        char c = *p;
        if (c == '\\' && p + 1 < e) {
            char x = *++p;
            c = x == 'n' ? '\n' : x == 't' ? '\t' : x;
        }
        if (sd_sbuf_putc(&b, c)) {
            sd_sbuf_free(&b);
            return NULL;
        }
    }
    return sd_sbuf_take(&b, NULL);
}

/* The first literal prompt that follows one of the heads in tmpl. */
static char *find_default(const char *tmpl, const char *const *heads, int nheads, const char *end)
{
    for (int h = 0; h < nheads; h++) {
        size_t hl = strlen(heads[h]);
        for (const char *p = strstr(tmpl, heads[h]); p; p = strstr(p + 1, heads[h])) {
            char *lit = literal_until(p + hl, end);
            if (lit)
                return lit;
        }
    }
    return NULL;
}

static int recognize(const char *tmpl)
{
    if (strstr(tmpl, "<|start_header_id|>"))
        return FAM_LLAMA3;
    if (strstr(tmpl, "<｜User｜>"))
        return FAM_DEEPSEEK3;
    if (strstr(tmpl, "<|im_user|>") || strstr(tmpl, "<|im_middle|>"))
        return FAM_KIMI;
    if (strstr(tmpl, "<|im_start|>"))
        return FAM_CHATML;
    /* [INST] turns: the published templates' own refusals tell them from
     * other templates that use the tags */
    if (strstr(tmpl, "[INST]") && strstr(tmpl, "<<SYS>>") &&
        strstr(tmpl, "Conversation roles must alternate"))
        return FAM_LLAMA2;
    if (strstr(tmpl, "[INST]") && strstr(tmpl, "Only user and assistant roles are supported"))
        return FAM_MISTRAL;
    return -1;
}

/* text is in t, as written or with its ' as " (Jinja takes either quote) */
static int has_form(const char *t, const char *text)
{
    char d[256];
    snprintf(d, sizeof d, "%s", text);
    for (char *c = d; *c; c++)
        if (*c == '\'')
            *c = '"';
    return strstr(t, text) || strstr(t, d);
}

/* A Mistral template's pieces (inst_form) from its text: each statement
 * that prints a turn matched whole against the forms the published
 * templates use; SD_ENOTSUP for any other (never a guess). */
static int inst_read(const char *t, inst_form *f)
{
    if (!strstr(t, "system_message")) { /* v0.1: the roles alone */
        *f = (inst_form){"[INST] ", " [/INST]", "", "</s>", 0, 0, 0};
        if (!has_form(t, "{{ '[INST] ' + message['content'] + ' [/INST]' }}"))
            return SD_ENOTSUP;
        if (has_form(t, "{{ message['content'] + eos_token + ' ' }}"))
            f->eos = "</s> ";
        else if (!has_form(t, "{{ message['content'] + eos_token}}"))
            return SD_ENOTSUP;
        return 0;
    }
    static const char *const opens[] = {" [INST] ", "[INST] ", "[INST]"}, *const closes[] = {" [/INST]", "[/INST]"};
    static const char *const asst[] = {"{{- ' ' + message['content']|trim + eos_token}}",
                                       "{{- ' ' + message['content'] + eos_token}}",
                                       "{{- message['content'] + eos_token}}"};
    int sys = has_form(t, "loop.first and system_message is defined")  ? 1
              : has_form(t, "loop.last and system_message is defined") ? 2
                                                                       : 0;
    int o = -1, c = -1, a = -1;
    for (int i = 0; i < 3 && o < 0; i++)
        for (int j = 0; j < 2 && o < 0; j++) {
            char with[256], plain[256];
            snprintf(with, sizeof with, "{{- '%s' + system_message + '\\n\\n' + message['content'] + '%s' }}",
                     opens[i], closes[j]);
            snprintf(plain, sizeof plain, "{{- '%s' + message['content'] + '%s' }}", opens[i], closes[j]);
            if (has_form(t, with) && has_form(t, plain))
                o = i, c = j;
        }
    for (int i = 0; i < 3 && a < 0; i++)
        if (has_form(t, asst[i]))
            a = i;
    if (!sys || o < 0 || a < 0)
        return SD_ENOTSUP;
    *f = (inst_form){opens[o], closes[c], a < 2 ? " " : "", "</s>", a == 0, sys,
                     strstr(t, "[TOOL_RESULTS]") != NULL};
    return 0;
}

/* Family defaults, then what the checkpoint's template says (tmpl may be NULL). */
static int configure(sd_chat_template *ct, const char *tmpl)
{
    switch (ct->fam) {
    case FAM_LLAMA3:
        ct->variant = LL_30;
        if (tmpl && strstr(tmpl, "Cutting Knowledge Date"))
            ct->variant = strstr(tmpl, "strftime_now") ? LL_32 : LL_31;
        break;
    case FAM_CHATML:
        if (tmpl) {
            static const char *const heads[] = {"<|im_start|>system\\n", "<|im_start|>system\n"};
            ct->default_system = find_default(tmpl, heads, 2, "<|im_end|>");
            ct->qwen3 = strstr(tmpl, "last_query_index") != NULL;
            ct->qwen_tools = strstr(tmpl, "<tool_response>") != NULL;
        }
        break;
    case FAM_DEEPSEEK3:
        ct->variant = DS_V3;
        ct->join_systems = 1;
        ct->gen_extra = "";
        if (tmpl) {
            if (strstr(tmpl, "is_last_user")) {
                ct->variant = DS_V31;
            } else {
                ct->join_systems = strstr(tmpl, "is_first_sp") != NULL;
                ct->think_strip = strstr(tmpl, "</think>") != NULL;
                if (strstr(tmpl, "<｜Assistant｜><think>\\n") || strstr(tmpl, "<｜Assistant｜><think>\n"))
                    ct->gen_extra = "<think>\n";
            }
        }
        break;
    case FAM_KIMI: {
        ct->variant = tmpl && strstr(tmpl, "<think>") ? KM_THINKING : KM_K2;
        static const char *const heads[] = {"<|im_system|>system<|im_middle|>"};
        ct->default_system = tmpl ? find_default(tmpl, heads, 1, "<|im_end|>") : NULL;
        if (!ct->default_system)
            ct->default_system = sd_strfmt("%s", "You are a helpful assistant");
        if (!ct->default_system)
            return SD_ENOMEM;
        break;
    }
    case FAM_MISTRAL:
        ct->inst = INST_DEFAULT;
        if (tmpl && inst_read(tmpl, &ct->inst))
            return SD_ENOTSUP;
        break;
    case FAM_LLAMA2:
    case N_FAMILIES:
        break;
    }
    return 0;
}

/* tokenizer_config.json's chat_template (a string, or a list of {name, template}
 * whose "default" entry counts), else chat_template.jinja / chat_template.json. */
static int read_template(const char *dir, char **tmpl, char **bos, int *has_im_start, sd_err *err)
{
    *tmpl = *bos = NULL;
    *has_im_start = 0;
    char *path = sd_strfmt("%s/tokenizer_config.json", dir);
    if (!path)
        return sd_err_set(err, SD_ENOMEM, "chat template: out of memory");
    if (sd_file_exists(path)) {
        json_error_t je;
        json_t *cfg = json_load_file(path, 0, &je);
        if (!cfg) {
            int rc = sd_err_set(err, SD_EFORMAT, "%s:%d:%d: malformed JSON: %s", path, je.line, je.column, je.text);
            free(path);
            return rc;
        }
        json_t *ctj = json_object_get(cfg, "chat_template");
        if (json_is_array(ctj)) {
            json_t *pick = NULL;
            for (size_t i = 0; i < json_array_size(ctj); i++) {
                json_t *e = json_array_get(ctj, i);
                json_t *nm = json_object_get(e, "name");
                if (json_is_string(nm) && !strcmp(json_string_value(nm), "default"))
                    pick = json_object_get(e, "template");
            }
            ctj = pick;
        }
        if (json_is_string(ctj))
            *tmpl = sd_strfmt("%s", json_string_value(ctj));
        json_t *b = json_object_get(cfg, "bos_token");
        if (json_is_object(b))
            b = json_object_get(b, "content");
        if (json_is_string(b))
            *bos = sd_strfmt("%s", json_string_value(b));
        json_decref(cfg);
    }
    free(path);
    const char *alts[] = {"chat_template.jinja", "chat_template.json"};
    for (int k = 0; k < 2 && !*tmpl; k++) {
        path = sd_strfmt("%s/%s", dir, alts[k]);
        if (path && sd_file_exists(path)) {
            char *data;
            size_t len;
            int rc = sd_read_file(path, &data, &len, err);
            if (rc) {
                free(path);
                return rc;
            }
            if (k == 0) {
                *tmpl = data;
            } else {
                json_error_t je;
                json_t *j = json_loadb(data, len, 0, &je);
                json_t *s = json_object_get(j, "chat_template");
                if (json_is_string(s))
                    *tmpl = sd_strfmt("%s", json_string_value(s));
                json_decref(j);
                free(data);
            }
        }
        free(path);
    }
    /* No template: is <|im_start|> in the vocabulary (tokenizer.json)? */
    path = sd_strfmt("%s/tokenizer.json", dir);
    if (!*tmpl && path && sd_file_exists(path)) {
        char *data;
        size_t len;
        if (!sd_read_file(path, &data, &len, NULL)) {
            *has_im_start = memmem(data, len, "\"<|im_start|>\"", 14) != NULL;
            free(data);
        }
    }
    free(path);
    return 0;
}

int sd_chat_template_load(sd_chat_template **out, const char *model_dir, const char *name, sd_err *err)
{
    *out = NULL;
    if (!name || !*name)
        name = "auto";
    int fam = -1;
    for (int i = 0; i < N_FAMILIES; i++)
        if (!strcmp(name, FAMILY_NAME[i]))
            fam = i;
    int is_auto = !strcmp(name, "auto");
    if (fam < 0 && !is_auto)
        return sd_err_set(err, SD_EINVAL,
                          "--chat-template %s: unknown template (choose auto, llama3, chatml, deepseek3, kimi-k2, "
                          "mistral or llama2)",
                          name);
    char *tmpl = NULL, *bos = NULL;
    int has_im_start = 0;
    if (model_dir && *model_dir) {
        if (!sd_dir_exists(model_dir))
            return sd_err_set(err, SD_ENOENT, "chat template: model folder %s does not exist", model_dir);
        int rc = read_template(model_dir, &tmpl, &bos, &has_im_start, err);
        if (rc)
            return rc;
    } else if (is_auto) {
        return sd_err_set(err, SD_EINVAL, "--chat-template auto needs a model folder to read the template from");
    }
    if (is_auto) {
        if (!tmpl) {
            if (!has_im_start) {
                free(bos);
                return sd_err_set(err, SD_ENOENT,
                                  "%s: no chat_template in tokenizer_config.json (nor chat_template.jinja) and no "
                                  "<|im_start|> in the vocabulary; pass --chat-template "
                                  "llama3|chatml|deepseek3|kimi-k2|mistral|llama2",
                                  model_dir);
            }
            fam = FAM_CHATML;
        } else {
            fam = recognize(tmpl);
            if (fam < 0) {
                free(tmpl);
                free(bos);
                return sd_err_set(err, SD_ENOTSUP,
                                  "%s: the chat_template is not one of the families specd knows (llama3, chatml, "
                                  "deepseek3, kimi-k2, mistral, llama2); pass --chat-template NAME to choose one",
                                  model_dir);
            }
        }
    }
    sd_chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) {
        free(tmpl);
        free(bos);
        return sd_err_set(err, SD_ENOMEM, "chat template: out of memory");
    }
    ct->fam = (family)fam;
    /* An explicit family reads the variant from the checkpoint's template only when
     * that template is of the same family. */
    const char *use = tmpl && recognize(tmpl) == fam ? tmpl : NULL;
    int rc = configure(ct, use);
    if (rc == SD_ENOTSUP) {
        /* a Mistral template whose pieces are not a form written here: an
         * error under auto, the family's defaults under its explicit name */
        if (is_auto) {
            free(tmpl);
            free(bos);
            sd_chat_template_free(ct);
            return sd_err_set(err, SD_ENOTSUP,
                              "%s: the chat_template's [INST] turns are not a form of Mistral's templates specd "
                              "writes out; pass --chat-template mistral (v0.3's form) or llama2",
                              model_dir);
        }
        rc = configure(ct, NULL);
    }
    const int needs_bos = fam == FAM_LLAMA3 || fam == FAM_DEEPSEEK3 || fam == FAM_MISTRAL || fam == FAM_LLAMA2;
    if (!rc && !bos && needs_bos)
        bos = sd_strfmt("%s", fam == FAM_LLAMA3      ? "<|begin_of_text|>"
                              : fam == FAM_DEEPSEEK3 ? "<｜begin▁of▁sentence｜>"
                                                     : "<s>");
    ct->bos = bos;
    free(tmpl);
    if (rc || (needs_bos && !ct->bos)) {
        sd_chat_template_free(ct);
        return sd_err_set(err, SD_ENOMEM, "chat template: out of memory");
    }
    *out = ct;
    return 0;
}

void sd_chat_template_free(sd_chat_template *ct)
{
    if (!ct)
        return;
    free(ct->bos);
    free(ct->default_system);
    free(ct);
}

const char *sd_chat_template_name(const sd_chat_template *ct) { return FAMILY_NAME[ct->fam]; }
sd_tool_format sd_chat_template_tool_format(const sd_chat_template *ct)
{
    if (ct->fam == FAM_CHATML && ct->qwen_tools)
        return SD_TOOLS_HERMES;
    if (ct->fam == FAM_LLAMA3 && ct->variant != LL_30)
        return SD_TOOLS_JSON;
    if (ct->fam == FAM_KIMI)
        return SD_TOOLS_KIMI;
    if (ct->fam == FAM_DEEPSEEK3)
        return ct->variant == DS_V31 ? SD_TOOLS_DEEPSEEK31 : SD_TOOLS_DEEPSEEK3;
    return SD_TOOLS_NONE;
}
const char *sd_chat_template_stop(const sd_chat_template *ct) { return FAMILY_STOP[ct->fam]; }
void sd_chat_template_set_date(sd_chat_template *ct, const char *date) { ct->date = date; }

/* ---- rendering helpers ------------------------------------------------------------ */

typedef struct out {
    sd_sbuf b;
    int oom;
} out;

static void o_put(out *o, const char *s, size_t n)
{
    if (!o->oom && sd_sbuf_put(&o->b, s, n))
        o->oom = 1;
}
static void o_str(out *o, const char *s) { o_put(o, s, strlen(s)); }
/* forward: json.dumps of v into o (indent < 0: none) */
static int py_dump(sd_sbuf *b, const json_t *v, int indent, int level);
static void o_dumps(out *o, const json_t *v, int indent)
{
    if (!o->oom && py_dump(&o->b, v, indent, 0))
        o->oom = 1;
}

/* Jinja's |trim (Python str.strip()): Unicode whitespace at both ends. */
static void o_trim(out *o, const char *s)
{
    size_t n = strlen(s), a = 0, b = n;
    const unsigned char *p = (const unsigned char *)s;
    while (a < b) {
        uint32_t cp = 0;
        size_t l;
        if (sd_utf8_next(p + a, b - a, &cp, &l) != SD_UTF8_OK || !sd_uc_py_space(cp))
            break;
        a += l;
    }
    while (b > a) {
        size_t k = b - 1;
        while (k > a && (p[k] & 0xC0) == 0x80 && b - k < 4)
            k--;
        uint32_t cp = 0;
        size_t l;
        if (sd_utf8_next(p + k, b - k, &cp, &l) != SD_UTF8_OK || k + l != b || !sd_uc_py_space(cp))
            break;
        b = k;
    }
    o_put(o, s + a, b - a);
}

/* transformers' tojson filter on a string: json.dumps(s, ensure_ascii=False). */
static void o_json_n(out *o, const char *s, size_t n)
{
    o_put(o, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s, *end = p + n; p < end; p++) {
        char esc[8];
        const char *e = NULL;
        switch (*p) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                e = esc;
            }
        }
        if (e)
            o_str(o, e);
        else
            o_put(o, (const char *)p, 1);
    }
    o_put(o, "\"", 1);
}
static void o_json(out *o, const char *s) { o_json_n(o, s, strlen(s)); }

/* Python's repr of a float: the shortest digits that read back as v, fixed
 * notation for decimal exponents -4..15 (with ".0" when whole), else d.ddde+XX. */
static int py_float(sd_sbuf *b, double v)
{
    char buf[40];
    if (v != v || v - v != 0) /* NaN, inf: json.dumps writes these names */
        return sd_sbuf_put(b, v != v ? "NaN" : v > 0 ? "Infinity" : "-Infinity", v != v ? 3 : v > 0 ? 8 : 9);
    int p = 0;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    const char *s = buf;
    int neg = *s == '-';
    s += neg;
    char dig[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.')
            dig[nd++] = *s;
    int ex = atoi(s + 1);
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    sd_sbuf *t = b; /* (a failure leaves part of it: the caller's output is dropped) */
    int rc = neg ? sd_sbuf_putc(t, '-') : 0;
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            rc |= sd_sbuf_put(t, "0.", 2);
            for (int i = 0; i < -ex - 1; i++)
                rc |= sd_sbuf_putc(t, '0');
            rc |= sd_sbuf_put(t, dig, (size_t)nd);
        } else if (ex + 1 >= nd) {
            rc |= sd_sbuf_put(t, dig, (size_t)nd);
            for (int i = nd; i < ex + 1; i++)
                rc |= sd_sbuf_putc(t, '0');
            rc |= sd_sbuf_put(t, ".0", 2);
        } else {
            rc |= sd_sbuf_put(t, dig, (size_t)ex + 1);
            rc |= sd_sbuf_putc(t, '.');
            rc |= sd_sbuf_put(t, dig + ex + 1, (size_t)(nd - ex - 1));
        }
    } else {
        rc |= sd_sbuf_putc(t, dig[0]);
        if (nd > 1) {
            rc |= sd_sbuf_putc(t, '.');
            rc |= sd_sbuf_put(t, dig + 1, (size_t)nd - 1);
        }
        char e[8];
        int el = snprintf(e, sizeof e, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
        rc |= sd_sbuf_put(t, e, (size_t)el);
    }
    return rc ? -1 : 0;
}

/* json.dumps's separator before an item: ", " without indent, else ",\n" (none
 * before the first) and the item's indentation */
static void py_sep(out *o, int first, int indent, int level)
{
    if (indent < 0) {
        if (!first)
            o_put(o, ", ", 2);
        return;
    }
    o_put(o, first ? "\n" : ",\n", first ? 1 : 2);
    for (int i = 0; i < indent * level; i++)
        o_put(o, " ", 1);
}

static int py_dump(sd_sbuf *b, const json_t *v, int indent, int level)
{
    out o = {{0}, 0};
    o.b = *b;
    int rc = 0;
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        int first = 1;
        o_put(&o, "{", 1);
        json_object_foreach((json_t *)v, k, x)
        {
            py_sep(&o, first, indent, level + 1);
            first = 0;
            o_json(&o, k);
            o_put(&o, ": ", 2);
            if (!o.oom && py_dump(&o.b, x, indent, level + 1))
                o.oom = 1;
        }
        if (!first && indent >= 0)
            py_sep(&o, 1, indent, level);
        o_put(&o, "}", 1);
        break;
    }
    case JSON_ARRAY:
        o_put(&o, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            py_sep(&o, i == 0, indent, level + 1);
            if (!o.oom && py_dump(&o.b, json_array_get(v, i), indent, level + 1))
                o.oom = 1;
        }
        if (json_array_size(v) && indent >= 0)
            py_sep(&o, 1, indent, level);
        o_put(&o, "]", 1);
        break;
    case JSON_STRING:
        o_json_n(&o, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
        o_str(&o, num);
        break;
    case JSON_REAL:
        if (!o.oom && py_float(&o.b, json_real_value(v)))
            o.oom = 1;
        break;
    case JSON_TRUE:
        o_str(&o, "true");
        break;
    case JSON_FALSE:
        o_str(&o, "false");
        break;
    case JSON_NULL:
        o_str(&o, "null");
        break;
    }
    *b = o.b;
    rc = o.oom ? -1 : 0;
    return rc;
}

int sd_py_json_dumps(sd_sbuf *b, const json_t *v) { return py_dump(b, v, -1, 0); }
int sd_py_json_dumps_indent(sd_sbuf *b, const json_t *v, int indent) { return py_dump(b, v, indent, 0); }

/* Python's s.strip('\n') / lstrip / rstrip on s[a..b). */
static void strip_nl(const char *s, size_t *a, size_t *b, int left, int right)
{
    while (left && *a < *b && s[*a] == '\n')
        (*a)++;
    while (right && *b > *a && s[*b - 1] == '\n')
        (*b)--;
}

/* The last occurrence of needle in s[0..n), or NULL. */
static const char *last_of(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (const char *p = s; (p = memmem(p, n - (size_t)(p - s), needle, k)); p++)
        hit = p;
    return hit;
}

/* ---- the families ------------------------------------------------------------------- */

/* Llama 3.1 / 3.2: the tools in the first user message (tools_in_user_message,
 * the templates' default) as tojson(indent=4); a tool call as the JSON the
 * model is told to answer with; a tool result printed through tojson. */
static const char LL_TOOLS_HEAD[] =
    "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a "
    "function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
    "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n";

static void r_llama3(const sd_chat_template *ct, const sd_chat_msg *m, int n, const json_t *tools, int gen, out *o)
{
    int i = 0;
    if (ct->variant == LL_30) {
        for (; i < n; i++) {
            if (i == 0)
                o_str(o, ct->bos);
            o_str(o, "<|start_header_id|>");
            o_str(o, m[i].role);
            o_str(o, "<|end_header_id|>\n\n");
            o_trim(o, m[i].content);
            o_str(o, "<|eot_id|>");
        }
    } else {
        char today[32];
        /* 3.1 fixes its date; 3.2 asks strftime_now for today's */
        const char *date = ct->variant == LL_31 ? "26 Jul 2024" : ct->date;
        if (!date) {
            time_t now = time(NULL);
            struct tm tmv;
            localtime_r(&now, &tmv);
            strftime(today, sizeof today, "%d %b %Y", &tmv);
            date = today;
        }
        int with_tools = json_array_size(tools) > 0;
        o_str(o, ct->bos);
        o_str(o, "<|start_header_id|>system<|end_header_id|>\n\n");
        if (with_tools)
            o_str(o, "Environment: ipython\n");
        o_str(o, "Cutting Knowledge Date: December 2023\nToday Date: ");
        o_str(o, date);
        o_str(o, "\n\n");
        if (n > 0 && !strcmp(m[0].role, "system")) {
            o_trim(o, m[0].content);
            i = 1;
        }
        o_str(o, "<|eot_id|>");
        if (with_tools) { /* (sd_chat_render_kw checked there is a first message) */
            o_str(o, LL_TOOLS_HEAD);
            for (size_t k = 0; k < json_array_size(tools); k++) {
                o_dumps(o, json_array_get(tools, k), 4);
                o_str(o, "\n\n");
            }
            o_trim(o, m[i].content ? m[i].content : "");
            o_str(o, "<|eot_id|>");
            i++;
        }
        for (; i < n; i++) {
            if (m[i].n_calls) { /* (one: sd_chat_render_kw checked) */
                o_str(o, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
                o_str(o, m[i].calls[0].name);
                o_str(o, "\", \"parameters\": ");
                o_dumps(o, m[i].calls[0].arguments, -1);
                o_str(o, "}<|eot_id|>");
                continue;
            }
            if (!strcmp(m[i].role, "tool") || !strcmp(m[i].role, "ipython")) {
                /* a string is "iterable" to Jinja: the template prints it through tojson */
                o_str(o, "<|start_header_id|>ipython<|end_header_id|>\n\n");
                o_json(o, m[i].content);
            } else {
                o_str(o, "<|start_header_id|>");
                o_str(o, m[i].role);
                o_str(o, "<|end_header_id|>\n\n");
                o_trim(o, m[i].content);
            }
            o_str(o, "<|eot_id|>");
        }
    }
    if (gen)
        o_str(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static int is_tool_response(const char *s)
{
    if (!s)
        return 0;
    size_t n = strlen(s);
    return n >= 15 && !strncmp(s, "<tool_response>", 15) && n >= 16 && !strcmp(s + n - 16, "</tool_response>");
}

/* Qwen2.5 / Qwen3: a tool call as '<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>' */
static void o_tool_call(out *o, const sd_chat_call *c)
{
    o_str(o, "<tool_call>\n{\"name\": \"");
    o_str(o, c->name);
    o_str(o, "\", \"arguments\": ");
    o_dumps(o, c->arguments, -1);
    o_str(o, "}\n</tool_call>");
}

static void r_chatml(const sd_chat_template *ct, const sd_chat_msg *m, int n, const json_t *tools,
                     const sd_chat_kwargs *kw, int gen, out *o)
{
    int first = 0; /* the first message printed by the loop */
    if (json_array_size(tools)) {
        /* the system turn with the tools' signatures, the first system message in it */
        int sys = n > 0 && !strcmp(m[0].role, "system");
        o_str(o, "<|im_start|>system\n");
        if (sys || !ct->qwen3) {
            o_str(o, sys ? m[0].content : ct->default_system ? ct->default_system : "");
            o_str(o, "\n\n");
        }
        o_str(o, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        for (size_t k = 0; k < json_array_size(tools); k++) {
            o_str(o, "\n");
            o_dumps(o, json_array_get(tools, k), -1);
        }
        o_str(o, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                 "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                 "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
        first = sys;
    } else if (ct->default_system && (n == 0 || strcmp(m[0].role, "system"))) {
        o_str(o, "<|im_start|>system\n");
        o_str(o, ct->default_system);
        o_str(o, "<|im_end|>\n");
    }
    int last_query = n - 1; /* Qwen3: the last real user turn */
    if (ct->qwen3)
        for (int i = n - 1; i >= 0; i--)
            if (!strcmp(m[i].role, "user") && !is_tool_response(m[i].content)) {
                last_query = i;
                break;
            }
    for (int i = first; i < n; i++) {
        const char *role = m[i].role, *c = m[i].content ? m[i].content : "";
        if (!ct->qwen3 && m[i].n_calls) { /* Qwen2.5 */
            o_str(o, "<|im_start|>assistant");
            if (*c) {
                o_str(o, "\n");
                o_str(o, c);
            }
            for (int k = 0; k < m[i].n_calls; k++) {
                o_str(o, "\n");
                o_tool_call(o, &m[i].calls[k]);
            }
            o_str(o, "<|im_end|>\n");
            continue;
        }
        if (ct->qwen_tools && !strcmp(role, "tool")) {
            if (i == 0 || strcmp(m[i - 1].role, "tool"))
                o_str(o, "<|im_start|>user");
            o_str(o, "\n<tool_response>\n");
            o_str(o, c);
            o_str(o, "\n</tool_response>");
            if (i == n - 1 || strcmp(m[i + 1].role, "tool"))
                o_str(o, "<|im_end|>\n");
            continue;
        }
        if (ct->qwen3 && !strcmp(role, "assistant")) {
            size_t cn = strlen(c), a = 0, b = cn;       /* content = c[a..b) */
            const char *rs = "";
            size_t ra = 0, rb = 0;                      /* reasoning = rs[ra..rb) */
            const char *close = strstr(c, "</think>");
            if (close) {
                /* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                size_t pre = (size_t)(close - c);
                strip_nl(c, &ra, &pre, 0, 1);
                const char *open = last_of(c, pre, "<think>");
                ra = open ? (size_t)(open - c) + 7 : 0;
                rb = pre;
                strip_nl(c, &ra, &rb, 1, 0);
                rs = c;
                /* content = content.split('</think>')[-1].lstrip('\n') */
                a = (size_t)(last_of(c, cn, "</think>") - c) + 8;
                strip_nl(c, &a, &b, 1, 0);
            }
            /* the calls' first newline follows `content` as set above, not
             * as printed below (content.lstrip('\n') in the expression) */
            const int has_content = b > a;
            o_str(o, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || rb > ra)) {
                strip_nl(rs, &ra, &rb, 1, 1);
                o_str(o, "<think>\n");
                o_put(o, rs + ra, rb - ra);
                o_str(o, "\n</think>\n\n");
                strip_nl(c, &a, &b, 1, 0);
            }
            o_put(o, c + a, b - a);
            for (int k = 0; k < m[i].n_calls; k++) {
                if (k > 0 || has_content)
                    o_str(o, "\n");
                o_tool_call(o, &m[i].calls[k]);
            }
            o_str(o, "<|im_end|>\n");
            continue;
        }
        o_str(o, "<|im_start|>");
        o_str(o, role);
        o_str(o, "\n");
        o_str(o, c);
        o_str(o, "<|im_end|>\n");
    }
    if (gen) {
        o_str(o, "<|im_start|>assistant\n");
        if (ct->qwen3 && kw->enable_thinking == 0) /* Qwen3's switch: an empty reasoning */
            o_str(o, "<think>\n\n</think>\n\n");
    }
}

/* DeepSeek's templates print no tools: the model card of V3.1 puts a tool
 * description after the system prompt ("{system prompt}\n\n{tool_description}"),
 * which this writes for V3.1 as the card has it (as SGLang's and vLLM's
 * DeepSeek-V3.1 tool templates do, blank lines and all). V3 and R1 publish none; they
 * get the same description with the call syntax their templates print in the
 * history (function<｜tool▁sep｜>NAME, the arguments in a json fence, calls
 * one a line). */
static void o_ds_tools(const sd_chat_template *ct, const json_t *tools, out *o)
{
    o_str(o, "## Tools\nYou have access to the following tools:\n\n");
    for (size_t k = 0; k < json_array_size(tools); k++) {
        const json_t *t = json_array_get(tools, k), *f = json_object_get(t, "function");
        if (!json_is_object(f))
            f = t;
        const json_t *nm = json_object_get(f, "name"), *ds = json_object_get(f, "description"),
                     *pa = json_object_get(f, "parameters");
        o_str(o, "### ");
        o_str(o, json_is_string(nm) ? json_string_value(nm) : "");
        o_str(o, "\nDescription: ");
        o_str(o, json_is_string(ds) ? json_string_value(ds) : "");
        o_str(o, "\n\nParameters: ");
        if (pa)
            o_dumps(o, pa, -1);
        else
            o_str(o, "{}");
        o_str(o, "\n\n");
    }
    const int v31 = ct->variant == DS_V31;
    o_str(o, "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n");
    o_str(o, v31 ? SD_DS_CALLS SD_DS_CALL "tool_call_name" SD_DS_SEP "tool_call_arguments" SD_DS_CALL_END
                 : SD_DS_CALLS SD_DS_CALL "function" SD_DS_SEP "tool_call_name\n```json\ntool_call_arguments\n```"
                       SD_DS_CALL_END);
    o_str(o, "{{additional_tool_calls}}" SD_DS_CALLS_END "\n\nWhere:\n\n"
             "- `tool_call_name` must be an exact match to one of the available tools\n"
             "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n");
    o_str(o, v31 ? "- For multiple tool calls, chain them directly without separators or spaces\n"
                 : "- For multiple tool calls, put each on a line of its own\n");
}

/* a call's arguments as the template prints them: the text the client sent
 * (the DeepSeek templates concatenate it), else json.dumps of the object */
static void o_args_text(out *o, const sd_chat_call *c)
{
    if (c->arguments_text)
        o_str(o, c->arguments_text);
    else
        o_dumps(o, c->arguments, -1);
}

/* An assistant message's calls, as V3 / R1 (first 1: the first calls of the
 * conversation, which its template never resets) or V3.1 print them. */
static void o_ds_calls(const sd_chat_template *ct, const sd_chat_msg *m, int *first, out *o)
{
    for (int k = 0; k < m->n_calls; k++) {
        const sd_chat_call *c = &m->calls[k];
        if (!*first) {
            if (ct->variant != DS_V31)
                o_str(o, "<｜Assistant｜>");
            o_str(o, m->content ? m->content : "");
            o_str(o, SD_DS_CALLS);
            *first = 1;
        } else if (ct->variant != DS_V31) {
            o_str(o, "\n");
        }
        o_str(o, SD_DS_CALL);
        if (ct->variant == DS_V31) {
            o_str(o, c->name);
            o_str(o, SD_DS_SEP);
            o_args_text(o, c);
        } else {
            o_str(o, "function" SD_DS_SEP);
            o_str(o, c->name);
            o_str(o, "\n```json\n");
            o_args_text(o, c);
            o_str(o, "\n```");
        }
        o_str(o, SD_DS_CALL_END);
    }
    o_str(o, SD_DS_CALLS_END "<｜end▁of▁sentence｜>");
}

static void r_deepseek3(const sd_chat_template *ct, const sd_chat_msg *m, int n, const json_t *tools,
                        const sd_chat_kwargs *kw, int gen, out *o)
{
    o_str(o, ct->bos);
    int first_sp = 1, last_sys = -1;
    for (int i = 0; i < n; i++) {
        if (strcmp(m[i].role, "system"))
            continue;
        if (ct->join_systems) {
            if (!first_sp)
                o_str(o, "\n\n");
            o_str(o, m[i].content);
            first_sp = 0;
        } else {
            last_sys = i;
        }
    }
    if (last_sys >= 0)
        o_str(o, m[last_sys].content);
    if (json_array_size(tools)) { /* "{system prompt}\n\n{tool_description}", the prompt empty or not */
        o_str(o, "\n\n");
        o_ds_tools(ct, tools, o);
    }
    int is_tool = 0, output_first = 1, last_user = 0, calls_first = 0;
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role, *c = m[i].content;
        if (!strcmp(role, "user")) {
            is_tool = 0;
            last_user = 1;
            if (ct->variant == DS_V31)
                calls_first = 0;
            o_str(o, "<｜User｜>");
            o_str(o, c);
        } else if (!strcmp(role, "assistant") && m[i].n_calls) {
            if (ct->variant == DS_V31) {
                if (last_user)
                    o_str(o, "<｜Assistant｜></think>");
                calls_first = 0;
            }
            last_user = 0;
            is_tool = 0;
            o_ds_calls(ct, &m[i], &calls_first, o);
        } else if (!strcmp(role, "assistant")) {
            if (ct->variant == DS_V31) {
                if (last_user)
                    o_str(o, "<｜Assistant｜></think>");
                last_user = 0;
                if (is_tool) {
                    is_tool = 0;
                } else {
                    const char *cl = strstr(c, "</think>"); /* split('</think>', 1)[1] */
                    if (cl)
                        c = cl + 8;
                }
                o_str(o, c);
                o_str(o, "<｜end▁of▁sentence｜>");
            } else if (is_tool) {
                o_str(o, "<｜tool▁outputs▁end｜>");
                o_str(o, c);
                o_str(o, "<｜end▁of▁sentence｜>");
                is_tool = 0;
            } else {
                if (ct->think_strip) { /* split('</think>')[-1] */
                    const char *cl = last_of(c, strlen(c), "</think>");
                    if (cl)
                        c = cl + 8;
                }
                o_str(o, "<｜Assistant｜>");
                o_str(o, c);
                o_str(o, "<｜end▁of▁sentence｜>");
            }
        } else if (!strcmp(role, "tool")) {
            last_user = 0;
            is_tool = 1;
            if (ct->variant == DS_V31) {
                o_str(o, "<｜tool▁output▁begin｜>");
            } else if (output_first) {
                o_str(o, "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>");
                output_first = 0;
            } else {
                o_str(o, "<｜tool▁output▁begin｜>");
            }
            o_str(o, c);
            o_str(o, "<｜tool▁output▁end｜>");
        }
    }
    if (ct->variant == DS_V31) {
        /* thinking: the template's `thinking`, else its enable_thinking, else off */
        int think = kw->thinking >= 0 ? kw->thinking : kw->enable_thinking > 0;
        if (gen && last_user && !is_tool)
            o_str(o, think ? "<｜Assistant｜><think>" : "<｜Assistant｜></think>");
        return;
    }
    if (is_tool)
        o_str(o, "<｜tool▁outputs▁end｜>");
    if (gen && !is_tool) {
        o_str(o, "<｜Assistant｜>");
        o_str(o, ct->gen_extra);
    }
}

static void r_kimi(const sd_chat_template *ct, const sd_chat_msg *m, int n, const json_t *tools, int gen, out *o)
{
    if (json_array_size(tools)) {
        o_str(o, "<|im_system|>tool_declare<|im_middle|>");
        o_dumps(o, tools, -1);
        o_str(o, "<|im_end|>");
    }
    if (n == 0 || strcmp(m[0].role, "system")) {
        if (ct->variant == KM_THINKING || n > 0) {
            o_str(o, "<|im_system|>system<|im_middle|>");
            o_str(o, ct->default_system);
            o_str(o, "<|im_end|>");
        }
    }
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (ct->variant == KM_THINKING) {
            o_str(o, !strcmp(role, "user") ? "<|im_user|>" : !strcmp(role, "assistant") ? "<|im_assistant|>"
                                                                                         : "<|im_system|>");
            o_str(o, role);
            o_str(o, "<|im_middle|>");
            if (!strcmp(role, "assistant")) {
                o_str(o, "<think></think>");
            } else if (!strcmp(role, "tool")) {
                o_str(o, "## Return of ");
                o_str(o, m[i].tool_call_id ? m[i].tool_call_id : "");
                o_str(o, "\n");
            }
        } else if (!strcmp(role, "system")) {
            o_str(o, "<|im_system|>system<|im_middle|>");
        } else if (!strcmp(role, "user")) {
            o_str(o, "<|im_user|>user<|im_middle|>");
        } else if (!strcmp(role, "assistant")) {
            o_str(o, "<|im_assistant|>assistant<|im_middle|>");
        } else if (!strcmp(role, "tool")) {
            o_str(o, "<|im_system|>tool<|im_middle|>");
        }
        o_str(o, m[i].content ? m[i].content : "");
        /* Kimi-K2-Thinking's template prints the calls; Kimi-K2-Instruct's
         * (the first) drops them (and fails on a call without content) */
        if (ct->variant == KM_THINKING && m[i].n_calls) {
            o_str(o, SD_KIMI_CALLS);
            for (int k = 0; k < m[i].n_calls; k++) {
                o_str(o, SD_KIMI_CALL);
                o_str(o, m[i].calls[k].id ? m[i].calls[k].id : "None");
                o_str(o, SD_KIMI_ARGS);
                o_dumps(o, m[i].calls[k].arguments, -1);
                o_str(o, SD_KIMI_CALL_END);
            }
            o_str(o, SD_KIMI_CALLS_END);
        }
        o_str(o, "<|im_end|>");
    }
    if (gen)
        o_str(o, "<|im_assistant|>assistant<|im_middle|>");
}

/* ---- [INST] turns: Mistral's and Llama 2's templates -------------------------------
 *
 * Text only (no tool format). Each template raises where the roles do not
 * alternate user / assistant after an optional first system message (the
 * earlier Mistral ones take no system message at all); inst_check refuses
 * what they raise on with SD_EINVAL, and tool results (where a template has
 * a tool format, not written here) with SD_ENOTSUP. */

static int is_role(const sd_chat_msg *m, const char *r) { return !strcmp(m->role, r); }

/* A first system message is the system prompt: every template but Mistral's v0.1 ones. */
static int takes_system(const sd_chat_template *ct)
{
    return ct->fam != FAM_MISTRAL || ct->inst.sys;
}
static int inst_system(const sd_chat_template *ct, const sd_chat_msg *m, int n)
{
    return takes_system(ct) && n > 0 && is_role(&m[0], "system");
}

static int inst_check(const sd_chat_template *ct, const sd_chat_msg *m, int n, sd_err *err)
{
    const char *who = ct->fam == FAM_LLAMA2 ? "Llama 2's" : "Mistral's";
    const int tool_format = ct->fam == FAM_MISTRAL && ct->inst.tools;
    if (n == 0 && takes_system(ct)) /* they read messages[0] */
        return sd_err_set(err, SD_EINVAL, "chat render: %s template needs a message", who);
    int turn = 0;
    for (int i = inst_system(ct, m, n); i < n; i++) {
        if (tool_format && (is_role(&m[i], "tool") || is_role(&m[i], "tool_results")))
            return sd_err_set(err, SD_ENOTSUP, "chat render: message %d: the mistral template's tool format is "
                              "not supported (tool results need it)", i);
        if (is_role(&m[i], "user") != (turn % 2 == 0))
            return sd_err_set(err, SD_EINVAL, "chat render: message %d (%s): %s template takes user and assistant "
                              "messages in turn%s, starting with a user's", i, m[i].role, who,
                              takes_system(ct) ? " after an optional first system message" : "");
        if (ct->fam == FAM_MISTRAL && !is_role(&m[i], "user") && !is_role(&m[i], "assistant"))
            return sd_err_set(err, SD_EINVAL, "chat render: message %d (%s): %s template takes only user and "
                              "assistant messages%s", i, m[i].role, who,
                              takes_system(ct) ? " after an optional first system message" : "");
        turn++;
    }
    return 0;
}

static void r_mistral(const sd_chat_template *ct, const sd_chat_msg *m, int n, out *o)
{
    const inst_form *f = &ct->inst;
    const int sys = inst_system(ct, m, n);
    o_str(o, ct->bos);
    for (int i = sys; i < n; i++) {
        if (is_role(&m[i], "user")) {
            o_str(o, f->open);
            if (sys && i == (f->sys == 1 ? 1 : n - 1)) { /* loop.first / loop.last */
                o_str(o, m[0].content);
                o_str(o, "\n\n");
            }
            o_str(o, m[i].content);
            o_str(o, f->close);
        } else {
            o_str(o, f->asst);
            if (f->trim)
                o_trim(o, m[i].content);
            else
                o_str(o, m[i].content);
            o_str(o, f->eos);
        }
    }
}

static void r_llama2(const sd_chat_template *ct, const sd_chat_msg *m, int n, out *o)
{
    const int sys = inst_system(ct, m, n);
    for (int i = sys; i < n; i++) {
        const int user = is_role(&m[i], "user");
        if (!user && !is_role(&m[i], "assistant"))
            continue; /* the template prints nothing for other roles */
        char *first = sys && i == 1 ? sd_strfmt("<<SYS>>\n%s\n<</SYS>>\n\n%s", m[0].content, m[i].content) : NULL;
        if (sys && i == 1 && !first) {
            o->oom = 1;
            return;
        }
        if (user) {
            o_str(o, ct->bos);
            o_str(o, "[INST] ");
        } else {
            o_str(o, " ");
        }
        o_trim(o, first ? first : m[i].content);
        o_str(o, user ? " [/INST]" : " </s>");
        free(first);
    }
}

int sd_chat_render(const sd_chat_template *ct, const sd_chat_msg *msgs, int n, int add_generation_prompt,
                   char **text, size_t *len, sd_err *err)
{
    return sd_chat_render_kw(ct, msgs, n, NULL, NULL, add_generation_prompt, text, len, err);
}

int sd_chat_render_kw(const sd_chat_template *ct, const sd_chat_msg *msgs, int n, const json_t *tools,
                      const sd_chat_kwargs *kwargs, int add_generation_prompt, char **text, size_t *len, sd_err *err)
{
    const sd_chat_kwargs none = SD_CHAT_KWARGS_NONE, *kw = kwargs ? kwargs : &none;
    *text = NULL;
    if (len)
        *len = 0;
    if (n < 0 || (n > 0 && !msgs))
        return sd_err_set(err, SD_EINVAL, "chat render: %d messages at %p", n, (const void *)msgs);
    if (tools && !json_is_array(tools))
        return sd_err_set(err, SD_EINVAL, "chat render: tools must be an array");
    int has_calls = 0, tool_format = sd_chat_template_tool_format(ct) != SD_TOOLS_NONE;
    for (int i = 0; i < n; i++) {
        const sd_chat_msg *m = &msgs[i];
        if (m->n_calls < 0 || (m->n_calls && (!m->calls || strcmp(m->role ? m->role : "", "assistant"))))
            return sd_err_set(err, SD_EINVAL, "chat render: message %d: tool calls belong to an assistant message", i);
        for (int k = 0; k < m->n_calls; k++)
            if (!m->calls[k].name || !json_is_object(m->calls[k].arguments))
                return sd_err_set(err, SD_EINVAL, "chat render: message %d: tool call %d needs a name and an "
                                  "arguments object", i, k);
        has_calls |= m->n_calls > 0;
        if (!m->role || (!m->content && !m->n_calls))
            return sd_err_set(err, SD_EINVAL, "chat render: message %d has no %s", i, m->role ? "content" : "role");
    }
    if ((json_array_size(tools) || has_calls) && !tool_format)
        return sd_err_set(err, SD_ENOTSUP, "chat render: the %s template's tool format is not supported (tools are "
                          "written out for Qwen2.5's and Qwen3's chatml, Llama 3.1's and 3.2's, DeepSeek's and "
                          "Kimi-K2's)", FAMILY_NAME[ct->fam]);
    if (ct->fam == FAM_LLAMA3 && tool_format) {
        int first = n > 0 && !strcmp(msgs[0].role, "system");
        if (json_array_size(tools) && first >= n)
            return sd_err_set(err, SD_EINVAL, "chat render: Llama 3's template puts the tools in the first user "
                              "message, and there is none");
        for (int i = 0; i < n; i++)
            if (msgs[i].n_calls > 1)
                return sd_err_set(err, SD_EINVAL, "chat render: message %d: Llama 3's template takes one tool call "
                                  "per assistant message (%d here)", i, msgs[i].n_calls);
    }
    if (ct->fam == FAM_KIMI && ct->variant == KM_K2)
        for (int i = 0; i < n; i++)
            if (msgs[i].n_calls && !msgs[i].content)
                return sd_err_set(err, SD_EINVAL, "chat render: message %d: Kimi-K2-Instruct's template does not "
                                  "print tool calls, and fails on a message of calls without content", i);
    if (ct->fam == FAM_MISTRAL || ct->fam == FAM_LLAMA2) {
        int rc = inst_check(ct, msgs, n, err);
        if (rc)
            return rc;
    }
    out o = {{0}, 0};
    switch (ct->fam) {
    case FAM_LLAMA3:
        r_llama3(ct, msgs, n, tools, add_generation_prompt, &o);
        break;
    case FAM_CHATML:
        r_chatml(ct, msgs, n, tools, kw, add_generation_prompt, &o);
        break;
    case FAM_DEEPSEEK3:
        r_deepseek3(ct, msgs, n, tools, kw, add_generation_prompt, &o);
        break;
    case FAM_KIMI:
        r_kimi(ct, msgs, n, tools, add_generation_prompt, &o);
        break;
    case FAM_MISTRAL:
        r_mistral(ct, msgs, n, &o); /* no generation prompt in these templates */
        break;
    case FAM_LLAMA2:
        r_llama2(ct, msgs, n, &o);
        break;
    case N_FAMILIES:
        break;
    }
    if (o.oom || !(*text = sd_sbuf_take(&o.b, len))) {
        sd_sbuf_free(&o.b);
        return sd_err_set(err, SD_ENOMEM, "chat render: out of memory");
    }
    return 0;
}
