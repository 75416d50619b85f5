/* test_gguf.c — GGUF writer round trip, and every class of corrupt file is
 * rejected by gguf_open with a message naming the field (never a crash: every
 * parse runs on an exact-size heap copy so ASan sees any over-read). */
#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_write.h"
#include "quant.h"
#include "test.h"

/* ---- helpers ----------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Runs gguf_open_buffer over an exact-size copy. Returns rc; *msg gets the error. */
static int open_copy(const uint8_t *buf, size_t len, const char *name, char *msg, size_t msg_sz) {
    uint8_t *copy = xmalloc(len);
    if (len) memcpy(copy, buf, len);
    gguf_file *f = (gguf_file *)1;
    ditto_err err = {{0}};
    int rc = gguf_open_buffer(&f, copy, len, name, &err);
    if (rc == 0) {
        CHECK(f != NULL, "%s: rc 0 but no file", name);
        gguf_close(f);
    } else {
        CHECK(f == NULL, "%s: rc -1 but *out not NULL", name);
    }
    snprintf(msg, msg_sz, "%s", err.msg);
    free(copy);
    return rc;
}

/* The (possibly NULL) words must all appear in the rejection message, and the
 * message must name the file. */
static void expect_fail(const uint8_t *buf, size_t len, const char *name, const char *w1, const char *w2) {
    char msg[512];
    int rc = open_copy(buf, len, name, msg, sizeof msg);
    CHECK(rc == -1, "%s: expected rejection, got rc %d", name, rc);
    if (rc != -1) return;
    CHECK(strstr(msg, name) != NULL, "%s: message does not name the file: %s", name, msg);
    if (w1) CHECK(strstr(msg, w1) != NULL, "%s: message lacks '%s': %s", name, w1, msg);
    if (w2) CHECK(strstr(msg, w2) != NULL, "%s: message lacks '%s': %s", name, w2, msg);
}

static void expect_ok(const uint8_t *buf, size_t len, const char *name) {
    char msg[512];
    int rc = open_copy(buf, len, name, msg, sizeof msg);
    CHECK(rc == 0, "%s: expected to open, got: %s", name, msg);
}

/* Offset of the first occurrence of a GGUF string (u64 length + bytes). */
static size_t find_gstr(const uint8_t *buf, size_t len, const char *s) {
    size_t n = strlen(s);
    uint8_t pat[300];
    put_u64(pat, n);
    memcpy(pat + 8, s, n);
    for (size_t i = 0; i + 8 + n <= len; i++)
        if (memcmp(buf + i, pat, 8 + n) == 0) return i;
    fprintf(stderr, "test bug: '%s' not found\n", s);
    abort();
}
/* Offset of the value-type field of metadata key. */
static size_t kv_at(const uint8_t *buf, size_t len, const char *key) {
    return find_gstr(buf, len, key) + 8 + strlen(key);
}
/* Offset of the n_dims field of a tensor info. */
static size_t ti_at(const uint8_t *buf, size_t len, const char *name) {
    return find_gstr(buf, len, name) + 8 + strlen(name);
}

/* A mutable copy of the valid file. */
static uint8_t *dup_buf(const uint8_t *b, size_t n) {
    uint8_t *p = xmalloc(n);
    memcpy(p, b, n);
    return p;
}

/* ---- the valid reference file ---------------------------------------------------- */

typedef struct tdef {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
} tdef;

static const tdef valid_tensors[] = {
    {"t.a", 2, {4, 3, 1, 1}, QT_F32},
    {"t.b", 2, {64, 2, 1, 1}, QT_Q8_0},
    {"t.c", 3, {256, 1, 2, 1}, QT_Q4_K},
    {"t.d", 1, {32, 1, 1, 1}, QT_Q4_0},
    {"t.e", 4, {2, 2, 2, 2}, QT_F32},
};
#define N_VALID_T (sizeof valid_tensors / sizeof valid_tensors[0])

static uint8_t pattern_byte(size_t t, uint64_t i) { return (uint8_t)((i * 7 + t * 31 + 1) % 251); }

static gguf_writer *valid_writer(void) {
    gguf_writer *w = gguf_write_new();
    static const char *const strs[] = {"a", "bc", "", "def"};
    static const int32_t ai[] = {1, -2, 3};
    static const uint32_t au[] = {4, 5};
    static const float af[] = {0.5f, -0.25f};
    gguf_write_set_str(w, "general.architecture", "test");
    gguf_write_set_u32(w, "general.alignment", 32);
    gguf_write_set_u32(w, "test.u32", 7);
    gguf_write_set_i32(w, "test.i32", -5);
    gguf_write_set_f32(w, "test.f32", 1.5f);
    gguf_write_set_bool(w, "test.bool", true);
    gguf_write_set_str(w, "test.str", "hello");
    gguf_write_set_arr_str(w, "test.arr_str", strs, 4);
    gguf_write_set_arr_i32(w, "test.arr_i32", ai, 3);
    gguf_write_set_arr_u32(w, "test.arr_u32", au, 2);
    gguf_write_set_arr_f32(w, "test.arr_f32", af, 2);
    gguf_write_set_u32(w, "dup.k1", 1);
    gguf_write_set_u32(w, "dup.k2", 2);
    gguf_write_set_u32(w, "test.replaced", 1);
    gguf_write_set_u32(w, "test.replaced", 99); /* replaces in place */
    for (size_t i = 0; i < N_VALID_T; i++)
        gguf_write_add_tensor(w, valid_tensors[i].name, valid_tensors[i].n_dims, valid_tensors[i].ne,
                              valid_tensors[i].type);
    return w;
}

/* Streams the pattern data, tensor i in chunks of (i+1)*5 bytes. */
static int write_pattern(gguf_writer *w, ditto_err *err) {
    for (uint64_t t = 0; t < gguf_write_n_tensors(w); t++) {
        uint64_t n = gguf_write_tensor_nbytes(w, t), chunk = (t + 1) * 5;
        uint8_t *d = xmalloc((size_t)n);
        for (uint64_t i = 0; i < n; i++) d[i] = pattern_byte((size_t)t, i);
        for (uint64_t o = 0; o < n; o += chunk) {
            if (gguf_write_data(w, d + o, (size_t)DT_MIN(chunk, n - o), err)) {
                free(d);
                return -1;
            }
        }
        free(d);
    }
    return 0;
}

/* Serialises a writer into a heap buffer via open_memstream. */
static uint8_t *write_to_mem(gguf_writer *w, size_t *len, bool pattern) {
    char *buf = NULL;
    size_t n = 0;
    FILE *fp = open_memstream(&buf, &n);
    DT_ASSERT(fp != NULL);
    ditto_err err = {{0}};
    int rc = gguf_write_begin_stream(w, fp, "mem", &err);
    if (rc == 0 && pattern) rc = write_pattern(w, &err);
    if (rc == 0) rc = gguf_write_finish(w, &err);
    CHECK(rc == 0, "write_to_mem: %s", err.msg);
    fclose(fp);
    *len = n;
    return (uint8_t *)buf;
}

static uint8_t *build_valid(size_t *len) {
    gguf_writer *w = valid_writer();
    uint64_t expect = gguf_write_total_size(w);
    uint8_t *b = write_to_mem(w, len, true);
    CHECK(*len == expect, "total_size %llu != written %zu", (unsigned long long)expect, *len);
    gguf_write_free(w);
    return b;
}

static bool str_eq(const char *s, uint64_t len, const char *want) {
    return len == strlen(want) && memcmp(s, want, (size_t)len) == 0;
}

static void check_valid_contents(const gguf_file *f) {
    ditto_err err;
    uint32_t u;
    float fl;
    char *s = NULL;
    CHECK(f->version == 3 && f->alignment == 32 && f->data_start % 32 == 0, "header fields");
    CHECK(f->n_kv == 14, "n_kv %llu", (unsigned long long)f->n_kv);
    CHECK(gguf_get_str(f, "general.architecture", &s, &err) == 0 && strcmp(s, "test") == 0, "arch");
    if (s) free(s);
    CHECK(gguf_get_u32(f, "test.u32", &u, &err) == 0 && u == 7, "u32");
    CHECK(gguf_get_u32(f, "test.replaced", &u, &err) == 0 && u == 99, "replaced key");
    CHECK(f->n_kv > 0 && strcmp(f->kv[f->n_kv - 1].key, "test.replaced") == 0, "replace keeps order");
    const gguf_kv *kv = gguf_find_kv(f, "test.i32");
    CHECK(kv && kv->type == GGUF_VT_INT32 && kv->v.i == -5, "i32");
    CHECK(gguf_get_u32(f, "test.i32", &u, &err) == -1 && strstr(err.msg, "test.i32"), "negative as u32");
    CHECK(gguf_get_f32(f, "test.f32", &fl, &err) == 0 && fl == 1.5f, "f32");
    kv = gguf_find_kv(f, "test.bool");
    CHECK(kv && kv->type == GGUF_VT_BOOL && kv->v.u == 1, "bool");
    kv = gguf_find_kv(f, "test.str");
    CHECK(kv && kv->type == GGUF_VT_STRING && str_eq(kv->str, kv->str_len, "hello"), "str");
    kv = gguf_find_kv(f, "test.arr_str");
    CHECK(kv && kv->type == GGUF_VT_ARRAY && kv->arr_type == GGUF_VT_STRING && kv->arr_n == 4, "arr_str");
    if (kv && kv->arr_n == 4) {
        static const char *const want[] = {"a", "bc", "", "def"};
        for (uint64_t i = 0; i < 4; i++) {
            uint64_t len;
            const char *e = gguf_arr_str(f, kv, i, &len);
            CHECK(str_eq(e, len, want[i]), "arr_str[%llu]", (unsigned long long)i);
        }
    }
    kv = gguf_find_kv(f, "test.arr_i32");
    int32_t ai[3];
    CHECK(kv && kv->arr_type == GGUF_VT_INT32 && kv->arr_n == 3, "arr_i32");
    if (kv && kv->arr_n == 3) {
        memcpy(ai, kv->arr_data, 12);
        CHECK(ai[0] == 1 && ai[1] == -2 && ai[2] == 3, "arr_i32 values");
    }
    kv = gguf_find_kv(f, "test.arr_u32");
    CHECK(kv && kv->arr_type == GGUF_VT_UINT32 && kv->arr_n == 2, "arr_u32");
    kv = gguf_find_kv(f, "test.arr_f32");
    float af[2] = {0, 0};
    if (kv && kv->arr_n == 2) memcpy(af, kv->arr_data, 8);
    CHECK(kv && kv->arr_type == GGUF_VT_FLOAT32 && af[0] == 0.5f && af[1] == -0.25f, "arr_f32");
    CHECK(f->n_tensors == N_VALID_T, "n_tensors");
    for (size_t i = 0; i < N_VALID_T && i < f->n_tensors; i++) {
        const tdef *d = &valid_tensors[i];
        const gguf_tensor *t = gguf_find_tensor(f, d->name);
        CHECK(t != NULL, "tensor %s missing", d->name);
        if (!t) continue;
        CHECK(t->n_dims == d->n_dims && t->type == d->type && t->offset % 32 == 0, "tensor %s info", d->name);
        for (int k = 0; k < 4; k++) CHECK(t->ne[k] == d->ne[k], "tensor %s ne[%d]", d->name, k);
        const uint8_t *p = t->data;
        bool ok = true;
        for (uint64_t j = 0; j < t->nbytes; j++) ok = ok && p[j] == pattern_byte(i, j);
        CHECK(ok, "tensor %s data", d->name);
    }
}

static void test_roundtrip(void) {
    size_t len;
    uint8_t *b = build_valid(&len);
    gguf_file *f;
    ditto_err err = {{0}};
    CHECK(gguf_open_buffer(&f, b, len, "valid", &err) == 0, "valid file: %s", err.msg);
    if (f) {
        check_valid_contents(f);
        /* the padding between header, tensors and at the end is zero */
        bool zero = true;
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const gguf_tensor *t = &f->tensors[i];
            uint64_t end = f->data_start + t->offset + t->nbytes;
            uint64_t next = i + 1 < f->n_tensors ? f->data_start + f->tensors[i + 1].offset : len;
            for (uint64_t j = end; j < next; j++) zero = zero && b[j] == 0;
        }
        CHECK(zero, "padding not zero");
        CHECK(len % 32 == 0, "file not padded to the alignment");

        /* copy every key into a second writer: byte-identical header */
        gguf_writer *w2 = gguf_write_new();
        CHECK(gguf_write_copy_kv(w2, f, NULL) == f->n_kv, "copy all keys");
        CHECK(gguf_write_copy_kv(w2, f, "test.arr") == 4, "copy by prefix");
        for (size_t i = 0; i < N_VALID_T; i++)
            gguf_write_add_tensor(w2, valid_tensors[i].name, valid_tensors[i].n_dims, valid_tensors[i].ne,
                                  valid_tensors[i].type);
        size_t len2;
        gguf_close(f);
        uint8_t *b2 = write_to_mem(w2, &len2, true);
        CHECK(len2 == len && memcmp(b, b2, len) == 0, "copied file differs");
        free(b2);
        gguf_write_free(w2);
    }
    free(b);

    /* via a temp file and gguf_open */
    char path[] = "/tmp/ditto_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        close(fd);
        gguf_writer *w = valid_writer();
        int rc = gguf_write_begin(w, path, &err);
        if (rc == 0) rc = write_pattern(w, &err);
        if (rc == 0) rc = gguf_write_finish(w, &err);
        CHECK(rc == 0, "write file: %s", err.msg);
        gguf_write_free(w);
        CHECK(gguf_open(&f, path, &err) == 0, "open written file: %s", err.msg);
        if (f) {
            check_valid_contents(f);
            gguf_close(f);
        }
        unlink(path);
    }

    /* a caller-set general.alignment is honoured */
    {
        gguf_writer *wa = valid_writer();
        gguf_write_set_u32(wa, "general.alignment", 256);
        size_t la;
        uint8_t *ba = write_to_mem(wa, &la, true);
        CHECK(la == gguf_write_total_size(wa) && la % 256 == 0, "aligned size %zu", la);
        gguf_write_free(wa);
        CHECK(gguf_open_buffer(&f, ba, la, "align256", &err) == 0, "align256: %s", err.msg);
        if (f) {
            bool ok = f->alignment == 256 && f->data_start % 256 == 0;
            for (uint64_t i = 0; i < f->n_tensors; i++) ok = ok && f->tensors[i].offset % 256 == 0;
            CHECK(ok, "alignment 256 not applied");
            gguf_close(f);
        }
        free(ba);
    }

    /* an empty file (no keys, no tensors) is valid */
    gguf_writer *w = gguf_write_new();
    size_t elen;
    uint8_t *e = write_to_mem(w, &elen, false);
    CHECK(elen == 32, "empty file size %zu", elen);
    expect_ok(e, elen, "empty");
    free(e);
    gguf_write_free(w);

    /* I/O errors come back as ditto_err naming the file */
    w = valid_writer();
    CHECK(gguf_write_begin(w, "/nonexistent-dir/x.gguf", &err) == -1 && strstr(err.msg, "/nonexistent-dir/x.gguf"),
          "create in missing dir: %s", err.msg);
    gguf_write_free(w);
    if (access("/dev/full", W_OK) == 0) {
        w = valid_writer();
        int rc = gguf_write_begin(w, "/dev/full", &err);
        if (rc == 0) rc = write_pattern(w, &err);
        if (rc == 0) rc = gguf_write_finish(w, &err);
        CHECK(rc == -1 && strstr(err.msg, "/dev/full") && strstr(err.msg, "fail"), "/dev/full: %s", err.msg);
        gguf_write_free(w);
    }
    /* finishing early is an error naming the tensor */
    w = valid_writer();
    char *mb = NULL;
    size_t ms = 0;
    FILE *fp = open_memstream(&mb, &ms);
    CHECK(gguf_write_begin_stream(w, fp, "early", &err) == 0, "begin");
    CHECK(gguf_write_finish(w, &err) == -1 && strstr(err.msg, "t.a"), "early finish: %s", err.msg);
    gguf_write_free(w);
    fclose(fp);
    free(mb);
}

/* ---- header corruption by patching the valid file ----------------------------------- */

static void patch_u32_case(const uint8_t *b, size_t len, size_t off, uint32_t v, const char *name, const char *w1,
                           const char *w2) {
    uint8_t *c = dup_buf(b, len);
    put_u32(c + off, v);
    expect_fail(c, len, name, w1, w2);
    free(c);
}
static void patch_u64_case(const uint8_t *b, size_t len, size_t off, uint64_t v, const char *name, const char *w1,
                           const char *w2) {
    uint8_t *c = dup_buf(b, len);
    put_u64(c + off, v);
    expect_fail(c, len, name, w1, w2);
    free(c);
}

static void test_header_cases(void) {
    size_t len;
    uint8_t *b = build_valid(&len);
    uint8_t *c;

    patch_u32_case(b, len, 0, 0x46554746, "magic.gguf", "magic", NULL);
    patch_u32_case(b, len, 4, 1, "ver1.gguf", "version", NULL);
    patch_u32_case(b, len, 4, 4, "ver4.gguf", "version", NULL);
    patch_u32_case(b, len, 4, 0xFFFFFFFFu, "verff.gguf", "version", NULL);

    patch_u64_case(b, len, 8, UINT64_MAX, "ntmax.gguf", "tensor count", NULL);
    patch_u64_case(b, len, 8, 1ull << 40, "nt40.gguf", "tensor count", NULL);
    patch_u64_case(b, len, 8, len / 33 + 1, "ntjust.gguf", "tensor count", NULL);
    patch_u64_case(b, len, 16, UINT64_MAX, "nkvmax.gguf", "metadata count", NULL);
    patch_u64_case(b, len, 16, 1ull << 40, "nkv40.gguf", "metadata count", NULL);
    patch_u64_case(b, len, 16, len / 14 + 1, "nkvjust.gguf", "metadata count", NULL);
    /* plausible but wrong counts still fail cleanly */
    patch_u64_case(b, len, 16, 15, "nkv15.gguf", NULL, NULL);
    patch_u64_case(b, len, 8, 6, "nt6.gguf", NULL, NULL);

    /* key strings */
    patch_u64_case(b, len, 24, len, "klen-eof.gguf", "key of metadata entry 0", "exceeds");
    patch_u64_case(b, len, 24, UINT64_MAX, "klen-max.gguf", "key of metadata entry 0", "exceeds");
    patch_u64_case(b, len, 24, 0, "klen0.gguf", "key of metadata entry 0", "length 0");
    c = dup_buf(b, len);
    c[24 + 8 + 3] = 0; /* NUL inside "general.architecture" */
    expect_fail(c, len, "knul.gguf", "key of metadata entry 0", "NUL");
    free(c);

    /* string value past EOF */
    size_t s = kv_at(b, len, "test.str");
    patch_u64_case(b, len, s + 4, len, "strlen.gguf", "test.str", "exceeds");
    patch_u64_case(b, len, s + 4, UINT64_MAX, "strlenmax.gguf", "test.str", NULL);

    /* value types */
    s = kv_at(b, len, "test.u32");
    patch_u32_case(b, len, s, GGUF_VT_COUNT, "vt13.gguf", "test.u32", "unknown value type");
    patch_u32_case(b, len, s, 0xFFFFFFFFu, "vtff.gguf", "test.u32", "unknown value type");

    /* arrays */
    s = kv_at(b, len, "test.arr_i32");
    patch_u32_case(b, len, s + 4, GGUF_VT_ARRAY, "arrarr.gguf", "test.arr_i32", "array of arrays");
    patch_u32_case(b, len, s + 4, GGUF_VT_COUNT, "arrunk.gguf", "test.arr_i32", "unknown element type");
    patch_u64_case(b, len, s + 8, UINT64_MAX, "arrnmax.gguf", "test.arr_i32", "count");
    patch_u64_case(b, len, s + 8, len, "arrneof.gguf", "test.arr_i32", "count");
    patch_u64_case(b, len, s + 8, 1ull << 62, "arrn62.gguf", "test.arr_i32", "count");
    s = kv_at(b, len, "test.arr_str");
    patch_u64_case(b, len, s + 8, UINT64_MAX, "sarrmax.gguf", "test.arr_str", "count");
    patch_u64_case(b, len, s + 8, 1ull << 61, "sarr61.gguf", "test.arr_str", "count");
    patch_u64_case(b, len, s + 8, len / 8, "sarreof.gguf", "test.arr_str", NULL);
    patch_u64_case(b, len, s + 8 + 8, UINT64_MAX - 3, "sarrelen.gguf", "test.arr_str", "exceeds");
    for (uint64_t n = 5; n < 40; n += 3) { /* a few too many: reads into later fields, then fails */
        c = dup_buf(b, len);
        put_u64(c + s + 8, n);
        char m[512];
        CHECK(open_copy(c, len, "sarr+.gguf", m, sizeof m) == -1, "string array count %llu accepted",
              (unsigned long long)n);
        free(c);
    }

    /* duplicates */
    c = dup_buf(b, len);
    c[find_gstr(c, len, "dup.k2") + 8 + 5] = '1';
    expect_fail(c, len, "dupkey.gguf", "duplicate metadata key", "dup.k1");
    free(c);
    c = dup_buf(b, len);
    c[find_gstr(c, len, "t.b") + 8 + 2] = 'a';
    expect_fail(c, len, "duptensor.gguf", "duplicate tensor name", "t.a");
    free(c);

    /* general.alignment */
    s = kv_at(b, len, "general.alignment");
    patch_u32_case(b, len, s + 4, 0, "al0.gguf", "alignment", "= 0");
    patch_u32_case(b, len, s + 4, 3, "al3.gguf", "alignment", "= 3");
    patch_u32_case(b, len, s + 4, 48, "al48.gguf", "alignment", "48");
    patch_u32_case(b, len, s + 4, 1u << 17, "albig.gguf", "alignment", "131072");
    patch_u32_case(b, len, s + 4, 0x80000000u, "al2g.gguf", "alignment", NULL);
    patch_u32_case(b, len, s + 4, 0xFFFFFFFFu, "alff.gguf", "alignment", NULL);
    patch_u32_case(b, len, s, GGUF_VT_INT32, "alint.gguf", "alignment", "int32");
    patch_u32_case(b, len, s, GGUF_VT_FLOAT32, "alflt.gguf", "alignment", "float32");
    for (uint32_t a = 1; a <= 1024; a *= 2) { /* valid powers of two: open or fail cleanly */
        c = dup_buf(b, len);
        put_u32(c + s + 4, a);
        char m[512];
        int rc = open_copy(c, len, "alpow2.gguf", m, sizeof m);
        if (a < 4) CHECK(rc != 0 && strstr(m, "general.alignment"), "alignment %u refused by name: %s", a, m);
        else CHECK(rc == 0 || a > 32, "alignment %u: %s", a, m);
        free(c);
    }

    /* tensor infos */
    s = ti_at(b, len, "t.a");
    patch_u32_case(b, len, s, 0, "nd0.gguf", "t.a", "n_dims = 0");
    patch_u32_case(b, len, s, 5, "nd5.gguf", "t.a", "n_dims = 5");
    patch_u64_case(b, len, s - 8 - 3, 0, "tname0.gguf", "name of tensor 0", "length 0");
    patch_u64_case(b, len, s - 8 - 3, 300, "tname300.gguf", "name of tensor 0", "length 300");
    patch_u64_case(b, len, s - 8 - 3, len, "tnameeof.gguf", "name of tensor 0", "exceeds");
    patch_u64_case(b, len, s + 4 + 8, 0, "dim0.gguf", "t.a", "dim 1 = 0");
    patch_u64_case(b, len, s + 4, (uint64_t)INT64_MAX + 1, "dimbig.gguf", "t.a", "dim 0");
    size_t tb = ti_at(b, len, "t.b");
    patch_u32_case(b, len, tb + 4 + 16, 99, "type99.gguf", "t.b", "unknown type id 99");
    patch_u32_case(b, len, tb + 4 + 16, 5, "type5.gguf", "t.b", "unknown type id 5");
    patch_u32_case(b, len, tb + 4 + 16, 37, "type37.gguf", "t.b", "unknown type id 37");
    patch_u32_case(b, len, tb + 4 + 16, QT_COUNT, "type40.gguf", "t.b", "unknown type");
    patch_u32_case(b, len, tb + 4 + 16, QT_Q4_K, "typerow.gguf", "t.b", "block size");
    patch_u64_case(b, len, tb + 4 + 16 + 4, 8, "misal.gguf", "t.b", "alignment");
    patch_u64_case(b, len, tb + 4 + 16 + 4, 0, "overlap.gguf", "overlaps", NULL);
    patch_u64_case(b, len, tb + 4 + 16 + 4, 1ull << 40, "pasteof.gguf", "t.b", "outside");
    patch_u64_case(b, len, tb + 4 + 16 + 4, UINT64_MAX - 31, "offmax.gguf", "t.b", "outside");
    patch_u64_case(b, len, tb + 4, 1ull << 20, "bigdim.gguf", "t.b", "outside");

    /* truncation at every length: fails below the end of the last tensor's data */
    gguf_file *f;
    ditto_err err;
    CHECK(gguf_open_buffer(&f, b, len, "x", &err) == 0, "valid");
    uint64_t need = 0;
    for (uint64_t i = 0; f && i < f->n_tensors; i++)
        need = DT_MAX(need, f->data_start + f->tensors[i].offset + f->tensors[i].nbytes);
    gguf_close(f);
    int bad = 0;
    for (size_t n = 0; n <= len; n++) {
        char m[512];
        int rc = open_copy(b, n, "trunc.gguf", m, sizeof m);
        if ((n < need) != (rc == -1)) {
            if (bad++ < 5) fprintf(stderr, "FAIL truncation at %zu: rc %d (%s)\n", n, rc, m);
        } else if (rc == -1 && !strstr(m, "trunc.gguf")) {
            if (bad++ < 5) fprintf(stderr, "FAIL truncation at %zu: message lacks the file: %s\n", n, m);
        }
    }
    CHECK(bad == 0, "%d truncation lengths misbehaved (file %zu bytes)", bad, len);
    free(b);
}

/* ---- structural cases from a raw builder ---------------------------------------------- */

typedef struct rawt {
    size_t name_len; /* 0 with name NULL: empty name */
    const char *name;
    uint32_t n_dims;
    uint64_t ne[5];
    uint32_t type;
    uint64_t offset;
} rawt;

/* A file with no metadata, the given tensor infos and data_bytes of data. */
static uint8_t *raw_file(const rawt *ts, int n, uint64_t data_bytes, size_t *len) {
    size_t hdr = 24;
    for (int i = 0; i < n; i++) hdr += 8 + ts[i].name_len + 4 + 8 * (size_t)ts[i].n_dims + 12;
    size_t ds = (hdr + 31) / 32 * 32;
    *len = ds + (size_t)data_bytes;
    uint8_t *b = xcalloc(*len, 1), *p = b;
    put_u32(p, 0x46554747u);
    put_u32(p + 4, 3);
    put_u64(p + 8, (uint64_t)n);
    put_u64(p + 16, 0);
    p += 24;
    for (int i = 0; i < n; i++) {
        put_u64(p, ts[i].name_len);
        memcpy(p + 8, ts[i].name, ts[i].name_len);
        p += 8 + ts[i].name_len;
        put_u32(p, ts[i].n_dims);
        p += 4;
        for (uint32_t d = 0; d < ts[i].n_dims; d++, p += 8) put_u64(p, ts[i].ne[d]);
        put_u32(p, ts[i].type);
        put_u64(p + 4, ts[i].offset);
        p += 12;
    }
    return b;
}

static void raw_case(const rawt *ts, int n, uint64_t data_bytes, const char *name, const char *w1, const char *w2) {
    size_t len;
    uint8_t *b = raw_file(ts, n, data_bytes, &len);
    if (w1 || w2)
        expect_fail(b, len, name, w1, w2);
    else
        expect_ok(b, len, name);
    free(b);
}

#define T1(nm, nd, type, off, ...) {sizeof(nm) - 1, nm, nd, __VA_ARGS__, type, off}

static void test_tensor_cases(void) {
    char longname[300];
    memset(longname, 'x', sizeof longname);
    rawt t[2];

    t[0] = (rawt)T1("w", 1, QT_F32, 0, {16});
    raw_case(t, 1, 64, "raw-ok.gguf", NULL, NULL);
    raw_case(t, 1, 60, "raw-eof.gguf", "'w'", "outside");

    t[0] = (rawt){255, longname, 1, {1}, QT_F32, 0};
    raw_case(t, 1, 32, "name255.gguf", NULL, NULL);
    t[0].name_len = 256;
    raw_case(t, 1, 32, "name256.gguf", "name of tensor 0", "length 256");
    t[0] = (rawt){0, "", 1, {1}, QT_F32, 0};
    raw_case(t, 1, 32, "name0.gguf", "name of tensor 0", "length 0");

    t[0] = (rawt)T1("w.nd0", 0, QT_F32, 0, {0});
    raw_case(t, 1, 64, "nd0.gguf", "w.nd0", "n_dims");
    t[0] = (rawt)T1("w.nd5", 5, QT_F32, 0, {1, 1, 1, 1, 1});
    raw_case(t, 1, 64, "nd5.gguf", "w.nd5", "n_dims");
    t[0] = (rawt)T1("w.nd4", 4, QT_F32, 0, {1, 2, 1, 2});
    raw_case(t, 1, 32, "nd4.gguf", NULL, NULL);

    t[0] = (rawt)T1("w.zero", 3, QT_F32, 0, {4, 0, 2});
    raw_case(t, 1, 64, "dimzero.gguf", "w.zero", "dim 1 = 0");
    t[0] = (rawt)T1("w.ovf", 2, QT_F32, 0, {1ull << 32, 1ull << 32});
    raw_case(t, 1, 64, "dimovf.gguf", "w.ovf", "overflow");
    t[0] = (rawt)T1("w.ovf3", 4, QT_F32, 0, {1ull << 20, 1ull << 20, 1ull << 20, 1ull << 20});
    raw_case(t, 1, 64, "dimovf4.gguf", "w.ovf3", "overflow");
    t[0] = (rawt)T1("w.max", 1, QT_F32, 0, {UINT64_MAX});
    raw_case(t, 1, 64, "dimmax.gguf", "w.max", "dim 0");
    t[0] = (rawt)T1("w.bytes", 2, QT_F32, 0, {1ull << 31, 1ull << 31}); /* 2^62 elements x 4 bytes */
    raw_case(t, 1, 64, "bytesovf.gguf", "w.bytes", "byte size overflow");
    t[0] = (rawt)T1("w.q8", 1, QT_Q8_0, 0, {1ull << 62}); /* fits: 2^57 blocks x 34 bytes, past EOF */
    raw_case(t, 1, 64, "q8big.gguf", "w.q8", "outside");

    t[0] = (rawt)T1("w.type", 1, 4, 0, {256});
    raw_case(t, 1, 1024, "type4.gguf", "w.type", "unknown type id 4");
    t[0] = (rawt)T1("w.type", 1, 31, 0, {256});
    raw_case(t, 1, 1024, "type31.gguf", "w.type", "unknown type id 31");
    t[0] = (rawt)T1("w.type", 1, 0xFFFFFFFFu, 0, {256});
    raw_case(t, 1, 1024, "typeff.gguf", "w.type", "unknown type id");
    t[0] = (rawt)T1("w.row", 2, QT_Q4_K, 0, {128, 2});
    raw_case(t, 1, 1024, "rowk.gguf", "w.row", "not a multiple of the Q4_K block size 256");
    t[0] = (rawt)T1("w.row", 1, QT_Q8_0, 0, {33});
    raw_case(t, 1, 1024, "row8.gguf", "w.row", "block size 32");

    t[0] = (rawt)T1("w.a", 1, QT_F32, 0, {16});
    t[1] = (rawt)T1("w.b", 1, QT_F32, 48, {16});
    raw_case(t, 2, 128, "misal.gguf", "w.b", "not a multiple of the alignment 32");
    t[1].offset = 32;
    raw_case(t, 2, 128, "overlap.gguf", "w.b", "overlaps");
    t[1].offset = 0;
    raw_case(t, 2, 128, "sameoff.gguf", "overlaps", NULL);
    t[1].offset = 64;
    raw_case(t, 2, 128, "twook.gguf", NULL, NULL);
    raw_case(t, 2, 127, "twoeof.gguf", "w.b", "outside");
    t[0].offset = 64; /* listed out of order, still no overlap */
    t[1].offset = 0;
    raw_case(t, 2, 128, "order.gguf", NULL, NULL);
    t[0].offset = 32;
    t[1].offset = 0;
    t[1].ne[0] = 16;
    raw_case(t, 2, 128, "overlap2.gguf", "w.a", "overlaps");
}

/* ---- fuzz ---------------------------------------------------------------------------------- */

/* Touch everything an opened file points to (ASan checks the bounds). */
static uint64_t walk(const gguf_file *f) {
    uint64_t h = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        h += strlen(kv->key);
        if (kv->type == GGUF_VT_STRING)
            for (uint64_t j = 0; j < kv->str_len; j++) h += (uint8_t)kv->str[j];
        if (kv->type == GGUF_VT_ARRAY && kv->arr_type == GGUF_VT_STRING) {
            for (uint64_t j = 0; j < kv->arr_n; j++) {
                uint64_t n;
                const char *s = gguf_arr_str(f, kv, j, &n);
                for (uint64_t k = 0; k < n; k++) h += (uint8_t)s[k];
            }
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const uint8_t *p = f->tensors[i].data;
        for (uint64_t j = 0; j < f->tensors[i].nbytes; j++) h += p[j];
    }
    return h;
}

static void test_fuzz(void) {
    size_t len;
    uint8_t *b = build_valid(&len);
    gguf_file *f0;
    ditto_err err;
    DT_ASSERT(gguf_open_buffer(&f0, b, len, "x", &err) == 0);
    size_t hdr = (size_t)f0->data_start;
    gguf_close(f0);
    static const uint64_t interesting[] = {0, 1, 2, 7, 8, 31, 32, 33, 255, 256, 0x7FFFFFFF, 0x80000000u,
                                           0xFFFFFFFFu, 1ull << 32, 1ull << 62, INT64_MAX, UINT64_MAX};
    uint64_t seed = 12345;
    int opened = 0, rejected = 0, bad = 0;
    const int iters = 20000;
    for (int it = 0; it < iters; it++) {
        uint8_t *c = dup_buf(b, len);
        size_t n = len;
        int nmut = 1 + (int)(rng_next(&seed) % 4);
        for (int m = 0; m < nmut; m++) {
            uint64_t r = rng_next(&seed);
            size_t span = (r >> 8) % 5 == 0 ? n : DT_MIN(hdr, n); /* mostly the header */
            if (span < 8) break;
            size_t off = (size_t)(rng_next(&seed) % (span - 7));
            switch (r % 5) {
            case 0: c[off] ^= (uint8_t)(1u << (r >> 16) % 8); break;
            case 1: c[off] = (uint8_t)(r >> 24); break;
            case 2: put_u64(c + off, interesting[(r >> 16) % (sizeof interesting / 8)]); break;
            case 3: put_u32(c + off, (uint32_t)interesting[(r >> 16) % (sizeof interesting / 8)]); break;
            case 4: n = (size_t)(rng_next(&seed) % (n + 1)); break;
            }
        }
        uint8_t *e = xmalloc(n ? n : 1); /* exact size */
        memcpy(e, c, n);
        gguf_file *f = (gguf_file *)1;
        ditto_err ferr = {{0}};
        int rc = gguf_open_buffer(&f, e, n, "fuzz", &ferr);
        if (rc == 0 && f) {
            opened++;
            (void)walk(f);
            gguf_close(f);
        } else if (rc == -1 && f == NULL && strncmp(ferr.msg, "fuzz: ", 6) == 0) {
            rejected++;
        } else {
            if (bad++ < 5) fprintf(stderr, "FAIL fuzz iteration %d: rc %d msg '%s'\n", it, rc, ferr.msg);
        }
        free(e);
        free(c);
    }
    printf("fuzz: %d mutations, %d opened, %d rejected\n", iters, opened, rejected);
    CHECK(bad == 0, "%d fuzz cases misbehaved", bad);
    CHECK(opened > 0 && rejected > iters / 4, "fuzz coverage: %d opened %d rejected", opened, rejected);
    free(b);
}

/* ---- files on disk ------------------------------------------------------------------------------ */

static void test_files(void) {
    gguf_file *f = (gguf_file *)1;
    ditto_err err;
    CHECK(gguf_open(&f, "/nonexistent/x.gguf", &err) == -1 && f == NULL && strstr(err.msg, "/nonexistent/x.gguf"),
          "missing file: %s", err.msg);
    CHECK(gguf_open(&f, "/tmp", &err) == -1 && strstr(err.msg, "regular"), "directory: %s", err.msg);
    char path[] = "/tmp/ditto_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) {
        CHECK(write(fd, "GGUF\3\0\0\0", 8) == 8, "write");
        close(fd);
        CHECK(gguf_open(&f, path, &err) == -1 && strstr(err.msg, "too small"), "tiny file: %s", err.msg);
        unlink(path);
    }
}

/* A huge claimed count in a large (sparse) file must be rejected, not abort in
 * an allocation sized by the count. Runs in a child so a crash is a failure. */
static void test_sparse_counts(void) {
    char path[] = "/tmp/ditto_test_sparse_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    uint64_t size = 64ull << 30; /* 64 GiB, sparse */
    uint8_t h[24];
    put_u32(h, 0x46554747u);
    put_u32(h + 4, 3);
    put_u64(h + 8, 0);
    put_u64(h + 16, (size - 24) / 14); /* passes the bytes-left bound */
    bool ok = write(fd, h, 24) == 24 && ftruncate(fd, (off_t)size) == 0;
    close(fd);
    if (!ok) {
        unlink(path);
        printf("sparse-count test skipped (cannot make a sparse file)\n");
        return;
    }
    static const char *const what[] = {"metadata", "tensor", "string array element"};
    for (int which = 0; which < 3; which++) {
        if (which == 1) { /* same with the tensor count */
            fd = open(path, O_WRONLY);
            put_u64(h + 8, (size - 24) / 33);
            put_u64(h + 16, 0);
            CHECK(fd >= 0 && pwrite(fd, h, 24, 0) == 24, "rewrite header");
            if (fd >= 0) close(fd);
        }
        if (which == 2) { /* one string array whose count fits the bytes left (8 per element) */
            uint8_t a[24 + 8 + 1 + 4 + 4 + 8 + 8];
            put_u32(a, 0x46554747u);
            put_u32(a + 4, 3);
            put_u64(a + 8, 0);
            put_u64(a + 16, 1);
            put_u64(a + 24, 1);
            a[32] = 'k';
            put_u32(a + 33, GGUF_VT_ARRAY);
            put_u32(a + 37, GGUF_VT_STRING);
            put_u64(a + 41, (size - 49) / 8);
            put_u64(a + 49, size); /* element 0 runs past EOF: a fixed parser stops at once */
            fd = open(path, O_WRONLY);
            CHECK(fd >= 0 && pwrite(fd, a, sizeof a, 0) == (ssize_t)sizeof a, "rewrite header");
            if (fd >= 0) close(fd);
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(30);
            gguf_file *f;
            ditto_err err;
            int rc = gguf_open(&f, path, &err);
            _exit(rc == -1 ? 0 : 1);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "gguf_open crashed on a huge %s count in a 64 GiB sparse file (child %s %d): an allocation "
              "sized by a count only bounded by the file size; gguf.c should cap the count",
              what[which], WIFSIGNALED(st) ? "killed by signal" : "exit",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
    unlink(path);
}

static void test_shared_models(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models", test_shared_dir());
    DIR *d = opendir(dir);
    if (!d) {
        printf("shared models not found in %s (skipped)\n", dir);
        return;
    }
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".gguf") != 0) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        gguf_file *f;
        ditto_err err;
        int rc = gguf_open(&f, path, &err);
        CHECK(rc == 0, "%s: %s", path, err.msg);
        if (rc) continue;
        n++;
        char *arch = NULL;
        CHECK(gguf_get_str(f, "general.architecture", &arch, &err) == 0 && strcmp(arch, "qwen3moe") == 0,
              "%s arch", path);
        free(arch);
        const gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
        CHECK(tok && tok->arr_type == GGUF_VT_STRING && tok->arr_n == 151936, "%s tokens", path);
        CHECK(gguf_find_tensor(f, "token_embd.weight") != NULL, "%s token_embd", path);

        /* copying the tokenizer keys is fast and exact */
        double t0 = time_now();
        gguf_writer *w = gguf_write_new();
        uint64_t nc = gguf_write_copy_kv(w, f, "tokenizer.");
        size_t len;
        uint8_t *b = write_to_mem(w, &len, false);
        double dt = time_now() - t0;
        gguf_write_free(w);
        gguf_file *g;
        CHECK(nc >= 5 && gguf_open_buffer(&g, b, len, "copy", &err) == 0, "copied tokenizer: %s", err.msg);
        if (g) {
            CHECK(g->n_kv == nc, "copied key count");
            for (uint64_t i = 0; i < g->n_kv; i++) {
                const gguf_kv *a = &g->kv[i], *o = gguf_find_kv(f, a->key);
                CHECK(o && o->type == a->type && o->arr_n == a->arr_n, "copied %s", a->key);
                if (!o || a->type != GGUF_VT_ARRAY || a->arr_type != GGUF_VT_STRING) continue;
                bool same = true;
                for (uint64_t j = 0; j < a->arr_n && same; j++) {
                    uint64_t la, lo;
                    const char *sa = gguf_arr_str(g, a, j, &la), *so = gguf_arr_str(f, o, j, &lo);
                    same = la == lo && memcmp(sa, so, (size_t)la) == 0;
                }
                CHECK(same, "copied string array %s differs", a->key);
            }
            gguf_close(g);
        }
        if (n == 1) printf("copied %llu tokenizer keys (%zu bytes) in %.1f ms\n", (unsigned long long)nc, len, dt * 1e3);
        CHECK(dt < 2.0, "tokenizer copy took %.2f s", dt);
        free(b);
        gguf_close(f);
    }
    closedir(d);
    CHECK(n >= 1, "no shared models opened in %s", dir);
}

int main(void) {
    double t0 = time_now();
    test_roundtrip();
    test_header_cases();
    test_tensor_cases();
    test_fuzz();
    test_files();
    test_sparse_counts();
    test_shared_models();
    printf("test_gguf: %.1f s\n", time_now() - t0);
    return test_summary();
}
