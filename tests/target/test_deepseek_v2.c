/* DeepSeek-V2 (DeepseekV2ForCausalLM, topk_method "greedy": V2-Lite):
 * V3's MLA and experts, routed by softmax scores and a plain top-k, with
 * neither groups nor a correction bias. The bundled model's weights under a
 * V2 config must give the bits of the same weights under the V3 config that
 * spells that routing out (scoring_func softmax, one group, no
 * e_score_correction_bias tensors), and a V2 config ignores such tensors
 * where a checkpoint has them. */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

#include "core/safetensors.h"
#include "core/util.h"
#include "fixtures.h"
#include "test.h"

/* The bundled weights (without the correction biases unless keep_bias)
 * and config cfg into dir. */
static int write_dir(const sd_st *src, const char *dir, json_t *cfg, int keep_bias, sd_err *err)
{
    mkdir(dir, 0700);
    int n = sd_st_count(src), k = 0;
    sd_st_tensor *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++)
        if (keep_bias || !strstr(sd_st_at(src, i)->name, "e_score_correction_bias"))
            t[k++] = *sd_st_at(src, i);
    char *p = sd_strfmt("%s/model.safetensors", dir);
    int rc = sd_st_write(p, t, k, NULL, err);
    free(p);
    free(t);
    p = sd_strfmt("%s/config.json", dir);
    if (!rc && json_dump_file(cfg, p, 0))
        rc = sd_err_set(err, SD_EIO, "%s: cannot write", p);
    free(p);
    return rc;
}

TEST(v2_greedy_routing_is_v3s_router_with_softmax_one_group_and_no_bias)
{
    char *src_dir = sd_strfmt("%s/models/specd-tiny", sd_test_srcdir());
    char *cfg_path = sd_strfmt("%s/config.json", src_dir);
    json_error_t je;
    json_t *base = json_load_file(cfg_path, 0, &je);
    free(cfg_path);
    if (!base) {
        free(src_dir);
        TEST_SKIP("no bundled model");
    }
    sd_st *src = NULL;
    sd_err err = {0};
    ASSERT_MSG(sd_st_open(&src, src_dir, &err) == 0, "%s", err.msg);
    /* V2: its own keys; group counts that V2's greedy top-k does not use */
    json_t *v2 = json_deep_copy(base);
    json_object_set_new(v2, "architectures", json_pack("[s]", "DeepseekV2ForCausalLM"));
    json_object_set_new(v2, "model_type", json_string("deepseek_v2"));
    json_object_set_new(v2, "topk_method", json_string("greedy"));
    json_object_set_new(v2, "scoring_func", json_string("softmax"));
    json_object_set_new(v2, "norm_topk_prob", json_false());
    json_object_set_new(v2, "routed_scaling_factor", json_real(1.0));
    json_object_del(v2, "num_nextn_predict_layers");
    /* V3 spelling the same routing out */
    json_t *v3 = json_deep_copy(base);
    json_object_set_new(v3, "scoring_func", json_string("softmax"));
    json_object_set_new(v3, "n_group", json_integer(1));
    json_object_set_new(v3, "topk_group", json_integer(1));
    json_object_set_new(v3, "norm_topk_prob", json_false());
    json_object_set_new(v3, "routed_scaling_factor", json_real(1.0));
    json_object_set_new(v3, "num_nextn_predict_layers", json_integer(0));
    char tmpl[] = "/tmp/sd_dsv2_XXXXXX";
    ASSERT(mkdtemp(tmpl));
    char *d2 = sd_strfmt("%s/v2", tmpl), *d2b = sd_strfmt("%s/v2bias", tmpl),
         *d3 = sd_strfmt("%s/v3", tmpl);
    ASSERT_OK(write_dir(src, d2, v2, 0, &err));
    ASSERT_OK(write_dir(src, d2b, v2, 1, &err));
    ASSERT_OK(write_dir(src, d3, v3, 0, &err));
    sd_st_close(src);
    json_decref(base);
    json_decref(v2);
    json_decref(v3);

    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    const int32_t ids[] = {0, 17, 230, 5, 991, 42, 8000, 3, 77, 1200, 64, 9};
    const int n = (int)SD_ARRAY_LEN(ids);
    outs a, b, c, o;
    int V = 0, D = 0;
    ASSERT_MSG(run_model(be, d2, ids, n, &a, &V, &D, &err) == 0, "v2: %s", err.msg);
    ASSERT_MSG(run_model(be, d2b, ids, n, &b, &V, &D, &err) == 0, "v2 + bias: %s", err.msg);
    ASSERT_MSG(run_model(be, d3, ids, n, &c, &V, &D, &err) == 0, "v3: %s", err.msg);
    ASSERT_MSG(run_model(be, src_dir, ids, n, &o, &V, &D, &err) == 0, "bundled: %s", err.msg);
    size_t nv = (size_t)n * V;
    int ok = same("v2 / v3 spelled out", "logits", a.logits, c.logits, nv) &
             same("v2 / v3 spelled out", "decode", a.step, c.step, nv) &
             same("v2 / v2 with biases", "logits", a.logits, b.logits, nv);
    ASSERT(!a.has_mtp);
    /* and the routing is not the bundled model's (sigmoid, groups, bias) */
    double moved = max_diff(a.logits, o.logits, nv);
    fprintf(stderr, "  against the bundled routing: max|d| %.3g\n", moved);
    outs_free(&a);
    outs_free(&b);
    outs_free(&c);
    outs_free(&o);
    sd_cpu_backend_destroy(be);
    rm_ckpt(d2);
    rm_ckpt(d2b);
    rm_ckpt(d3);
    rmdir(tmpl);
    free(d2);
    free(d2b);
    free(d3);
    free(src_dir);
    ASSERT_MSG(ok, "the V2 config's routing differs from its V3 spelling");
    ASSERT(moved > 1e-3);
}

TEST_MAIN(T(v2_greedy_routing_is_v3s_router_with_softmax_one_group_and_no_bias))
