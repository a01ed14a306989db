/* comm: the entry points, shared checks, then the implementation's vtable. */
#include "comm/comm.h"

static int bad_rank(const sd_comm *c, int rank)
{
    return !c || rank < 0 || rank >= c->size;
}

int sd_comm_allreduce_sum(sd_comm *c, int rank, float *buf, size_t n)
{
    if (bad_rank(c, rank) || (n && !buf))
        return SD_EINVAL;
    return c->ops->allreduce_sum(c, rank, buf, n);
}

int sd_comm_allgather(sd_comm *c, int rank, float *dst, const float *src, size_t n)
{
    if (bad_rank(c, rank) || (n && (!dst || !src)))
        return SD_EINVAL;
    return c->ops->allgather(c, rank, dst, src, n);
}

int sd_comm_allreduce_add_rmsnorm(sd_comm *c, int rank, sd_backend *be, float *partial, float *x,
                                  float *xn, const sd_weight *w, int rows, int d, float eps)
{
    if (bad_rank(c, rank) || !be || !w || rows < 0 || d <= 0 ||
        (rows && (!partial || !x || !xn)))
        return SD_EINVAL;
    if (rows == 0)
        return 0;
    if (c->ops->allreduce_add_rmsnorm) {
        int rc = c->ops->allreduce_add_rmsnorm(c, rank, partial, x, xn, w, rows, d, eps);
        if (rc != SD_ENOTSUP)
            return rc;
    }
    int rc = c->ops->allreduce_sum(c, rank, partial, (size_t)rows * (size_t)d);
    if (rc)
        return rc;
    be->ops->add(be, x, partial, rows, d);
    be->ops->rmsnorm(be, xn, x, w, rows, d, d, d, eps);
    return 0;
}

int sd_comm_barrier(sd_comm *c, int rank)
{
    if (bad_rank(c, rank))
        return SD_EINVAL;
    return c->ops->barrier(c, rank);
}

void sd_comm_abort(sd_comm *c)
{
    if (c)
        c->ops->abort(c);
}

void sd_comm_destroy(sd_comm *c)
{
    if (c)
        c->ops->destroy(c);
}

const char *sd_comm_name(const sd_comm *c)
{
    return c ? c->ops->name : "none";
}
