/* gguf_write.c — streaming GGUF v3 writer (see gguf_write.h). Metadata values
 * are kept pre-encoded (u32 type + payload, exactly as they go to disk), so the
 * header is a concatenation and copying a value from a mapped file is a memcpy.
 * Assumes a little-endian host, like the reader. */
#include "gguf_write.h"

#include <errno.h>
#include <string.h>

#include "quant.h"

#define GW_MAGIC 0x46554747u
#define GW_VERSION 3u
#define GW_DEFAULT_ALIGN 32u
#define GW_MAX_KEY 65535u

typedef struct gw_kv {
    char *key;
    uint8_t *val; /* u32 type + encoded value */
    size_t val_len;
} gw_kv;

typedef struct gw_tensor {
    char *name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t nbytes;
    uint64_t offset; /* set by begin */
} gw_tensor;

enum gw_state { GW_DECLARE, GW_DATA, GW_DONE };

struct gguf_writer {
    gw_kv *kv;
    size_t n_kv, cap_kv;
    gw_tensor *t;
    size_t n_t, cap_t;
    enum gw_state state;
    FILE *fp;
    bool owns_fp;
    char *name;
    uint64_t align;
    size_t cur;            /* tensor being written */
    uint64_t cur_done;     /* bytes of it written */
    uint64_t written;      /* total bytes written */
};

/* ---- growable byte buffer for encoding ------------------------------------ */

typedef struct gw_buf {
    uint8_t *p;
    size_t n, cap;
} gw_buf;

static void buf_put(gw_buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "ditto: out of memory (%zu bytes)\n", cap);
            abort();
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void buf_u32(gw_buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(gw_buf *b, uint64_t v) { buf_put(b, &v, 8); }

/* ---- declaration ------------------------------------------------------------ */

gguf_writer *gguf_write_new(void) {
    gguf_writer *w = xcalloc(1, sizeof *w);
    w->align = GW_DEFAULT_ALIGN;
    return w;
}

void gguf_write_free(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    if (w->fp && w->owns_fp) fclose(w->fp);
    free(w->name);
    free(w);
}

/* Stores an encoded value under key (replacing an existing one); takes b->p. */
static void put_kv(gguf_writer *w, const char *key, gw_buf *b) {
    DT_ASSERT(w->state == GW_DECLARE);
    size_t klen = strlen(key);
    DT_ASSERT(klen >= 1 && klen <= GW_MAX_KEY);
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].val = b->p;
            w->kv[i].val_len = b->n;
            return;
        }
    }
    if (w->n_kv == w->cap_kv) {
        w->cap_kv = w->cap_kv ? 2 * w->cap_kv : 32;
        gw_kv *kv = realloc(w->kv, w->cap_kv * sizeof *kv);
        DT_ASSERT(kv != NULL);
        w->kv = kv;
    }
    gw_kv *kv = &w->kv[w->n_kv++];
    kv->key = xmalloc(klen + 1);
    memcpy(kv->key, key, klen + 1);
    kv->val = b->p;
    kv->val_len = b->n;
}

static void set_scalar(gguf_writer *w, const char *key, uint32_t type, const void *v, size_t n) {
    gw_buf b = {0};
    buf_u32(&b, type);
    buf_put(&b, v, n);
    put_kv(w, key, &b);
}

void gguf_write_set_u32(gguf_writer *w, const char *key, uint32_t v) {
    set_scalar(w, key, GGUF_VT_UINT32, &v, 4);
}
void gguf_write_set_i32(gguf_writer *w, const char *key, int32_t v) {
    set_scalar(w, key, GGUF_VT_INT32, &v, 4);
}
void gguf_write_set_f32(gguf_writer *w, const char *key, float v) {
    set_scalar(w, key, GGUF_VT_FLOAT32, &v, 4);
}
void gguf_write_set_bool(gguf_writer *w, const char *key, bool v) {
    uint8_t x = v ? 1 : 0;
    set_scalar(w, key, GGUF_VT_BOOL, &x, 1);
}

void gguf_write_set_strn(gguf_writer *w, const char *key, const char *s, uint64_t len) {
    gw_buf b = {0};
    buf_u32(&b, GGUF_VT_STRING);
    buf_u64(&b, len);
    buf_put(&b, s, (size_t)len);
    put_kv(w, key, &b);
}
void gguf_write_set_str(gguf_writer *w, const char *key, const char *s) {
    gguf_write_set_strn(w, key, s, strlen(s));
}

void gguf_write_set_arr_str(gguf_writer *w, const char *key, const char *const *s, uint64_t n) {
    gw_buf b = {0};
    buf_u32(&b, GGUF_VT_ARRAY);
    buf_u32(&b, GGUF_VT_STRING);
    buf_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = strlen(s[i]);
        buf_u64(&b, len);
        buf_put(&b, s[i], (size_t)len);
    }
    put_kv(w, key, &b);
}

static void set_arr(gguf_writer *w, const char *key, uint32_t et, const void *v, uint64_t n, size_t es) {
    gw_buf b = {0};
    buf_u32(&b, GGUF_VT_ARRAY);
    buf_u32(&b, et);
    buf_u64(&b, n);
    buf_put(&b, v, (size_t)n * es);
    put_kv(w, key, &b);
}
void gguf_write_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n) {
    set_arr(w, key, GGUF_VT_INT32, v, n, 4);
}
void gguf_write_set_arr_u32(gguf_writer *w, const char *key, const uint32_t *v, uint64_t n) {
    set_arr(w, key, GGUF_VT_UINT32, v, n, 4);
}
void gguf_write_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n) {
    set_arr(w, key, GGUF_VT_FLOAT32, v, n, 4);
}

static size_t vt_size(uint32_t t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

/* Re-encodes a decoded scalar exactly as it was stored. */
static void enc_scalar(gw_buf *b, const gguf_kv *kv) {
    switch (kv->type) {
    case GGUF_VT_UINT8: case GGUF_VT_BOOL: { uint8_t x = (uint8_t)kv->v.u; buf_put(b, &x, 1); break; }
    case GGUF_VT_INT8: { int8_t x = (int8_t)kv->v.i; buf_put(b, &x, 1); break; }
    case GGUF_VT_UINT16: { uint16_t x = (uint16_t)kv->v.u; buf_put(b, &x, 2); break; }
    case GGUF_VT_INT16: { int16_t x = (int16_t)kv->v.i; buf_put(b, &x, 2); break; }
    case GGUF_VT_UINT32: { uint32_t x = (uint32_t)kv->v.u; buf_put(b, &x, 4); break; }
    case GGUF_VT_INT32: { int32_t x = (int32_t)kv->v.i; buf_put(b, &x, 4); break; }
    case GGUF_VT_UINT64: buf_put(b, &kv->v.u, 8); break;
    case GGUF_VT_INT64: buf_put(b, &kv->v.i, 8); break;
    case GGUF_VT_FLOAT32: { float x = (float)kv->v.f; buf_put(b, &x, 4); break; }
    case GGUF_VT_FLOAT64: buf_put(b, &kv->v.f, 8); break;
    default: DT_ASSERT(!"not a scalar type");
    }
}

void gguf_write_copy_one(gguf_writer *w, const gguf_file *src, const gguf_kv *kv) {
    gw_buf b = {0};
    buf_u32(&b, kv->type);
    if (kv->type == GGUF_VT_STRING) {
        buf_u64(&b, kv->str_len);
        buf_put(&b, kv->str, (size_t)kv->str_len);
    } else if (kv->type == GGUF_VT_ARRAY) {
        buf_u32(&b, kv->arr_type);
        buf_u64(&b, kv->arr_n);
        if (kv->arr_type == GGUF_VT_STRING) {
            if (kv->arr_n > 0) {
                /* the elements are contiguous in the mapping: copy the whole run */
                uint64_t first = kv->arr_str_off[0], last = kv->arr_str_off[kv->arr_n - 1], len;
                memcpy(&len, src->map + last, 8);
                uint64_t end = last + 8 + len;
                DT_ASSERT(end <= src->size && first <= end);
                buf_put(&b, src->map + first, (size_t)(end - first));
            }
        } else {
            size_t es = vt_size(kv->arr_type);
            DT_ASSERT(es > 0);
            buf_put(&b, kv->arr_data, (size_t)kv->arr_n * es);
        }
    } else {
        enc_scalar(&b, kv);
    }
    put_kv(w, kv->key, &b);
}

uint64_t gguf_write_copy_kv(gguf_writer *w, const gguf_file *src, const char *prefix) {
    size_t pl = prefix ? strlen(prefix) : 0;
    uint64_t n = 0;
    for (uint64_t i = 0; i < src->n_kv; i++) {
        if (pl && strncmp(src->kv[i].key, prefix, pl) != 0) continue;
        gguf_write_copy_one(w, src, &src->kv[i]);
        n++;
    }
    return n;
}

uint64_t gguf_write_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *ne,
                               uint32_t type) {
    DT_ASSERT(w->state == GW_DECLARE);
    size_t nlen = strlen(name);
    DT_ASSERT(nlen >= 1 && nlen < GGUF_MAX_NAME);
    DT_ASSERT(n_dims >= 1 && n_dims <= GGUF_MAX_DIMS);
    const quant_traits *tr = quant_traits_of(type);
    DT_ASSERT(tr != NULL);
    DT_ASSERT(ne[0] % tr->blck == 0);
    for (size_t i = 0; i < w->n_t; i++) DT_ASSERT(strcmp(w->t[i].name, name) != 0);
    uint64_t nel = 1;
    gw_tensor t = {0};
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t.ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        DT_ASSERT(ne[d] >= 1 && ne[d] <= (uint64_t)INT64_MAX / nel);
        t.ne[d] = ne[d];
        nel *= ne[d];
    }
    DT_ASSERT(nel / tr->blck <= UINT64_MAX / tr->bytes / 2);
    t.name = xmalloc(nlen + 1);
    memcpy(t.name, name, nlen + 1);
    t.n_dims = n_dims;
    t.type = type;
    t.nbytes = nel / tr->blck * tr->bytes;
    if (w->n_t == w->cap_t) {
        w->cap_t = w->cap_t ? 2 * w->cap_t : 64;
        gw_tensor *nt = realloc(w->t, w->cap_t * sizeof *nt);
        DT_ASSERT(nt != NULL);
        w->t = nt;
    }
    w->t[w->n_t++] = t;
    return t.nbytes;
}

uint64_t gguf_write_n_tensors(const gguf_writer *w) { return w->n_t; }
uint64_t gguf_write_tensor_nbytes(const gguf_writer *w, uint64_t i) {
    DT_ASSERT(i < w->n_t);
    return w->t[i].nbytes;
}
const char *gguf_write_tensor_name(const gguf_writer *w, uint64_t i) {
    DT_ASSERT(i < w->n_t);
    return w->t[i].name;
}
uint64_t gguf_write_current(const gguf_writer *w) { return w->cur; }
uint64_t gguf_write_bytes_written(const gguf_writer *w) { return w->written; }

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Alignment from a caller-set general.alignment (uint32), else the default. */
static uint64_t chosen_alignment(const gguf_writer *w) {
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment") != 0) continue;
        uint32_t type, a;
        DT_ASSERT(w->kv[i].val_len == 8);
        memcpy(&type, w->kv[i].val, 4);
        memcpy(&a, w->kv[i].val + 4, 4);
        DT_ASSERT(type == GGUF_VT_UINT32 && a > 0 && (a & (a - 1)) == 0 && a <= GGUF_MAX_ALIGNMENT);
        return a;
    }
    return GW_DEFAULT_ALIGN;
}

static uint64_t header_size(const gguf_writer *w) {
    uint64_t n = 24;
    for (size_t i = 0; i < w->n_kv; i++) n += 8 + strlen(w->kv[i].key) + w->kv[i].val_len;
    for (size_t i = 0; i < w->n_t; i++) n += 8 + strlen(w->t[i].name) + 4 + 8ull * w->t[i].n_dims + 4 + 8;
    return n;
}

uint64_t gguf_write_total_size(const gguf_writer *w) {
    uint64_t a = chosen_alignment(w), n = align_up(header_size(w), a);
    for (size_t i = 0; i < w->n_t; i++) n += align_up(w->t[i].nbytes, a);
    return n;
}

/* ---- output -------------------------------------------------------------------- */

static int out(gguf_writer *w, const void *p, size_t n, ditto_err *err) {
    if (n == 0) return 0;
    if (fwrite(p, 1, n, w->fp) != n) {
        int e = errno;
        return err_set(err, "%s: write failed at byte %llu: %s", w->name, (unsigned long long)w->written,
                       e ? strerror(e) : "short write");
    }
    w->written += n;
    return 0;
}

static int out_zeros(gguf_writer *w, uint64_t n, ditto_err *err) {
    uint8_t z[512];
    memset(z, 0, sizeof z);
    while (n > 0) {
        size_t k = (size_t)DT_MIN(n, (uint64_t)sizeof z);
        if (out(w, z, k, err)) return -1;
        n -= k;
    }
    return 0;
}

static int write_header(gguf_writer *w, ditto_err *err) {
    w->align = chosen_alignment(w);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        off += align_up(w->t[i].nbytes, w->align);
    }
    uint32_t magic = GW_MAGIC, version = GW_VERSION;
    uint64_t nt = w->n_t, nkv = w->n_kv;
    if (out(w, &magic, 4, err) || out(w, &version, 4, err) || out(w, &nt, 8, err) || out(w, &nkv, 8, err))
        return -1;
    for (size_t i = 0; i < w->n_kv; i++) {
        uint64_t kl = strlen(w->kv[i].key);
        if (out(w, &kl, 8, err) || out(w, w->kv[i].key, (size_t)kl, err) ||
            out(w, w->kv[i].val, w->kv[i].val_len, err))
            return -1;
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const gw_tensor *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        if (out(w, &nl, 8, err) || out(w, t->name, (size_t)nl, err) || out(w, &t->n_dims, 4, err) ||
            out(w, t->ne, 8 * (size_t)t->n_dims, err) || out(w, &t->type, 4, err) || out(w, &t->offset, 8, err))
            return -1;
    }
    if (out_zeros(w, align_up(w->written, w->align) - w->written, err)) return -1;
    w->state = GW_DATA;
    w->cur = 0;
    w->cur_done = 0;
    return 0;
}

int gguf_write_begin_stream(gguf_writer *w, FILE *fp, const char *name, ditto_err *err) {
    DT_ASSERT(w->state == GW_DECLARE && w->fp == NULL);
    w->fp = fp;
    w->owns_fp = false;
    w->name = xmalloc(strlen(name) + 1);
    strcpy(w->name, name);
    return write_header(w, err);
}

int gguf_write_begin(gguf_writer *w, const char *path, ditto_err *err) {
    DT_ASSERT(w->state == GW_DECLARE && w->fp == NULL);
    FILE *fp = fopen(path, "wb");
    if (!fp) return err_set(err, "%s: cannot create: %s", path, strerror(errno));
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    int rc = gguf_write_begin_stream(w, fp, path, err);
    w->owns_fp = true;
    return rc;
}

int gguf_write_data(gguf_writer *w, const void *data, size_t n, ditto_err *err) {
    DT_ASSERT(w->state == GW_DATA && w->cur < w->n_t);
    gw_tensor *t = &w->t[w->cur];
    DT_ASSERT(n <= t->nbytes - w->cur_done);
    if (out(w, data, n, err)) return -1;
    w->cur_done += n;
    if (w->cur_done == t->nbytes) {
        if (out_zeros(w, align_up(t->nbytes, w->align) - t->nbytes, err)) return -1;
        w->cur++;
        w->cur_done = 0;
    }
    return 0;
}

int gguf_write_finish(gguf_writer *w, ditto_err *err) {
    DT_ASSERT(w->state == GW_DATA);
    if (w->cur < w->n_t)
        return err_set(err, "%s: tensor '%s' incomplete: %llu of %llu bytes written", w->name, w->t[w->cur].name,
                       (unsigned long long)w->cur_done, (unsigned long long)w->t[w->cur].nbytes);
    w->state = GW_DONE;
    if (fflush(w->fp) != 0 || ferror(w->fp)) {
        int e = errno;
        return err_set(err, "%s: write failed: %s", w->name, e ? strerror(e) : "stream error");
    }
    if (w->owns_fp) {
        FILE *fp = w->fp;
        w->fp = NULL;
        if (fclose(fp) != 0) return err_set(err, "%s: close failed: %s", w->name, strerror(errno));
    }
    return 0;
}
