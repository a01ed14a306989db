#include "net/openai.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "verify/json_schema.h"
#include "verify/schema_cache.h"

/* ---- errors ---------------------------------------------------------------- */

int sd_api_error_set(sd_api_error *e, int status, const char *param, const char *code,
                     const char *fmt, ...)
{
    if (!e)
        return SD_EINVAL;
    e->status = status;
    e->type = status >= 500 ? "server_error" : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return SD_EINVAL;
}

/* Compact, and reals with 12 significant digits (0.0056051940000000008
 * reads 0.005605194). */
#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(12))

/* Appends compact JSON of v to out and releases v. */
static int dump_json(sd_buf *out, json_t *v)
{
    if (!v)
        return SD_ENOMEM;
    size_t n = json_dumpb(v, NULL, 0, DUMP_FLAGS);
    int rc = SD_ENOMEM;
    if (n && sd_buf_reserve(out, n) == 0) {
        json_dumpb(v, out->p + out->len, n, DUMP_FLAGS);
        out->len += n;
        out->p[out->len] = 0;
        rc = 0;
    }
    json_decref(v);
    return rc;
}

/* A JSON string of possibly invalid UTF-8 (replaced by U+FFFD). */
static json_t *text_json(const char *s, size_t len)
{
    json_t *v = json_stringn(s ? s : "", s ? len : 0);
    if (v)
        return v;
    sd_buf b = {0};
    if (sd_utf8_sanitize(&b, s, len)) {
        sd_buf_free(&b);
        return NULL;
    }
    v = json_stringn(b.p ? b.p : "", b.len);
    sd_buf_free(&b);
    return v;
}

/* A param or code: a name cut to fit may end inside a character, which
 * text_json repairs like the message. */
static json_t *str_or_null(const char *s) { return s && *s ? text_json(s, strlen(s)) : json_null(); }

int sd_api_error_json(sd_buf *out, const sd_api_error *e)
{
    json_t *inner = json_object();
    json_object_set_new(inner, "message", text_json(e->message, strlen(e->message)));
    json_object_set_new(inner, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(inner, "param", str_or_null(e->param));
    json_object_set_new(inner, "code", str_or_null(e->code));
    json_t *root = json_object();
    json_object_set_new(root, "error", inner);
    return dump_json(out, root);
}

/* ---- request validation ------------------------------------------------------ */

/* NUL is allowed in JSON text (\u0000) so that a prompt may hold it; every
 * other string must not (they are C strings from here on). */
#define LOAD_FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL)

static int has_nul(const json_t *v)
{
    return json_is_string(v) && memchr(json_string_value(v), 0, json_string_length(v)) != NULL;
}

static int nul_error(sd_api_error *e, const char *param)
{
    return sd_api_error_set(e, 400, param, "invalid_value",
                            "%s: NUL characters are not allowed here", param);
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

static int bad_type(sd_api_error *e, const char *param, const char *want, const json_t *v)
{
    return sd_api_error_set(e, 400, param, "invalid_type", "%s: expected %s, got %s", param, want,
                            type_name(v));
}

static int unsupported(sd_api_error *e, const char *param, const char *why)
{
    return sd_api_error_set(e, 400, param, "unsupported_parameter",
                            "%s: %s is not supported by this server", param, why);
}

/* An integer; a real with an integral value counts (1.0). */
static int get_int(const json_t *v, const char *param, long long lo, long long hi, long long *out,
                   sd_api_error *e)
{
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d == floor(d)) || d < -9.2e18 || d > 9.2e18)
            return bad_type(e, param, "an integer", v);
        x = (long long)d;
    } else {
        return bad_type(e, param, "an integer", v);
    }
    if (x < lo || x > hi)
        return sd_api_error_set(e, 400, param, "invalid_value",
                                "%s: %lld is out of range [%lld, %lld]", param, x, lo, hi);
    *out = x;
    return 0;
}

/* lo_open: the lower bound itself is refused (top_p > 0). */
static int get_num(const json_t *v, const char *param, double lo, int lo_open, double hi,
                   double *out, sd_api_error *e)
{
    if (!json_is_number(v))
        return bad_type(e, param, "a number", v);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
        return sd_api_error_set(e, 400, param, "invalid_value", "%s: %g is out of range %c%g, %g]",
                                param, x, lo_open ? '(' : '[', lo, hi);
    *out = x;
    return 0;
}

static int get_bool(const json_t *v, const char *param, int *out, sd_api_error *e)
{
    if (!json_is_boolean(v))
        return bad_type(e, param, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static int oom(sd_api_error *e)
{
    return sd_api_error_set(e, 500, NULL, "out_of_memory", "out of memory");
}

/* Parameters each route accepts; anything else is refused by name, as
 * OpenAI does, so a client never believes an option took effect. */
enum { K_CMPL = 1, K_CHAT = 2, K_BOTH = 3 };
static const struct {
    const char *name;
    int kinds;
} known_params[] = {
    {"model", K_BOTH},
    {"prompt", K_CMPL},
    {"messages", K_CHAT},
    {"stream", K_BOTH},
    {"stream_options", K_BOTH},
    {"max_tokens", K_BOTH},
    {"max_completion_tokens", K_CHAT},
    {"temperature", K_BOTH},
    {"top_p", K_BOTH},
    {"top_k", K_BOTH},
    {"seed", K_BOTH},
    {"n", K_BOTH},
    {"stop", K_BOTH},
    {"ignore_eos", K_BOTH},
    {"min_tokens", K_BOTH},
    {"user", K_BOTH},
    {"logprobs", K_BOTH},
    {"top_logprobs", K_CHAT},
    {"echo", K_CMPL},
    {"best_of", K_CMPL},
    {"suffix", K_CMPL},
    {"presence_penalty", K_BOTH},
    {"frequency_penalty", K_BOTH},
    {"logit_bias", K_BOTH},
    {"tools", K_CHAT},
    {"tool_choice", K_CHAT},
    {"functions", K_CHAT},
    {"function_call", K_CHAT},
    {"parallel_tool_calls", K_CHAT},
    {"chat_template_kwargs", K_CHAT},
    {"response_format", K_CHAT},
    {"store", K_CHAT},
    {"metadata", K_CHAT},
    {"service_tier", K_CHAT},
};

static int check_known(json_t *root, sd_oai_kind kind, sd_api_error *e)
{
    const char *key;
    json_t *v;
    int bit = kind == SD_OAI_CHAT ? K_CHAT : K_CMPL;
    json_object_foreach(root, key, v)
    {
        int ok = 0;
        for (size_t i = 0; i < sizeof known_params / sizeof known_params[0]; i++)
            if (strcmp(key, known_params[i].name) == 0 && (known_params[i].kinds & bit)) {
                ok = 1;
                break;
            }
        if (!ok) {
            char shown[64];
            snprintf(shown, sizeof shown, "%s", key);
            return sd_api_error_set(e, 400, shown, "unrecognized_argument",
                                    "Unrecognized request argument supplied: %s", shown);
        }
    }
    return 0;
}

/* Options specd does not implement: accepted only at their neutral value. */
static int check_unsupported(json_t *root, sd_oai_kind kind, sd_api_error *e)
{
    json_t *v;
    long long x;
    if ((v = json_object_get(root, "best_of")) && !json_is_null(v)) {
        if (get_int(v, "best_of", 1, 128, &x, e))
            return SD_EINVAL;
        if (x != 1)
            return unsupported(e, "best_of", "best_of > 1");
    }
    if ((v = json_object_get(root, "suffix")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return bad_type(e, "suffix", "a string", v);
        if (json_string_length(v))
            return unsupported(e, "suffix", "insertion with a suffix");
    }
    /* the legacy function calling */
    if ((v = json_object_get(root, "functions")) && !json_is_null(v)) {
        if (!json_is_array(v))
            return bad_type(e, "functions", "an array", v);
        if (json_array_size(v))
            return unsupported(e, "functions", "the legacy function calling (send tools)");
    }
    if ((v = json_object_get(root, "function_call")) && !json_is_null(v)) {
        if (!json_is_string(v) && !json_is_object(v))
            return bad_type(e, "function_call", "a string or an object", v);
        if (!json_is_string(v) || strcmp(json_string_value(v), "none") != 0)
            return unsupported(e, "function_call", "the legacy function calling (send tools)");
    }
    if ((v = json_object_get(root, "response_format")) && !json_is_null(v)) {
        if (!json_is_object(v))
            return bad_type(e, "response_format", "an object", v);
        json_t *t = json_object_get(v, "type");
        if (!json_is_string(t))
            return sd_api_error_set(e, 400, "response_format.type", "invalid_type",
                                    "response_format.type: expected a string");
        const char *ty = json_string_value(t);
        if (!strcmp(ty, "json_schema")) {
            json_t *js = json_object_get(v, "json_schema"), *f;
            if (!json_is_object(js))
                return sd_api_error_set(e, 400, "response_format.json_schema", "invalid_type",
                                        "response_format.json_schema: expected an object");
            if ((f = json_object_get(js, "name")) && !json_is_null(f) && !json_is_string(f))
                return bad_type(e, "response_format.json_schema.name", "a string", f);
            if ((f = json_object_get(js, "strict")) && !json_is_null(f) && !json_is_boolean(f))
                return bad_type(e, "response_format.json_schema.strict", "a boolean", f);
            if ((f = json_object_get(js, "schema")) && !json_is_null(f) && !json_is_object(f) &&
                !json_is_true(f))
                return bad_type(e, "response_format.json_schema.schema", "an object", f);
        } else if (strcmp(ty, "text") != 0 && strcmp(ty, "json_object") != 0) {
            return unsupported(e, "response_format",
                               "a response_format other than text, json_object and json_schema");
        }
    }
    if ((v = json_object_get(root, "user")) && !json_is_null(v) && !json_is_string(v))
        return bad_type(e, "user", "a string", v);
    if ((v = json_object_get(root, "store")) && !json_is_null(v)) {
        int b = 0;
        if (get_bool(v, "store", &b, e))
            return SD_EINVAL;
        if (b)
            return unsupported(e, "store", "storing completions");
    }
    if ((v = json_object_get(root, "metadata")) && !json_is_null(v) && !json_is_object(v))
        return bad_type(e, "metadata", "an object", v);
    if ((v = json_object_get(root, "service_tier")) && !json_is_null(v) && !json_is_string(v))
        return bad_type(e, "service_tier", "a string", v);
    return 0;
}

/* One prompt: a string, or an array of token ids (param names it in errors). */
static int parse_one_prompt(json_t *v, const char *param, sd_oai_prompt *p, sd_api_error *e)
{
    if (json_is_string(v)) {
        p->len = json_string_length(v);
        p->text = dup_n(json_string_value(v), p->len);
        return p->text ? 0 : oom(e);
    }
    if (!json_is_array(v))
        return sd_api_error_set(e, 400, "prompt", "invalid_type",
                                "%s: expected a string or an array of token ids, got %s", param,
                                type_name(v));
    size_t n = json_array_size(v);
    if (n == 0)
        return sd_api_error_set(e, 400, "prompt", "invalid_value", "%s: the token array is empty",
                                param);
    if (n > INT_MAX / 2)
        return sd_api_error_set(e, 400, "prompt", "invalid_value", "%s: too many tokens", param);
    p->ids = malloc(n * sizeof *p->ids);
    if (!p->ids)
        return oom(e);
    p->is_ids = 1;
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(v, i);
        if (!json_is_integer(t))
            return sd_api_error_set(e, 400, "prompt", "invalid_type",
                                    "%s[%zu]: expected a token id (integer), got %s", param, i,
                                    type_name(t));
        json_int_t id = json_integer_value(t);
        if (id < 0 || id > INT32_MAX)
            return sd_api_error_set(e, 400, "prompt", "invalid_value",
                                    "%s[%zu]: token id %lld is out of range", param, i, (long long)id);
        p->ids[i] = (int32_t)id;
        p->n_ids = (int)i + 1;
    }
    return 0;
}

/* prompt: a string, an array of token ids, or a batch: an array of
 * strings or of token arrays (batch: 0 allows one prompt only) */
static int parse_prompt(json_t *root, sd_oai_request *r, int batch, sd_api_error *e)
{
    json_t *v = json_object_get(root, "prompt");
    if (!v || json_is_null(v))
        return sd_api_error_set(e, 400, "prompt", "missing_required_parameter",
                                "prompt: this parameter is required");
    if (!json_is_string(v) && !json_is_array(v))
        return bad_type(e, "prompt", "a string, an array of strings or an array of token ids", v);
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n == 0)
        return sd_api_error_set(e, 400, "prompt", "invalid_value", "prompt: the array is empty");
    json_t *first = json_is_array(v) ? json_array_get(v, 0) : v;
    const int several = json_is_array(v) && (json_is_string(first) || json_is_array(first));
    if (!several)
        n = 1;
    if (several && n > 1 && !batch)
        return unsupported(e, "prompt", "a batch of several prompts here");
    if (n > SD_OAI_MAX_N)
        return sd_api_error_set(e, 400, "prompt", "invalid_value",
                                "prompt: %zu prompts, at most %d are allowed", n, SD_OAI_MAX_N);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts)
        return oom(e);
    r->n_prompts = (int)n;
    for (size_t i = 0; i < n; i++) {
        char param[32];
        if (several)
            snprintf(param, sizeof param, "prompt[%zu]", i);
        else
            snprintf(param, sizeof param, "prompt");
        if (parse_one_prompt(several ? json_array_get(v, i) : v, param, &r->prompts[i], e))
            return SD_EINVAL;
    }
    return 0;
}

/* Message content: a string, or an array of {"type": "text", "text": ...}
 * parts joined by newlines. null only for an assistant turn. */
static int parse_content(json_t *c, size_t i, int allow_null, char **out, sd_api_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (json_is_string(c)) {
        if (has_nul(c))
            return nul_error(e, param);
        *out = dup_n(json_string_value(c), json_string_length(c));
        return *out ? 0 : oom(e);
    }
    if ((!c || json_is_null(c)) && allow_null) {
        *out = dup_n("", 0);
        return *out ? 0 : oom(e);
    }
    if (!c)
        return sd_api_error_set(e, 400, param, "missing_required_parameter",
                                "%s: this parameter is required", param);
    if (!json_is_array(c))
        return bad_type(e, param, "a string or an array of content parts", c);
    sd_buf b = {0};
    for (size_t j = 0; j < json_array_size(c); j++) {
        json_t *part = json_array_get(c, j);
        char pp[96];
        snprintf(pp, sizeof pp, "messages[%zu].content[%zu]", i, j);
        if (!json_is_object(part)) {
            sd_buf_free(&b);
            return bad_type(e, pp, "an object", part);
        }
        json_t *t = json_object_get(part, "type");
        if (!json_is_string(t)) {
            sd_buf_free(&b);
            return sd_api_error_set(e, 400, pp, "invalid_type", "%s.type: expected a string", pp);
        }
        if (strcmp(json_string_value(t), "text") != 0) {
            char what[96];
            snprintf(what, sizeof what, "content of type '%.40s' (text only)", json_string_value(t));
            sd_buf_free(&b);
            return unsupported(e, pp, what);
        }
        json_t *txt = json_object_get(part, "text");
        if (!json_is_string(txt)) {
            sd_buf_free(&b);
            return sd_api_error_set(e, 400, pp, "invalid_type", "%s.text: expected a string", pp);
        }
        if (has_nul(txt)) {
            sd_buf_free(&b);
            return nul_error(e, pp);
        }
        if (j)
            sd_buf_append(&b, "\n", 1);
        sd_buf_append(&b, json_string_value(txt), json_string_length(txt));
    }
    if (b.oom) {
        sd_buf_free(&b);
        return oom(e);
    }
    *out = sd_buf_take(&b, NULL);
    return *out ? 0 : oom(e);
}

/* A function name as OpenAI allows it: 1-64 of a-z A-Z 0-9 _ - */
static int fn_name_ok(const json_t *n)
{
    if (!json_is_string(n) || json_string_length(n) < 1 || json_string_length(n) > 64)
        return 0;
    for (const char *s = json_string_value(n); *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-'))
            return 0;
    return strlen(json_string_value(n)) == json_string_length(n);
}

/* chat_template_kwargs (vLLM's and SGLang's): the template arguments specd's
 * renderers read, enable_thinking and thinking (booleans); any other is
 * refused by name, so a client never believes it reached the template. */
static int parse_kwargs(json_t *root, sd_oai_request *r, sd_api_error *e)
{
    r->kwargs = SD_CHAT_KWARGS_NONE;
    json_t *v = json_object_get(root, "chat_template_kwargs"), *x;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return bad_type(e, "chat_template_kwargs", "an object", v);
    const char *key;
    json_object_foreach(v, key, x)
    {
        char p[96];
        snprintf(p, sizeof p, "chat_template_kwargs.%.60s", key);
        int *to = !strcmp(key, "enable_thinking") ? &r->kwargs.enable_thinking
                  : !strcmp(key, "thinking")      ? &r->kwargs.thinking
                                                  : NULL;
        if (!to)
            return sd_api_error_set(e, 400, p, "unsupported_parameter",
                                    "%s: not a template argument specd passes (enable_thinking and thinking are)", p);
        if (!json_is_null(x) && get_bool(x, p, to, e))
            return SD_EINVAL;
    }
    return 0;
}

/* a number's range */
static const char *const RANGE_KW[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

/* a schema of a "type" with integer or number among it whose range
 * keywords are numbers: json_schema holds them (it refuses them without a
 * type) */
static int range_held(json_t *sch)
{
    json_t *ty = json_object_get(sch, "type");
    int numeric = 0;
    for (size_t i = 0; i < (json_is_array(ty) ? json_array_size(ty) : 1); i++) {
        const char *t = json_string_value(json_is_array(ty) ? json_array_get(ty, i) : ty);
        numeric |= t && (!strcmp(t, "integer") || !strcmp(t, "number"));
    }
    for (size_t i = 0; i < sizeof RANGE_KW / sizeof RANGE_KW[0]; i++) {
        json_t *b = json_object_get(sch, RANGE_KW[i]);
        if (b && !json_is_number(b))
            return 0;
    }
    return numeric;
}

/* 1 where json_schema holds sch's keywords kw (n of them, those present)
 * under the type ty (NULL: sch's own "type"): compiled alone to see */
static int held_alone(json_t *sch, const char *ty, const char *const *kw, size_t n)
{
    json_t *probe = json_object();
    if (probe && ty)
        json_object_set_new(probe, "type", json_string(ty));
    else if (probe && json_object_get(sch, "type"))
        json_object_set(probe, "type", json_object_get(sch, "type"));
    for (size_t i = 0; probe && i < n; i++)
        if (json_object_get(sch, kw[i]))
            json_object_set(probe, kw[i], json_object_get(sch, kw[i]));
    char *text = probe ? json_dumps(probe, JSON_COMPACT) : NULL;
    json_decref(probe);
    sd_jschema *s = NULL;
    const int ok = text && !sd_jschema_compile(text, strlen(text), &s, NULL);
    sd_jschema_free(s);
    free(text);
    return ok;
}

/* "multipleOf" as json_schema holds it: an integer's (a "type" with
 * integer, not number), a whole number from 1 to 2^32 - 1 */
static int multiple_held(json_t *sch)
{
    static const char *const kw[] = {"multipleOf"};
    return held_alone(sch, NULL, kw, 1);
}

/* "pattern" as json_schema holds it: one of its subset, which some string
 * of the schema's lengths matches */
static int pattern_held(json_t *sch)
{
    static const char *const kw[] = {"pattern", "minLength", "maxLength"};
    return held_alone(sch, "string", kw, 3);
}

/* A tool's parameters schema without the value bounds json_schema does not
 * take (a number's multiples, patterns outside its subset, objects'
 * counts, unique items, a range without a numeric type): a forced call
 * keeps its arguments' keys, types, enums, integers' and numbers' ranges,
 * integers' multiples and strings' patterns (tools' schemas carry such
 * bounds often; response_format's are refused) */
static void strip_bounds(json_t *sch)
{
    static const char *const bounds[] = {"minProperties",   "maxProperties", "uniqueItems",
                                         "contentEncoding", "contentMediaType"};
    if (!json_is_object(sch))
        return;
    const int keep_range = range_held(sch);
    for (size_t i = 0; !keep_range && i < sizeof RANGE_KW / sizeof RANGE_KW[0]; i++)
        json_object_del(sch, RANGE_KW[i]);
    if (json_object_get(sch, "multipleOf") && !multiple_held(sch))
        json_object_del(sch, "multipleOf");
    if (json_object_get(sch, "pattern") && !pattern_held(sch))
        json_object_del(sch, "pattern");
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        json_object_del(sch, bounds[i]);
    static const char *const maps[] = {"properties", "$defs", "definitions"};
    for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
        const char *k;
        json_t *x;
        json_object_foreach(json_object_get(sch, maps[i]), k, x)
            strip_bounds(x);
    }
    static const char *const lists[] = {"anyOf", "oneOf", "allOf", "items", "prefixItems"};
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        json_t *l = json_object_get(sch, lists[i]);
        if (json_is_object(l))
            strip_bounds(l);
        for (size_t k = 0; k < json_array_size(l); k++)
            strip_bounds(json_array_get(l, k));
    }
    strip_bounds(json_object_get(sch, "additionalProperties"));
}

/* Compiles r->schema_text to check it: through r->schemas where the server
 * gave its engine's cache (held there, r->held, in place of the schema it
 * replaces, until sd_oai_request_free: the engine's look-up of the same
 * text finds it), else alone. 0, or the compiler's error. */
static int check_schema(sd_oai_request *r, sd_err *ce)
{
    if (r->schemas) {
        const sd_jschema *s = NULL;
        const int rc = sd_schema_cache_get(r->schemas, r->schema_text, &s, ce);
        if (!rc) {
            sd_schema_cache_put(r->schemas, r->held);
            r->held = s;
        }
        return rc;
    }
    sd_jschema *cs = NULL;
    const int rc = sd_jschema_compile(r->schema_text, strlen(r->schema_text), &cs, ce);
    sd_jschema_free(cs);
    return rc;
}

/* r's schema becomes text (owned; NULL: out of memory) where it compiles
 * (check_schema), else stays: 1 it did, 0 refused, -1 out of memory */
static int swap_schema(sd_oai_request *r, char *text)
{
    if (!text)
        return -1;
    char *old = r->schema_text;
    r->schema_text = text;
    sd_err ce = {0};
    const int rc = check_schema(r, &ce);
    if (rc) {
        r->schema_text = old;
        free(text);
        return rc == SD_ENOMEM ? -1 : 0;
    }
    free(old);
    r->gen.json_schema = r->schema_text;
    return 1;
}

/* a tool's parameters for a forced call: a copy without the bounds
 * json_schema does not take (an object of no keys where none are given) */
static json_t *tool_params(json_t *f)
{
    json_t *pa = json_object_get(f, "parameters");
    json_t *params = json_is_object(pa) ? json_deep_copy(pa)
                                        : json_pack("{s:s, s:{}}", "type", "object", "properties");
    strip_bounds(params);
    return params;
}

/* The literals of a model's own call format (verify/json_schema.h's
 * x-specd-calls): the text its chat template writes a call as, which the
 * tool-call parser reads (net/toolcall.h). */
typedef struct call_fmt {
    const char *begin, *sep, *end, *pre_tail, *suffix;
    int specials, one; /* special tokens' text in the literals; one call at most */
} call_fmt;

static const call_fmt *call_fmt_of(sd_tool_format f)
{
    static const call_fmt HERMES = {"<tool_call>\n{\"name\": \"", "\n<tool_call>\n{\"name\": \"", "",
                                    "\", \"arguments\": ", "}\n</tool_call>", 0, 0};
    static const call_fmt LLAMA = {"{\"name\": \"", "", "", "\", \"parameters\": ", "}", 0, 1};
    static const call_fmt DS3 = {SD_DS_CALLS SD_DS_CALL "function" SD_DS_SEP,
                                 "\n" SD_DS_CALL "function" SD_DS_SEP, SD_DS_CALLS_END, "\n```json\n",
                                 "\n```" SD_DS_CALL_END, 1, 0};
    static const call_fmt DS31 = {SD_DS_CALLS SD_DS_CALL, SD_DS_CALL, SD_DS_CALLS_END, SD_DS_SEP,
                                  SD_DS_CALL_END, 1, 0};
    /* functions.NAME:I, I the call's number (the digits byte, 0x01) */
    static const call_fmt KIMI = {SD_KIMI_CALLS SD_KIMI_CALL "functions.", SD_KIMI_CALL "functions.",
                                  SD_KIMI_CALLS_END, ":\x01" SD_KIMI_ARGS, SD_KIMI_CALL_END, 1, 0};
    switch (f) {
    case SD_TOOLS_HERMES: return &HERMES;
    case SD_TOOLS_JSON: return &LLAMA;
    case SD_TOOLS_DEEPSEEK3: return &DS3;
    case SD_TOOLS_DEEPSEEK31: return &DS31;
    case SD_TOOLS_KIMI: return &KIMI;
    default: return NULL;
    }
}

int sd_oai_force_format(sd_oai_request *r, sd_tool_format f, sd_api_error *e)
{
    const call_fmt *cf = call_fmt_of(f);
    if (!r->tool_forced || !r->tools || !cf)
        return 0;
    json_t *tools = json_array();
    for (size_t i = 0; tools && i < json_array_size(r->tools); i++) {
        json_t *fn = json_object_get(json_array_get(r->tools, i), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (r->tool_forced == 1 && strcmp(name, r->forced_name))
            continue;
        char pre[128];
        snprintf(pre, sizeof pre, "%s%s", name, cf->pre_tail);
        json_array_append_new(tools, json_pack("{s:s, s:o, s:s}", "prefix", pre, "parameters",
                                               tool_params(fn), "suffix", cf->suffix));
    }
    const int max = r->tool_forced == 1 || !r->parallel_tool_calls || cf->one ? 1 : 16;
    json_t *spec = tools ? json_pack("{s:{s:s, s:s, s:s, s:i, s:b, s:o}}", "x-specd-calls", "begin",
                                     cf->begin, "sep", cf->sep, "end", cf->end, "max", max,
                                     "specials", cf->specials, "tools", tools)
                         : NULL;
    char *text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    /* (refused: a tool's parameters that are not an object schema; the bare JSON stays) */
    const int rc = swap_schema(r, text);
    if (rc < 0)
        return oom(e);
    if (rc)
        r->tool_format = f;
    return 0;
}

int sd_oai_json_after(sd_oai_request *r, const char *open, const char *close, int specials,
                      sd_api_error *e)
{
    /* json_object: any object, as a schema */
    const char *sch = r->gen.json_schema ? r->gen.json_schema
                      : r->gen.json_object ? "{\"type\":\"object\",\"additionalProperties\":true}"
                                           : NULL;
    if (!sch)
        return 0;
    json_error_t je;
    json_t *then = json_loads(sch, JSON_DECODE_ANY, &je);
    json_t *o = then ? json_pack("{s:s, s:b, s:o}", "x-specd-after", close, "specials", specials,
                                 "x-specd-then", then)
                     : NULL;
    if (o && open && json_object_set_new(o, "x-specd-open", json_string(open))) {
        json_decref(o);
        o = NULL;
    }
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    /* (refused: past the length limit wrapped; the schema stays as it was) */
    const int rc = swap_schema(r, text);
    if (rc > 0)
        r->gen.json_object = 0;
    return rc < 0 ? oom(e) : 0;
}

/* The JSON Schema a forced tool_choice decodes to (vLLM's way, whatever the
 * model's own call format): a named function's parameters; for required,
 * an array of at least one {"name": a tool's, "parameters": its}, at most
 * one without parallel_tool_calls. Compiled here: a parameters schema
 * outside json_schema's subset is a 400 naming tools. */
static int forced_schema(sd_oai_request *r, json_t *tools, sd_api_error *e)
{
    json_t *sch = NULL, *alts = json_array();
    for (size_t i = 0; alts && i < json_array_size(tools); i++) {
        json_t *f = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        json_t *params = tool_params(f);
        if (r->tool_forced == 1) {
            if (!strcmp(name, r->forced_name)) {
                sch = params;
                break;
            }
            json_decref(params);
            continue;
        }
        json_array_append_new(
            alts, json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s,s], s:b}", "type", "object", "properties",
                            "name", "const", name, "parameters", params, "required", "name",
                            "parameters", "additionalProperties", 0));
    }
    if (r->tool_forced == 1 && !sch) {
        json_decref(alts);
        return sd_api_error_set(e, 400, "tool_choice", "invalid_value",
                                "tool_choice: the function \"%.64s\" is not among the tools",
                                r->forced_name);
    }
    if (r->tool_forced == 2) {
        json_t *items = json_array_size(alts) == 1 ? json_incref(json_array_get(alts, 0))
                                                   : json_pack("{s:O}", "anyOf", alts);
        sch = json_pack("{s:s, s:i, s:o}", "type", "array", "minItems", 1, "items", items);
        if (sch && !r->parallel_tool_calls)
            json_object_set_new(sch, "maxItems", json_integer(1));
    }
    json_decref(alts);
    r->schema_text = sch ? json_dumps(sch, JSON_COMPACT) : NULL;
    json_decref(sch);
    if (!r->schema_text)
        return oom(e);
    sd_err ce = {0};
    const int rc = check_schema(r, &ce);
    if (rc == SD_ENOMEM)
        return oom(e);
    if (rc)
        return sd_api_error_set(e, 400, "tools", "invalid_value",
                                "tools: a forced tool_choice decodes to the tools' parameters, and "
                                "%s",
                                ce.msg);
    r->gen.json_schema = r->schema_text;
    return 0;
}

/* tools, tool_choice, parallel_tool_calls. The tools go to the template as
 * given (it prints each with tojson), so each is checked for OpenAI's shape:
 * {"type": "function", "function": {"name", "description"?, "parameters"?,
 * "strict"?}}. tool_choice "auto" (the default) and "none" are served, and
 * "required" or a named function {"type": "function", "function": {"name"}}
 * decode the reply to a call (forced_schema). */
static int parse_tools(json_t *root, sd_oai_request *r, sd_api_error *e)
{
    json_t *v = json_object_get(root, "parallel_tool_calls");
    r->parallel_tool_calls = 1;
    if (v && !json_is_null(v) && get_bool(v, "parallel_tool_calls", &r->parallel_tool_calls, e))
        return SD_EINVAL;
    v = json_object_get(root, "tools");
    int none = 0;
    json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (!json_is_string(tc) && !json_is_object(tc))
            return bad_type(e, "tool_choice", "a string or an object", tc);
        const char *s = json_is_string(tc) ? json_string_value(tc) : "";
        if (json_is_string(tc) && strcmp(s, "none") && strcmp(s, "auto") && strcmp(s, "required"))
            return sd_api_error_set(e, 400, "tool_choice", "invalid_value",
                                    "tool_choice: '%.40s' is not one of none, auto, required", s);
        if (json_is_object(tc)) {
            json_t *ty = json_object_get(tc, "type"),
                   *fn = json_object_get(json_object_get(tc, "function"), "name");
            if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_string(fn))
                return sd_api_error_set(e, 400, "tool_choice", "invalid_value",
                                        "tool_choice: expected {\"type\": \"function\", "
                                        "\"function\": {\"name\": ...}}");
            if (!(r->forced_name = strdup(json_string_value(fn))))
                return oom(e);
            r->tool_forced = 1;
        } else if (!strcmp(s, "required")) {
            r->tool_forced = 2;
        }
        none = !strcmp(s, "none");
        if (!none && (!v || json_is_null(v) || !json_array_size(v)))
            return sd_api_error_set(e, 400, "tool_choice", "invalid_value",
                                    "tool_choice: only allowed when tools are given");
    }
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return bad_type(e, "tools", "an array", v);
    if (json_array_size(v) > 128)
        return sd_api_error_set(e, 400, "tools", "invalid_value", "tools: %zu tools, at most 128 are allowed",
                                json_array_size(v));
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *t = json_array_get(v, i), *ty = json_object_get(t, "type"), *f = json_object_get(t, "function");
        char p[64];
        snprintf(p, sizeof p, "tools[%zu]", i);
        if (!json_is_object(t))
            return bad_type(e, p, "an object", t);
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))
            return sd_api_error_set(e, 400, p, "invalid_value", "%s.type: must be \"function\"", p);
        if (!json_is_object(f))
            return sd_api_error_set(e, 400, p, "invalid_value", "%s.function: expected an object", p);
        if (!fn_name_ok(json_object_get(f, "name")))
            return sd_api_error_set(e, 400, p, "invalid_value",
                                    "%s.function.name: 1 to 64 of a-z, A-Z, 0-9, _ and - are required", p);
        json_t *d = json_object_get(f, "description"), *pa = json_object_get(f, "parameters"),
               *st = json_object_get(f, "strict");
        if ((d && !json_is_string(d) && !json_is_null(d)) || (pa && !json_is_object(pa) && !json_is_null(pa)) ||
            (st && !json_is_boolean(st) && !json_is_null(st)))
            return sd_api_error_set(e, 400, p, "invalid_type",
                                    "%s.function: description must be a string, parameters an object, "
                                    "strict a boolean",
                                    p);
    }
    if (!none && json_array_size(v))
        r->tools = json_incref(v);
    return r->tool_forced ? forced_schema(r, v, e) : 0;
}

/* An assistant message's tool_calls: [{id, type: "function", function: {name,
 * arguments: JSON text of an object}}]. */
static int parse_calls(json_t *tc, size_t i, sd_oai_msg *m, sd_api_error *e)
{
    char p[96];
    snprintf(p, sizeof p, "messages[%zu].tool_calls", i);
    if (!json_is_array(tc))
        return bad_type(e, p, "an array", tc);
    m->calls = calloc(json_array_size(tc) ? json_array_size(tc) : 1, sizeof *m->calls);
    if (!m->calls)
        return oom(e);
    for (size_t k = 0; k < json_array_size(tc); k++) {
        json_t *c = json_array_get(tc, k), *f = json_object_get(c, "function");
        json_t *ty = json_object_get(c, "type"), *args = json_object_get(f, "arguments");
        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu]", i, k);
        if (!json_is_object(c) || !json_is_object(f) || (ty && !json_is_null(ty) && (!json_is_string(ty) ||
                                                                                    strcmp(json_string_value(ty),
                                                                                           "function"))))
            return sd_api_error_set(e, 400, p, "invalid_value",
                                    "%s: expected {\"type\": \"function\", \"function\": {...}}", p);
        if (!fn_name_ok(json_object_get(f, "name")))
            return sd_api_error_set(e, 400, p, "invalid_value",
                                    "%s.function.name: 1 to 64 of a-z, A-Z, 0-9, _ and - are required", p);
        if (!json_is_string(args))
            return sd_api_error_set(e, 400, p, "invalid_type", "%s.function.arguments: expected a string", p);
        json_error_t je;
        json_t *a = json_loadb(json_string_value(args), json_string_length(args), JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(a)) {
            json_decref(a);
            return sd_api_error_set(e, 400, p, "invalid_value",
                                    "%s.function.arguments: not the JSON text of an object", p);
        }
        m->calls[k].arguments = a;
        m->calls[k].name = dup_n(json_string_value(json_object_get(f, "name")),
                                 json_string_length(json_object_get(f, "name")));
        m->calls[k].arguments_text = dup_n(json_string_value(args), json_string_length(args));
        m->n_calls = (int)k + 1;
        if (!m->calls[k].name || !m->calls[k].arguments_text)
            return oom(e);
        json_t *id = json_object_get(c, "id");
        if (id && !json_is_null(id)) {
            if (!json_is_string(id) || has_nul(id))
                return sd_api_error_set(e, 400, p, "invalid_type", "%s.id: expected a string", p);
            if (!(m->calls[k].id = dup_n(json_string_value(id), json_string_length(id))))
                return oom(e);
        }
    }
    return 0;
}

static int parse_messages(json_t *root, sd_oai_request *r, sd_api_error *e)
{
    json_t *v = json_object_get(root, "messages");
    if (!v || json_is_null(v))
        return sd_api_error_set(e, 400, "messages", "missing_required_parameter",
                                "messages: this parameter is required");
    if (!json_is_array(v))
        return bad_type(e, "messages", "an array", v);
    size_t n = json_array_size(v);
    if (n == 0)
        return sd_api_error_set(e, 400, "messages", "invalid_value",
                                "messages: at least one message is required");
    if (n > 100000)
        return sd_api_error_set(e, 400, "messages", "invalid_value", "messages: too many messages");
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs)
        return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i);
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m))
            return bad_type(e, param, "an object", m);
        const char *key;
        json_t *f;
        json_object_foreach(m, key, f)
        {
            if (!strcmp(key, "role") || !strcmp(key, "content") || !strcmp(key, "name"))
                continue;
            int empty = json_is_null(f) || (json_is_array(f) && json_array_size(f) == 0);
            if (!strcmp(key, "tool_calls") || !strcmp(key, "tool_call_id"))
                continue; /* checked with the role */
            if (!strcmp(key, "function_call")) {
                if (empty)
                    continue;
                char p2[128];
                snprintf(p2, sizeof p2, "%s.%s", param, key);
                return unsupported(e, p2, "the legacy function calling (send tool_calls)");
            }
            if (!strcmp(key, "refusal") && json_is_null(f))
                continue;
            char p2[128];
            snprintf(p2, sizeof p2, "%s.%.40s", param, key);
            return sd_api_error_set(e, 400, p2, "unrecognized_argument",
                                    "Unrecognized request argument supplied: %s", p2);
        }
        json_t *name = json_object_get(m, "name");
        if (name && !json_is_null(name) && !json_is_string(name)) {
            char p2[128];
            snprintf(p2, sizeof p2, "%s.name", param);
            return bad_type(e, p2, "a string", name);
        }
        json_t *role = json_object_get(m, "role");
        char rp[96];
        snprintf(rp, sizeof rp, "%s.role", param);
        if (!role)
            return sd_api_error_set(e, 400, rp, "missing_required_parameter",
                                    "%s: this parameter is required", rp);
        if (!json_is_string(role))
            return bad_type(e, rp, "a string", role);
        if (has_nul(role))
            return nul_error(e, rp);
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "developer"))
            rs = "system";
        if (!strcmp(rs, "function"))
            return unsupported(e, rp, "the legacy function role (send the tool role)");
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))
            return sd_api_error_set(e, 400, rp, "invalid_value",
                                    "%s: '%.40s' is not one of system, developer, user, assistant, tool",
                                    rp, rs);
        r->msgs[i].role = dup_n(rs, strlen(rs));
        r->n_msgs = (int)i + 1;
        if (!r->msgs[i].role)
            return oom(e);
        json_t *tc = json_object_get(m, "tool_calls"), *tid = json_object_get(m, "tool_call_id");
        int has_calls = tc && !json_is_null(tc) && !(json_is_array(tc) && json_array_size(tc) == 0);
        char p2[128];
        if (has_calls && strcmp(rs, "assistant")) {
            snprintf(p2, sizeof p2, "%s.tool_calls", param);
            return sd_api_error_set(e, 400, p2, "invalid_value", "%s: only an assistant message has tool calls", p2);
        }
        if (tid && !json_is_null(tid) && (!json_is_string(tid) || strcmp(rs, "tool"))) {
            snprintf(p2, sizeof p2, "%s.tool_call_id", param);
            return sd_api_error_set(e, 400, p2, "invalid_value", "%s: a string, in a tool message only", p2);
        }
        if (has_calls && parse_calls(tc, i, &r->msgs[i], e))
            return SD_EINVAL;
        if (tid && json_is_string(tid)) {
            if (has_nul(tid)) {
                snprintf(p2, sizeof p2, "%s.tool_call_id", param);
                return nul_error(e, p2);
            }
            if (!(r->msgs[i].tool_call_id = dup_n(json_string_value(tid), json_string_length(tid))))
                return oom(e);
        }
        json_t *cv = json_object_get(m, "content");
        r->msgs[i].content_null = !cv || json_is_null(cv);
        if (parse_content(cv, i, !strcmp(rs, "assistant"),
                          &r->msgs[i].content, e))
            return SD_EINVAL;
    }
    return 0;
}

static int parse_stop(json_t *root, sd_oai_request *r, sd_api_error *e)
{
    json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v))
        return 0;
    size_t n;
    if (json_is_string(v))
        n = 1;
    else if (json_is_array(v))
        n = json_array_size(v);
    else
        return bad_type(e, "stop", "a string or an array of strings", v);
    if (n > SD_OAI_MAX_STOP)
        return sd_api_error_set(e, 400, "stop", "invalid_value",
                                "stop: %zu stop strings, at most %d are allowed", n,
                                SD_OAI_MAX_STOP);
    r->stop = calloc(n ? n : 1, sizeof *r->stop);
    if (!r->stop)
        return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(s))
            return sd_api_error_set(e, 400, "stop", "invalid_type",
                                    "stop[%zu]: expected a string, got %s", i, type_name(s));
        size_t len = json_string_length(s);
        if (len == 0 || len > SD_OAI_MAX_STOP_LEN)
            return sd_api_error_set(e, 400, "stop", "invalid_value",
                                    "stop[%zu]: a stop string holds 1 to %d bytes, not %zu", i,
                                    SD_OAI_MAX_STOP_LEN, len);
        if (has_nul(s))
            return sd_api_error_set(e, 400, "stop", "invalid_value",
                                    "stop[%zu]: NUL characters are not allowed", i);
        r->stop[i] = dup_n(json_string_value(s), len);
        r->n_stop = (int)i + 1;
        if (!r->stop[i])
            return oom(e);
    }
    return 0;
}

static int parse_fields(json_t *root, sd_oai_kind kind, const char *served_model,
                        sd_oai_request *r, sd_api_error *e)
{
    json_t *v;
    if (check_known(root, kind, e))
        return SD_EINVAL;

    v = json_object_get(root, "model");
    if (!v || json_is_null(v))
        return sd_api_error_set(e, 400, "model", "missing_required_parameter",
                                "model: this parameter is required");
    if (!json_is_string(v))
        return bad_type(e, "model", "a string", v);
    if (has_nul(v))
        return nul_error(e, "model");
    if (served_model && strcmp(json_string_value(v), served_model) != 0)
        return sd_api_error_set(e, 400, "model", "model_not_found",
                                "The model '%.200s' does not exist; this server serves '%.200s'",
                                json_string_value(v), served_model);
    r->model = dup_n(json_string_value(v), json_string_length(v));
    if (!r->model)
        return oom(e);

    if (kind == SD_OAI_CHAT ? parse_messages(root, r, e) || parse_tools(root, r, e) || parse_kwargs(root, r, e)
                            : parse_prompt(root, r, 1, e))
        return SD_EINVAL;

    if ((v = json_object_get(root, "stream")) && !json_is_null(v) &&
        get_bool(v, "stream", &r->stream, e))
        return SD_EINVAL;
    if ((v = json_object_get(root, "stream_options")) && !json_is_null(v)) {
        if (!json_is_object(v))
            return bad_type(e, "stream_options", "an object", v);
        if (!r->stream)
            return sd_api_error_set(e, 400, "stream_options", "invalid_value",
                                    "stream_options: only allowed when stream is true");
        const char *key;
        json_t *f;
        json_object_foreach(v, key, f)
        {
            if (strcmp(key, "include_usage") == 0) {
                if (!json_is_null(f) && get_bool(f, "stream_options.include_usage",
                                                 &r->include_usage, e))
                    return SD_EINVAL;
            } else {
                char p2[128];
                snprintf(p2, sizeof p2, "stream_options.%.60s", key);
                return sd_api_error_set(e, 400, p2, "unrecognized_argument",
                                        "Unrecognized request argument supplied: %s", p2);
            }
        }
    }

    long long x;
    json_t *mt = json_object_get(root, "max_tokens");
    json_t *mct = json_object_get(root, "max_completion_tokens");
    r->max_tokens = -1;
    r->max_tokens_param = "max_tokens";
    if (mct && !json_is_null(mct)) {
        if (get_int(mct, "max_completion_tokens", 1, INT_MAX, &x, e))
            return SD_EINVAL;
        r->max_tokens = (int)x;
        r->max_tokens_param = "max_completion_tokens";
    }
    if (mt && !json_is_null(mt)) {
        if (get_int(mt, "max_tokens", 0, INT_MAX, &x, e)) /* 0: with echo (below) */
            return SD_EINVAL;
        if (r->max_tokens >= 0 && r->max_tokens != (int)x)
            return sd_api_error_set(e, 400, "max_tokens", "invalid_value",
                                    "max_tokens and max_completion_tokens disagree (%lld vs %d)",
                                    x, r->max_tokens);
        if (r->max_tokens < 0) {
            r->max_tokens = (int)x;
            r->max_tokens_param = "max_tokens";
        }
    }

    sd_gen_params *g = &r->gen;
    g->temperature = 1.0; /* OpenAI's default */
    g->top_p = 1.0;
    g->top_k = 0;
    if ((v = json_object_get(root, "temperature")) && !json_is_null(v) &&
        get_num(v, "temperature", 0.0, 0, 2.0, &g->temperature, e))
        return SD_EINVAL;
    if ((v = json_object_get(root, "top_p")) && !json_is_null(v) &&
        get_num(v, "top_p", 0.0, 1, 1.0, &g->top_p, e))
        return SD_EINVAL;
    if ((v = json_object_get(root, "top_k")) && !json_is_null(v)) {
        /* -1 and 0 both mean off (vLLM and SGLang spell it -1). */
        if (get_int(v, "top_k", -1, INT_MAX, &x, e))
            return SD_EINVAL;
        g->top_k = x < 0 ? 0 : (int)x;
    }
    if ((v = json_object_get(root, "seed")) && !json_is_null(v)) {
        if (get_int(v, "seed", LLONG_MIN, LLONG_MAX, &x, e))
            return SD_EINVAL;
        g->seed = (uint64_t)x;
        g->has_seed = 1;
    }
    /* log probabilities: chat's logprobs (a bool) and top_logprobs (which
     * needs it); completions' logprobs (the top count) */
    if ((v = json_object_get(root, "logprobs")) && !json_is_null(v)) {
        if (kind == SD_OAI_CHAT) {
            if (get_bool(v, "logprobs", &g->logprobs, e))
                return SD_EINVAL;
        } else {
            if (get_int(v, "logprobs", 0, SD_MAX_TOP_LOGPROBS, &x, e))
                return SD_EINVAL;
            g->logprobs = 1;
            g->top_logprobs = (int)x;
        }
    }
    if ((v = json_object_get(root, "top_logprobs")) && !json_is_null(v)) { /* (chat only) */
        if (get_int(v, "top_logprobs", 0, SD_MAX_TOP_LOGPROBS, &x, e))
            return SD_EINVAL;
        if (!g->logprobs)
            return sd_api_error_set(e, 400, "top_logprobs", "invalid_value",
                                    "top_logprobs: logprobs must be true to use it");
        g->top_logprobs = (int)x;
    }
    /* logits processors: the penalties and logit_bias ({"token id": bias}) */
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++) {
        double d = 0;
        if ((v = json_object_get(root, penalties[i])) && !json_is_null(v) &&
            get_num(v, penalties[i], -2.0, 0, 2.0, &d, e))
            return SD_EINVAL;
        *(i ? &g->frequency_penalty : &g->presence_penalty) = (float)d;
    }
    if ((v = json_object_get(root, "logit_bias")) && !json_is_null(v)) {
        if (!json_is_object(v))
            return bad_type(e, "logit_bias", "an object", v);
        size_t nb = json_object_size(v);
        if (nb > SD_MAX_LOGIT_BIAS)
            return sd_api_error_set(e, 400, "logit_bias", "invalid_value",
                                    "logit_bias: %zu tokens, at most %d are allowed", nb, SD_MAX_LOGIT_BIAS);
        r->bias_ids = malloc((nb ? nb : 1) * sizeof *r->bias_ids);
        r->bias = malloc((nb ? nb : 1) * sizeof *r->bias);
        if (!r->bias_ids || !r->bias)
            return oom(e);
        const char *key;
        json_t *b;
        json_object_foreach(v, key, b)
        {
            int64_t id = -1;
            double d = 0;
            char p2[96];
            snprintf(p2, sizeof p2, "logit_bias.%.60s", key);
            if (sd_parse_i64(key, &id) || id < 0 || id > INT32_MAX)
                return sd_api_error_set(e, 400, "logit_bias", "invalid_value",
                                        "logit_bias: the key \"%.60s\" is not a token id", key);
            if (get_num(b, p2, -100.0, 0, 100.0, &d, e))
                return SD_EINVAL;
            r->bias_ids[r->n_bias] = (int32_t)id;
            r->bias[r->n_bias++] = (float)d;
        }
        g->bias_ids = r->bias_ids;
        g->bias = r->bias;
        g->n_bias = r->n_bias;
    }
    /* response_format json_object / json_schema (their shape checked with
     * the others); a schema is compiled here so that what it does not take
     * is the client's 400 (through the engine's cache: check_schema) */
    json_t *rf = json_object_get(json_object_get(root, "response_format"), "type");
    g->json_object = json_is_string(rf) && !strcmp(json_string_value(rf), "json_object");
    if (r->tool_forced && json_is_string(rf) && strcmp(json_string_value(rf), "text"))
        return sd_api_error_set(e, 400, "response_format", "invalid_value",
                                "response_format: a forced tool_choice decodes the reply to a call "
                                "already");
    if (json_is_string(rf) && !strcmp(json_string_value(rf), "json_schema")) {
        json_t *sc = json_object_get(
            json_object_get(json_object_get(root, "response_format"), "json_schema"), "schema");
        r->schema_text = sc && !json_is_null(sc) ? json_dumps(sc, JSON_COMPACT | JSON_ENCODE_ANY)
                                                 : strdup("{}");
        if (!r->schema_text)
            return oom(e);
        sd_err ce = {0};
        const int crc = check_schema(r, &ce);
        if (crc == SD_ENOMEM)
            return oom(e);
        if (crc)
            return sd_api_error_set(e, 400, "response_format.json_schema.schema",
                                    "invalid_value", "%s", ce.msg);
        g->json_schema = r->schema_text;
    }
    /* completions' echo (the key is refused for chat with the other
     * unknown ones) */
    if ((v = json_object_get(root, "echo")) && !json_is_null(v)) {
        if (get_bool(v, "echo", &r->echo, e))
            return SD_EINVAL;
        g->prompt_logprobs = r->echo && g->logprobs;
    }
    /* max_tokens 0: the prompt alone comes back (echo), with its logprobs
     * (an evaluation's scoring) */
    if (r->max_tokens == 0 && !r->echo)
        return sd_api_error_set(e, 400, r->max_tokens_param, "invalid_value",
                                "%s: must be at least 1 (0 only with echo)", r->max_tokens_param);
    r->n = 1;
    if ((v = json_object_get(root, "n")) && !json_is_null(v)) {
        if (get_int(v, "n", 1, SD_OAI_MAX_N, &x, e))
            return SD_EINVAL;
        r->n = (int)x;
    }
    if (r->n_prompts > 1 && (long long)r->n * r->n_prompts > SD_OAI_MAX_N)
        return sd_api_error_set(e, 400, "n", "invalid_value",
                                "n: %d choices for each of %d prompts make %lld, at most %d are allowed",
                                r->n, r->n_prompts, (long long)r->n * r->n_prompts, SD_OAI_MAX_N);
    if ((v = json_object_get(root, "min_tokens")) && !json_is_null(v)) { /* (vLLM's) */
        if (get_int(v, "min_tokens", 0, INT_MAX, &x, e))
            return SD_EINVAL;
        g->min_tokens = (int)x;
    }
    if ((v = json_object_get(root, "ignore_eos")) && !json_is_null(v) &&
        get_bool(v, "ignore_eos", &g->ignore_eos, e))
        return SD_EINVAL;
    if (parse_stop(root, r, e))
        return SD_EINVAL;
    g->stop = (const char *const *)r->stop;
    g->n_stop = r->n_stop;
    return check_unsupported(root, kind, e);
}

int sd_oai_parse(sd_oai_kind kind, const char *body, size_t len, const char *served_model,
                 sd_schema_cache *schemas, sd_oai_request *r, sd_api_error *e)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->schemas = schemas;
    r->max_tokens = -1;
    r->kwargs = SD_CHAT_KWARGS_NONE;
    r->add_generation_prompt = 1;
    r->add_special_tokens = kind == SD_OAI_COMPLETIONS;
    json_error_t je;
    json_t *root = json_loadb(body ? body : "", body ? len : 0, LOAD_FLAGS, &je);
    if (!root)
        return sd_api_error_set(e, 400, NULL, "invalid_json",
                                "The request body is not valid JSON: %s (line %d, column %d)",
                                je.text, je.line, je.column);
    int rc = 0;
    if (!json_is_object(root))
        rc = sd_api_error_set(e, 400, NULL, "invalid_json",
                              "The request body must be a JSON object, got %s", type_name(root));
    else
        rc = parse_fields(root, kind, served_model, r, e);
    json_decref(root);
    if (rc) {
        sd_oai_request_free(r);
        r->kind = kind;
    }
    return rc;
}

static int parse_tokenize(json_t *root, const char *served_model, sd_oai_request *r,
                          sd_api_error *e)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        int chat_only = !strcmp(key, "tools") || !strcmp(key, "tool_choice") || !strcmp(key, "parallel_tool_calls") ||
                        !strcmp(key, "chat_template_kwargs");
        if ((chat_only && !json_object_get(root, "messages")) ||
            (!chat_only && strcmp(key, "model") && strcmp(key, "prompt") && strcmp(key, "messages") &&
             strcmp(key, "add_generation_prompt") && strcmp(key, "add_special_tokens"))) {
            char shown[64];
            snprintf(shown, sizeof shown, "%s", key);
            return sd_api_error_set(e, 400, shown, "unrecognized_argument",
                                    "Unrecognized request argument supplied: %s", shown);
        }
    }
    if ((v = json_object_get(root, "model")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return bad_type(e, "model", "a string", v);
        if (has_nul(v))
            return nul_error(e, "model");
        if (served_model && strcmp(json_string_value(v), served_model) != 0)
            return sd_api_error_set(e, 400, "model", "model_not_found",
                                    "The model '%.200s' does not exist; this server serves "
                                    "'%.200s'",
                                    json_string_value(v), served_model);
    }
    int has_p = json_object_get(root, "prompt") != NULL;
    int has_m = json_object_get(root, "messages") != NULL;
    if (has_p == has_m)
        return sd_api_error_set(e, 400, has_p ? "messages" : "prompt", "invalid_value",
                                "give exactly one of prompt and messages");
    r->kind = has_m ? SD_OAI_CHAT : SD_OAI_COMPLETIONS;
    if (has_m ? parse_messages(root, r, e) || parse_tools(root, r, e) || parse_kwargs(root, r, e)
              : parse_prompt(root, r, 0, e))
        return SD_EINVAL;
    r->add_generation_prompt = 1;
    r->add_special_tokens = !has_m;
    if ((v = json_object_get(root, "add_generation_prompt")) && !json_is_null(v) &&
        get_bool(v, "add_generation_prompt", &r->add_generation_prompt, e))
        return SD_EINVAL;
    if ((v = json_object_get(root, "add_special_tokens")) && !json_is_null(v) &&
        get_bool(v, "add_special_tokens", &r->add_special_tokens, e))
        return SD_EINVAL;
    return 0;
}

int sd_oai_parse_tokenize(const char *body, size_t len, const char *served_model,
                          sd_schema_cache *schemas, sd_oai_request *r, sd_api_error *e)
{
    memset(r, 0, sizeof *r);
    r->schemas = schemas;
    r->max_tokens = -1;
    r->kwargs = SD_CHAT_KWARGS_NONE;
    json_error_t je;
    json_t *root = json_loadb(body ? body : "", body ? len : 0, LOAD_FLAGS, &je);
    if (!root)
        return sd_api_error_set(e, 400, NULL, "invalid_json",
                                "The request body is not valid JSON: %s (line %d, column %d)",
                                je.text, je.line, je.column);
    int rc = json_is_object(root)
                 ? parse_tokenize(root, served_model, r, e)
                 : sd_api_error_set(e, 400, NULL, "invalid_json",
                                    "The request body must be a JSON object, got %s",
                                    type_name(root));
    json_decref(root);
    if (rc)
        sd_oai_request_free(r);
    return rc;
}

void sd_oai_request_free(sd_oai_request *r)
{
    if (r->schemas)
        sd_schema_cache_put(r->schemas, r->held);
    free(r->model);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    free(r->bias_ids);
    free(r->bias);
    free(r->schema_text);
    free(r->forced_name);
    for (int i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].role);
        free(r->msgs[i].content);
        for (int k = 0; k < r->msgs[i].n_calls; k++) {
            free(r->msgs[i].calls[k].id);
            free(r->msgs[i].calls[k].name);
            free(r->msgs[i].calls[k].arguments_text);
            json_decref(r->msgs[i].calls[k].arguments);
        }
        free(r->msgs[i].calls);
        free(r->msgs[i].tool_call_id);
    }
    free(r->msgs);
    json_decref(r->tools);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    memset(r, 0, sizeof *r);
    r->max_tokens = -1;
}

int sd_oai_fit_context(sd_oai_request *r, int n_prompt, int max_context, sd_api_error *e)
{
    const char *pp = r->kind == SD_OAI_CHAT ? "messages" : "prompt";
    if (n_prompt <= 0)
        return sd_api_error_set(e, 400, pp, "invalid_value", "%s: the prompt is empty", pp);
    if (n_prompt >= max_context)
        return sd_api_error_set(e, 400, pp, "context_length_exceeded",
                                "This model's maximum context length is %d tokens; the prompt "
                                "holds %d tokens, which leaves no room for a completion",
                                max_context, n_prompt);
    int room = max_context - n_prompt;
    if (r->max_tokens >= 0) {
        if (r->max_tokens > room)
            return sd_api_error_set(
                e, 400, r->max_tokens_param, "context_length_exceeded",
                "This model's maximum context length is %d tokens; you requested %lld tokens "
                "(%d in the prompt, %d for the completion). Reduce %s or the prompt",
                max_context, (long long)n_prompt + r->max_tokens, n_prompt, r->max_tokens,
                r->max_tokens_param);
        r->gen.max_tokens = r->max_tokens;
    } else if (r->kind == SD_OAI_COMPLETIONS) {
        r->gen.max_tokens = SD_OAI_DEFAULT_COMPLETION_TOKENS < room
                                ? SD_OAI_DEFAULT_COMPLETION_TOKENS
                                : room;
    } else {
        r->gen.max_tokens = room;
    }
    return 0;
}

/* ---- responses --------------------------------------------------------------- */

/* "stop" | "length" for a finished request, else NULL (JSON null). */
static const char *finish_reason(sd_finish why)
{
    switch (why) {
    case SD_FINISH_STOP: return "stop";
    case SD_FINISH_LENGTH: return "length";
    default: return NULL;
    }
}

static json_t *finish_json(sd_finish why)
{
    const char *s = finish_reason(why);
    return s ? json_string(s) : json_null();
}

/* Speculative statistics of one request: the `speculative` usage extension. */
static json_t *spec_json(const sd_spec_stats *s)
{
    json_t *o = json_object();
    json_object_set_new(o, "steps", json_integer((json_int_t)s->steps));
    json_object_set_new(o, "draft_tokens", json_integer((json_int_t)s->drafted));
    json_object_set_new(o, "accepted_tokens", json_integer((json_int_t)s->accepted));
    json_object_set_new(o, "acceptance_rate",
                        json_real(s->drafted ? (double)s->accepted / (double)s->drafted : 0.0));
    /* Tokens each verify step emitted: accepted drafts + the bonus token. */
    json_object_set_new(o, "mean_accepted_length",
                        json_real(s->steps ? (double)s->emitted / (double)s->steps : 0.0));
    json_object_set_new(o, "draft_seconds", json_real(s->draft_s));
    json_object_set_new(o, "verify_seconds", json_real(s->verify_s));
    int last = -1;
    for (int i = 0; i < 16; i++)
        if (s->proposed_at[i])
            last = i;
    json_t *pos = json_array();
    for (int i = 0; i <= last; i++)
        json_array_append_new(pos, json_real(s->proposed_at[i] ? (double)s->accepted_at[i] /
                                                                     (double)s->proposed_at[i]
                                                               : 0.0));
    json_object_set_new(o, "acceptance_by_position", pos);
    return o;
}

static json_t *usage_obj(const sd_req_stats *st)
{
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(st->prompt_tokens));
    json_object_set_new(u, "completion_tokens", json_integer(st->completion_tokens));
    json_object_set_new(u, "total_tokens",
                        json_integer((json_int_t)st->prompt_tokens + st->completion_tokens));
    /* the prompt tokens the prefix cache held (OpenAI's field) */
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(st->cached_tokens));
    json_object_set_new(u, "prompt_tokens_details", d);
    json_object_set_new(u, "speculative", spec_json(&st->spec));
    return u;
}

static json_t *head(const sd_oai_meta *m, const char *object)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(m->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(m->created));
    json_object_set_new(o, "model", text_json(m->model, strlen(m->model)));
    return o;
}

/* c, a choice object holding its index and its text, message or delta,
 * gets its logprobs (null without) and its finish reason (last, as OpenAI
 * orders them) */
static json_t *logprobs_json(sd_oai_kind kind, const sd_oai_logprobs *lp);

static json_t *choice_end(json_t *c, sd_finish why, sd_oai_kind kind, const sd_oai_logprobs *lp)
{
    json_object_set_new(c, "logprobs", lp ? logprobs_json(kind, lp) : json_null());
    json_object_set_new(c, "finish_reason", finish_json(why));
    return c;
}

/* a token's text as a decode of it alone gives it (specials printed; a
 * piece of a UTF-8 character as U+FFFD), or NULL */
static char *token_text(const sd_tokenizer *tok, int32_t id, size_t *len)
{
    char *t = NULL;
    sd_err err = {0};
    *len = 0;
    if (!tok || sd_tok_decode(tok, &id, 1, 0, &t, len, &err))
        return NULL;
    return t;
}

/* JSON has no -inf: OpenAI's and vLLM's floor */
static json_t *lp_real(float x) { return json_real(x > -9999.0f ? (double)x : -9999.0); }

/* chat's {"token", "logprob", "bytes"} of one token: bytes are the
 * token's own in running text, as OpenAI gives them (a piece of a UTF-8
 * character as its raw bytes, where "token" has U+FFFD: the bytes of a
 * reply's tokens make its text) */
static json_t *chat_token(const sd_tokenizer *tok, int32_t id, float lp)
{
    size_t len, blen = 0;
    char *t = token_text(tok, id, &len);
    const char *raw = tok ? sd_tok_token_bytes(tok, id, &blen) : NULL;
    if (!raw) {
        raw = t;
        blen = len;
    }
    json_t *o = json_object(), *b = json_array();
    json_object_set_new(o, "token", text_json(t, len));
    json_object_set_new(o, "logprob", lp_real(lp));
    for (size_t i = 0; i < blen; i++)
        json_array_append_new(b, json_integer((unsigned char)raw[i]));
    json_object_set_new(o, "bytes", b);
    free(t);
    return o;
}

/* chat: {"content": [token, ... with its top_logprobs]}; completions:
 * {"tokens", "token_logprobs", "top_logprobs", "text_offset"} */
static json_t *logprobs_json(sd_oai_kind kind, const sd_oai_logprobs *lp)
{
    json_t *o = json_object();
    if (kind == SD_OAI_CHAT) {
        json_t *content = json_array();
        for (int i = 0; i < lp->n; i++) {
            const sd_token_logprob *t = &lp->lp[i];
            json_t *e = chat_token(lp->tok, lp->ids[i], t->logprob), *top = json_array();
            for (int j = 0; j < t->n_top && j < lp->top; j++)
                json_array_append_new(top, chat_token(lp->tok, t->top_ids[j], t->top_logprobs[j]));
            json_object_set_new(e, "top_logprobs", top);
            json_array_append_new(content, e);
        }
        json_object_set_new(o, "content", content);
        return o;
    }
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t off = lp->offset ? *lp->offset : 0;
    for (int i = 0; i < lp->n; i++) {
        const sd_token_logprob *t = &lp->lp[i];
        size_t len;
        char *s = token_text(lp->tok, lp->ids[i], &len);
        json_array_append_new(toks, text_json(s, len));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += len;
        free(s);
        if (isnan(t->logprob)) { /* an echoed prompt's first token: nothing before it */
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, lp_real(t->logprob));
        json_t *top = json_object();
        for (int j = 0; j < t->n_top && j < lp->top; j++) {
            char *a = token_text(lp->tok, t->top_ids[j], &len);
            json_t *key = text_json(a, len);
            if (key && !json_object_get(top, json_string_value(key)))
                json_object_set_new(top, json_string_value(key), lp_real(t->top_logprobs[j]));
            json_decref(key);
            free(a);
        }
        json_array_append_new(tops, top);
    }
    if (lp->offset)
        *lp->offset = off;
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
}

static json_t *choice_obj(int index)
{
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(index));
    return c;
}

/* one chunk's choices: [c] (c's index m->index), returned */
static json_t *chunk_choice(json_t *o, const sd_oai_meta *m)
{
    json_t *c = choice_obj(m->index), *arr = json_array();
    json_array_append_new(arr, c);
    json_object_set_new(o, "choices", arr);
    return c;
}

/* a message's reasoning_content: rs NULL none, else the text, null when empty */
static void set_reasoning(json_t *msg, const char *rs, size_t rlen)
{
    if (rs)
        json_object_set_new(msg, "reasoning_content", rlen ? text_json(rs, rlen) : json_null());
}

static json_t *call_json(const sd_tool_call *c, int index)
{
    json_t *o = json_object(), *f = json_object();
    if (index >= 0)
        json_object_set_new(o, "index", json_integer(index));
    json_object_set_new(o, "id", json_string(c->id));
    json_object_set_new(o, "type", json_string("function"));
    json_object_set_new(f, "name", text_json(c->name, strlen(c->name)));
    json_object_set_new(f, "arguments", text_json(c->arguments, strlen(c->arguments)));
    json_object_set_new(o, "function", f);
    return o;
}

int sd_oai_response(sd_buf *out, const sd_oai_meta *m, const sd_oai_choice *choices, int n,
                    const sd_req_stats *usage)
{
    int chat = m->kind == SD_OAI_CHAT;
    json_t *o = head(m, chat ? "chat.completion" : "text_completion"), *arr = json_array();
    for (int i = 0; i < n; i++) {
        const sd_oai_choice *ch = &choices[i];
        json_t *c = choice_obj(i);
        if (chat) {
            json_t *msg = json_object();
            json_object_set_new(msg, "role", json_string("assistant"));
            json_object_set_new(msg, "content", ch->n_calls && !ch->len ? json_null()
                                                                        : text_json(ch->text, ch->len));
            set_reasoning(msg, ch->reasoning, ch->rlen);
            if (ch->n_calls) {
                json_t *calls = json_array();
                for (int k = 0; k < ch->n_calls; k++)
                    json_array_append_new(calls, call_json(&ch->calls[k], -1));
                json_object_set_new(msg, "tool_calls", calls);
            }
            json_object_set_new(c, "message", msg);
        } else {
            json_object_set_new(c, "text", text_json(ch->text, ch->len));
        }
        choice_end(c, ch->why, m->kind, ch->logprobs);
        if (ch->n_calls)
            json_object_set_new(c, "finish_reason", json_string("tool_calls"));
        json_array_append_new(arr, c);
    }
    json_object_set_new(o, "choices", arr);
    json_object_set_new(o, "usage", usage_obj(usage));
    return dump_json(out, o);
}

static int event(sd_buf *out, json_t *o)
{
    sd_buf tmp = {0};
    int rc = dump_json(&tmp, o);
    if (rc == 0)
        rc = sd_sse_event(out, tmp.p, tmp.len);
    sd_buf_free(&tmp);
    return rc;
}

int sd_oai_chunk_event(sd_buf *out, const sd_oai_meta *m, int role, const char *text, size_t len,
                       sd_finish why)
{
    return sd_oai_chunk_event_lp(out, m, role, text, len, why, NULL);
}

int sd_oai_chunk_event_lp(sd_buf *out, const sd_oai_meta *m, int role, const char *text, size_t len,
                          sd_finish why, const sd_oai_logprobs *lp)
{
    int chat = m->kind == SD_OAI_CHAT;
    json_t *o = head(m, chat ? "chat.completion.chunk" : "text_completion");
    json_t *c = chunk_choice(o, m);
    if (chat) {
        json_t *d = json_object();
        if (role)
            json_object_set_new(d, "role", json_string("assistant"));
        if (why == SD_FINISH_NONE && (role || len))
            json_object_set_new(d, "content", text_json(text, len));
        json_object_set_new(c, "delta", d);
    } else {
        json_object_set_new(c, "text", text_json(text, len));
    }
    choice_end(c, why, m->kind, lp);
    return event(out, o);
}

int sd_oai_reasoning_event(sd_buf *out, const sd_oai_meta *m, const char *text, size_t len)
{
    json_t *o = head(m, "chat.completion.chunk");
    json_t *c = chunk_choice(o, m), *d = json_object();
    json_object_set_new(d, "reasoning_content", text_json(text, len));
    json_object_set_new(c, "delta", d);
    choice_end(c, SD_FINISH_NONE, m->kind, NULL);
    return event(out, o);
}

int sd_oai_tool_call_event(sd_buf *out, const sd_oai_meta *m, int index, const sd_tool_call *tc)
{
    json_t *o = head(m, "chat.completion.chunk");
    json_t *c = chunk_choice(o, m), *d = json_object(), *arr = json_array();
    json_array_append_new(arr, call_json(tc, index));
    json_object_set_new(d, "tool_calls", arr);
    json_object_set_new(c, "delta", d);
    choice_end(c, SD_FINISH_NONE, m->kind, NULL);
    return event(out, o);
}

int sd_oai_tool_calls_finish_event(sd_buf *out, const sd_oai_meta *m)
{
    json_t *o = head(m, "chat.completion.chunk");
    json_t *c = chunk_choice(o, m);
    json_object_set_new(c, "delta", json_object());
    choice_end(c, SD_FINISH_NONE, m->kind, NULL);
    json_object_set_new(c, "finish_reason", json_string("tool_calls"));
    return event(out, o);
}

int sd_oai_usage_event(sd_buf *out, const sd_oai_meta *m, const sd_req_stats *st)
{
    json_t *o = head(m, m->kind == SD_OAI_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_obj(st));
    return event(out, o);
}

int sd_oai_models(sd_buf *out, const char *model, long long created, int max_context)
{
    json_t *m = json_object();
    json_object_set_new(m, "id", text_json(model, strlen(model)));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(created));
    json_object_set_new(m, "owned_by", json_string("specd"));
    if (max_context > 0)
        json_object_set_new(m, "max_model_len", json_integer(max_context));
    json_t *arr = json_array();
    json_array_append_new(arr, m);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", arr);
    return dump_json(out, o);
}

/* ---- SSE --------------------------------------------------------------------- */

int sd_sse_event(sd_buf *out, const char *json, size_t len)
{
    if (memchr(json, '\n', len) || memchr(json, '\r', len))
        return SD_EINVAL; /* would split the event */
    sd_buf_append(out, "data: ", 6);
    sd_buf_append(out, json, len);
    sd_buf_append(out, "\n\n", 2);
    return out->oom ? SD_ENOMEM : 0;
}

int sd_sse_done(sd_buf *out) { return sd_buf_puts(out, "data: [DONE]\n\n"); }

int sd_sse_error(sd_buf *out, const sd_api_error *e)
{
    sd_buf tmp = {0};
    int rc = sd_api_error_json(&tmp, e);
    if (rc == 0)
        rc = sd_sse_event(out, tmp.p, tmp.len);
    sd_buf_free(&tmp);
    return rc;
}

/* ---- UTF-8 ------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is not one
 * (overlongs, surrogates and code points past U+10FFFF are invalid). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

int sd_utf8_sanitize(sd_buf *out, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < len) {
        size_t k = utf8_seq(p + i, len - i);
        if (k) {
            i += k;
            continue;
        }
        sd_buf_append(out, s + run, i - run);
        sd_buf_append(out, "\xef\xbf\xbd", 3);
        i++;
        run = i;
    }
    sd_buf_append(out, s + run, len - run);
    return out->oom ? SD_ENOMEM : 0;
}
