/* Chat templates: the native renderers against Jinja's output on the published
 * templates (tests/golden/tokenizer/chat_golden.json, made by
 * tools/golden/chat_templates.py), family recognition, and the errors. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tokenizer.h"
#include "core/util.h"
#include "test.h"

static char *mkdir_tmp(void)
{
    char tmpl[] = "/tmp/sdchat-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static void rm_tree(char *dir)
{
    char *cmd = sd_strfmt("rm -rf '%s'", dir);
    if (cmd && system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", dir);
    free(cmd);
    free(dir);
}

static int put_text(const char *dir, const char *name, const char *text)
{
    char *p = sd_strfmt("%s/%s", dir, name);
    int rc = sd_write_file(p, text, strlen(text), NULL);
    free(p);
    return rc;
}

/* dir/tokenizer_config.json with chat_template = tmpl (NULL: none), bos_token. */
static int put_config(const char *dir, const char *tmpl, const char *bos)
{
    json_t *c = json_object();
    if (tmpl)
        json_object_set_new(c, "chat_template", json_string(tmpl));
    json_object_set_new(c, "bos_token", bos ? json_string(bos) : json_null());
    char *p = sd_strfmt("%s/tokenizer_config.json", dir);
    int rc = json_dump_file(c, p, 0);
    free(p);
    json_decref(c);
    return rc;
}

static char *read_template(const char *file)
{
    char *p = sd_strfmt("%s/tests/golden/tokenizer/chat/%s", sd_test_srcdir(), file), *data = NULL;
    size_t len;
    if (sd_read_file(p, &data, &len, NULL))
        data = NULL;
    free(p);
    return data;
}

TEST(native_renders_equal_jinja_on_the_published_templates)
{
    /* SD_CHAT_GOLDEN: another file of cases (tests/core/test_chat_fuzz.sh's random ones) */
    const char *other = getenv("SD_CHAT_GOLDEN");
    char *p = other && *other ? sd_strfmt("%s", other)
                              : sd_strfmt("%s/tests/golden/tokenizer/chat_golden.json", sd_test_srcdir());
    json_error_t je;
    json_t *g = json_load_file(p, 0, &je);
    free(p);
    ASSERT_MSG(g, "chat_golden.json: %s", je.text);
    const char *date = json_string_value(json_object_get(g, "pinned_date"));
    json_t *tmpls = json_object_get(g, "templates");
    ASSERT_GE(json_array_size(tmpls), 19);
    int bad = 0, checked = 0;
    json_t *owned = json_array(); /* arguments parsed from their text, kept to the end */
    ASSERT(owned);
    for (size_t k = 0; k < json_array_size(tmpls); k++) {
        json_t *e = json_array_get(tmpls, k);
        const char *file = json_string_value(json_object_get(e, "file"));
        const char *family = json_string_value(json_object_get(e, "family"));
        json_t *bos = json_object_get(e, "bos_token");
        char *text = read_template(file), *dir = mkdir_tmp();
        ASSERT(text && dir);
        ASSERT_OK(put_config(dir, text, json_is_string(bos) ? json_string_value(bos) : NULL));
        sd_err err = {0};
        sd_chat_template *ct;
        ASSERT_MSG(!sd_chat_template_load(&ct, dir, "auto", &err), "%s: %s", file, err.msg);
        ASSERT_MSG(!strcmp(sd_chat_template_name(ct), family), "%s recognized as %s, want %s", file,
                   sd_chat_template_name(ct), family);
        sd_chat_template_set_date(ct, date);
        json_t *cases = json_object_get(e, "cases");
        for (size_t i = 0; i < json_array_size(cases); i++) {
            json_t *c = json_array_get(cases, i), *msgs = json_object_get(c, "messages");
            sd_chat_msg m[16] = {{0}};
            sd_chat_call calls[16][4];
            int n = (int)json_array_size(msgs);
            ASSERT_LE(n, 16);
            for (int j = 0; j < n; j++) {
                json_t *mj = json_array_get(msgs, (size_t)j), *tc = json_object_get(mj, "tool_calls");
                m[j].role = json_string_value(json_object_get(mj, "role"));
                m[j].content = json_string_value(json_object_get(mj, "content"));
                ASSERT_LE(json_array_size(tc), 4);
                for (size_t q = 0; q < json_array_size(tc); q++) {
                    json_t *f = json_object_get(json_array_get(tc, q), "function"),
                           *a = json_object_get(f, "arguments");
                    /* arguments as JSON text (DeepSeek's cases, as a client sends them): parsed too */
                    json_t *parsed = json_is_string(a) ? json_loads(json_string_value(a), 0, NULL) : NULL;
                    ASSERT(!json_is_string(a) || json_is_object(parsed));
                    if (parsed)
                        ASSERT_EQ(json_array_append_new(owned, parsed), 0);
                    calls[j][q] = (sd_chat_call){.name = json_string_value(json_object_get(f, "name")),
                                                 .arguments = parsed ? parsed : a,
                                                 .arguments_text = json_string_value(a),
                                                 .id = json_string_value(json_object_get(json_array_get(tc, q), "id"))};
                }
                m[j].tool_call_id = json_string_value(json_object_get(mj, "tool_call_id"));
                m[j].calls = calls[j];
                m[j].n_calls = (int)json_array_size(tc);
            }
            int gen = json_is_true(json_object_get(c, "add_generation_prompt"));
            json_t *tools = json_object_get(c, "tools");
            const char *want = json_string_value(json_object_get(c, "text"));
            char *out;
            size_t len;
            /* tools: Qwen2.5's, Qwen3's, Llama 3.1's / 3.2's, DeepSeek's and
             * Kimi-K2's formats are written out; every other template refuses them (where Jinja
             * renders them, or not); what Jinja refuses (Llama: two calls in
             * one message) specd refuses too */
            int tool_case = tools != NULL;
            int written = !strcmp(file, "qwen2.5.jinja") || !strcmp(file, "qwen3.jinja") ||
                          !strcmp(file, "llama3.1.jinja") || !strcmp(file, "llama3.2.jinja") ||
                          !strncmp(file, "kimi-k2", 7) || !strncmp(file, "deepseek", 8);
            /* chat_template_kwargs: enable_thinking, thinking */
            json_t *kwj = json_object_get(c, "kwargs");
            sd_chat_kwargs kw = SD_CHAT_KWARGS_NONE;
            if (json_object_get(kwj, "enable_thinking"))
                kw.enable_thinking = json_is_true(json_object_get(kwj, "enable_thinking"));
            if (json_object_get(kwj, "thinking"))
                kw.thinking = json_is_true(json_object_get(kwj, "thinking"));
            int rc = sd_chat_render_kw(ct, m, n, tools, kwj ? &kw : NULL, gen, &out, &len, &err);
            checked++;
            /* every difference is counted and shown (a file of random cases
             * may hold several) */
            if (tool_case && !written) {
                if (rc != SD_ENOTSUP || !strstr(err.msg, "tool format is not supported")) {
                    fprintf(stderr, "  %s tool case %zu: rc %d (%s), want the tool format refused\n", file, i, rc,
                            err.msg);
                    bad++;
                }
                if (!rc)
                    free(out);
                continue;
            }
            if (!want) {
                if (rc != SD_EINVAL) {
                    fprintf(stderr, "  %s case %zu: rc %d, rendered what Jinja refuses\n", file, i, rc);
                    bad++;
                }
                if (!rc)
                    free(out);
                continue;
            }
            if (rc) {
                fprintf(stderr, "  %s case %zu: refused what Jinja renders: %s\n", file, i, err.msg);
                bad++;
                continue;
            }
            if (strcmp(out, want)) {
                fprintf(stderr, "  %s case %zu (gen %d):\n    got  \"%s\"\n    want \"%s\"\n", file, i, gen, out, want);
                bad++;
            }
            ASSERT_EQ(len, strlen(out));
            free(out);
        }
        sd_chat_template_free(ct);
        free(text);
        rm_tree(dir);
    }
    fprintf(stderr, "  %d renders checked, %d differ\n", checked, bad);
    json_decref(owned);
    json_decref(g);
    ASSERT_EQ(bad, 0);
}

/* transformers' tojson is Python's json.dumps(ensure_ascii=False): key order
 * kept, ", " / ": ", floats as repr (the shortest digits that read back; fixed
 * notation for exponents -4..15), escapes for the control characters only. The
 * wanted texts are Python 3's. */
TEST(tojson_prints_as_pythons_json_dumps)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"1e16", "1e+16"},
        {"1e15", "1000000000000000.0"},
        {"0.0001", "0.0001"},
        {"0.00001", "1e-05"},
        {"1.5e300", "1.5e+300"},
        {"5e-324", "5e-324"},
        {"0.30000000000000004", "0.30000000000000004"},
        {"123456789012345680.0", "1.2345678901234568e+17"},
        {"-0.0", "-0.0"},
        {"2.5", "2.5"},
        {"1e22", "1e+22"},
        {"1.7976931348623157e308", "1.7976931348623157e+308"},
        {"2.2250738585072014e-308", "2.2250738585072014e-308"},
        {"100.0", "100.0"},
        {"1234.5678", "1234.5678"},
        {"-1e-7", "-1e-07"},
        {"9999999999999998.0", "9999999999999998.0"},
        {"-42", "-42"},
        {"{\"b\":1,\"a\":[true,false,null,\"x\\u0001\\\"\\\\\\/\\u00e9\"],\"c\":{}}",
         "{\"b\": 1, \"a\": [true, false, null, \"x\\u0001\\\"\\\\/\xc3\xa9\"], \"c\": {}}"},
        {"[]", "[]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_error_t je;
        json_t *v = json_loads(cases[i].in, JSON_DECODE_ANY, &je);
        ASSERT_MSG(v, "%s: %s", cases[i].in, je.text);
        sd_sbuf b = {0};
        ASSERT_OK(sd_py_json_dumps(&b, v));
        ASSERT_MSG(b.len == strlen(cases[i].want) && !memcmp(b.p, cases[i].want, b.len), "%s: got %.*s",
                   cases[i].in, (int)b.len, b.p);
        sd_sbuf_free(&b);
        json_decref(v);
    }
}

TEST(the_golden_tokenizer_folders_are_recognized)
{
    static const char *const dirs[][2] = {{"llama3ish", "llama3"}, {"deepseekish", "deepseek3"}, {"kimiish", "kimi-k2"}};
    for (size_t i = 0; i < SD_ARRAY_LEN(dirs); i++) {
        char *d = sd_strfmt("%s/tests/golden/tokenizer/%s", sd_test_srcdir(), dirs[i][0]);
        sd_err err = {0};
        sd_chat_template *ct;
        ASSERT_MSG(!sd_chat_template_load(&ct, d, "auto", &err), "%s", err.msg);
        ASSERT_STR_EQ(sd_chat_template_name(ct), dirs[i][1]);
        sd_chat_template_free(ct);
        free(d);
    }
}

TEST(an_explicit_name_overrides_the_checkpoint_template)
{
    char *dir = mkdir_tmp(), *llama = read_template("llama3.jinja");
    ASSERT(dir && llama);
    ASSERT_OK(put_config(dir, llama, "<|begin_of_text|>"));
    sd_err err = {0};
    sd_chat_template *ct;
    ASSERT_OK(sd_chat_template_load(&ct, dir, "chatml", &err));
    ASSERT_STR_EQ(sd_chat_template_name(ct), "chatml");
    ASSERT_STR_EQ(sd_chat_template_stop(ct), "<|im_end|>");
    sd_chat_msg m[] = {{.role = "user", .content = "hi"}};
    char *out;
    size_t len;
    ASSERT_OK(sd_chat_render(ct, m, 1, 1, &out, &len, &err));
    ASSERT_STR_EQ(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    sd_chat_template_free(ct);
    /* no folder at all, an explicit name */
    ASSERT_OK(sd_chat_template_load(&ct, NULL, "deepseek3", &err));
    ASSERT_OK(sd_chat_render(ct, m, 1, 1, &out, &len, &err));
    ASSERT_STR_EQ(out, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>hi<"
                       "\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
    ASSERT_STR_EQ(sd_chat_template_stop(ct), "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    free(out);
    sd_chat_template_free(ct);
    free(llama);
    rm_tree(dir);
}

TEST(unknown_names_and_unrecognized_templates_are_errors_not_fallbacks)
{
    sd_err err = {0};
    sd_chat_template *ct = NULL;
    ASSERT_EQ(sd_chat_template_load(&ct, NULL, "vicuna", &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "vicuna");
    ASSERT(!ct);
    ASSERT_EQ(sd_chat_template_load(&ct, NULL, "auto", &err), SD_EINVAL);
    char *dir = mkdir_tmp();
    ASSERT(dir);
    /* no template, no <|im_start|> in the vocabulary */
    ASSERT_OK(put_config(dir, NULL, NULL));
    ASSERT_OK(put_text(dir, "tokenizer.json", "{\"added_tokens\": [{\"content\": \"<s>\"}]}"));
    ASSERT_EQ(sd_chat_template_load(&ct, dir, "auto", &err), SD_ENOENT);
    ASSERT_CONTAINS(err.msg, dir);
    ASSERT_CONTAINS(err.msg, "--chat-template");
    /* ... with <|im_start|>: chatml */
    ASSERT_OK(put_text(dir, "tokenizer.json", "{\"added_tokens\": [{\"content\": \"<|im_start|>\"}]}"));
    ASSERT_OK(sd_chat_template_load(&ct, dir, "auto", &err));
    ASSERT_STR_EQ(sd_chat_template_name(ct), "chatml");
    sd_chat_template_free(ct);
    /* a template of no known family */
    ASSERT_OK(put_config(dir, "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}", "<s>"));
    ASSERT_EQ(sd_chat_template_load(&ct, dir, "auto", &err), SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, "not one of the families");
    /* chat_template.jinja beside a config without one */
    ASSERT_OK(put_config(dir, NULL, "<|begin_of_text|>"));
    ASSERT_OK(put_text(dir, "chat_template.jinja", "{{ bos_token }}<|start_header_id|>{{ x }}"));
    ASSERT_OK(sd_chat_template_load(&ct, dir, "auto", &err));
    ASSERT_STR_EQ(sd_chat_template_name(ct), "llama3");
    sd_chat_template_free(ct);
    /* a list of named templates: the "default" one counts */
    json_t *c = json_pack("{s:[{s:s, s:s}, {s:s, s:s}]}", "chat_template", "name", "tool_use", "template",
                          "<|start_header_id|>", "name", "default", "template", "<|im_user|><|im_middle|>");
    char *p = sd_strfmt("%s/tokenizer_config.json", dir);
    ASSERT_OK(json_dump_file(c, p, 0));
    json_decref(c);
    free(p);
    ASSERT_OK(sd_chat_template_load(&ct, dir, "auto", &err));
    ASSERT_STR_EQ(sd_chat_template_name(ct), "kimi-k2");
    sd_chat_msg bad[] = {{.role = "user", .content = NULL}};
    char *out = NULL;
    size_t len;
    ASSERT_EQ(sd_chat_render(ct, bad, 1, 1, &out, &len, &err), SD_EINVAL);
    sd_chat_template_free(ct);
    rm_tree(dir);
}

/* [INST] turns: an explicit mistral / llama2 without a checkpoint template
 * (Mistral's newest published form, <s> and </s>), and the roles the
 * templates raise on refused with a message that says why. */
TEST(inst_templates_by_name_and_their_refusals)
{
    sd_err err = {0};
    sd_chat_template *ct;
    sd_chat_msg m[] = {{.role = "system", .content = "S"},
                       {.role = "user", .content = "hi"},
                       {.role = "assistant", .content = " yo "},
                       {.role = "user", .content = "more"}};
    char *out;
    size_t len;
    ASSERT_OK(sd_chat_template_load(&ct, NULL, "mistral", &err));
    ASSERT_STR_EQ(sd_chat_template_name(ct), "mistral");
    ASSERT_STR_EQ(sd_chat_template_stop(ct), "</s>");
    ASSERT_OK(sd_chat_render(ct, m, 4, 1, &out, &len, &err));
    ASSERT_STR_EQ(out, "<s>[INST] S\n\nhi[/INST] yo</s>[INST] more[/INST]");
    free(out);
    /* two users in a row */
    sd_chat_msg two[] = {{.role = "user", .content = "a"}, {.role = "user", .content = "b"}};
    ASSERT_EQ(sd_chat_render(ct, two, 2, 1, &out, &len, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "message 1 (user)");
    /* a system message after the first turn */
    sd_chat_msg late[] = {{.role = "user", .content = "a"}, {.role = "system", .content = "b"}};
    ASSERT_EQ(sd_chat_render(ct, late, 2, 1, &out, &len, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "only user and assistant");
    /* tool results: no tool format for Mistral's */
    sd_chat_msg tool[] = {{.role = "user", .content = "a"}, {.role = "tool", .content = "b"}};
    ASSERT_EQ(sd_chat_render(ct, tool, 2, 1, &out, &len, &err), SD_ENOTSUP);
    sd_chat_template_free(ct);
    ASSERT_OK(sd_chat_template_load(&ct, NULL, "llama2", &err));
    ASSERT_OK(sd_chat_render(ct, m, 4, 1, &out, &len, &err));
    ASSERT_STR_EQ(out, "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nhi [/INST] yo </s><s>[INST] more [/INST]");
    free(out);
    ASSERT_EQ(sd_chat_render(ct, two, 2, 1, &out, &len, &err), SD_EINVAL);
    sd_chat_template_free(ct);
    /* Mistral-7B-Instruct-v0.1's template takes no system message at all */
    char *dir = mkdir_tmp(), *v1 = read_template("mistral-v0.1.jinja");
    ASSERT(dir && v1);
    ASSERT_OK(put_config(dir, v1, "<s>"));
    ASSERT_OK(sd_chat_template_load(&ct, dir, "auto", &err));
    ASSERT_EQ(sd_chat_render(ct, m, 4, 1, &out, &len, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "message 0 (system)");
    ASSERT_OK(sd_chat_render(ct, m + 1, 3, 1, &out, &len, &err));
    ASSERT_STR_EQ(out, "<s>[INST] hi [/INST] yo </s> [INST] more [/INST]");
    free(out);
    sd_chat_template_free(ct);
    /* v0.2's template with an assistant turn of another form (two spaces
     * before the text): refused under auto, not guessed; the explicit name
     * takes the family's defaults */
    char *v2 = read_template("mistral-v0.2.jinja");
    ASSERT(v2);
    char *at = strstr(v2, "' ' + message['content'] + eos_token");
    ASSERT(at);
    size_t k = (size_t)(at - v2);
    char *odd = sd_strfmt("%.*s'  '%s", (int)k, v2, at + 3);
    ASSERT(odd);
    ASSERT_OK(put_config(dir, odd, "<s>"));
    ASSERT_EQ(sd_chat_template_load(&ct, dir, "auto", &err), SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, "--chat-template mistral");
    ASSERT_OK(sd_chat_template_load(&ct, dir, "mistral", &err));
    ASSERT_OK(sd_chat_render(ct, m + 1, 3, 1, &out, &len, &err));
    ASSERT_STR_EQ(out, "<s>[INST] hi[/INST] yo</s>[INST] more[/INST]");
    free(out);
    sd_chat_template_free(ct);
    free(odd);
    free(v2);
    free(v1);
    rm_tree(dir);
}

TEST_MAIN(T(native_renders_equal_jinja_on_the_published_templates), T(tojson_prints_as_pythons_json_dumps), T(the_golden_tokenizer_folders_are_recognized),
          T(an_explicit_name_overrides_the_checkpoint_template),
          T(unknown_names_and_unrecognized_templates_are_errors_not_fallbacks),
          T(inst_templates_by_name_and_their_refusals))
