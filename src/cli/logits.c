/* specd logits: full prefill of --ids, float32 little-endian logits
 * [n_ids, vocab] to --out. --tp N runs N tensor-parallel ranks (GPUs, or
 * CPU rank threads with the thread all-reduce); on the CPU their logits
 * equal --tp 1's up to the order of fp32 sums. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/util.h"
#include "engine/backend.h"
#include "engine/tp.h"
#include "target/runner.h"

static int check_ids(const int32_t *ids, int n, const sd_model_cfg *c, sd_err *err)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return sd_err_set(err, SD_ERANGE, "--ids: id %d is out of range (vocab_size %d)",
                              ids[i], c->vocab_size);
    return 0;
}

/* --tp N: the ranks of one model (GPUs 0..N-1, or CPU threads). */
static int logits_tp(const sd_opts *o, const int32_t *ids, int n, sd_err *err)
{
    sd_tp_runner *t = NULL;
    float *logits = NULL;
    sd_model_opts mo = {.max_tokens = n < 256 ? n : 256, .load_mtp = 0, .ep = o->ep,
                        .moe_shared_slots = o->moe_shared_slots, .fp8_keep = sd_opts_fp8_keep(o)};
    int rc = sd_tp_runner_open(&t, sd_opts_model_dir(o), o, &mo, err);
    if (rc)
        return rc;
    const sd_model_cfg *c = sd_model_cfg_of(sd_tp_runner_model(t, 0));
    size_t bytes = (size_t)n * (size_t)c->vocab_size * sizeof(float);
    if (!(rc = check_ids(ids, n, c, err)) && !(rc = sd_tp_runner_alloc_kv(t, n, err))) {
        logits = malloc(bytes);
        if (!logits)
            rc = sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    sd_seq_out so = {.logits = logits};
    if (!rc)
        rc = sd_tp_runner_target(t, ids, n, 0, &so, err);
    if (!rc)
        rc = sd_write_file(o->out, logits, bytes, err);
    free(logits);
    sd_tp_runner_close(t);
    return rc;
}

int sd_cmd_logits(const sd_opts *o)
{
    sd_err err = {0};
    int32_t *ids = NULL;
    int n = 0, status = 1;
    sd_backend *be = NULL;
    sd_model *m = NULL;
    float *logits = NULL;
    if (!o->out[0]) {
        fprintf(stderr, "specd logits: --out FILE is required\n");
        return 2;
    }
    if (sd_parse_ids(o->ids, &ids, &n, "--ids", &err) || n == 0) {
        fprintf(stderr, "specd logits: %s\n", n == 0 && !err.msg[0] ? "--ids is required" : err.msg);
        free(ids);
        return 2;
    }
    if (o->tp > 1) {
        if (logits_tp(o, ids, n, &err))
            goto fail;
        status = 0;
        goto done;
    }
    const char *dir = sd_opts_model_dir(o);
    if (sd_backend_open(&be, o, &err))
        goto fail;
    sd_model_opts mo = {.max_tokens = n < 256 ? n : 256, .load_mtp = 0,
                        .fp8_keep = sd_opts_fp8_keep(o)};
    if (sd_model_load(&m, dir, be, &mo, &err))
        goto fail;
    const sd_model_cfg *c = sd_model_cfg_of(m);
    if (check_ids(ids, n, c, &err))
        goto fail;
    if (sd_model_alloc_kv(m, n, &err))
        goto fail;
    logits = malloc((size_t)n * (size_t)c->vocab_size * sizeof(float));
    if (!logits) {
        sd_err_set(&err, SD_ENOMEM, "out of memory");
        goto fail;
    }
    sd_seq_out so = {.logits = logits};
    if (sd_runner_target(m, ids, n, 0, &so, &err))
        goto fail;
    if (sd_write_file(o->out, logits, (size_t)n * (size_t)c->vocab_size * sizeof(float), &err))
        goto fail;
    status = 0;
    goto done;
fail:
    fprintf(stderr, "specd logits: %s\n", err.msg);
done:
    free(logits);
    free(ids);
    sd_model_free(m);
    sd_backend_close(be);
    return status;
}
