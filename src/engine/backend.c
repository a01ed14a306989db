#include "engine/backend.h"

#include <string.h>

#include "core/log.h"
#include "core/util.h"

int sd_backend_open(sd_backend **out, const sd_opts *o, sd_err *err)
{
    *out = NULL;
    const char *dev = o->device ? o->device : "auto";
    if (!strcmp(dev, "cuda"))
        return sd_err_set(err, SD_ENOTSUP,
                          "--device cuda: this build has no CUDA backend (build with -Dcuda=enabled)");
    if (o->tp > 1)
        return sd_err_set(err, SD_ENOTSUP, "--tp %d: the serving engine runs one rank so far (specd logits --tp N "
                          "runs tensor parallel on the CPU)",
                          o->tp);
    if (sd_cpu_backend_create(out, o->threads))
        return sd_err_set(err, SD_ENOMEM, "cannot start the CPU backend");
    return 0;
}

void sd_backend_close(sd_backend *be)
{
    if (be)
        sd_cpu_backend_destroy(be);
}

const char *sd_opts_model_dir(const sd_opts *o)
{
    return o->model && o->model[0] ? o->model : sd_bundled_model_dir();
}
