#include "core/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int sd_err_set(sd_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int sd_err_prefix(sd_err *err, const char *fmt, ...)
{
    if (!err)
        return SD_EINVAL;
    char head[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t hl = strlen(head);
    if (hl >= sizeof err->msg)
        hl = sizeof err->msg - 1;
    memcpy(err->msg, head, hl);
    size_t ol = strnlen(old, sizeof old - 1);
    if (ol > sizeof err->msg - 1 - hl)
        ol = sizeof err->msg - 1 - hl;
    memcpy(err->msg + hl, old, ol);
    err->msg[hl + ol] = 0;
    return err->code;
}

void sd_err_clear(sd_err *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = 0;
    }
}

const char *sd_strerror(int code)
{
    switch (code) {
    case SD_OK: return "ok";
    case SD_EINVAL: return "invalid argument";
    case SD_ENOMEM: return "out of memory";
    case SD_EIO: return "i/o error";
    case SD_EFORMAT: return "malformed data";
    case SD_ENOTSUP: return "not supported";
    case SD_ENOENT: return "not found";
    case SD_ERANGE: return "out of range";
    case SD_ECANCELED: return "cancelled";
    case SD_EFULL: return "full";
    case SD_EDEVICE: return "device error";
    case SD_ESTATE: return "invalid state";
    default: return "unknown error";
    }
}
