/* test_tokenizer.c — BPE against HF / llama.cpp reference ids, round trips, fuzz,
 * streaming detokenizer, chat rendering, load errors.
 * Env: DITTO_SHARED (test data dir), DITTO_QUICK=1 (corpus limited to 3000 documents). */
#include <pthread.h>
#include <unistd.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>
#include <utf8proc.h>

#include "chat.h"
#include "gguf.h"
#include "test.h"
#include "tokenizer.h"

/* ---- small helpers ----------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void buf_add(buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        DT_ASSERT(b->p);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

typedef struct ivec {
    int32_t *p;
    size_t n, cap;
} ivec;

static void ivec_add(ivec *v, int32_t x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 64;
        v->p = realloc(v->p, v->cap * sizeof *v->p);
        DT_ASSERT(v->p);
    }
    v->p[v->n++] = x;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    buf b = {0};
    char tmp[65536];
    size_t r;
    while ((r = fread(tmp, 1, sizeof tmp, f)) > 0) buf_add(&b, tmp, r);
    fclose(f);
    if (!b.p) buf_add(&b, "", 0);
    *len = b.n;
    return b.p;
}

static size_t utf8_enc(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000)
        return o[0] = (char)(0xe0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)),
               o[2] = (char)(0x80 | (cp & 0x3f)), 3;
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Whole valid UTF-8 (checked with utf8proc, independent of the tokenizer's decoder). */
static bool utf8_ok(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (l <= 0) return false;
        i += (size_t)l;
    }
    return true;
}

/* What encode+decode must give back: NFC of each valid stretch, invalid bytes as-is. */
static void expect_roundtrip(const char *s, size_t n, buf *out) {
    out->n = 0;
    buf_add(out, "", 0);
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + j, (utf8proc_ssize_t)(n - j), &cp);
            if (l <= 0) break;
            j += (size_t)l;
        }
        if (j > i) {
            utf8proc_uint8_t *nf = NULL;
            utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(j - i), &nf,
                                               UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            DT_ASSERT(nl >= 0);
            buf_add(out, nf, (size_t)nl);
            free(nf);
        }
        if (j < n) buf_add(out, s + j, 1), j++;
        i = j;
    }
}

/* ---- a JSON reader just big enough for the test files ------------------------- */

static void js_ws(const char **p) {
    while (**p == ' ' || **p == '\n' || **p == '\r' || **p == '\t') (*p)++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool js_hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return false;
        *v = *v << 4 | (uint32_t)h;
    }
    return true;
}

static bool js_string(const char **pp, buf *out) {
    const char *p = *pp;
    out->n = 0;
    buf_add(out, "", 0);
    if (*p != '"') return false;
    p++;
    while (*p && *p != '"') {
        if (*p != '\\') {
            const char *q = p;
            while (*q && *q != '"' && *q != '\\') q++;
            buf_add(out, p, (size_t)(q - p));
            p = q;
            continue;
        }
        p++;
        char c = *p++, ch;
        switch (c) {
        case 'n': ch = '\n'; break;
        case 't': ch = '\t'; break;
        case 'r': ch = '\r'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case '/': ch = '/'; break;
        case '\\': ch = '\\'; break;
        case '"': ch = '"'; break;
        case 'u': {
            uint32_t cp, lo;
            if (!js_hex4(p, &cp)) return false;
            p += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && p[0] == '\\' && p[1] == 'u' && js_hex4(p + 2, &lo) && lo >= 0xdc00 &&
                lo < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                p += 6;
            }
            char tmp[4];
            buf_add(out, tmp, utf8_enc(cp, tmp));
            continue;
        }
        default: return false;
        }
        buf_add(out, &ch, 1);
    }
    if (*p != '"') return false;
    *pp = p + 1;
    return true;
}

static bool js_int_array(const char **pp, ivec *v) {
    const char *p = *pp;
    v->n = 0;
    if (*p != '[') return false;
    p++;
    for (;;) {
        js_ws(&p);
        if (*p == ']') break;
        char *e;
        long x = strtol(p, &e, 10);
        if (e == p) return false;
        ivec_add(v, (int32_t)x);
        p = e;
        js_ws(&p);
        if (*p == ',') p++;
    }
    *pp = p + 1;
    return true;
}

/* One object {"k": string | int array, ...}: fills text / ids / decoded if present. */
static bool js_record(const char **pp, buf *text, ivec *ids, buf *decoded, bool *has_decoded) {
    const char *p = *pp;
    buf key = {0};
    bool ok = false;
    *has_decoded = false;
    js_ws(&p);
    if (*p != '{') goto out;
    p++;
    for (;;) {
        js_ws(&p);
        if (*p == '}') break;
        if (!js_string(&p, &key)) goto out;
        js_ws(&p);
        if (*p++ != ':') goto out;
        js_ws(&p);
        if (!strcmp(key.p, "ids")) {
            if (!js_int_array(&p, ids)) goto out;
        } else {
            buf *dst = !strcmp(key.p, "text") ? text : !strcmp(key.p, "decoded") ? decoded : &key;
            if (dst == decoded) *has_decoded = true;
            buf tmp = {0};
            if (!js_string(&p, dst == &key ? &tmp : dst)) {
                free(tmp.p);
                goto out;
            }
            free(tmp.p);
        }
        js_ws(&p);
        if (*p == ',') p++;
    }
    *pp = p + 1;
    ok = true;
out:
    free(key.p);
    return ok;
}

/* ---- shared state --------------------------------------------------------------- */

static tokenizer *g_tok;

static bool ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void print_ids(const char *what, const int32_t *a, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, n > 64 ? " ...\n" : "\n");
}

/* Encodes and compares with want; decodes and compares with want_text. Returns ok. */
static bool check_case(const char *label, const char *text, size_t len, bool special, const int32_t *want,
                       size_t n_want, const char *want_text, size_t want_len, bool verbose) {
    int32_t *ids;
    size_t n;
    ditto_err err;
    if (tokenizer_encode(g_tok, text, len, special, &ids, &n, &err)) {
        CHECK(0, "%s: encode failed: %s", label, err.msg);
        return false;
    }
    bool ok = ids_eq(ids, n, want, n_want);
    if (!ok && verbose) {
        fprintf(stderr, "ids differ for %s: %.*s\n", label, (int)DT_MIN(len, 200), text);
        print_ids("got ", ids, n);
        print_ids("want", want, n_want);
    }
    if (want_text) {
        char *dec;
        size_t dl;
        bool dok = tokenizer_decode(g_tok, ids, n, &dec, &dl, &err) == 0 && dl == want_len &&
                   memcmp(dec, want_text, dl) == 0;
        if (!dok && verbose) fprintf(stderr, "decode differs for %s\n", label);
        ok = ok && dok;
        free(dec);
    }
    free(ids);
    return ok;
}

/* ---- reference vectors ------------------------------------------------------------ */

static void test_hf_strings(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/hf-strings.json", test_shared_dir());
    size_t len;
    char *js = read_file(path, &len);
    CHECK(js != NULL, "cannot read %s", path);
    if (!js) return;
    const char *p = js;
    js_ws(&p);
    CHECK(*p == '[', "hf-strings.json: not an array");
    p++;
    buf text = {0}, dec = {0};
    ivec ids = {0};
    int n = 0, bad = 0;
    for (;;) {
        js_ws(&p);
        if (*p == ']' || !*p) break;
        bool has_dec;
        if (!js_record(&p, &text, &ids, &dec, &has_dec)) {
            CHECK(0, "hf-strings.json: parse error near byte %zu", (size_t)(p - js));
            break;
        }
        js_ws(&p);
        if (*p == ',') p++;
        char label[32];
        snprintf(label, sizeof label, "hf-strings[%d]", n);
        bool ok = check_case(label, text.p, text.n, true, ids.p, ids.n, dec.p, dec.n, true);
        CHECK(ok, "%s", label);
        /* the decoded text is the NFC of the input */
        buf nf = {0};
        expect_roundtrip(text.p, text.n, &nf);
        CHECK(nf.n == dec.n && memcmp(nf.p, dec.p, nf.n) == 0, "%s: reference decode is not NFC(text)", label);
        free(nf.p);
        bad += !ok;
        n++;
    }
    printf("hf-strings: %d cases, %d mismatches\n", n, bad);
    CHECK(n >= 25, "hf-strings: only %d cases", n);
    free(text.p);
    free(dec.p);
    free(ids.p);
    free(js);
}

static void test_llamacpp(void) {
    char pi[1024], po[1024];
    snprintf(pi, sizeof pi, "%s/tokenizer/llamacpp-qwen2.inp", test_shared_dir());
    snprintf(po, sizeof po, "%s/tokenizer/llamacpp-qwen2.out", test_shared_dir());
    size_t li, lo;
    char *inp = read_file(pi, &li), *out = read_file(po, &lo);
    CHECK(inp && out, "cannot read %s / %s", pi, po);
    if (!inp || !out) {
        free(inp);
        free(out);
        return;
    }
    const char *sep = "__ggml_vocab_test__";
    int n = 0, bad = 0;
    const char *ip = inp, *op = out;
    buf text = {0};
    ivec want = {0};
    while (ip < inp + li) {
        /* an input is the lines up to the next separator line, joined with '\n' */
        text.n = 0;
        buf_add(&text, "", 0);
        bool first = true, found = false;
        while (ip < inp + li) {
            const char *e = memchr(ip, '\n', (size_t)(inp + li - ip));
            if (!e) e = inp + li;
            size_t ll = (size_t)(e - ip);
            const char *line = ip;
            ip = e < inp + li ? e + 1 : e;
            if (ll == strlen(sep) && memcmp(line, sep, ll) == 0) {
                found = true;
                break;
            }
            if (!first) buf_add(&text, "\n", 1);
            buf_add(&text, line, ll);
            first = false;
        }
        if (!found) break;
        const char *oe = memchr(op, '\n', (size_t)(out + lo - op));
        if (!oe) oe = out + lo;
        want.n = 0;
        for (const char *q = op; q < oe;) {
            char *e;
            long x = strtol(q, &e, 10);
            if (e == q) break;
            ivec_add(&want, (int32_t)x);
            q = e;
        }
        op = oe < out + lo ? oe + 1 : oe;
        buf nf = {0};
        expect_roundtrip(text.p, text.n, &nf);
        char label[32];
        snprintf(label, sizeof label, "llamacpp[%d]", n);
        bool ok = check_case(label, text.p, text.n, true, want.p, want.n, nf.p, nf.n, true);
        CHECK(ok, "%s", label);
        bad += !ok;
        free(nf.p);
        n++;
    }
    printf("llamacpp-qwen2: %d cases, %d mismatches\n", n, bad);
    CHECK(n == 46, "llamacpp-qwen2: %d cases (want 46)", n);
    free(text.p);
    free(want.p);
    free(inp);
    free(out);
}

static void test_corpus(void) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s/tokenizer/hf-corpus-docs.jsonl.gz'", test_shared_dir());
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL, "cannot run %s", cmd);
    if (!f) return;
    const char *q = getenv("DITTO_QUICK");
    long limit = q && *q && strcmp(q, "0") ? 3000 : -1;
    char *line = NULL;
    size_t cap = 0;
    buf text = {0}, dec = {0}, nf = {0};
    ivec ids = {0};
    long docs = 0, bad_ids = 0, bad_dec = 0, parse_err = 0;
    size_t tokens = 0, bytes = 0;
    double t_enc = 0;
    while (getline(&line, &cap, f) > 0 && (limit < 0 || docs < limit)) {
        const char *p = line;
        bool has_dec;
        if (!js_record(&p, &text, &ids, &dec, &has_dec)) {
            parse_err++;
            continue;
        }
        int32_t *got;
        size_t n;
        ditto_err err;
        double t0 = time_now();
        int rc = tokenizer_encode(g_tok, text.p, text.n, true, &got, &n, &err);
        t_enc += time_now() - t0;
        if (rc) {
            bad_ids++;
            continue;
        }
        tokens += ids.n;
        bytes += text.n;
        if (!ids_eq(got, n, ids.p, ids.n)) {
            if (bad_ids < 3) {
                fprintf(stderr, "corpus doc %ld ids differ\n", docs);
                size_t k = 0;
                while (k < n && k < ids.n && got[k] == ids.p[k]) k++;
                print_ids("got  (from first difference)", got + k, n - k < 8 ? n - k : 8);
                print_ids("want (from first difference)", ids.p + k, ids.n - k < 8 ? ids.n - k : 8);
            }
            bad_ids++;
        }
        char *d = NULL;
        size_t dl;
        expect_roundtrip(text.p, text.n, &nf);
        if (tokenizer_decode(g_tok, got, n, &d, &dl, &err) || dl != nf.n || memcmp(d, nf.p, dl)) bad_dec++;
        free(d);
        free(got);
        docs++;
    }
    pclose(f);
    printf("corpus: %ld documents, %zu tokens, %zu bytes, encode %.2f s (%.1f MB/s), %ld id mismatches, %ld decode "
           "mismatches\n",
           docs, tokens, bytes, t_enc, t_enc > 0 ? (double)bytes / t_enc / 1e6 : 0.0, bad_ids, bad_dec);
    CHECK(parse_err == 0, "corpus: %ld unparsable lines", parse_err);
    CHECK(docs == (limit < 0 ? 32508 : limit), "corpus: %ld documents", docs);
    CHECK(limit >= 0 || tokens == 2229991, "corpus: %zu reference tokens (want 2229991)", tokens);
    CHECK(bad_ids == 0, "corpus: %ld documents with wrong ids", bad_ids);
    CHECK(bad_dec == 0, "corpus: %ld documents decode wrong", bad_dec);
    free(line);
    free(text.p);
    free(dec.p);
    free(nf.p);
    free(ids.p);
}

/* ---- an independent, naive reference: PCRE2 split + O(n^2) rank scan ----------- */

static const char ref_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static uint32_t byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256u + (uint32_t)n;
}

typedef struct ref_bpe {
    uint64_t *key;
    uint32_t *rank;
    size_t mask;
    int16_t inv[324];
    pcre2_code *re;
} ref_bpe;

static size_t ref_slot(const ref_bpe *r, uint64_t k) {
    size_t i = (size_t)((k * 0x9e3779b97f4a7c15ull) >> 20) & r->mask;
    while (r->key[i] != UINT64_MAX && r->key[i] != k) i = (i + 1) & r->mask;
    return i;
}

static size_t ref_unbyte(const ref_bpe *r, const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        DT_ASSERT(l > 0 && cp < 324 && r->inv[cp] >= 0);
        out[o++] = (char)r->inv[cp];
        i += (size_t)l;
    }
    return o;
}

static void ref_init(ref_bpe *r, const gguf_file *f) {
    for (int i = 0; i < 324; i++) r->inv[i] = -1;
    for (int b = 0; b < 256; b++) r->inv[byte_to_cp(b)] = (int16_t)b;
    const gguf_kv *mk = gguf_find_kv(f, "tokenizer.ggml.merges");
    DT_ASSERT(mk);
    size_t cap = 16;
    while (cap < 2 * mk->arr_n) cap <<= 1;
    r->mask = cap - 1;
    r->key = xmalloc(cap * sizeof *r->key);
    r->rank = xmalloc(cap * sizeof *r->rank);
    for (size_t i = 0; i < cap; i++) r->key[i] = UINT64_MAX;
    char tmp[8192];
    for (uint64_t m = 0; m < mk->arr_n; m++) {
        uint64_t l;
        const char *s = gguf_arr_str(f, mk, m, &l);
        const char *sp = memchr(s, ' ', (size_t)l);
        DT_ASSERT(sp && l < sizeof tmp);
        size_t la = ref_unbyte(r, s, (size_t)(sp - s), tmp);
        size_t lb = ref_unbyte(r, sp + 1, (size_t)(s + l - sp - 1), tmp + la);
        int32_t a = tokenizer_find(g_tok, tmp, la), b = tokenizer_find(g_tok, tmp + la, lb);
        DT_ASSERT(a >= 0 && b >= 0);
        uint64_t k = (uint64_t)a << 32 | (uint32_t)b;
        size_t i = ref_slot(r, k);
        if (r->key[i] == UINT64_MAX) r->key[i] = k, r->rank[i] = (uint32_t)m;
    }
    int ec;
    PCRE2_SIZE eo;
    r->re = pcre2_compile((PCRE2_SPTR)ref_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    DT_ASSERT(r->re);
}

static void ref_free(ref_bpe *r) {
    free(r->key);
    free(r->rank);
    pcre2_code_free(r->re);
}

static void ref_word(const ref_bpe *r, const char *w, size_t n, ivec *out) {
    size_t *st = xmalloc((n + 1) * sizeof *st), ns = n; /* symbol i = w[st[i] .. st[i+1]) */
    for (size_t i = 0; i <= n; i++) st[i] = i;
    for (;;) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < ns; i++) {
            int32_t a = tokenizer_find(g_tok, w + st[i], st[i + 1] - st[i]);
            int32_t b = tokenizer_find(g_tok, w + st[i + 1], st[i + 2] - st[i + 1]);
            uint64_t k = (uint64_t)a << 32 | (uint32_t)b;
            size_t s = ref_slot(r, k);
            if (r->key[s] == k && r->rank[s] < best) best = r->rank[s], bi = i;
        }
        if (best == UINT32_MAX) break;
        memmove(st + bi + 1, st + bi + 2, (ns - bi - 1) * sizeof *st);
        ns--;
    }
    for (size_t i = 0; i < ns; i++) ivec_add(out, tokenizer_find(g_tok, w + st[i], st[i + 1] - st[i]));
    free(st);
}

/* Reference ids of valid UTF-8 text without special-token parsing. */
static void ref_encode(const ref_bpe *r, const char *s, size_t n, ivec *out) {
    out->n = 0;
    buf nf = {0};
    expect_roundtrip(s, n, &nf);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->re, NULL);
    size_t off = 0;
    while (off < nf.n) {
        int rc = pcre2_match(r->re, (PCRE2_SPTR)nf.p, nf.n, off, 0, md, NULL);
        DT_ASSERT(rc > 0);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        DT_ASSERT(ov[0] == off && ov[1] > ov[0]);
        ref_word(r, nf.p + ov[0], ov[1] - ov[0], out);
        off = ov[1];
    }
    pcre2_match_data_free(md);
    free(nf.p);
}

/* ---- random text ------------------------------------------------------------------ */

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static uint32_t rnd_in(uint32_t lo, uint32_t hi) { return lo + rnd() % (hi - lo + 1); }

/* A random code point from ranges that stress the pre-tokenizer and NFC. */
static uint32_t rnd_cp(void) {
    static const uint32_t ranges[][2] = {
        {'a', 'z'},       {'A', 'Z'},       {'0', '9'},       {' ', '/'},       {':', '@'},       {'[', '`'},
        {'{', '~'},       {'\t', '\r'},     {' ', ' '},       {'\'', '\''},     {0x00, 0x1f},     {0x7f, 0xff},
        {0x100, 0x17f},   {0x300, 0x36f},   {0x391, 0x3c9},   {0x400, 0x44f},   {0x5d0, 0x5ea},   {0x620, 0x64a},
        {0x660, 0x669},   {0x900, 0x97f},   {0x1100, 0x1112}, {0x1161, 0x1175}, {0x11a8, 0x11c2}, {0xac00, 0xd7a3},
        {0x2000, 0x206f}, {0x2070, 0x218f}, {0x2460, 0x24ff}, {0x3000, 0x303f}, {0x3040, 0x30ff}, {0x4e00, 0x9fff},
        {0xf900, 0xfaff}, {0xfb00, 0xfb4f}, {0xfe00, 0xfe0f}, {0xff00, 0xffef}, {0xfff0, 0xffff}, {0x1f300, 0x1faff},
        {0x1f1e6, 0x1f1ff}, {0x1d400, 0x1d7ff}, {0x10000, 0x10ffff}, {0x85, 0x85}, {0xa0, 0xa0},  {0x17f, 0x17f},
    };
    size_t k = rnd() % (sizeof ranges / sizeof ranges[0]);
    for (;;) {
        uint32_t cp = rnd_in(ranges[k][0], ranges[k][1]);
        if (cp < 0xd800 || cp > 0xdfff) return cp;
    }
}

static void rnd_text(buf *b, size_t n_cp) {
    static const char *frags[] = {"'s", "'LL", "'Re", " the", "  ", "\r\n", "\n\n", "...", "1234", " x",
                                  "\xc3\xa9",  "e\xcc\x81", "\xe1\x84\x80\xe1\x85\xa1", "ﬁ", "’s"};
    b->n = 0;
    buf_add(b, "", 0);
    for (size_t i = 0; i < n_cp; i++) {
        if (rnd() % 8 == 0) {
            const char *f = frags[rnd() % (sizeof frags / sizeof frags[0])];
            buf_add(b, f, strlen(f));
        } else {
            char t[4];
            buf_add(b, t, utf8_enc(rnd_cp(), t));
        }
    }
}

static bool roundtrip_ok(const char *s, size_t n, bool special, int32_t **ids_out, size_t *n_out) {
    int32_t *ids;
    size_t ni;
    ditto_err err;
    if (tokenizer_encode(g_tok, s, n, special, &ids, &ni, &err)) return false;
    bool ok = true;
    for (size_t i = 0; i < ni; i++) ok = ok && ids[i] >= 0 && ids[i] < tokenizer_n_vocab(g_tok);
    if (!special && ok) {
        char *d;
        size_t dl;
        buf want = {0};
        expect_roundtrip(s, n, &want);
        ok = tokenizer_decode(g_tok, ids, ni, &d, &dl, &err) == 0 && dl == want.n && memcmp(d, want.p, dl) == 0;
        free(d);
        free(want.p);
    }
    if (ids_out) {
        *ids_out = ids;
        *n_out = ni;
    } else {
        free(ids);
    }
    return ok;
}

static void test_fuzz(const ref_bpe *ref) {
    buf b = {0};
    ivec want = {0};
    int bad_bytes = 0, bad_utf8 = 0, bad_ref = 0, n_bytes = 0, n_utf8 = 0;
    /* random bytes, including invalid UTF-8 */
    for (int it = 0; it < 3000; it++) {
        size_t n = rnd() % 200;
        b.n = 0;
        buf_add(&b, "", 0);
        for (size_t i = 0; i < n; i++) {
            uint8_t c = (uint8_t)(it % 3 == 0 ? rnd() : it % 3 == 1 ? rnd_in(0x80, 0xff) : rnd_in(0, 0x7f) | (rnd() % 4 ? 0 : 0x80));
            buf_add(&b, &c, 1);
        }
        bool ok = roundtrip_ok(b.p, b.n, false, NULL, NULL) && roundtrip_ok(b.p, b.n, true, NULL, NULL);
        if (!ok && bad_bytes++ < 3) fprintf(stderr, "random bytes round trip failed (iteration %d)\n", it);
        n_bytes++;
    }
    /* random valid UTF-8: decode(encode(x)) == NFC(x), ids equal the naive reference */
    for (int it = 0; it < 3000; it++) {
        rnd_text(&b, rnd() % 60);
        int32_t *ids;
        size_t ni;
        bool ok = roundtrip_ok(b.p, b.n, false, &ids, &ni);
        if (!ok && bad_utf8++ < 3) fprintf(stderr, "random UTF-8 round trip failed (iteration %d)\n", it);
        ref_encode(ref, b.p, b.n, &want);
        if (!ids_eq(ids, ni, want.p, want.n) && bad_ref++ < 3) {
            fprintf(stderr, "random UTF-8 ids differ from the naive reference (iteration %d)\n", it);
            print_ids("got ", ids, ni);
            print_ids("want", want.p, want.n);
        }
        free(ids);
        n_utf8++;
    }
    /* random ASCII (the tokenizer's hand-written ASCII splitter) against PCRE2 */
    int bad_ascii = 0, n_ascii = 0;
    static const char *afr[] = {"'s", "'S", "'t", "'re", "'RE", "'rE", "'ve", "'m", "'ll", "'LL", "'d", "'x", "''",
                                "  ", "\r\n", "\n\n", " \n ", "\t ", " !", "!!\r\n", " 1", "a1b", "\v", "\f"};
    static const char alpha[] = "abcXYZ019 \t\n\r\v\f\x1c\x1f\x01\x7f'!\"#.,;:-_()[]{}<>|/\\?@`~^&*+=$%";
    for (int it = 0; it < 5000; it++) {
        size_t n = rnd() % 40;
        b.n = 0;
        buf_add(&b, "", 0);
        for (size_t i = 0; i < n; i++) {
            if (rnd() % 4 == 0) {
                const char *f = afr[rnd() % (sizeof afr / sizeof afr[0])];
                buf_add(&b, f, strlen(f));
            } else {
                buf_add(&b, &alpha[rnd() % (sizeof alpha - 1)], 1);
            }
        }
        if (rnd() % 8 == 0) buf_add(&b, "\0", 1);
        int32_t *ids;
        size_t ni;
        bool ok = roundtrip_ok(b.p, b.n, false, &ids, &ni);
        ref_encode(ref, b.p, b.n, &want);
        if ((!ok || !ids_eq(ids, ni, want.p, want.n)) && bad_ascii++ < 3) {
            fprintf(stderr, "random ASCII differs from the PCRE2 reference (iteration %d): '%s'\n", it, b.p);
            print_ids("got ", ids, ni);
            print_ids("want", want.p, want.n);
        }
        free(ids);
        n_ascii++;
    }
    CHECK(bad_ascii == 0, "fuzz: %d random ASCII strings differ from the PCRE2 split", bad_ascii);
    printf("fuzz: %d random byte strings, %d random UTF-8 strings, %d random ASCII strings\n", n_bytes, n_utf8,
           n_ascii);
    CHECK(bad_bytes == 0, "fuzz: %d random byte strings failed", bad_bytes);
    CHECK(bad_utf8 == 0, "fuzz: %d random UTF-8 strings failed the round trip", bad_utf8);
    CHECK(bad_ref == 0, "fuzz: %d random UTF-8 strings differ from the naive BPE", bad_ref);

    /* long inputs: big words, long whitespace runs, many lines (regex engine limits) */
    static const char *units[] = {"a", " ", "\n", "1", "!", "日", "\xcc\x81", "ab "};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        b.n = 0;
        buf_add(&b, "x", 1);
        while (b.n < 300000) buf_add(&b, units[u], strlen(units[u]));
        buf_add(&b, "y", 1);
        double t0 = time_now();
        bool ok = roundtrip_ok(b.p, b.n, false, NULL, NULL);
        CHECK(ok, "long input of '%s' x %zu failed", units[u], b.n);
        CHECK(time_now() - t0 < 20.0, "long input of '%s' took %.1f s", units[u], time_now() - t0);
    }
    free(b.p);
    free(want.p);
}

/* The tokenizer skips NFC for text made only of code points it considers inert. Put
 * every code point after starters that do compose with something (Latin, Greek, Indic
 * vowel signs, Hangul L and LV, kana): whatever the tokenizer decides, the round trip
 * must equal the NFC of the string. */
static void test_nfc_quickcheck(void) {
    static const uint32_t bases[] = {'e',    'A',    'o',    0x391,  0x915,  0x9c7, 0xb47,  0xbc6,  0xc46,
                                     0xcc6,  0xd46,  0xdd9,  0x1025, 0x1100, 0xac00, 0x304b, 0x1b05};
    buf b = {0};
    int bad = 0;
    for (uint32_t cp = 0x300; cp < 0x30000; cp++) {
        if (cp >= 0xd800 && cp <= 0xdfff) continue;
        b.n = 0;
        buf_add(&b, "", 0);
        char t[4];
        for (size_t k = 0; k < sizeof bases / sizeof bases[0]; k++) {
            buf_add(&b, t, utf8_enc(bases[k], t));
            buf_add(&b, t, utf8_enc(cp, t));
        }
        if (!roundtrip_ok(b.p, b.n, false, NULL, NULL) && bad++ < 5) fprintf(stderr, "NFC quick check: U+%04X\n", cp);
    }
    CHECK(bad == 0, "NFC quick check: %d code points wrongly treated as inert", bad);
    free(b.p);
}

/* ---- special tokens ------------------------------------------------------------------ */

static void test_specials(void) {
    /* expected pieces (looked up by text): specials on/off, longest match, unused tokens */
    static const struct {
        const char *text;
        bool special;
        const char *pieces[12];
    } cases[] = {
        {"<|im_start|>user\nHi<|im_end|>", true, {"<|im_start|>", "user", "\n", "Hi", "<|im_end|>"}},
        {"<think>", true, {"<think>"}},
        {"<think>", false, {"<th", "ink", ">"}}, /* "<think" is one pre-token */
        {"<|im_end|><|im_end|>", true, {"<|im_end|>", "<|im_end|>"}},
        {"x<|endoftext|>", true, {"x", "<|endoftext|>"}},
        {"<|im_start", true, {"<", "|", "im", "_start"}},
        {"<|im_start|>", false, {"<", "|", "im", "_start", "|", ">"}},
        {"<tool_call></tool_call>", true, {"<tool_call>", "</tool_call>"}},
        {"<tool_call></tool_call>", false, {"<", "tool", "_call", "></", "tool", "_call", ">"}},
        {"[PAD151669]", true, {"[P", "AD", "1", "5", "1", "6", "6", "9", "]"}}, /* unused: plain text */
        {"Hello\xffworld", true, {"Hello", "\xff", "world"}}, /* invalid UTF-8: a byte token alone */
        {"\xe2\x82 \xc3", true, {"\xe2", "\x82", " ", "\xc3"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t want[12];
        size_t n = 0;
        for (; n < 12 && cases[i].pieces[n]; n++) {
            want[n] = tokenizer_find(g_tok, cases[i].pieces[n], strlen(cases[i].pieces[n]));
            CHECK(want[n] >= 0, "specials[%zu]: no token '%s'", i, cases[i].pieces[n]);
        }
        char label[48];
        snprintf(label, sizeof label, "specials[%zu]", i);
        bool ok = check_case(label, cases[i].text, strlen(cases[i].text), cases[i].special, want, n, cases[i].text,
                             strlen(cases[i].text), true);
        CHECK(ok, "%s: %s", label, cases[i].text);
    }
    CHECK(tokenizer_is_special(g_tok, 151644) && tokenizer_is_special(g_tok, 151667), "specials flagged");
    CHECK(!tokenizer_is_special(g_tok, 9707) && !tokenizer_is_special(g_tok, 151700), "normal/unused not special");
    CHECK(tokenizer_token_type(g_tok, 151700) == TOK_TYPE_UNUSED, "unused type");
    CHECK(tokenizer_token_type(g_tok, -1) == 0 && tokenizer_token_type(g_tok, 1 << 30) == 0, "type of bad id");
    CHECK(tokenizer_eos(g_tok) == 151645 && tokenizer_bos(g_tok) == 151643 && tokenizer_pad(g_tok) == 151643,
          "eos/bos/pad = %d/%d/%d", tokenizer_eos(g_tok), tokenizer_bos(g_tok), tokenizer_pad(g_tok));
    CHECK(tokenizer_is_eog(g_tok, 151645) && tokenizer_is_eog(g_tok, 151643) && !tokenizer_is_eog(g_tok, 151644) &&
              !tokenizer_is_eog(g_tok, 0) && !tokenizer_is_eog(g_tok, -1),
          "is_eog");
    CHECK(tokenizer_n_vocab(g_tok) == 151936, "n_vocab %d", tokenizer_n_vocab(g_tok));
    CHECK(tokenizer_find(g_tok, "<|im_start|>", 12) == 151644, "find special");
    CHECK(tokenizer_find(g_tok, " the", 4) == 279, "find ' the'");
    CHECK(tokenizer_find(g_tok, "", 0) == -1 && tokenizer_find(g_tok, "\xff\xfe\xfd zzq", 8) == -1, "find missing");
    size_t l;
    const char *p = tokenizer_piece(g_tok, 279, &l);
    CHECK(p && l == 4 && !memcmp(p, " the", 4), "piece 279");
    CHECK(tokenizer_piece(g_tok, -5, &l) == NULL && l == 0, "piece of bad id");
    for (int b = 0; b < 256; b++) {
        p = tokenizer_piece(g_tok, tokenizer_byte_token(g_tok, (uint8_t)b), &l);
        if (!(p && l == 1 && (uint8_t)p[0] == b)) CHECK(0, "byte token %d", b);
    }
    int32_t bad_ids[] = {5, 151936};
    char *d = (char *)1;
    size_t dl = 7;
    ditto_err err;
    CHECK(tokenizer_decode(g_tok, bad_ids, 2, &d, &dl, &err) == -1 && d == NULL && strstr(err.msg, "151936") &&
              strstr(err.msg, "index 1"),
          "decode out of range: %s", err.msg);
    int32_t *ids;
    size_t n;
    CHECK(tokenizer_encode(g_tok, "", 0, true, &ids, &n, &err) == 0 && ids != NULL && n == 0, "empty encode");
    free(ids);
    CHECK(tokenizer_decode(g_tok, NULL, 0, &d, &dl, &err) == 0 && dl == 0 && d && d[0] == 0, "empty decode");
    free(d);
    /* an embedded NUL is ordinary text */
    CHECK(roundtrip_ok("a\0b", 3, false, NULL, NULL), "NUL byte round trip");
}

/* ---- streaming detokenizer ------------------------------------------------------------ */

/* Pushes ids, checking every chunk is whole valid UTF-8; returns the concatenation. */
static bool stream_all(const int32_t *ids, size_t n, buf *out, bool one_char_max) {
    detok_stream ds;
    detok_stream_init(&ds, g_tok);
    out->n = 0;
    buf_add(out, "", 0);
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = detok_stream_push(&ds, ids[i], &l);
        ok = ok && utf8_ok(p, l);
        if (one_char_max && l > 0) {
            utf8proc_int32_t cp;
            ok = ok && utf8proc_iterate((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)l, &cp) == (utf8proc_ssize_t)l;
        }
        buf_add(out, p, l);
    }
    size_t l;
    const char *p = detok_stream_flush(&ds, &l);
    ok = ok && utf8_ok(p, l);
    buf_add(out, p, l);
    detok_stream_free(&ds);
    return ok;
}

static void test_stream(void) {
    const char *text = "Grüße, 日本語のテキスト 😀👍🏽🇩🇪 👨‍👩‍👧 ½ ∮ E⋅da = Q, 한국어 ok";
    size_t tl = strlen(text);
    int32_t *ids;
    size_t n;
    ditto_err err;
    CHECK(tokenizer_encode(g_tok, text, tl, true, &ids, &n, &err) == 0, "encode");
    /* the text must really split characters across tokens for this to test anything */
    int split = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = tokenizer_piece(g_tok, ids[i], &l);
        split += !utf8_ok(p, l);
    }
    CHECK(split >= 4, "stream test text has only %d partial-character tokens", split);
    buf out = {0};
    CHECK(stream_all(ids, n, &out, false), "stream chunks are whole characters");
    CHECK(out.n == tl && memcmp(out.p, text, tl) == 0, "stream concatenation == text");
    free(ids);

    /* byte by byte: every chunk is exactly one character (or empty) */
    ivec bytes = {0};
    for (size_t i = 0; i < tl; i++) ivec_add(&bytes, tokenizer_byte_token(g_tok, (uint8_t)text[i]));
    CHECK(stream_all(bytes.p, bytes.n, &out, true), "byte stream chunks are single characters");
    CHECK(out.n == tl && memcmp(out.p, text, tl) == 0, "byte stream concatenation == text");

    /* invalid sequences: U+FFFD per maximal invalid subpart, held tails flushed as U+FFFD */
    static const struct {
        const char *in;
        const char *out;
    } bad[] = {
        {"\xe2\x82" "A", "\xef\xbf\xbd" "A"},
        {"\x80", "\xef\xbf\xbd"},
        {"\xf0\x9f", "\xef\xbf\xbd"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"a\xf0\x9f\x98" "b\xf0\x9f\x98\x80", "a\xef\xbf\xbd" "b\xf0\x9f\x98\x80"},
        {"\xff\xfe", "\xef\xbf\xbd\xef\xbf\xbd"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        bytes.n = 0;
        for (const char *c = bad[k].in; *c; c++) ivec_add(&bytes, tokenizer_byte_token(g_tok, (uint8_t)*c));
        bool ok = stream_all(bytes.p, bytes.n, &out, false);
        CHECK(ok && out.n == strlen(bad[k].out) && memcmp(out.p, bad[k].out, out.n) == 0, "invalid stream case %zu", k);
    }
    /* a lead byte then a special token; an incomplete character is not emitted early */
    detok_stream ds;
    detok_stream_init(&ds, g_tok);
    size_t l;
    const char *p = detok_stream_push(&ds, tokenizer_byte_token(g_tok, 0xe6), &l);
    CHECK(l == 0, "lead byte held back");
    p = detok_stream_push(&ds, tokenizer_byte_token(g_tok, 0x97), &l);
    CHECK(l == 0, "two bytes of three held back");
    p = detok_stream_push(&ds, 151645, &l);
    CHECK(l == 13 && memcmp(p, "\xef\xbf\xbd<|im_end|>", 13) == 0, "broken char before a special");
    p = detok_stream_flush(&ds, &l);
    CHECK(l == 0, "nothing left");
    p = detok_stream_push(&ds, tokenizer_byte_token(g_tok, 0xe6), &l);
    p = detok_stream_push(&ds, tokenizer_byte_token(g_tok, 0x97), &l);
    p = detok_stream_push(&ds, tokenizer_byte_token(g_tok, 0xa5), &l);
    CHECK(l == 3 && memcmp(p, "日", 3) == 0, "completed character emitted whole");
    detok_stream_free(&ds);

    /* random splits of valid text into vocabulary pieces and bytes, and random ids */
    buf t = {0};
    int bad_split = 0, bad_rand = 0;
    for (int it = 0; it < 500; it++) {
        rnd_text(&t, 1 + rnd() % 40);
        bytes.n = 0;
        for (size_t i = 0; i < t.n;) {
            size_t len = 1 + rnd() % 6;
            if (len > t.n - i) len = t.n - i;
            int32_t id = tokenizer_find(g_tok, t.p + i, len);
            if (id >= 0 && tokenizer_token_type(g_tok, id) == TOK_TYPE_NORMAL) {
                ivec_add(&bytes, id);
                i += len;
            } else {
                ivec_add(&bytes, tokenizer_byte_token(g_tok, (uint8_t)t.p[i]));
                i++;
            }
        }
        if (!stream_all(bytes.p, bytes.n, &out, false) || out.n != t.n || memcmp(out.p, t.p, t.n)) bad_split++;
        bytes.n = 0;
        for (int k = 0; k < 30; k++)
            ivec_add(&bytes, rnd() % 2 ? tokenizer_byte_token(g_tok, (uint8_t)rnd())
                                       : (int32_t)(rnd() % (uint32_t)tokenizer_n_vocab(g_tok)));
        if (!stream_all(bytes.p, bytes.n, &out, false)) bad_rand++;
    }
    CHECK(bad_split == 0, "stream of randomly split text: %d failures", bad_split);
    CHECK(bad_rand == 0, "stream of random ids: %d emitted invalid UTF-8", bad_rand);
    free(t.p);
    free(bytes.p);
    free(out.p);
}

/* ---- chat ------------------------------------------------------------------------------- */

static void test_chat(void) {
    CHECK(tokenizer_chat_kind(g_tok) == CHAT_QWEN3, "model template is Qwen3");
    CHECK(tokenizer_chat_warning(g_tok) == NULL, "no template warning");
    /* expected strings rendered by Jinja2 from the GGUF's own tokenizer.chat_template */
    static const struct {
        const char *name;
        chat_msg m[6];
        size_t n;
        bool gen, think;
        const char *want;
    } cases[] = {
        {"sys_user_think", {{"system", "You are helpful.", 0}, {"user", "Hi", 0}}, 2, true, true,
         "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
        {"sys_user_nothink", {{"system", "You are helpful.", 0}, {"user", "Hi", 0}}, 2, true, false,
         "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
         "<think>\n\n</think>\n\n"},
        {"multi_turn",
         {{"user", "What is 2+2?", 0}, {"assistant", "<think>\nadd them\n</think>\n\n4", 0}, {"user", "And 3+3?", 0}},
         3, true, true,
         "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd "
         "3+3?<|im_end|>\n<|im_start|>assistant\n"},
        {"last_assistant", {{"user", "Q", 0}, {"assistant", "<think>\n\nr1\n\n</think>\n\nA1", 0}}, 2, false, true,
         "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\nA1<|im_end|>\n"},
        {"last_assistant_plain", {{"user", "Q", 0}, {"assistant", "A1", 0}}, 2, false, true,
         "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA1<|im_end|>\n"},
        {"reasoning_field",
         {{"user", "Q", 0}, {"assistant", "\nA", "\nthought\n"}, {"user", "Q2", 0}, {"assistant", "B", "deep"}}, 4,
         false, true,
         "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n\nA<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_"
         "start|>assistant\n<think>\ndeep\n</think>\n\nB<|im_end|>\n"},
        {"tools",
         {{"user", "weather?", 0},
          {"assistant", "calling", 0},
          {"tool", "{\"t\": 20}", 0},
          {"tool", "{\"t\": 21}", 0},
          {"assistant", "<think>ok</think>It is 20.", 0}},
         5, true, false,
         "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\ncalling<|im_end|>\n<|im_start|>user\n<tool_"
         "response>\n{\"t\": 20}\n</tool_response>\n<tool_response>\n{\"t\": 21}\n</tool_response><|im_end|>\n<|im_"
         "start|>assistant\n<think>\nok\n</think>\n\nIt is 20.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</"
         "think>\n\n"},
        {"tool_response_user",
         {{"user", "go", 0},
          {"assistant", "x", 0},
          {"user", "<tool_response>r</tool_response>", 0},
          {"assistant", "<think>\nz\n</think>y", 0}},
         4, false, true,
         "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\nx<|im_end|>\n<|im_start|>user\n<tool_response>r</"
         "tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nz\n</think>\n\ny<|im_end|>\n"},
        {"system_late_unknown",
         {{"user", "a", 0}, {"system", "s2", 0}, {"developer", "dev", 0}, {"assistant", "b", 0}}, 4, true, true,
         "<|im_start|>user\na<|im_end|>\n<|im_start|>system\ns2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</"
         "think>\n\nb<|im_end|>\n<|im_start|>assistant\n"},
        {"multi_think", {{"user", "u", 0}, {"assistant", "<think>a</think><think>b</think>\n\nc</think>\nd", 0}}, 2,
         false, true, "<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n<think>\na\n</think>\n\nd<|im_end|>\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *s = chat_render(g_tok, cases[i].m, cases[i].n, cases[i].gen, cases[i].think);
        bool ok = s && strcmp(s, cases[i].want) == 0;
        CHECK(ok, "chat %s:\n got: %s\nwant: %s", cases[i].name, s, cases[i].want);
        free(s);
    }
    /* exact ids (reference ids from hf-strings.json) */
    chat_msg hi[] = {{"user", "Hi", NULL}};
    static const int32_t want_think[] = {151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198};
    static const int32_t want_nothink[] = {151644, 872, 198, 13048, 151645, 198, 151644,
                                           77091,  198, 151667, 271, 151668, 271};
    for (int th = 0; th < 2; th++) {
        char *s = chat_render(g_tok, hi, 1, true, th == 1);
        int32_t *ids;
        size_t n;
        ditto_err err;
        CHECK(tokenizer_encode(g_tok, s, strlen(s), true, &ids, &n, &err) == 0, "encode chat");
        CHECK(th ? ids_eq(ids, n, want_think, 9) : ids_eq(ids, n, want_nothink, 13), "chat ids (thinking %d)", th);
        free(ids);
        free(s);
    }
    /* plain ChatML */
    chat_msg two[] = {{"system", "S", NULL}, {"user", NULL, NULL}};
    char *s = chat_render_kind(CHAT_CHATML, two, 2, true, false);
    CHECK(!strcmp(s, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"),
          "chatml: %s", s);
    free(s);
    s = chat_render(g_tok, NULL, 0, true, true);
    CHECK(!strcmp(s, "<|im_start|>assistant\n"), "no messages: %s", s);
    free(s);
}

/* ---- synthetic GGUF files: load errors and BPE details on a tiny vocabulary -------------- */

typedef struct gw {
    buf kv;
    uint64_t n_kv;
    buf file;
} gw;

static void gw_raw_str(buf *b, const char *s, size_t n) {
    uint64_t l = n;
    buf_add(b, &l, 8);
    buf_add(b, s, n);
}
static void gw_key(gw *g, const char *key, uint32_t type) {
    gw_raw_str(&g->kv, key, strlen(key));
    buf_add(&g->kv, &type, 4);
    g->n_kv++;
}
static void gw_str(gw *g, const char *key, const char *v) {
    gw_key(g, key, GGUF_VT_STRING);
    gw_raw_str(&g->kv, v, strlen(v));
}
static void gw_u32(gw *g, const char *key, uint32_t v) {
    gw_key(g, key, GGUF_VT_UINT32);
    buf_add(&g->kv, &v, 4);
}
static void gw_strs(gw *g, const char *key, char **v, size_t n) {
    gw_key(g, key, GGUF_VT_ARRAY);
    uint32_t t = GGUF_VT_STRING;
    uint64_t nn = n;
    buf_add(&g->kv, &t, 4);
    buf_add(&g->kv, &nn, 8);
    for (size_t i = 0; i < n; i++) gw_raw_str(&g->kv, v[i], strlen(v[i]));
}
static void gw_i32s(gw *g, const char *key, const int32_t *v, size_t n) {
    gw_key(g, key, GGUF_VT_ARRAY);
    uint32_t t = GGUF_VT_INT32;
    uint64_t nn = n;
    buf_add(&g->kv, &t, 4);
    buf_add(&g->kv, &nn, 8);
    buf_add(&g->kv, v, 4 * n);
}
static gguf_file *gw_open(gw *g) {
    g->file.n = 0;
    uint32_t magic = 0x46554747u, ver = 3;
    uint64_t nt = 0;
    buf_add(&g->file, &magic, 4);
    buf_add(&g->file, &ver, 4);
    buf_add(&g->file, &nt, 8);
    buf_add(&g->file, &g->n_kv, 8);
    buf_add(&g->file, g->kv.p, g->kv.n);
    gguf_file *f = NULL;
    ditto_err err;
    if (gguf_open_buffer(&f, g->file.p, g->file.n, "synthetic.gguf", &err)) {
        fprintf(stderr, "synthetic gguf: %s\n", err.msg);
        return NULL;
    }
    return f;
}

/* Tiny vocabulary: 256 byte tokens, then extra tokens; merges as given. Options let
 * each case break one thing. */
typedef struct synth {
    const char *model, *pre, *tmpl;
    const char **extra;     /* byte-level strings appended to the vocabulary */
    const int32_t *extra_type;
    size_t n_extra;
    const char **merges;
    size_t n_merges;
    int drop_byte;          /* >= 0: leave this byte's token out */
    int type_len_delta;
    int64_t eos;            /* < 0: absent */
} synth;

static void byte_str(int b, char *o) { o[utf8_enc(byte_to_cp(b), o)] = 0; }

static int synth_load(const synth *sy, tokenizer **tok, ditto_err *err, gw *g) {
    memset(g, 0, sizeof *g);
    if (sy->model) gw_str(g, "tokenizer.ggml.model", sy->model);
    if (sy->pre) gw_str(g, "tokenizer.ggml.pre", sy->pre);
    char **toks = xmalloc((256 + sy->n_extra) * sizeof *toks);
    int32_t *types = xmalloc((256 + sy->n_extra) * sizeof *types);
    size_t n = 0;
    for (int b = 0; b < 256; b++) {
        if (b == sy->drop_byte) continue;
        toks[n] = xmalloc(8);
        byte_str(b, toks[n]);
        types[n++] = 1;
    }
    for (size_t i = 0; i < sy->n_extra; i++) {
        toks[n] = strdup(sy->extra[i]);
        types[n++] = sy->extra_type ? sy->extra_type[i] : 1;
    }
    gw_strs(g, "tokenizer.ggml.tokens", toks, n);
    gw_i32s(g, "tokenizer.ggml.token_type", types, (size_t)((int64_t)n + sy->type_len_delta));
    gw_strs(g, "tokenizer.ggml.merges", (char **)sy->merges, sy->n_merges);
    if (sy->eos >= 0) gw_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)sy->eos);
    if (sy->tmpl) gw_str(g, "tokenizer.chat_template", sy->tmpl);
    for (size_t i = 0; i < n; i++) free(toks[i]);
    free(toks);
    free(types);
    gguf_file *f = gw_open(g);
    if (!f) return err_set(err, "gguf_open_buffer failed");
    int rc = tokenizer_load(tok, f, err);
    gguf_close(f); /* the tokenizer must not keep pointers into the file */
    return rc;
}

static void gw_free(gw *g) {
    free(g->kv.p);
    free(g->file.p);
}

static void encode_pieces(tokenizer *t, const char *text, buf *out) {
    int32_t *ids;
    size_t n;
    ditto_err err;
    out->n = 0;
    buf_add(out, "", 0);
    DT_ASSERT(tokenizer_encode(t, text, strlen(text), true, &ids, &n, &err) == 0);
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = tokenizer_piece(t, ids[i], &l);
        if (i) buf_add(out, "|", 1);
        buf_add(out, p, l);
    }
    free(ids);
}

static void test_synthetic(void) {
    static const char *extra[] = {"aa", "aaa", "ab", "bc", "abc", "<s>", "<ss>", "Ġx", "ĠĠ", "[X]", "[PAD1]"};
    static const int32_t extra_type[] = {1, 1, 1, 1, 1, 3, 4, 1, 1, 4, 5};
    static const char *merges[] = {"a a", "aa a", "b c", "a b", "ab c", "Ġ x", "Ġ Ġ"};
    synth ok = {"gpt2", "qwen2", "{{ bos }}", extra, extra_type, 11, merges, 7, -1, 0, 256 + 5};
    tokenizer *t = NULL;
    ditto_err err = {{0}};
    gw g;
    int rc = synth_load(&ok, &t, &err, &g);
    CHECK(rc == 0, "synthetic load: %s", err.msg);
    if (rc == 0) {
        static const struct {
            const char *in, *want;
        } cases[] = {
            {"aaa", "aaa"},           /* a a (leftmost of equal ranks), then aa a */
            {"aaaa", "aa|aa"},        /* a a at 0, then a a at 2 beats aa a */
            {"aaaaa", "aa|aaa"},      /* aa|a|a|a -> aa|aa|a (rank 0 first) -> aa|aaa */
            {"abc", "a|bc"},          /* 'abc' is in the vocabulary but BPE gives a|bc */
            {"ab", "ab"},
            {"<ss><s>x", "<ss>|<s>|x"},
            {"<sss>", "<|s|s|s|>"},   /* no special matches: plain text */
            {" x  x", " x| | x"},     /* '\s+(?!\S)' leaves one space for the next word */
            {"a[X]<s>[X", "a|[X]|<s>|[|X"}, /* specials with different first bytes */
            {"[PAD1]", "[|P|A|D|1|]"},  /* unused tokens are never matched */
        };
        buf out = {0};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            encode_pieces(t, cases[i].in, &out);
            CHECK(!strcmp(out.p, cases[i].want), "synthetic '%s' -> '%s' (want '%s')", cases[i].in, out.p,
                  cases[i].want);
        }
        free(out.p);
        CHECK(tokenizer_chat_kind(t) == CHAT_CHATML && tokenizer_chat_warning(t) &&
                  strstr(tokenizer_chat_warning(t), "not recognised"),
              "unrecognised template warns");
        CHECK(tokenizer_eos(t) == 256 + 5 && tokenizer_bos(t) == -1, "synthetic eos/bos");
    }
    tokenizer_free(t);
    gw_free(&g);

    static const struct {
        const char *what;
        synth s;
        const char *need1, *need2;
    } bad[] = {
        {"model", {"llama", "qwen2", 0, extra, 0, 5, merges, 5, -1, 0, -1}, "tokenizer.ggml.model", "llama"},
        {"pre", {"gpt2", "deepseek-llm", 0, extra, 0, 5, merges, 5, -1, 0, -1}, "tokenizer.ggml.pre", "deepseek-llm"},
        {"no pre", {"gpt2", NULL, 0, extra, 0, 5, merges, 5, -1, 0, -1}, "tokenizer.ggml.pre", "missing"},
        {"no model", {NULL, "qwen2", 0, extra, 0, 5, merges, 5, -1, 0, -1}, "tokenizer.ggml.model", "missing"},
        {"merge unknown", {"gpt2", "qwen2", 0, extra, 0, 2, merges, 4, -1, 0, -1}, "tokenizer.ggml.merges[2]", "b c"},
        {"byte missing", {"gpt2", "qwen2", 0, extra, 0, 5, merges, 0, 'q', 0, -1}, "byte 0x71", "tokenizer.ggml.tokens"},
        {"type length", {"gpt2", "qwen2", 0, extra, 0, 5, merges, 5, -1, -1, -1}, "tokenizer.ggml.token_type", "entries"},
        {"eos range", {"gpt2", "qwen2", 0, extra, 0, 5, merges, 5, -1, 0, 100000}, "eos_token_id", "100000"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = NULL;
        err.msg[0] = 0;
        rc = synth_load(&bad[i].s, &t, &err, &g);
        CHECK(rc == -1 && t == NULL && strstr(err.msg, bad[i].need1) && strstr(err.msg, bad[i].need2),
              "load error '%s': rc %d, message '%s'", bad[i].what, rc, err.msg);
        tokenizer_free(t);
        gw_free(&g);
    }
    /* template detection */
    static const struct {
        const char *tmpl;
        enum chat_kind kind;
        bool warn;
    } tm[] = {
        {NULL, CHAT_CHATML, true},
        {"{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}", CHAT_CHATML, false},
        {"<|im_start|> {% if enable_thinking %}", CHAT_QWEN3, false},
        {"[INST] {{ m }} [/INST]", CHAT_CHATML, true},
    };
    for (size_t i = 0; i < sizeof tm / sizeof tm[0]; i++) {
        synth s = {"gpt2", "qwen2", tm[i].tmpl, extra, 0, 5, merges, 5, -1, 0, -1};
        t = NULL;
        rc = synth_load(&s, &t, &err, &g);
        CHECK(rc == 0 && tokenizer_chat_kind(t) == tm[i].kind && (tokenizer_chat_warning(t) != NULL) == tm[i].warn,
              "template detection case %zu", i);
        tokenizer_free(t);
        gw_free(&g);
    }
}

/* ---- threads ------------------------------------------------------------------------------ */

typedef struct thr_arg {
    const char **texts;
    const ivec *want;
    size_t n;
    int bad;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    for (int rep = 0; rep < 20; rep++)
        for (size_t i = 0; i < a->n; i++) {
            int32_t *ids;
            size_t n;
            ditto_err err;
            if (tokenizer_encode(g_tok, a->texts[i], strlen(a->texts[i]), true, &ids, &n, &err) ||
                !ids_eq(ids, n, a->want[i].p, a->want[i].n))
                a->bad++;
            free(ids);
        }
    return NULL;
}

static void test_threads(void) {
    static const char *texts[] = {
        "Hello, world! <|im_start|>user\nhi<|im_end|>",
        "日本語のテキストと中文文本混合 café naïve",
        "The quick brown fox jumps over the lazy dog. 1234567 'LL 're",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "\xff\xfe broken \xe2\x82 utf8 e\xcc\x81",
    };
    size_t n = sizeof texts / sizeof texts[0];
    ivec want[5] = {{0}};
    for (size_t i = 0; i < n; i++) {
        int32_t *ids;
        size_t k;
        ditto_err err;
        DT_ASSERT(tokenizer_encode(g_tok, texts[i], strlen(texts[i]), true, &ids, &k, &err) == 0);
        for (size_t j = 0; j < k; j++) ivec_add(&want[i], ids[j]);
        free(ids);
    }
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){texts, want, n, 0};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += args[i].bad;
    }
    CHECK(bad == 0, "concurrent encode: %d mismatches", bad);
    for (size_t i = 0; i < n; i++) free(want[i].p);
}

/* ---- the CLI ------------------------------------------------------------------------------- */

static char *capture_cmd(int argc, char **argv, int *rc) {
    fflush(stdout);
    FILE *tmp = tmpfile();
    DT_ASSERT(tmp);
    fflush(stderr);
    int saved = dup(1), saved_err = dup(2);
    FILE *null = fopen("/dev/null", "w");
    DT_ASSERT(null);
    dup2(fileno(tmp), 1);
    dup2(fileno(null), 2); /* the error cases print usage text */
    *rc = tokenizer_cmd(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved, 1);
    dup2(saved_err, 2);
    close(saved);
    close(saved_err);
    fclose(null);
    size_t n = (size_t)ftell(tmp);
    char *s = xmalloc(n + 1);
    rewind(tmp);
    n = fread(s, 1, n, tmp);
    s[n] = 0;
    fclose(tmp);
    return s;
}

static void test_cli(const char *model) {
    int rc;
    char *a1[] = {"tokenize", "-m", (char *)model, "Hello, world!", NULL};
    char *s = capture_cmd(4, a1, &rc);
    CHECK(rc == 0 && !strcmp(s, "9707 11 1879 0\n"), "tokenize: rc %d '%s'", rc, s);
    free(s);
    char *a2[] = {"tokenize", "--pieces", "-m", (char *)model, "Hello\n<think>", NULL};
    s = capture_cmd(5, a2, &rc);
    CHECK(rc == 0 && !strcmp(s, "9707\tHello\n198\t\\n\n151667\t<think>\n"), "tokenize --pieces: '%s'", s);
    free(s);
    char *a3[] = {"tokenize", "--no-special", "-m", (char *)model, "<think>", NULL};
    s = capture_cmd(5, a3, &rc);
    CHECK(rc == 0 && !strcmp(s, "13708 766 29\n"), "tokenize --no-special: '%s'", s);
    free(s);
    char *a4[] = {"tokenize", "-m", "/nonexistent.gguf", "x", NULL};
    s = capture_cmd(4, a4, &rc);
    CHECK(rc == 1, "tokenize with a missing model: rc %d", rc);
    free(s);
    char *a5[] = {"tokenize", "--bogus", NULL};
    s = capture_cmd(2, a5, &rc);
    CHECK(rc == 2, "tokenize with a bad option: rc %d", rc);
    free(s);
}

int main(void) {
    char model[1024];
    snprintf(model, sizeof model, "%s/models/tiny-qwen3moe-q4_k_m.gguf", test_shared_dir());
    gguf_file *f = NULL;
    ditto_err err = {{0}};
    double t0 = time_now();
    int rc = gguf_open(&f, model, &err);
    CHECK(rc == 0, "open %s: %s", model, err.msg);
    if (rc) return test_summary();
    rc = tokenizer_load(&g_tok, f, &err);
    CHECK(rc == 0, "tokenizer_load: %s", err.msg);
    if (rc) return test_summary();
    printf("load: %.3f s\n", time_now() - t0);

    double t = time_now();
    test_hf_strings();
    test_llamacpp();
    test_specials();
    test_synthetic();
    test_stream();
    test_chat();
    test_threads();
    test_cli(model);
    ref_bpe ref;
    ref_init(&ref, f);
    test_fuzz(&ref);
    ref_free(&ref);
    test_nfc_quickcheck();
    printf("unit tests + fuzz: %.2f s\n", time_now() - t);
    t = time_now();
    test_corpus();
    printf("corpus test: %.2f s\n", time_now() - t);

    tokenizer_free(g_tok);
    gguf_close(f);
    return test_summary();
}
