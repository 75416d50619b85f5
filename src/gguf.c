/* gguf.c — bounded-cursor GGUF v3 parser. Nothing is allocated with a size read
 * from the file before that size has been checked against the bytes left. */
#include "gguf.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_MAX_KEY 65535
#define GGUF_MAX_KV (1u << 20)        /* real files: a few dozen */
#define GGUF_MAX_TENSORS (1u << 20)   /* real files: hundreds to a few thousand */
#define GGUF_MAX_STR_ARRAY (1u << 24) /* string array elements (Qwen3 vocab: 151936) */

typedef struct cursor {
    const uint8_t *p;
    uint64_t pos, size;
    const char *file;
    ditto_err *err;
} cursor;

static uint64_t left(const cursor *c) { return c->size - c->pos; }

static int need(cursor *c, uint64_t n, const char *field) {
    if (n > left(c))
        return err_set(c->err, "%s: truncated reading %s at offset %llu (need %llu bytes, %llu left)",
                       c->file, field, (unsigned long long)c->pos, (unsigned long long)n,
                       (unsigned long long)left(c));
    return 0;
}

static int rd(cursor *c, void *dst, uint64_t n, const char *field) {
    if (need(c, n, field)) return -1;
    memcpy(dst, c->p + c->pos, n);
    c->pos += n;
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *field) { return rd(c, v, 4, field); }
static int rd_u64(cursor *c, uint64_t *v, const char *field) { return rd(c, v, 8, field); }

/* A string in place: length checked against the bytes left. */
static int rd_str(cursor *c, const char **s, uint64_t *len, const char *field) {
    if (rd_u64(c, len, field)) return -1;
    if (*len > left(c))
        return err_set(c->err, "%s: %s length %llu exceeds the %llu bytes left in the file", c->file,
                       field, (unsigned long long)*len, (unsigned long long)left(c));
    *s = (const char *)c->p + c->pos;
    c->pos += *len;
    return 0;
}

static const uint64_t scalar_size[GGUF_VT_COUNT] = {
    [GGUF_VT_UINT8] = 1, [GGUF_VT_INT8] = 1,   [GGUF_VT_UINT16] = 2,  [GGUF_VT_INT16] = 2,
    [GGUF_VT_UINT32] = 4, [GGUF_VT_INT32] = 4, [GGUF_VT_FLOAT32] = 4, [GGUF_VT_BOOL] = 1,
    [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8, [GGUF_VT_FLOAT64] = 8,
};

const char *gguf_vtype_name(uint32_t t) {
    static const char *names[GGUF_VT_COUNT] = {"uint8", "int8",   "uint16", "int16", "uint32",
                                               "int32", "float32", "bool",  "string", "array",
                                               "uint64", "int64", "float64"};
    return t < GGUF_VT_COUNT ? names[t] : "unknown";
}

static void decode_scalar(gguf_kv *kv, const uint8_t *p) {
    switch (kv->type) {
    case GGUF_VT_UINT8: kv->v.u = p[0]; break;
    case GGUF_VT_BOOL: kv->v.u = p[0] != 0; break;
    case GGUF_VT_INT8: kv->v.i = (int8_t)p[0]; break;
    case GGUF_VT_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; break; }
    case GGUF_VT_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i = x; break; }
    case GGUF_VT_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; break; }
    case GGUF_VT_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i = x; break; }
    case GGUF_VT_UINT64: { uint64_t x; memcpy(&x, p, 8); kv->v.u = x; break; }
    case GGUF_VT_INT64: { int64_t x; memcpy(&x, p, 8); kv->v.i = x; break; }
    case GGUF_VT_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f = x; break; }
    case GGUF_VT_FLOAT64: { double x; memcpy(&x, p, 8); kv->v.f = x; break; }
    default: break;
    }
}

static int parse_kv(cursor *c, gguf_kv *kv, uint64_t idx) {
    char field[96];
    const char *key;
    uint64_t klen;
    snprintf(field, sizeof field, "key of metadata entry %llu", (unsigned long long)idx);
    if (rd_str(c, &key, &klen, field)) return -1;
    if (klen == 0 || klen > GGUF_MAX_KEY)
        return err_set(c->err, "%s: %s has invalid length %llu", c->file, field, (unsigned long long)klen);
    if (memchr(key, 0, klen))
        return err_set(c->err, "%s: %s contains a NUL byte", c->file, field);
    kv->key = xmalloc(klen + 1);
    memcpy(kv->key, key, klen);
    kv->key[klen] = 0;
    snprintf(field, sizeof field, "value type of metadata key '%.*s'", (int)DT_MIN(klen, (uint64_t)60), key);
    if (rd_u32(c, &kv->type, field)) return -1;
    if (kv->type >= GGUF_VT_COUNT)
        return err_set(c->err, "%s: metadata key '%s' has unknown value type %u", c->file, kv->key, kv->type);
    if (kv->type == GGUF_VT_STRING) {
        return rd_str(c, &kv->str, &kv->str_len, kv->key);
    }
    if (kv->type != GGUF_VT_ARRAY) {
        if (need(c, scalar_size[kv->type], kv->key)) return -1;
        decode_scalar(kv, c->p + c->pos);
        c->pos += scalar_size[kv->type];
        return 0;
    }
    if (rd_u32(c, &kv->arr_type, kv->key) || rd_u64(c, &kv->arr_n, kv->key)) return -1;
    if (kv->arr_type >= GGUF_VT_COUNT)
        return err_set(c->err, "%s: array '%s' has unknown element type %u", c->file, kv->key, kv->arr_type);
    if (kv->arr_type == GGUF_VT_ARRAY)
        return err_set(c->err, "%s: array '%s' is an array of arrays (not allowed)", c->file, kv->key);
    if (kv->arr_type == GGUF_VT_STRING) {
        /* each element needs at least its 8-byte length */
        if (kv->arr_n > GGUF_MAX_STR_ARRAY || kv->arr_n > left(c) / 8)
            return err_set(c->err, "%s: string array '%s' count %llu exceeds the limit (%u) or the bytes left (%llu)",
                           c->file, kv->key, (unsigned long long)kv->arr_n, GGUF_MAX_STR_ARRAY, (unsigned long long)left(c));
        kv->arr_str_off = xmalloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof(uint64_t));
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            const char *s;
            uint64_t len;
            kv->arr_str_off[i] = c->pos;
            if (rd_str(c, &s, &len, kv->key)) return -1;
        }
        return 0;
    }
    uint64_t es = scalar_size[kv->arr_type];
    if (kv->arr_n > left(c) / es)
        return err_set(c->err, "%s: array '%s' count %llu x %llu bytes exceeds the %llu bytes left", c->file,
                       kv->key, (unsigned long long)kv->arr_n, (unsigned long long)es,
                       (unsigned long long)left(c));
    kv->arr_data = c->p + c->pos;
    c->pos += kv->arr_n * es;
    return 0;
}

static int parse_tensor_info(cursor *c, gguf_tensor *t, uint64_t idx) {
    char field[96];
    const char *name;
    uint64_t nlen;
    snprintf(field, sizeof field, "name of tensor %llu", (unsigned long long)idx);
    if (rd_str(c, &name, &nlen, field)) return -1;
    if (nlen == 0 || nlen >= GGUF_MAX_NAME)
        return err_set(c->err, "%s: %s has length %llu (must be 1..%d)", c->file, field,
                       (unsigned long long)nlen, GGUF_MAX_NAME - 1);
    if (memchr(name, 0, nlen)) return err_set(c->err, "%s: %s contains a NUL byte", c->file, field);
    t->name = xmalloc(nlen + 1);
    memcpy(t->name, name, nlen);
    t->name[nlen] = 0;
    if (rd_u32(c, &t->n_dims, t->name)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return err_set(c->err, "%s: tensor '%s' n_dims = %u (must be 1..%d)", c->file, t->name, t->n_dims,
                       GGUF_MAX_DIMS);
    uint64_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (rd_u64(c, &t->ne[d], t->name)) return -1;
        if (t->ne[d] == 0 || t->ne[d] > INT64_MAX)
            return err_set(c->err, "%s: tensor '%s' dim %u = %llu (must be >= 1)", c->file, t->name, d,
                           (unsigned long long)t->ne[d]);
        if (nel > (uint64_t)INT64_MAX / t->ne[d])
            return err_set(c->err, "%s: tensor '%s' element count overflows at dim %u", c->file, t->name, d);
        nel *= t->ne[d];
    }
    if (rd_u32(c, &t->type, t->name) || rd_u64(c, &t->offset, t->name)) return -1;
    const quant_traits *tr = quant_traits_of(t->type);
    if (!tr)
        return err_set(c->err, "%s: tensor '%s' has unknown type id %u", c->file, t->name, t->type);
    if (t->ne[0] % tr->blck)
        return err_set(c->err, "%s: tensor '%s' row length %llu is not a multiple of the %s block size %u",
                       c->file, t->name, (unsigned long long)t->ne[0], tr->name, tr->blck);
    uint64_t nblocks = nel / tr->blck;
    if (nblocks > UINT64_MAX / tr->bytes)
        return err_set(c->err, "%s: tensor '%s' byte size overflows", c->file, t->name);
    t->nbytes = nblocks * tr->bytes;
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Duplicate detection by sorting a temporary array of name pointers. */
static int check_dups(const char **names, uint64_t n, const char *what, const char *file, ditto_err *err) {
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (uint64_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return err_set(err, "%s: duplicate %s '%s'", file, what, names[i]);
    return 0;
}

static int cmp_off(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse(gguf_file *f, ditto_err *err) {
    cursor c = {f->map, 0, f->size, f->path, err};
    uint32_t magic;
    if (rd_u32(&c, &magic, "magic")) return -1;
    if (magic != GGUF_MAGIC) return err_set(err, "%s: bad magic 0x%08x (not a GGUF file)", f->path, magic);
    if (rd_u32(&c, &f->version, "version")) return -1;
    if (f->version != 3 && f->version != 2)
        return err_set(err, "%s: unsupported GGUF version %u (need 2 or 3)", f->path, f->version);
    uint64_t n_tensors, n_kv;
    if (rd_u64(&c, &n_tensors, "tensor count") || rd_u64(&c, &n_kv, "metadata count")) return -1;
    /* smallest kv: 8 (key len) + 1 (key) + 4 (type) + 1 (value); smallest tensor info: 8+1+4+8+4+8 */
    if (n_kv > GGUF_MAX_KV || n_kv > left(&c) / 14)
        return err_set(err, "%s: metadata count %llu is over the limit or impossible for a file of %llu bytes", f->path,
                       (unsigned long long)n_kv, (unsigned long long)f->size);
    if (n_tensors > GGUF_MAX_TENSORS || n_tensors > left(&c) / 33)
        return err_set(err, "%s: tensor count %llu is over the limit or impossible for a file of %llu bytes", f->path,
                       (unsigned long long)n_tensors, (unsigned long long)f->size);
    f->kv = xcalloc((size_t)(n_kv ? n_kv : 1), sizeof(gguf_kv));
    f->n_kv = n_kv;
    for (uint64_t i = 0; i < n_kv; i++)
        if (parse_kv(&c, &f->kv[i], i)) return -1;
    f->tensors = xcalloc((size_t)(n_tensors ? n_tensors : 1), sizeof(gguf_tensor));
    f->n_tensors = n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++)
        if (parse_tensor_info(&c, &f->tensors[i], i)) return -1;

    const char **names = xmalloc((size_t)(DT_MAX(n_kv, n_tensors) + 1) * sizeof(char *));
    for (uint64_t i = 0; i < n_kv; i++) names[i] = f->kv[i].key;
    int rc = check_dups(names, n_kv, "metadata key", f->path, err);
    for (uint64_t i = 0; rc == 0 && i < n_tensors; i++) names[i] = f->tensors[i].name;
    if (rc == 0) rc = check_dups(names, n_tensors, "tensor name", f->path, err);
    free(names);
    if (rc) return -1;

    f->alignment = 32;
    const gguf_kv *al = gguf_find_kv(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_VT_UINT32 && al->type != GGUF_VT_UINT64)
            return err_set(err, "%s: general.alignment has type %s (need uint32)", f->path,
                           gguf_vtype_name(al->type));
        uint64_t a = al->v.u;
        /* at least 4: every tensor's data must sit aligned for its element type (f32, block scales) */
        if (a < 4 || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT)
            return err_set(err, "%s: general.alignment = %llu (must be a power of two from 4 to %d)", f->path,
                           (unsigned long long)a, GGUF_MAX_ALIGNMENT);
        f->alignment = a;
    }
    uint64_t ds = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
    if (n_tensors > 0 && ds > f->size)
        return err_set(err, "%s: data section starts at %llu, past the end of the file (%llu bytes)", f->path,
                       (unsigned long long)ds, (unsigned long long)f->size);
    f->data_start = ds;
    uint64_t data_size = f->size > ds ? f->size - ds : 0;

    gguf_tensor **order = xmalloc((size_t)(n_tensors + 1) * sizeof(*order));
    for (uint64_t i = 0; i < n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)n_tensors, sizeof *order, cmp_off);
    uint64_t end = 0;
    for (uint64_t i = 0; i < n_tensors && rc == 0; i++) {
        gguf_tensor *t = order[i];
        if (t->offset % f->alignment)
            rc = err_set(err, "%s: tensor '%s' offset %llu is not a multiple of the alignment %llu", f->path,
                         t->name, (unsigned long long)t->offset, (unsigned long long)f->alignment);
        else if (t->offset < end)
            rc = err_set(err, "%s: tensor '%s' at offset %llu overlaps the previous tensor (ends at %llu)",
                         f->path, t->name, (unsigned long long)t->offset, (unsigned long long)end);
        else if (t->offset > data_size || t->nbytes > data_size - t->offset)
            rc = err_set(err, "%s: tensor '%s' data [%llu, +%llu) lies outside the data section (%llu bytes)",
                         f->path, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                         (unsigned long long)data_size);
        else {
            end = t->offset + t->nbytes;
            t->data = f->map + ds + t->offset;
        }
    }
    free(order);
    return rc;
}

static int open_common(gguf_file **out, gguf_file *f, ditto_err *err) {
    if (parse(f, err)) {
        gguf_close(f);
        *out = NULL;
        return -1;
    }
    *out = f;
    return 0;
}

int gguf_open(gguf_file **out, const char *path, ditto_err *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return err_set(err, "%s: cannot open: %m", path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return err_set(err, "%s: file too small for a GGUF header (%lld bytes)", path, (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return err_set(err, "%s: mmap failed: %m", path);
    gguf_file *f = xcalloc(1, sizeof *f);
    f->path = strdup(path);
    f->map = m;
    f->owns_map = true;
    f->size = (uint64_t)st.st_size;
    return open_common(out, f, err);
}

int gguf_open_buffer(gguf_file **out, const void *buf, uint64_t size, const char *name, ditto_err *err) {
    gguf_file *f = xcalloc(1, sizeof *f);
    f->path = strdup(name);
    f->map = buf;
    f->size = size;
    return open_common(out, f, err);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

void gguf_populate(const gguf_file *f) {
    if (!f->owns_map || f->size == 0) return;
    /* one bulk fault-in now instead of a minor fault per 4 KiB page inside the
     * decode loop; older kernels lack the advice, then pages fault in lazily */
    const size_t step = (size_t)256 << 20;
    for (size_t off = 0; off < f->size; off += step) {
        size_t n = f->size - off < step ? (size_t)(f->size - off) : step;
        madvise((void *)(f->map + off), n, MADV_POPULATE_READ);
        progress_show("loading weights  ", off + n, f->size);
    }
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (uint64_t i = 0; i < f->n_kv && f->kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].arr_str_off);
    }
    for (uint64_t i = 0; i < f->n_tensors && f->tensors; i++) free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    if (f->owns_map) munmap((void *)f->map, (size_t)f->size);
    free(f->path);
    free(f);
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (f->kv[i].key && strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].name && strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static bool is_uint(uint32_t t) {
    return t == GGUF_VT_UINT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_UINT32 || t == GGUF_VT_UINT64;
}
static bool is_sint(uint32_t t) {
    return t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, ditto_err *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return err_set(err, "%s: missing metadata key '%s'", f->path, key);
    if (is_uint(kv->type) && kv->v.u <= UINT32_MAX) {
        *out = (uint32_t)kv->v.u;
        return 0;
    }
    if (is_sint(kv->type) && kv->v.i >= 0 && kv->v.i <= (int64_t)UINT32_MAX) {
        *out = (uint32_t)kv->v.i;
        return 0;
    }
    if (is_uint(kv->type) || is_sint(kv->type))
        return err_set(err, "%s: metadata '%s' is out of range for uint32", f->path, key);
    return err_set(err, "%s: metadata '%s' has type %s (need an integer)", f->path, key,
                   gguf_vtype_name(kv->type));
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, ditto_err *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return err_set(err, "%s: missing metadata key '%s'", f->path, key);
    if (kv->type == GGUF_VT_FLOAT32 || kv->type == GGUF_VT_FLOAT64) {
        *out = (float)kv->v.f;
        return 0;
    }
    if (is_uint(kv->type)) {
        *out = (float)kv->v.u;
        return 0;
    }
    if (is_sint(kv->type)) {
        *out = (float)kv->v.i;
        return 0;
    }
    return err_set(err, "%s: metadata '%s' has type %s (need a number)", f->path, key, gguf_vtype_name(kv->type));
}

int gguf_get_str(const gguf_file *f, const char *key, char **out, ditto_err *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return err_set(err, "%s: missing metadata key '%s'", f->path, key);
    if (kv->type != GGUF_VT_STRING)
        return err_set(err, "%s: metadata '%s' has type %s (need string)", f->path, key, gguf_vtype_name(kv->type));
    *out = xmalloc(kv->str_len + 1);
    memcpy(*out, kv->str, kv->str_len);
    (*out)[kv->str_len] = 0;
    return 0;
}

const char *gguf_arr_str(const gguf_file *f, const gguf_kv *kv, uint64_t i, uint64_t *len) {
    DT_ASSERT(kv->type == GGUF_VT_ARRAY && kv->arr_type == GGUF_VT_STRING && i < kv->arr_n);
    uint64_t off = kv->arr_str_off[i];
    memcpy(len, f->map + off, 8);
    return (const char *)f->map + off + 8;
}
