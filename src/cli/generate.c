/* specd generate: one request through the engine; the continuation on
 * stdout (text, or comma-separated ids for a checkpoint without a
 * tokenizer), one JSON line of statistics on stderr last. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/tokenizer.h"
#include "core/util.h"
#include "engine/engine.h"

typedef struct gen_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    sd_finish why;
    sd_req_stats st;
    char msg[512];
    char *text;
    size_t n_text, cap_text;
    int32_t *ids;
    int n_ids, cap_ids;
} gen_state;

static void on_output(void *user, const char *text, size_t len, const int32_t *ids, int n_ids)
{
    gen_state *g = user;
    pthread_mutex_lock(&g->mu);
    if (g->n_text + len + 1 > g->cap_text) {
        size_t cap = (g->n_text + len + 1) * 2;
        char *t = realloc(g->text, cap);
        if (t) {
            g->text = t;
            g->cap_text = cap;
        }
    }
    if (len > 0 && g->n_text + len + 1 <= g->cap_text) {
        memcpy(g->text + g->n_text, text, len);
        g->n_text += len;
        g->text[g->n_text] = 0;
    }
    if (g->n_ids + n_ids > g->cap_ids) {
        int cap = (g->n_ids + n_ids) * 2;
        int32_t *p = realloc(g->ids, (size_t)cap * sizeof *p);
        if (p) {
            g->ids = p;
            g->cap_ids = cap;
        }
    }
    if (n_ids > 0 && g->n_ids + n_ids <= g->cap_ids) {
        memcpy(g->ids + g->n_ids, ids, (size_t)n_ids * sizeof *ids);
        g->n_ids += n_ids;
    }
    pthread_mutex_unlock(&g->mu);
}

static void on_finish(void *user, sd_finish why, const sd_req_stats *st, const char *msg)
{
    gen_state *g = user;
    pthread_mutex_lock(&g->mu);
    g->why = why;
    g->st = *st;
    snprintf(g->msg, sizeof g->msg, "%s", msg ? msg : "");
    g->done = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void print_stats(const gen_state *g)
{
    const sd_spec_stats *s = &g->st.spec;
    double mean = s->steps ? (double)s->emitted / (double)s->steps : 0;
    fprintf(stderr,
            "{\"prompt_tokens\": %d, \"completion_tokens\": %d, \"ttft_s\": %.6f, \"total_s\": %.6f, "
            "\"tokens_per_s\": %.3f, \"steps\": %llu, \"drafted\": %llu, \"accepted\": %llu, "
            "\"mean_accepted_length\": %.4f, \"acceptance_by_position\": [",
            g->st.prompt_tokens, g->st.completion_tokens, g->st.ttft_s, g->st.total_s,
            g->st.total_s > 0 ? g->st.completion_tokens / g->st.total_s : 0.0,
            (unsigned long long)s->steps, (unsigned long long)s->drafted,
            (unsigned long long)s->accepted, mean);
    int last = 0;
    for (int i = 0; i < 16; i++)
        if (s->proposed_at[i])
            last = i + 1;
    for (int i = 0; i < last; i++)
        fprintf(stderr, "%s%.4f", i ? ", " : "",
                s->proposed_at[i] ? (double)s->accepted_at[i] / (double)s->proposed_at[i] : 0.0);
    fprintf(stderr, "], \"draft_s\": %.6f, \"verify_s\": %.6f}\n", s->draft_s, s->verify_s);
}

int sd_cmd_generate(const sd_opts *o)
{
    sd_err err = {0};
    if (o->nnodes > 1 && o->node_rank > 0)
        return sd_cli_follow(o, "generate");
    if (!!o->prompt[0] == !!o->ids[0]) {
        fprintf(stderr, "specd generate: give exactly one of --prompt and --ids\n");
        return 2;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (o->ids[0] && sd_parse_ids(o->ids, &ids, &n, "--ids", &err)) {
        fprintf(stderr, "specd generate: %s\n", err.msg);
        return 2;
    }
    sd_engine *e = NULL;
    if (sd_engine_create(&e, o, &err)) {
        fprintf(stderr, "specd generate: %s\n", err.msg);
        free(ids);
        return 1;
    }
    const sd_tokenizer *tok = sd_engine_tokenizer(e);
    if (o->prompt[0]) {
        if (!tok) {
            fprintf(stderr, "specd generate: %s has no tokenizer (tokenizer.json or tiktoken.model): use --ids\n",
                    sd_engine_model_dir(e));
            sd_engine_destroy(e);
            return 1;
        }
        if (sd_tok_encode(tok, o->prompt, strlen(o->prompt), 1, &ids, &n, &err)) {
            fprintf(stderr, "specd generate: %s\n", err.msg);
            sd_engine_destroy(e);
            return 1;
        }
    }
    gen_state g = {0};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    sd_gen_params p = {.max_tokens = o->max_tokens, .temperature = o->temperature,
                       .top_p = o->top_p, .top_k = o->top_k, .seed = (uint64_t)o->seed,
                       .has_seed = 1};
    sd_req_events ev = {.on_output = on_output, .on_finish = on_finish};
    int status = 1;
    if (sd_engine_submit(e, ids, n, &p, &ev, &g, NULL, &err)) {
        fprintf(stderr, "specd generate: %s\n", err.msg);
        goto done;
    }
    pthread_mutex_lock(&g.mu);
    while (!g.done)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    if (g.why == SD_FINISH_ERROR) {
        fprintf(stderr, "specd generate: %s\n", g.msg);
        goto done;
    }
    if (tok) {
        fwrite(g.text ? g.text : "", 1, g.n_text, stdout);
    } else {
        for (int i = 0; i < g.n_ids; i++)
            printf("%s%d", i ? "," : "", g.ids[i]);
    }
    fputc('\n', stdout);
    fflush(stdout);
    print_stats(&g);
    status = 0;
done:
    sd_engine_destroy(e);
    free(ids);
    free(g.text);
    free(g.ids);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    return status;
}
