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
