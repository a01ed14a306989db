#include "engine/backend.h"

#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"
#ifdef SD_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#endif

const char *sd_backend_kind(const sd_opts *o)
{
    const char *dev = o->device ? o->device : "auto";
    if (strcmp(dev, "auto"))
        return dev;
#ifdef SD_HAVE_CUDA
    return sd_cuda_device_count() > 0 ? "cuda" : "cpu";
#else
    return "cpu";
#endif
}

/* rank of n: GPU `rank` (with at least n GPUs visible), else a CPU backend
 * with its share of --threads (threads = 0 in o: all cores) */
int sd_backend_open_rank(sd_backend **out, const sd_opts *o, int rank, int n, sd_err *err)
{
    *out = NULL;
    const char *dev = sd_backend_kind(o); /* auto: the GPU when one is present */
#ifdef SD_HAVE_CUDA
    int n_gpu = strcmp(dev, "cpu") ? sd_cuda_device_count() : 0;
    if (n_gpu > 0) {
        if (n_gpu < n)
            return sd_err_set(err, SD_EDEVICE, "--tp %d: %d GPUs are visible", n, n_gpu);
        return sd_cuda_backend_create(out, rank, err);
    }
    if (!strcmp(dev, "cuda"))
        return sd_err_set(err, SD_EDEVICE,
                          "--device cuda: no CUDA device is visible (driver missing or no GPU)");
#else
    if (!strcmp(dev, "cuda"))
        return sd_err_set(err, SD_ENOTSUP,
                          "--device cuda: this build has no CUDA backend (build with -Dcuda=enabled)");
#endif
    int threads = o->threads;
    if (n > 1) { /* the CPU ranks share the threads */
        if (threads <= 0) {
            long nc = sysconf(_SC_NPROCESSORS_ONLN);
            threads = nc > 0 ? (int)nc : 1;
        }
        threads = threads / n > 0 ? threads / n : 1;
    }
    if (sd_cpu_backend_create(out, threads))
        return n > 1 ? sd_err_set(err, SD_ENOMEM, "cannot start the CPU backend of rank %d", rank)
                     : sd_err_set(err, SD_ENOMEM, "cannot start the CPU backend");
    return 0;
}

int sd_backend_open(sd_backend **out, const sd_opts *o, sd_err *err)
{
    *out = NULL;
    if (o->tp > 1)
        return sd_err_set(err, SD_EINVAL, "--tp %d: open the ranks with sd_backend_open_rank", o->tp);
    return sd_backend_open_rank(out, o, 0, 1, err);
}

void sd_backend_close(sd_backend *be)
{
    if (!be)
        return;
#ifdef SD_HAVE_CUDA
    if (be->device >= 0) {
        sd_cuda_backend_destroy(be);
        return;
    }
#endif
    sd_cpu_backend_destroy(be);
}

const char *sd_opts_model_dir(const sd_opts *o)
{
    return o->model && o->model[0] ? o->model : sd_bundled_model_dir();
}
