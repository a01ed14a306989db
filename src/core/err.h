/* core/err: error codes and the message that travels with them.
 *
 * Library code returns 0 or a negative SD_E* code and, when it fails, fills an
 * sd_err with one line that names the file, tensor, key or flag at fault.
 * It never prints and never exits: the caller decides what a failure means. */
#ifndef SD_CORE_ERR_H
#define SD_CORE_ERR_H

enum {
    SD_OK = 0,
    SD_EINVAL = -1,    /* bad argument or input */
    SD_ENOMEM = -2,    /* allocation failed */
    SD_EIO = -3,       /* read/write/open failed */
    SD_EFORMAT = -4,   /* malformed file or data */
    SD_ENOTSUP = -5,   /* recognized but not supported */
    SD_ENOENT = -6,    /* missing file, key or tensor */
    SD_ERANGE = -7,    /* value out of range */
    SD_ECANCELED = -8, /* request cancelled */
    SD_EFULL = -9,     /* queue or cache full */
    SD_EDEVICE = -10,  /* GPU / driver / library failure */
    SD_ESTATE = -11,   /* call not valid in the current state */
};

typedef struct sd_err {
    int code;
    char msg[1024];
} sd_err;

/* Sets err (if not NULL) and returns code, so `return sd_err_set(...)` reads well. */
int sd_err_set(sd_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends context ("loading model.safetensors: ") to an existing message; returns err->code. */
int sd_err_prefix(sd_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sd_err_clear(sd_err *err);
const char *sd_strerror(int code);

#endif
