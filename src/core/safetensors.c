/* core/safetensors: read-only mmap'd checkpoints and a small writer.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the data section; offsets are relative to the start of the data section.
 * Every check below exists because a malformed file would otherwise turn into
 * an out-of-bounds read of the mapping later, far from the cause. */
#include "core/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"

/* The reference implementation refuses headers above 100 MB; so do we. */
#define SD__ST_MAX_HEADER (100ull * 1024 * 1024)

typedef struct sd__st_file {
    char *path;       /* as opened: folder/base or the path given */
    const char *base; /* points into path */
    const uint8_t *map;
    size_t size;
} sd__st_file;

/* The public record comes first so a const sd_st_tensor * from sd_st_at/find
 * converts back to its entry. */
typedef struct sd__st_ent {
    sd_st_tensor t;
    int file;
    void *owned; /* an F8_E4M3 tensor's dequantized BF16 copy (t.data then) */
} sd__st_ent;

struct sd_st {
    char *root; /* the path given to sd_st_open, for "tensor is missing" */
    sd__st_file *files;
    int nfiles, cap_files;
    sd__st_ent *ents; /* sorted by name once open succeeds */
    int n, cap;
    int fp8_block[2]; /* sd_st_fp8_blocks; 0: F8_E4M3 tensors are refused */
};

static const char *const sd__dtype_names[SD_DT_COUNT] = {"F32", "F16", "BF16", "F8_E4M3",
                                                         "I32", "I64", "U8",   "BOOL"};

static int sd__dtype_parse(const char *s, sd_dtype *out)
{
    for (int i = 0; i < SD_DT_COUNT; i++)
        if (strcmp(s, sd__dtype_names[i]) == 0) {
            *out = (sd_dtype)i;
            return 0;
        }
    return -1;
}

/* "[a,b,c]" into buf. */
static const char *sd__shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
    return buf;
}

/* Product of dims times element size; -1 on overflow. */
static int64_t sd__shape_bytes(int ndim, const int64_t *shape, sd_dtype dt)
{
    uint64_t n = sd_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        uint64_t r;
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &r) || r > INT64_MAX)
            return -1;
        n = r;
    }
    return (int64_t)n;
}

static const char *sd__base(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int sd__push_file(sd_st *st, char *path, sd_err *err)
{
    if (st->nfiles == st->cap_files) {
        int cap = st->cap_files ? st->cap_files * 2 : 4;
        sd__st_file *f = realloc(st->files, (size_t)cap * sizeof *f);
        if (!f) {
            free(path);
            return sd_err_set(err, SD_ENOMEM, "%s: out of memory", st->root);
        }
        st->files = f;
        st->cap_files = cap;
    }
    sd__st_file *f = &st->files[st->nfiles++];
    memset(f, 0, sizeof *f);
    f->path = path;
    f->base = sd__base(path);
    return 0;
}

static int sd__push_ent(sd_st *st, const sd__st_ent *e, sd_err *err)
{
    if (st->n == st->cap) {
        int cap = st->cap ? st->cap * 2 : 64;
        sd__st_ent *p = realloc(st->ents, (size_t)cap * sizeof *p);
        if (!p)
            return sd_err_set(err, SD_ENOMEM, "%s: out of memory", st->root);
        st->ents = p;
        st->cap = cap;
    }
    st->ents[st->n++] = *e;
    return 0;
}

typedef struct sd__span {
    uint64_t b, e;
    const char *name;
} sd__span;

static int sd__span_cmp(const void *a, const void *b)
{
    const sd__span *x = a, *y = b;
    if (x->b != y->b)
        return x->b < y->b ? -1 : 1;
    return x->e < y->e ? -1 : x->e > y->e;
}

/* Reads a non-negative JSON integer (offsets, dims). */
static int sd__json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* One header entry -> ent. path names the file in messages. */
static int sd__parse_entry(const char *path, const char *name, const json_t *v, const uint8_t *data,
                           uint64_t dsize, sd__st_ent *ent, sd__span *span, sd_err *err)
{
    if (!json_is_object(v))
        return sd_err_set(err, SD_EFORMAT, "%s: tensor %s: header entry is not an object", path,
                          name);
    const json_t *jd = json_object_get(v, "dtype");
    const json_t *js = json_object_get(v, "shape");
    const json_t *jo = json_object_get(v, "data_offsets");
    if (!jd || !js || !jo)
        return sd_err_set(err, SD_EFORMAT, "%s: tensor %s: header entry lacks \"%s\"", path, name,
                          !jd   ? "dtype"
                          : !js ? "shape"
                                : "data_offsets");
    if (!json_is_string(jd))
        return sd_err_set(err, SD_EFORMAT, "%s: tensor %s: dtype is not a string", path, name);
    sd_dtype dt;
    if (sd__dtype_parse(json_string_value(jd), &dt) != 0)
        return sd_err_set(err, SD_ENOTSUP,
                          "%s: tensor %s: unknown dtype \"%s\" (supported: F32, F16, BF16, "
                          "F8_E4M3, I32, I64, U8, BOOL)",
                          path, name, json_string_value(jd));
    size_t nd = json_is_array(js) ? json_array_size(js) : 0;
    if (!json_is_array(js) || nd > SD_ST_MAX_DIMS)
        return sd_err_set(err, SD_EFORMAT,
                          "%s: tensor %s: shape is not an array of at most %d dimensions", path,
                          name, SD_ST_MAX_DIMS);
    sd_st_tensor *t = &ent->t;
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (sd__json_u64(json_array_get(js, i), &d) != 0 || d > INT64_MAX)
            return sd_err_set(err, SD_EFORMAT,
                              "%s: tensor %s: shape[%zu] is not a non-negative integer", path, name,
                              i);
        t->shape[i] = (int64_t)d;
    }
    uint64_t b, e;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        sd__json_u64(json_array_get(jo, 0), &b) != 0 ||
        sd__json_u64(json_array_get(jo, 1), &e) != 0)
        return sd_err_set(err, SD_EFORMAT,
                          "%s: tensor %s: data_offsets is not a pair of non-negative integers",
                          path, name);
    if (b > e)
        return sd_err_set(err, SD_EFORMAT, "%s: tensor %s: data_offsets [%llu,%llu] are inverted",
                          path, name, (unsigned long long)b, (unsigned long long)e);
    if (e > dsize)
        return sd_err_set(err, SD_EFORMAT,
                          "%s: tensor %s: data_offsets [%llu,%llu] run past the end of the data "
                          "(%llu bytes): truncated file?",
                          path, name, (unsigned long long)b, (unsigned long long)e,
                          (unsigned long long)dsize);
    char sh[256];
    int64_t need = sd__shape_bytes(t->ndim, t->shape, dt);
    if (need < 0 || (uint64_t)need != e - b)
        return sd_err_set(
            err, SD_EFORMAT,
            "%s: tensor %s: data_offsets [%llu,%llu] hold %llu bytes but shape %s "
            "of %s needs %lld",
            path, name, (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b),
            sd__shape_str(sh, sizeof sh, t->ndim, t->shape), sd__dtype_names[dt], (long long)need);
    t->data = data + b;
    t->nbytes = (size_t)(e - b);
    span->b = b;
    span->e = e;
    return 0;
}

/* Maps one file and appends its tensors. path is taken over (freed on error
 * by sd_st_close through st->files). */
static int sd__load_file(sd_st *st, char *path, sd_err *err)
{
    int rc = sd__push_file(st, path, err);
    if (rc)
        return rc;
    int fi = st->nfiles - 1;
    sd__st_file *f = &st->files[fi];

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sd_err_set(err, errno == ENOENT ? SD_ENOENT : SD_EIO, "%s: %s", path,
                          strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return sd_err_set(err, SD_EIO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return sd_err_set(err, SD_EFORMAT,
                          "%s: truncated file: %zu bytes, shorter than the 8-byte header length",
                          path, size);
    }
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int merr = errno;
    close(fd);
    if (m == MAP_FAILED)
        return sd_err_set(err, SD_EIO, "%s: mmap failed: %s", path, strerror(merr));
    f->map = m;
    f->size = size;

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | f->map[i];
    if (hlen > size - 8)
        return sd_err_set(err, SD_EFORMAT,
                          "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                          (unsigned long long)hlen, size);
    if (hlen > SD__ST_MAX_HEADER)
        return sd_err_set(err, SD_EFORMAT, "%s: header length %llu is over the 100 MB limit", path,
                          (unsigned long long)hlen);
    json_error_t je;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return sd_err_set(err, SD_EFORMAT, "%s: malformed header JSON (byte %d): %s", path,
                          je.position, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return sd_err_set(err, SD_EFORMAT, "%s: header JSON is not an object", path);
    }
    const uint8_t *data = f->map + 8 + hlen;
    uint64_t dsize = size - 8 - hlen;
    size_t cnt = json_object_size(root);
    sd__span *spans = malloc((cnt ? cnt : 1) * sizeof *spans);
    if (!spans) {
        json_decref(root);
        return sd_err_set(err, SD_ENOMEM, "%s: out of memory", path);
    }
    size_t ns = 0;
    const char *key;
    json_t *val;
    rc = 0;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val) && !json_is_null(val)) {
                rc = sd_err_set(err, SD_EFORMAT, "%s: __metadata__ is not an object", path);
                break;
            }
            continue;
        }
        sd__st_ent ent = {0};
        rc = sd__parse_entry(path, key, val, data, dsize, &ent, &spans[ns], err);
        if (rc)
            break;
        ent.file = fi;
        ent.t.file = f->base;
        ent.t.name = strdup(key);
        if (!ent.t.name) {
            rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", path);
            break;
        }
        rc = sd__push_ent(st, &ent, err);
        if (rc) {
            free((char *)ent.t.name);
            break;
        }
        spans[ns].name = ent.t.name;
        ns++;
    }
    /* Overlapping tensors would alias each other's data: refuse them. Gaps
     * are harmless and left alone. */
    if (!rc && ns > 1) {
        qsort(spans, ns, sizeof *spans, sd__span_cmp);
        const sd__span *far = &spans[0]; /* the span reaching furthest so far */
        for (size_t i = 1; i < ns; i++) {
            if (spans[i].e > spans[i].b && spans[i].b < far->e) {
                rc = sd_err_set(err, SD_EFORMAT, "%s: tensors %s and %s overlap in the data", path,
                                far->name, spans[i].name);
                break;
            }
            if (spans[i].e > far->e)
                far = &spans[i];
        }
    }
    free(spans);
    json_decref(root);
    return rc;
}

static int sd__ent_cmp(const void *a, const void *b)
{
    const sd__st_ent *x = a, *y = b;
    int c = strcmp(x->t.name, y->t.name);
    if (c)
        return c;
    return x->file - y->file;
}

static const sd__st_ent *sd__find(const sd_st *st, const char *name)
{
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(st->ents[mid].t.name, name);
        if (c == 0)
            return &st->ents[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

static char *sd__join(const char *dir, const char *name)
{
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    return sd_strfmt("%.*s/%s", (int)dl, dir, name);
}

static int sd__str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name from an index must stay inside the folder. */
static int sd__plain_name(const char *s)
{
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int sd__load_index(sd_st *st, const char *dir, const char *ipath, sd_err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = sd_read_file(ipath, &text, &len, err);
    if (rc)
        return rc;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root)
        return sd_err_set(err, SD_EFORMAT, "%s: malformed JSON (line %d, column %d): %s", ipath,
                          je.line, je.column, je.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        json_decref(root);
        return sd_err_set(err, wm ? SD_EFORMAT : SD_ENOENT, "%s: key \"weight_map\" is %s", ipath,
                          wm ? "not an object" : "missing");
    }
    size_t cnt = json_object_size(wm);
    const char **names = malloc((cnt ? cnt : 1) * sizeof *names);
    if (!names) {
        json_decref(root);
        return sd_err_set(err, SD_ENOMEM, "%s: out of memory", ipath);
    }
    size_t nn = 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val)
    {
        if (!json_is_string(val) || !sd__plain_name(json_string_value(val))) {
            rc = sd_err_set(err, SD_EFORMAT,
                            "%s: weight_map entry for tensor %s is not a file name in the folder",
                            ipath, key);
            free(names);
            json_decref(root); /* key lives in root */
            return rc;
        }
        names[nn++] = json_string_value(val);
    }
    /* Each shard is opened once, in name order. */
    qsort(names, nn, sizeof *names, sd__str_cmp);
    for (size_t i = 0; i < nn && !rc; i++) {
        if (i && strcmp(names[i], names[i - 1]) == 0)
            continue;
        char *p = sd__join(dir, names[i]);
        if (!p)
            rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", ipath);
        else if (!sd_file_exists(p)) {
            rc = sd_err_set(err, SD_ENOENT, "%s: shard %s named by the index does not exist", ipath,
                            names[i]);
            free(p);
        } else
            rc = sd__load_file(st, p, err);
    }
    free(names);
    if (!rc) {
        if (st->n > 1)
            qsort(st->ents, (size_t)st->n, sizeof *st->ents, sd__ent_cmp);
        for (int i = 1; i < st->n && !rc; i++)
            if (strcmp(st->ents[i].t.name, st->ents[i - 1].t.name) == 0)
                rc = sd_err_set(err, SD_EFORMAT, "%s: tensor %s appears in both %s and %s", dir,
                                st->ents[i].t.name, st->ents[i - 1].t.file, st->ents[i].t.file);
    }
    /* The index must agree with the shards, or a tensor would silently come
     * from a file other than the one the checkpoint's writer meant. */
    if (!rc) {
        json_object_foreach(wm, key, val)
        {
            const sd__st_ent *e = sd__find(st, key);
            const char *want = json_string_value(val);
            if (!e) {
                rc = sd_err_set(err, SD_ENOENT, "%s: tensor %s is listed in %s but %s lacks it",
                                ipath, key, want, want);
                break;
            }
            if (strcmp(e->t.file, want) != 0) {
                rc = sd_err_set(err, SD_EFORMAT, "%s: tensor %s is listed in %s but is in %s",
                                ipath, key, want, e->t.file);
                break;
            }
        }
    }
    json_decref(root);
    return rc;
}

static int sd__is_st_name(const struct dirent *d)
{
    size_t l = strlen(d->d_name);
    return l > 12 && strcmp(d->d_name + l - 12, ".safetensors") == 0;
}

int sd_st_open(sd_st **out, const char *path_or_dir, sd_err *err)
{
    *out = NULL;
    sd_st *st = calloc(1, sizeof *st);
    if (!st)
        return sd_err_set(err, SD_ENOMEM, "%s: out of memory", path_or_dir);
    st->root = strdup(path_or_dir);
    if (!st->root) {
        free(st);
        return sd_err_set(err, SD_ENOMEM, "%s: out of memory", path_or_dir);
    }
    int rc = 0;
    if (sd_file_exists(path_or_dir)) {
        char *p = strdup(path_or_dir);
        rc = p ? sd__load_file(st, p, err) : sd_err_set(err, SD_ENOMEM, "out of memory");
    } else if (sd_dir_exists(path_or_dir)) {
        char *idx = sd__join(path_or_dir, "model.safetensors.index.json");
        char *one = sd__join(path_or_dir, "model.safetensors");
        if (!idx || !one) {
            rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", path_or_dir);
        } else if (sd_file_exists(idx)) {
            rc = sd__load_index(st, path_or_dir, idx, err);
        } else if (sd_file_exists(one)) {
            rc = sd__load_file(st, one, err);
            one = NULL;
        } else {
            struct dirent **list = NULL;
            int nl = scandir(path_or_dir, &list, sd__is_st_name, alphasort);
            if (nl < 0)
                rc = sd_err_set(err, SD_EIO, "%s: %s", path_or_dir, strerror(errno));
            else if (nl == 0)
                rc = sd_err_set(err, SD_ENOENT,
                                "%s: no model.safetensors.index.json, model.safetensors or "
                                "*.safetensors file",
                                path_or_dir);
            for (int i = 0; i < nl; i++) {
                if (!rc) {
                    char *p = sd__join(path_or_dir, list[i]->d_name);
                    rc = p ? sd__load_file(st, p, err)
                           : sd_err_set(err, SD_ENOMEM, "%s: out of memory", path_or_dir);
                }
                free(list[i]);
            }
            free(list);
        }
        free(idx);
        free(one);
    } else {
        rc = sd_err_set(err, SD_ENOENT, "%s: no such file or folder", path_or_dir);
    }
    if (!rc) {
        /* Sorted by name: lookups are binary searches (a DeepSeek-V3 checkpoint
         * has ~92k tensors) and duplicates across shards sit side by side. */
        if (st->n > 1) /* none: no array to sort */
            qsort(st->ents, (size_t)st->n, sizeof *st->ents, sd__ent_cmp);
        for (int i = 1; i < st->n && !rc; i++)
            if (strcmp(st->ents[i].t.name, st->ents[i - 1].t.name) == 0)
                rc = sd_err_set(err, SD_EFORMAT, "%s: tensor %s appears in both %s and %s",
                                path_or_dir, st->ents[i].t.name, st->ents[i - 1].t.file,
                                st->ents[i].t.file);
    }
    if (rc) {
        sd_st_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

void sd_st_close(sd_st *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->n; i++) {
        free((char *)st->ents[i].t.name);
        free(st->ents[i].owned);
    }
    for (int i = 0; i < st->nfiles; i++) {
        if (st->files[i].map)
            munmap((void *)st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->ents);
    free(st->files);
    free(st->root);
    free(st);
}

int sd_st_count(const sd_st *st) { return st ? st->n : 0; }

const sd_st_tensor *sd_st_at(const sd_st *st, int i)
{
    if (!st || i < 0 || i >= st->n)
        return NULL;
    return &st->ents[i].t;
}

const sd_st_tensor *sd_st_find(const sd_st *st, const char *name)
{
    if (!st || !name)
        return NULL;
    const sd__st_ent *e = sd__find(st, name);
    return e ? &e->t : NULL;
}

int sd_st_fp8_blocks(sd_st *st, int rows, int cols)
{
    if (!st || rows < 1 || cols < 1)
        return SD_EINVAL;
    st->fp8_block[0] = rows;
    st->fp8_block[1] = cols;
    return 0;
}

/* The scales of F8_E4M3 weight e [R, C]: "<name>_scale_inv" [ceil(R / bm),
 * ceil(C / bn)], F32, BF16 or F16. 0 with *se, or an error naming them. */
static int fp8_scales(const sd_st *st, const sd__st_ent *e, const sd__st_ent **se, sd_err *err)
{
    const char *fpath = st->files[e->file].path, *name = e->t.name;
    const int64_t bm = st->fp8_block[0], bn = st->fp8_block[1];
    if (e->t.ndim != 2)
        return sd_err_set(err, SD_EFORMAT,
                          "%s: tensor %s: an F8_E4M3 tensor of %d dimensions (block scales "
                          "take 2)",
                          fpath, name, e->t.ndim);
    const int64_t R = e->t.shape[0], C = e->t.shape[1];
    char *sname = sd_strfmt("%s_scale_inv", name);
    if (!sname)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    const sd__st_ent *x = sd__find(st, sname);
    const int64_t want[2] = {(R + bm - 1) / bm, (C + bn - 1) / bn};
    int rc = 0;
    if (!x)
        rc = sd_err_set(err, SD_ENOENT, "%s: tensor %s is F8_E4M3 and its scales %s are missing",
                        fpath, name, sname);
    else if (x->t.dtype != SD_DT_F32 && x->t.dtype != SD_DT_BF16 && x->t.dtype != SD_DT_F16)
        rc = sd_err_set(err, SD_EFORMAT, "%s: tensor %s: dtype %s (scales are F32, BF16 or F16)",
                        st->files[x->file].path, sname, sd_dtype_name(x->t.dtype));
    else if (x->t.ndim != 2 || x->t.shape[0] != want[0] || x->t.shape[1] != want[1]) {
        char a[256], b[256];
        rc = sd_err_set(err, SD_EFORMAT,
                        "%s: tensor %s: shape %s does not match %s's blocks of %lld x %lld "
                        "(expected %s)",
                        st->files[x->file].path, sname,
                        sd__shape_str(a, sizeof a, x->t.ndim, x->t.shape), name, (long long)bm,
                        (long long)bn, sd__shape_str(b, sizeof b, 2, want));
    }
    free(sname);
    *se = x;
    return rc;
}

int sd_st_fp8_parts(const sd_st *st, const char *name, int ndim, const int64_t *shape,
                    const sd_st_tensor **q, const sd_st_tensor **scale, sd_err *err)
{
    *q = *scale = NULL;
    const sd__st_ent *e = st ? sd__find(st, name) : NULL;
    if (!e || e->t.dtype != SD_DT_F8_E4M3 || !st->fp8_block[0])
        return 1;
    int same = e->t.ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = e->t.shape[i] == shape[i];
    if (!same)
        return 1; /* sd_st_expect names the mismatch */
    const sd__st_ent *se;
    int rc = fp8_scales(st, e, &se, err);
    if (rc)
        return rc;
    *q = &e->t;
    *scale = &se->t;
    return 0;
}

/* An F8_E4M3 weight [R, C] becomes BF16: fp8 x its block's scale in F32,
 * rounded to nearest even (DeepSeek-V3's reference weight_dequant into its
 * bf16 default dtype). The entry then holds the copy. */
static int dequant_fp8(sd_st *st, sd__st_ent *e, sd_err *err)
{
    const sd__st_ent *se;
    int rc = fp8_scales(st, e, &se, err);
    if (rc)
        return rc;
    const char *fpath = st->files[e->file].path, *name = e->t.name;
    const int64_t bm = st->fp8_block[0], bn = st->fp8_block[1];
    const int64_t R = e->t.shape[0], C = e->t.shape[1], SC = se->t.shape[1];
    uint16_t *out = malloc((size_t)R * (size_t)C * sizeof *out);
    if (!out)
        return sd_err_set(err, SD_ENOMEM, "%s: out of memory dequantizing %s", fpath, name);
    const uint8_t *q = e->t.data;
    for (int64_t r = 0; r < R; r++) {
        const size_t srow = (size_t)(r / bm) * (size_t)SC;
        for (int64_t c0 = 0; c0 < C; c0 += bn) {
            const float sc = sd_load_f32(se->t.data, se->t.dtype, srow + (size_t)(c0 / bn));
            const int64_t c1 = c0 + bn < C ? c0 + bn : C;
            for (int64_t c = c0; c < c1; c++) {
                const size_t i = (size_t)(r * C + c);
                out[i] = sd_f32_to_bf16(sd_fp8_e4m3_to_f32(q[i]) * sc);
            }
        }
    }
    e->owned = out;
    e->t.data = out;
    e->t.dtype = SD_DT_BF16;
    e->t.nbytes = (size_t)R * (size_t)C * sizeof *out;
    return 0;
}

int sd_st_expect(const sd_st *st, const char *name, int ndim, const int64_t *shape,
                 const sd_st_tensor **out, sd_err *err)
{
    if (out)
        *out = NULL;
    const sd__st_ent *e = st ? sd__find(st, name) : NULL;
    if (!e)
        return sd_err_set(err, SD_ENOENT, "%s: tensor %s is missing", st ? st->root : "(none)",
                          name);
    const char *fpath = st->files[e->file].path;
    if (e->t.dtype == SD_DT_F8_E4M3) {
        if (!st->fp8_block[0])
            return sd_err_set(err, SD_ENOTSUP,
                              "%s: tensor %s: dtype F8_E4M3, and the config has no fp8 "
                              "quantization_config (block scales)",
                              fpath, name);
        /* dequantized once, at its first load (the entry is the cache) */
        int rc = dequant_fp8((sd_st *)st, (sd__st_ent *)e, err);
        if (rc)
            return rc;
    }
    int same = e->t.ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = e->t.shape[i] == shape[i];
    if (!same) {
        char a[256], b[256];
        return sd_err_set(err, SD_EFORMAT,
                          "%s: tensor %s: shape %s does not match the config (expected %s)", fpath,
                          name, sd__shape_str(a, sizeof a, e->t.ndim, e->t.shape),
                          sd__shape_str(b, sizeof b, ndim < 0 ? 0 : ndim, shape));
    }
    if (out)
        *out = &e->t;
    return 0;
}

/* ---- writer -------------------------------------------------------------- */

typedef struct sd__wslot {
    int idx;
    size_t esize;
} sd__wslot;

/* Larger elements first, then input order: every tensor starts at a multiple
 * of its element size, given an 8-aligned data section. */
static int sd__wslot_cmp(const void *a, const void *b)
{
    const sd__wslot *x = a, *y = b;
    if (x->esize != y->esize)
        return x->esize > y->esize ? -1 : 1;
    return x->idx - y->idx;
}

static int sd__write_all(FILE *f, const void *p, size_t n)
{
    return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

int sd_st_write(const char *path, const sd_st_tensor *tensors, int n, const char *metadata_json,
                sd_err *err)
{
    if (n < 0 || (n > 0 && !tensors))
        return sd_err_set(err, SD_EINVAL, "%s: bad tensor list", path);
    int rc = 0;
    json_t *root = json_object();
    sd__wslot *slots = malloc((size_t)(n ? n : 1) * sizeof *slots);
    uint64_t *begin = malloc((size_t)(n ? n : 1) * sizeof *begin);
    char *hdr = NULL;
    FILE *f = NULL;
    if (!root || !slots || !begin) {
        rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    if (metadata_json) {
        json_error_t je;
        json_t *md = json_loads(metadata_json, 0, &je);
        int ok = json_is_object(md);
        const char *k;
        json_t *v;
        if (ok) {
            json_object_foreach(md, k, v)
            {
                ok = ok && json_is_string(v);
            }
        }
        if (!ok) {
            json_decref(md);
            rc = sd_err_set(err, SD_EINVAL, "%s: metadata is not a JSON object of strings", path);
            goto out;
        }
        json_object_set_new(root, "__metadata__", md);
    }
    for (int i = 0; i < n; i++) {
        const sd_st_tensor *t = &tensors[i];
        if (!t->name || strcmp(t->name, "__metadata__") == 0) {
            rc = sd_err_set(err, SD_EINVAL, "%s: tensor %d has no usable name", path, i);
            goto out;
        }
        if ((unsigned)t->dtype >= SD_DT_COUNT || t->ndim < 0 || t->ndim > SD_ST_MAX_DIMS) {
            rc = sd_err_set(err, SD_EINVAL, "%s: tensor %s: bad dtype or ndim", path, t->name);
            goto out;
        }
        int64_t need = sd__shape_bytes(t->ndim, t->shape, t->dtype);
        if (need < 0 || (uint64_t)need != t->nbytes || (t->nbytes && !t->data)) {
            char sh[256];
            rc = sd_err_set(err, SD_EINVAL,
                            "%s: tensor %s: nbytes %zu does not match shape %s of %s (%lld bytes)",
                            path, t->name, t->nbytes,
                            sd__shape_str(sh, sizeof sh, t->ndim, t->shape),
                            sd_dtype_name(t->dtype), (long long)need);
            goto out;
        }
        slots[i].idx = i;
        slots[i].esize = sd_dtype_size(t->dtype);
    }
    qsort(slots, (size_t)n, sizeof *slots, sd__wslot_cmp);
    uint64_t off = 0;
    for (int s = 0; s < n; s++) {
        begin[slots[s].idx] = off;
        off += tensors[slots[s].idx].nbytes;
    }
    for (int i = 0; i < n && !rc; i++) {
        const sd_st_tensor *t = &tensors[i];
        if (json_object_get(root, t->name)) {
            rc = sd_err_set(err, SD_EINVAL, "%s: tensor %s appears twice", path, t->name);
            break;
        }
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        int bad = !e || !sh || !of;
        for (int d = 0; !bad && d < t->ndim; d++)
            bad = json_array_append_new(sh, json_integer(t->shape[d])) != 0;
        bad = bad || json_array_append_new(of, json_integer((json_int_t)begin[i])) != 0 ||
              json_array_append_new(of, json_integer((json_int_t)(begin[i] + t->nbytes))) != 0 ||
              json_object_set_new(e, "dtype", json_string(sd_dtype_name(t->dtype))) != 0;
        if (bad) {
            json_decref(e);
            json_decref(sh);
            json_decref(of);
            rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", path);
            break;
        }
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", of);
        if (json_object_set_new(root, t->name, e) != 0)
            rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", path);
    }
    if (rc)
        goto out;
    hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!hdr) {
        rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    /* Header padded with spaces so the data section starts 8-aligned. */
    size_t hl = strlen(hdr), pad = (8 - hl % 8) % 8;
    uint64_t total = hl + pad;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)(total >> (8 * i));
    static const char spaces[8] = "        ";
    f = fopen(path, "wb");
    if (!f) {
        rc = sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
        goto out;
    }
    int bad =
        sd__write_all(f, len8, 8) || sd__write_all(f, hdr, hl) || sd__write_all(f, spaces, pad);
    for (int s = 0; s < n && !bad; s++)
        bad = sd__write_all(f, tensors[slots[s].idx].data, tensors[slots[s].idx].nbytes);
    bad = fclose(f) != 0 || bad;
    f = NULL;
    if (bad) {
        unlink(path);
        rc = sd_err_set(err, SD_EIO, "%s: write failed", path);
    }
out:
    free(hdr);
    free(begin);
    free(slots);
    json_decref(root);
    return rc;
}
