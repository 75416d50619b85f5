/* tokenizer.c — byte-level BPE for Qwen2/Qwen3 vocabularies (see tokenizer.h).
 *
 * Data built at load (immutable afterwards):
 *   pieces    every token's decoded bytes, concatenated; off[id]..off[id+1]
 *   vmap      open addressing: decoded bytes -> id (normal tokens win ties), with the
 *             first 8 bytes inline in the slot
 *   pmap      open addressing: (left id, right id) -> (merge rank, merged id)
 *   whole_ok  per token: BPE of its own bytes gives back exactly that token, so a
 *             pre-token equal to a vocabulary entry skips the merge loop (true for
 *             every normal Qwen token)
 *   specials  control + user-defined ids sorted by first byte, longest first
 *   nfc_inert bitmap of code points that cannot change under NFC (quick check)
 * and one mutable part, the word cache (striped mutexes), for merge-loop results.
 *
 * encode: split on specials -> per valid UTF-8 stretch: NFC unless every code point is
 * inert -> pre-tokenize (a hand-written equivalent of the regex on all-ASCII
 * stretches, PCRE2 otherwise) -> pre-tokens pass through a short FIFO that prefetches
 * their vmap slots -> single byte: byte token; whole_ok hit: that token; else the word
 * cache, else the merge loop: symbols in a doubly linked list, candidate pairs in a
 * binary min-heap keyed (rank, position) — the lowest rank merges first, leftmost on
 * ties — stale entries detected by re-checking both ids at pop time. */
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <string.h>
#include <utf8proc.h>

#define TOK_MAX_VOCAB (1 << 24)
#define TOK_MAX_PIECE 4096 /* bytes; longer vocabulary entries are rejected at load */

/* Qwen2 pre-tokenizer regex (tokenizer.json "Split" pattern, behaviour Isolated). */
static const char qwen2_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct word_cache word_cache;

/* The first 8 bytes live in the slot, so short pieces compare without touching
 * the pieces buffer; tag = hash bits << 8 | min(len, 255), 0 = empty. */
typedef struct vslot {
    uint64_t head;
    uint32_t tag;
    int32_t id;
} vslot;

typedef struct pslot {
    uint64_t key; /* (left << 32) | right; UINT64_MAX = empty */
    uint32_t rank;
    int32_t merged;
} pslot;

struct tokenizer {
    int32_t n_vocab;
    uint8_t *type;
    uint8_t *whole_ok;
    uint32_t *off; /* n_vocab + 1 */
    char *pieces;
    size_t max_piece;

    vslot *vmap;
    size_t vmask;
    pslot *pmap;
    size_t pmask;
    uint32_t n_merges;
    int32_t byte_id[256];

    int32_t *spec;           /* special ids, grouped by first byte, longest first */
    uint32_t spec_start[257]; /* bucket b = spec[spec_start[b] .. spec_start[b+1]) */
    uint32_t n_spec;
    int spec_lead;            /* the first byte of every special, or -1 (several / none) */

    int32_t eos, bos, pad, im_end, endoftext;
    pcre2_code *re;
    word_cache *cache; /* the only mutable part: internally locked */
    uint8_t *nfc_inert;

    enum chat_kind chat;
    char chat_warn[256]; /* empty: none */
};

/* ---- hashing --------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return mix64(h ^ v);
}

static uint32_t vtag(uint64_t h, size_t n) { return (uint32_t)(h >> 40) << 8 | (uint32_t)(n < 255 ? n : 255); }

static uint64_t head8(const uint8_t *s, size_t n) {
    uint64_t v = 0;
    memcpy(&v, s, n < 8 ? n : 8);
    return v;
}

static size_t piece_len(const tokenizer *t, int32_t id) { return t->off[id + 1] - t->off[id]; }

static bool vslot_eq(const tokenizer *t, const vslot *v, uint32_t tag, uint64_t head, const uint8_t *s, size_t n) {
    if (v->tag != tag || v->head != head) return false;
    if (n <= 8) return true; /* tag holds the length */
    return piece_len(t, v->id) == n && memcmp(t->pieces + t->off[v->id] + 8, s + 8, n - 8) == 0;
}

/* h = hash_bytes(s, n) */
static int32_t vmap_get_h(const tokenizer *t, const uint8_t *s, size_t n, uint64_t h) {
    uint64_t head = head8(s, n);
    uint32_t tag = vtag(h, n);
    for (size_t i = (size_t)h & t->vmask;; i = (i + 1) & t->vmask) {
        const vslot *v = &t->vmap[i];
        if (v->tag == 0) return -1;
        if (vslot_eq(t, v, tag, head, s, n)) return v->id;
    }
}

static int32_t vmap_get(const tokenizer *t, const uint8_t *s, size_t n) {
    return vmap_get_h(t, s, n, hash_bytes(s, n));
}

/* Inserts id under its piece unless that text is already present. */
static void vmap_put(tokenizer *t, int32_t id) {
    const uint8_t *s = (const uint8_t *)t->pieces + t->off[id];
    size_t n = piece_len(t, id);
    uint64_t h = hash_bytes(s, n), head = head8(s, n);
    uint32_t tag = vtag(h, n);
    for (size_t i = (size_t)h & t->vmask;; i = (i + 1) & t->vmask) {
        vslot *v = &t->vmap[i];
        if (v->tag == 0) {
            v->head = head;
            v->tag = tag;
            v->id = id;
            return;
        }
        if (vslot_eq(t, v, tag, head, s, n)) return;
    }
}

static const pslot *pmap_get(const tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = (size_t)mix64(key) & t->pmask;; i = (i + 1) & t->pmask) {
        const pslot *p = &t->pmap[i];
        if (p->key == key) return p;
        if (p->key == UINT64_MAX) return NULL;
    }
}

/* Keeps the lowest rank for a pair listed twice. */
static void pmap_put(tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = (size_t)mix64(key) & t->pmask;; i = (i + 1) & t->pmask) {
        pslot *p = &t->pmap[i];
        if (p->key == key) return;
        if (p->key == UINT64_MAX) {
            p->key = key;
            p->rank = rank;
            p->merged = merged;
            return;
        }
    }
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- UTF-8 ----------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence starting at s[0] (n bytes available), or 0 if
 * s[0] does not start one. *incomplete (may be NULL) is set when the bytes present
 * are a valid but truncated prefix. */
static size_t utf8_seq(const uint8_t *s, size_t n, bool *incomplete) {
    if (incomplete) *incomplete = false;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= n) {
            if (incomplete) *incomplete = true;
            return 0;
        }
        uint8_t b = s[k];
        if (b < lo || b > hi) return 0;
        lo = 0x80;
        hi = 0xbf;
    }
    return need;
}

/* Number of bytes of a maximal invalid subpart starting at s[0] (>= 1): the lead
 * byte plus the continuation bytes that were valid so far. */
static size_t utf8_bad_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) need = 2;
    else if (c >= 0xe0 && c <= 0xef) need = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4) need = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else return 1;
    size_t k = 1;
    while (k < need && k < n && s[k] >= lo && s[k] <= hi) {
        k++;
        lo = 0x80;
        hi = 0xbf;
    }
    return k;
}

/* NFC quick check. A code point is "inert" when no text changes under NFC because of
 * it: NFC of it alone is itself, canonical combining class 0, and it can never be the
 * second half of a composition (those are all marks, Mn/Mc/Me, or Hangul V/T jamo).
 * A valid stretch made only of inert code points is already NFC and skips utf8proc.
 * Bitmap over [0, NFC_INERT_END), computed at load; code points above are not inert. */
#define NFC_INERT_END 0x30000

static bool nfc_inert_cp(utf8proc_int32_t cp) {
    if (cp < 0x300) return true;
    if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11a8 && cp <= 0x11c2)) return false;
    const utf8proc_property_t *p = utf8proc_get_property(cp);
    if (p->combining_class != 0 || p->category == UTF8PROC_CATEGORY_MN || p->category == UTF8PROC_CATEGORY_MC ||
        p->category == UTF8PROC_CATEGORY_ME)
        return false;
    utf8proc_int32_t d[16];
    int bound = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char(cp, d, 16, UTF8PROC_DECOMPOSE, &bound);
    if (n < 1 || n > 16) return false;
    n = utf8proc_normalize_utf32(d, n, UTF8PROC_COMPOSE);
    return n == 1 && d[0] == cp;
}

static uint8_t *nfc_inert_build(void) {
    uint8_t *bits = xcalloc(NFC_INERT_END / 8, 1);
    for (utf8proc_int32_t cp = 0; cp < NFC_INERT_END; cp++)
        if ((cp < 0xd800 || cp > 0xdfff) && nfc_inert_cp(cp)) bits[cp >> 3] |= (uint8_t)(1u << (cp & 7));
    return bits;
}

/* Length of the longest valid UTF-8 prefix of s; *need_nfc is set if it holds a code
 * point that is not NFC-inert (inert: bitmap, or NULL = only those below U+0300),
 * *ascii if it is all ASCII. */
static size_t utf8_valid_prefix(const uint8_t *inert, const uint8_t *s, size_t n, bool *need_nfc, bool *ascii) {
    size_t i = 0;
    bool nfc = false, asc = true;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = utf8_seq(s + i, n - i, NULL);
        if (l == 0) break;
        asc = false;
        if (s[i] >= 0xcc && !nfc) {
            uint32_t cp;
            if (l == 2) cp = (uint32_t)(s[i] & 0x1f) << 6 | (s[i + 1] & 0x3f);
            else if (l == 3) cp = (uint32_t)(s[i] & 0x0f) << 12 | (uint32_t)(s[i + 1] & 0x3f) << 6 | (s[i + 2] & 0x3f);
            else
                cp = (uint32_t)(s[i] & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3f) << 12 |
                     (uint32_t)(s[i + 2] & 0x3f) << 6 | (s[i + 3] & 0x3f);
            if (!inert || cp >= NFC_INERT_END || !(inert[cp >> 3] & (1u << (cp & 7)))) nfc = true;
        }
        i += l;
    }
    *need_nfc = nfc;
    *ascii = asc;
    return i;
}

/* GPT-2 bytes_to_unicode, inverted: code point (< 324) -> byte, or -1. */
static void byte_unicode_inverse(int16_t inv[324]) {
    for (int i = 0; i < 324; i++) inv[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        inv[self ? b : 256 + n++] = (int16_t)b;
    }
}

/* Decodes a byte-level token string into raw bytes (out has room for n bytes:
 * decoding never grows). Code points outside the byte alphabet, and invalid UTF-8,
 * are copied through unchanged. Returns the length. */
static size_t byte_level_decode(const int16_t inv[324], const uint8_t *s, size_t n, uint8_t *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_seq(s + i, n - i, NULL);
        if (l == 0) {
            out[o++] = s[i++];
            continue;
        }
        uint32_t cp;
        if (l == 1) cp = s[i];
        else if (l == 2) cp = ((uint32_t)(s[i] & 0x1f) << 6) | (s[i + 1] & 0x3f);
        else cp = 0x110000; /* never in the alphabet */
        if (cp < 324 && inv[cp] >= 0) {
            out[o++] = (uint8_t)inv[cp];
        } else {
            memcpy(out + o, s + i, l);
            o += l;
        }
        i += l;
    }
    return o;
}

/* ---- BPE ------------------------------------------------------------------- */

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next; /* symbol indices, -1 at the ends */
    uint32_t len;       /* bytes; 0 = merged into its left neighbour */
} bpe_sym;

typedef struct bpe_cand {
    uint64_t key; /* (rank << 32) | left symbol index */
    int32_t left, right, merged;
} bpe_cand;

typedef struct bpe_scratch {
    bpe_sym *sym;
    bpe_cand *heap;
    size_t cap, n_heap;
} bpe_scratch;

typedef struct id_vec {
    int32_t *p;
    size_t n, cap;
} id_vec;

static void vec_push(id_vec *v, int32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, v->cap * sizeof *p);
        if (!p) {
            fprintf(stderr, "ditto: out of memory (%zu ids)\n", v->cap);
            abort();
        }
        v->p = p;
    }
    v->p[v->n++] = id;
}

static void scratch_reserve(bpe_scratch *s, size_t n) {
    if (n <= s->cap) return;
    size_t c = pow2_at_least(n);
    free(s->sym);
    free(s->heap);
    s->sym = xmalloc(c * sizeof *s->sym);
    s->heap = xmalloc(3 * c * sizeof *s->heap);
    s->cap = c;
}

static void scratch_free(bpe_scratch *s) {
    free(s->sym);
    free(s->heap);
}

static void heap_push(bpe_scratch *s, bpe_cand c) {
    size_t i = s->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (s->heap[p].key <= c.key) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = c;
}

static bpe_cand heap_pop(bpe_scratch *s) {
    bpe_cand top = s->heap[0];
    bpe_cand last = s->heap[--s->n_heap];
    size_t n = s->n_heap, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && s->heap[c + 1].key < s->heap[c].key) c++;
        if (last.key <= s->heap[c].key) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

static void pmap_prefetch(const tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    __builtin_prefetch(&t->pmap[(size_t)mix64(key) & t->pmask]);
}

static void bpe_prefetch_pair(const tokenizer *t, const bpe_scratch *s, int32_t li) {
    if (li >= 0 && s->sym[li].next >= 0) pmap_prefetch(t, s->sym[li].id, s->sym[s->sym[li].next].id);
}

static void bpe_try_pair(const tokenizer *t, bpe_scratch *s, int32_t li) {
    if (li < 0 || s->sym[li].next < 0) return;
    int32_t ri = s->sym[li].next;
    const pslot *p = pmap_get(t, s->sym[li].id, s->sym[ri].id);
    if (!p) return;
    bpe_cand c = {((uint64_t)p->rank << 32) | (uint32_t)li, s->sym[li].id, s->sym[ri].id, p->merged};
    heap_push(s, c);
}

/* Byte-level BPE of w[0..n) (n >= 1); appends the ids to out. */
static void bpe_word(const tokenizer *t, const uint8_t *w, size_t n, bpe_scratch *s, id_vec *out) {
    scratch_reserve(s, n);
    for (size_t i = 0; i < n; i++) {
        s->sym[i].id = t->byte_id[w[i]];
        s->sym[i].prev = (int32_t)i - 1;
        s->sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        s->sym[i].len = 1;
    }
    s->n_heap = 0;
    /* the lookups are independent cache misses: start them all, then use them */
    for (size_t i = 0; i + 1 < n; i++) pmap_prefetch(t, s->sym[i].id, s->sym[i + 1].id);
    for (size_t i = 0; i + 1 < n; i++) bpe_try_pair(t, s, (int32_t)i);
    while (s->n_heap) {
        bpe_cand c = heap_pop(s);
        int32_t li = (int32_t)(uint32_t)c.key;
        bpe_sym *l = &s->sym[li];
        if (l->len == 0 || l->id != c.left || l->next < 0) continue;
        bpe_sym *r = &s->sym[l->next];
        if (r->id != c.right) continue;
        l->id = c.merged;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (l->next >= 0) s->sym[l->next].prev = li;
        bpe_prefetch_pair(t, s, l->prev);
        bpe_prefetch_pair(t, s, li);
        bpe_try_pair(t, s, l->prev);
        bpe_try_pair(t, s, li);
    }
    for (int32_t i = 0; i >= 0; i = s->sym[i].next) vec_push(out, s->sym[i].id);
}

/* ---- word cache -------------------------------------------------------------
 * Results of the merge loop for words of 2..WC_MAX_WORD bytes that are not a single
 * token, in a 2-way set-associative table shared by all encode calls (a new entry goes
 * to way 0, pushing way 0 to way 1). Each set is guarded by one of WC_STRIPES mutexes
 * (set index mod WC_STRIPES); the merge loop itself runs outside any lock. A slot holds
 * at most WC_MAX_IDS ids; longer results are not cached. */
#define WC_SETS (1u << 14)
#define WC_STRIPES 64u
#define WC_MAX_WORD 22
#define WC_MAX_IDS 8

typedef struct wc_slot {
    uint64_t hash;
    int32_t ids[WC_MAX_IDS];
    uint8_t len; /* 0 = empty */
    uint8_t n_ids;
    uint8_t word[WC_MAX_WORD];
} wc_slot;

typedef union wc_lock {
    pthread_mutex_t m;
    char pad[64]; /* one cache line each */
} wc_lock;

struct word_cache {
    wc_lock lock[WC_STRIPES];
    wc_slot *slot; /* 2 * WC_SETS: set i = slot[2i], slot[2i + 1] */
};

static word_cache *wc_new(void) {
    word_cache *c = xcalloc(1, sizeof *c);
    for (unsigned i = 0; i < WC_STRIPES; i++) DT_ASSERT(pthread_mutex_init(&c->lock[i].m, NULL) == 0);
    c->slot = xcalloc(2 * WC_SETS, sizeof *c->slot);
    return c;
}

static void wc_free(word_cache *c) {
    if (!c) return;
    for (unsigned i = 0; i < WC_STRIPES; i++) pthread_mutex_destroy(&c->lock[i].m);
    free(c->slot);
    free(c);
}

static size_t wc_set(uint64_t h) { return (size_t)(h >> 17) & (WC_SETS - 1); }

static bool wc_get(word_cache *c, uint64_t h, const uint8_t *w, size_t n, id_vec *out) {
    size_t set = wc_set(h), k = 0;
    int32_t ids[WC_MAX_IDS];
    bool hit = false;
    pthread_mutex_t *m = &c->lock[set % WC_STRIPES].m;
    pthread_mutex_lock(m);
    for (size_t way = 0; way < 2 && !hit; way++) {
        const wc_slot *s = &c->slot[2 * set + way];
        if (s->hash == h && s->len == n && memcmp(s->word, w, n) == 0) {
            hit = true;
            k = s->n_ids;
            memcpy(ids, s->ids, k * sizeof *ids);
        }
    }
    pthread_mutex_unlock(m);
    for (size_t j = 0; j < k; j++) vec_push(out, ids[j]);
    return hit;
}

static void wc_put(word_cache *c, uint64_t h, const uint8_t *w, size_t n, const int32_t *ids, size_t k) {
    if (k > WC_MAX_IDS) return;
    size_t set = wc_set(h);
    pthread_mutex_t *m = &c->lock[set % WC_STRIPES].m;
    pthread_mutex_lock(m);
    wc_slot *s = &c->slot[2 * set];
    s[1] = s[0];
    s->hash = h;
    s->len = (uint8_t)n;
    s->n_ids = (uint8_t)k;
    memcpy(s->word, w, n);
    memcpy(s->ids, ids, k * sizeof *ids);
    pthread_mutex_unlock(m);
}

/* Encodes one pre-token w[0..n), n >= 1; h = hash_bytes(w, n) (unused when n == 1). */
static void encode_word(const tokenizer *t, const uint8_t *w, size_t n, uint64_t h, bpe_scratch *s, id_vec *out) {
    if (n == 1) {
        vec_push(out, t->byte_id[w[0]]);
        return;
    }
    int32_t id = vmap_get_h(t, w, n, h);
    if (id >= 0 && t->whole_ok[id]) {
        vec_push(out, id);
        return;
    }
    if (n > WC_MAX_WORD) {
        bpe_word(t, w, n, s, out);
        return;
    }
    if (wc_get(t->cache, h, w, n, out)) return;
    size_t before = out->n;
    bpe_word(t, w, n, s, out);
    wc_put(t->cache, h, w, n, out->p + before, out->n - before);
}

/* ---- load ------------------------------------------------------------------ */

static const gguf_kv *find_str_array(const gguf_file *f, const char *key, ditto_err *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) {
        err_set(err, "%s: missing metadata key '%s'", f->path, key);
        return NULL;
    }
    if (kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING) {
        err_set(err, "%s: metadata '%s' has type %s (need an array of strings)", f->path, key,
                kv->type == GGUF_VT_ARRAY ? "array of non-strings" : gguf_vtype_name(kv->type));
        return NULL;
    }
    return kv;
}

static int check_str(const gguf_file *f, const char *key, const char *want, ditto_err *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return err_set(err, "%s: missing metadata key '%s' (need \"%s\")", f->path, key, want);
    if (kv->type != GGUF_VT_STRING)
        return err_set(err, "%s: metadata '%s' has type %s (need string \"%s\")", f->path, key,
                       gguf_vtype_name(kv->type), want);
    if (kv->str_len != strlen(want) || memcmp(kv->str, want, kv->str_len) != 0) {
        int n = kv->str_len > 64 ? 64 : (int)kv->str_len;
        return err_set(err, "%s: unsupported %s = \"%.*s\"%s (supported: \"%s\")", f->path, key, n, kv->str,
                       kv->str_len > 64 ? "..." : "", want);
    }
    return 0;
}

static int opt_token_id(const gguf_file *f, const char *key, int32_t n_vocab, int32_t *out, ditto_err *err) {
    *out = -1;
    if (!gguf_find_kv(f, key)) return 0;
    uint32_t v;
    if (gguf_get_u32(f, key, &v, err)) return -1;
    if (v >= (uint32_t)n_vocab)
        return err_set(err, "%s: %s = %u is out of range (vocabulary has %d tokens)", f->path, key, v, n_vocab);
    *out = (int32_t)v;
    return 0;
}

typedef struct spec_key {
    uint32_t first, len;
    int32_t id;
} spec_key;

/* By first byte, then longest first, then lowest id. */
static int spec_cmp(const void *pa, const void *pb) {
    const spec_key *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static void classify_chat(tokenizer *t, const gguf_file *f) {
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.chat_template");
    t->chat = CHAT_CHATML;
    t->chat_warn[0] = 0;
    if (!kv || kv->type != GGUF_VT_STRING) {
        snprintf(t->chat_warn, sizeof t->chat_warn,
                 "%s: no tokenizer.chat_template; using plain ChatML (<|im_start|>role ... <|im_end|>)", f->path);
        return;
    }
    const char *s = kv->str;
    size_t n = (size_t)kv->str_len;
    bool im = memmem(s, n, "<|im_start|>", 12) != NULL;
    bool think = memmem(s, n, "enable_thinking", 15) != NULL || memmem(s, n, "<think>", 7) != NULL;
    if (im && think) t->chat = CHAT_QWEN3;
    else if (!im)
        snprintf(t->chat_warn, sizeof t->chat_warn,
                 "%s: tokenizer.chat_template not recognised (%zu bytes); using plain ChatML", f->path, n);
}

int tokenizer_load(tokenizer **out, const gguf_file *f, ditto_err *err) {
    *out = NULL;
    if (check_str(f, "tokenizer.ggml.model", "gpt2", err)) return -1;
    if (check_str(f, "tokenizer.ggml.pre", "qwen2", err)) return -1;
    const gguf_kv *tk = find_str_array(f, "tokenizer.ggml.tokens", err);
    if (!tk) return -1;
    const gguf_kv *mk = find_str_array(f, "tokenizer.ggml.merges", err);
    if (!mk) return -1;
    const gguf_kv *ty = gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (!ty) return err_set(err, "%s: missing metadata key 'tokenizer.ggml.token_type'", f->path);
    if (ty->type != GGUF_VT_ARRAY || ty->arr_type != GGUF_VT_INT32)
        return err_set(err, "%s: metadata 'tokenizer.ggml.token_type' has type %s (need an array of int32)",
                       f->path, ty->type == GGUF_VT_ARRAY ? gguf_vtype_name(ty->arr_type) : gguf_vtype_name(ty->type));
    if (tk->arr_n == 0 || tk->arr_n > TOK_MAX_VOCAB)
        return err_set(err, "%s: tokenizer.ggml.tokens has %llu entries (need 1..%d)", f->path,
                       (unsigned long long)tk->arr_n, TOK_MAX_VOCAB);
    if (ty->arr_n != tk->arr_n)
        return err_set(err, "%s: tokenizer.ggml.token_type has %llu entries but tokenizer.ggml.tokens has %llu",
                       f->path, (unsigned long long)ty->arr_n, (unsigned long long)tk->arr_n);
    if (mk->arr_n >= UINT32_MAX)
        return err_set(err, "%s: tokenizer.ggml.merges has %llu entries (too many)", f->path,
                       (unsigned long long)mk->arr_n);

    int32_t nv = (int32_t)tk->arr_n;
    tokenizer *t = xcalloc(1, sizeof *t);
    t->n_vocab = nv;
    t->type = xmalloc((size_t)nv);
    t->whole_ok = xcalloc((size_t)nv, 1);
    t->off = xmalloc(((size_t)nv + 1) * sizeof *t->off);
    int16_t inv[324];
    byte_unicode_inverse(inv);

    /* pieces: decoded bytes, never longer than the stored string */
    size_t total = 0;
    for (int32_t i = 0; i < nv; i++) {
        uint64_t l;
        gguf_arr_str(f, tk, (uint64_t)i, &l);
        if (l == 0 || l > TOK_MAX_PIECE) {
            tokenizer_free(t);
            return err_set(err, "%s: tokenizer.ggml.tokens[%d] has length %llu (need 1..%d)", f->path, i,
                           (unsigned long long)l, TOK_MAX_PIECE);
        }
        total += (size_t)l;
        int32_t v;
        memcpy(&v, ty->arr_data + 4 * (size_t)i, 4);
        if (v < 0 || v > TOK_TYPE_BYTE) {
            tokenizer_free(t);
            return err_set(err, "%s: tokenizer.ggml.token_type[%d] = %d (need 0..6)", f->path, i, v);
        }
        t->type[i] = v == 0 ? TOK_TYPE_NORMAL : (uint8_t)v;
    }
    if (total >= UINT32_MAX) {
        tokenizer_free(t);
        return err_set(err, "%s: tokenizer.ggml.tokens total %zu bytes (too large)", f->path, total);
    }
    t->pieces = xmalloc(total + 1);
    size_t pos = 0;
    for (int32_t i = 0; i < nv; i++) {
        uint64_t l;
        const uint8_t *s = (const uint8_t *)gguf_arr_str(f, tk, (uint64_t)i, &l);
        t->off[i] = (uint32_t)pos;
        if (t->type[i] == TOK_TYPE_NORMAL) {
            pos += byte_level_decode(inv, s, (size_t)l, (uint8_t *)t->pieces + pos);
        } else {
            memcpy(t->pieces + pos, s, (size_t)l);
            pos += (size_t)l;
        }
        if (pos - t->off[i] > t->max_piece) t->max_piece = pos - t->off[i];
    }
    t->off[nv] = (uint32_t)pos;

    t->vmask = pow2_at_least((size_t)nv + (size_t)nv / 2) - 1; /* load <= 2/3 */
    t->vmap = xcalloc(t->vmask + 1, sizeof *t->vmap);
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; i < nv; i++)
            if ((t->type[i] == TOK_TYPE_NORMAL) == (pass == 0) && piece_len(t, i) > 0) vmap_put(t, i);

    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        int32_t id = vmap_get(t, &c, 1);
        if (id < 0 || t->type[id] != TOK_TYPE_NORMAL) {
            int rc = err_set(err, "%s: tokenizer.ggml.tokens has no token for byte 0x%02x", f->path, b);
            tokenizer_free(t);
            return rc;
        }
        t->byte_id[b] = id;
    }

    /* merges */
    t->n_merges = (uint32_t)mk->arr_n;
    t->pmask = pow2_at_least((size_t)mk->arr_n + (size_t)mk->arr_n / 2) - 1;
    t->pmap = xmalloc((t->pmask + 1) * sizeof *t->pmap);
    for (size_t i = 0; i <= t->pmask; i++) t->pmap[i].key = UINT64_MAX;
    uint8_t *mbuf = xmalloc(2 * TOK_MAX_PIECE + 2);
    for (uint64_t m = 0; m < mk->arr_n; m++) {
        uint64_t l;
        const uint8_t *s = (const uint8_t *)gguf_arr_str(f, mk, m, &l);
        const uint8_t *sp = l <= 2 * TOK_MAX_PIECE + 1 ? memchr(s, ' ', (size_t)l) : NULL;
        bool form = sp && sp > s && sp + 1 < s + l && !memchr(sp + 1, ' ', (size_t)(s + l - sp - 1));
        int32_t a = -1, b = -1, ab = -1;
        if (form) {
            size_t la = byte_level_decode(inv, s, (size_t)(sp - s), mbuf);
            size_t lb = byte_level_decode(inv, sp + 1, (size_t)(s + l - sp - 1), mbuf + la);
            a = vmap_get(t, mbuf, la);
            b = vmap_get(t, mbuf + la, lb);
            ab = vmap_get(t, mbuf, la + lb);
        }
        if (a < 0 || b < 0 || ab < 0) {
            int n = l > 80 ? 80 : (int)l;
            int rc = err_set(err, "%s: tokenizer.ggml.merges[%llu] = \"%.*s\" %s", f->path, (unsigned long long)m, n,
                             (const char *)s,
                             !form ? "is not of the form \"left right\"" : "names a token missing from the vocabulary");
            free(mbuf);
            tokenizer_free(t);
            return rc;
        }
        pmap_put(t, a, b, (uint32_t)m, ab);
    }
    free(mbuf);

    /* whole-token shortcut: valid where BPE of the token's own bytes is that token */
    bpe_scratch sc = {0};
    id_vec tmp = {0};
    for (int32_t i = 0; i < nv; i++) {
        if (t->type[i] != TOK_TYPE_NORMAL || vmap_get(t, (const uint8_t *)t->pieces + t->off[i], piece_len(t, i)) != i)
            continue;
        tmp.n = 0;
        bpe_word(t, (const uint8_t *)t->pieces + t->off[i], piece_len(t, i), &sc, &tmp);
        t->whole_ok[i] = tmp.n == 1 && tmp.p[0] == i;
    }
    scratch_free(&sc);
    free(tmp.p);

    /* specials: control and user-defined tokens, bucketed by first byte */
    size_t n_spec = 0;
    for (int32_t i = 0; i < nv; i++) n_spec += t->type[i] == TOK_TYPE_CONTROL || t->type[i] == TOK_TYPE_USER;
    spec_key *sk = xmalloc((n_spec ? n_spec : 1) * sizeof *sk);
    n_spec = 0;
    for (int32_t i = 0; i < nv; i++)
        if (t->type[i] == TOK_TYPE_CONTROL || t->type[i] == TOK_TYPE_USER)
            sk[n_spec++] = (spec_key){(uint8_t)t->pieces[t->off[i]], (uint32_t)piece_len(t, i), i};
    qsort(sk, n_spec, sizeof *sk, spec_cmp);
    t->spec = xmalloc((n_spec ? n_spec : 1) * sizeof *t->spec);
    for (size_t k = 0; k < n_spec; k++) {
        t->spec[k] = sk[k].id;
        t->spec_start[sk[k].first + 1]++;
    }
    free(sk);
    for (int b = 0; b < 256; b++) t->spec_start[b + 1] += t->spec_start[b];
    t->n_spec = (uint32_t)n_spec;
    t->spec_lead = -1;
    if (n_spec && t->spec_start[(uint8_t)t->pieces[t->off[t->spec[0]]] + 1] == n_spec)
        t->spec_lead = (uint8_t)t->pieces[t->off[t->spec[0]]];

    if (opt_token_id(f, "tokenizer.ggml.eos_token_id", nv, &t->eos, err) ||
        opt_token_id(f, "tokenizer.ggml.bos_token_id", nv, &t->bos, err) ||
        opt_token_id(f, "tokenizer.ggml.padding_token_id", nv, &t->pad, err)) {
        tokenizer_free(t);
        return -1;
    }
    t->im_end = tokenizer_find(t, "<|im_end|>", 10);
    t->endoftext = tokenizer_find(t, "<|endoftext|>", 13);

    int ec;
    PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)qwen2_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        int rc = err_set(err, "tokenizer: cannot compile the qwen2 pre-tokenizer regex: %s at %zu", (char *)msg,
                         (size_t)eo);
        tokenizer_free(t);
        return rc;
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* failure: the interpreter is used */

    classify_chat(t, f);
    t->cache = wc_new();
    t->nfc_inert = nfc_inert_build();
    *out = t;
    return 0;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->type);
    free(t->whole_ok);
    free(t->off);
    free(t->pieces);
    free(t->vmap);
    free(t->pmap);
    free(t->spec);
    if (t->re) pcre2_code_free(t->re);
    wc_free(t->cache);
    free(t->nfc_inert);
    free(t);
}

/* ---- encode ---------------------------------------------------------------- */

/* The Qwen2 split regex evaluated by hand on ASCII-only text, alternative by
 * alternative in the regex's order (PCRE picks the first alternative that matches at
 * the current position). On ASCII: \p{L} = [A-Za-z], \p{N} = [0-9], \s = [\t\n\v\f\r ].
 * tests/test_tokenizer.c checks it against PCRE2 on random ASCII text. */
static inline bool a_let(uint8_t c) { return (uint8_t)((c | 0x20) - 'a') < 26; }
static inline bool a_dig(uint8_t c) { return (uint8_t)(c - '0') < 10; }
static inline bool a_spc(uint8_t c) { return c == ' ' || (uint8_t)(c - '\t') < 5; }
static inline bool a_nl(uint8_t c) { return c == '\r' || c == '\n'; }
static inline bool a_oth(uint8_t c) { return !a_let(c) && !a_dig(c) && !a_spc(c); }

/* End of the pre-token that starts at s[i] (i < n). */
static size_t ascii_pretoken_end(const uint8_t *s, size_t n, size_t i) {
    uint8_t c = s[i];
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d)  (| 0x20 folds only letters onto these letters) */
    if (c == '\'' && i + 1 < n) {
        uint8_t d = s[i + 1] | 0x20;
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
        if (i + 2 < n) {
            uint8_t e = s[i + 2] | 0x20;
            if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return i + 3;
        }
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    size_t j = i;
    if (!a_let(c) && !a_dig(c) && !a_nl(c) && i + 1 < n && a_let(s[i + 1])) j = i + 1;
    if (a_let(s[j])) {
        while (j < n && a_let(s[j])) j++;
        return j;
    }
    /* \p{N} */
    if (a_dig(c)) return i + 1;
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    j = c == ' ' && i + 1 < n && a_oth(s[i + 1]) ? i + 1 : i;
    if (a_oth(s[j])) {
        while (j < n && a_oth(s[j])) j++;
        while (j < n && a_nl(s[j])) j++;
        return j;
    }
    /* c is whitespace; e = end of the run */
    size_t e = i;
    while (e < n && a_spc(s[e])) e++;
    /* \s*[\r\n]+ : \s* backs off to the run's last CR/LF */
    for (size_t k = e; k > i; k--)
        if (a_nl(s[k - 1])) return k;
    /* \s+(?!\S) : the whole run at the end of text, else all but its last char */
    if (e == n || e - i >= 2) return e == n ? e : e - 1;
    /* \s+ */
    return e;
}

/* Pre-tokens wait in a short FIFO so that the vocabulary-map slot of each is
 * prefetched several words before it is looked up. */
#define WQ_LEN 8

typedef struct wq_item {
    const uint8_t *w;
    size_t n;
    uint64_t h;
} wq_item;

typedef struct enc_ctx {
    const tokenizer *t;
    pcre2_match_data *md;
    bpe_scratch sc;
    id_vec out;
    ditto_err *err;
    wq_item q[WQ_LEN];
    size_t q_head, q_n;
} enc_ctx;

static void wq_pop(enc_ctx *c) {
    const wq_item *it = &c->q[c->q_head];
    encode_word(c->t, it->w, it->n, it->h, &c->sc, &c->out);
    c->q_head = (c->q_head + 1) % WQ_LEN;
    c->q_n--;
}

/* Encodes every queued word: call before emitting anything else and before the
 * text the queue points into goes away. */
static void wq_flush(enc_ctx *c) {
    while (c->q_n) wq_pop(c);
}

static void wq_add(enc_ctx *c, const uint8_t *w, size_t n) {
    if (c->q_n == WQ_LEN) wq_pop(c);
    uint64_t h = 0;
    if (n > 1) {
        h = hash_bytes(w, n);
        __builtin_prefetch(&c->t->vmap[(size_t)h & c->t->vmask]);
    }
    c->q[(c->q_head + c->q_n) % WQ_LEN] = (wq_item){w, n, h};
    c->q_n++;
}

/* Runs the pre-tokenizer over valid UTF-8 s[0..n) and encodes each piece. */
static int pretokenize(enc_ctx *c, const uint8_t *s, size_t n) {
    if (!c->md) {
        c->md = pcre2_match_data_create_from_pattern(c->t->re, NULL);
        DT_ASSERT(c->md);
    }
    size_t off = 0;
    while (off < n) {
        int rc = pcre2_match(c->t->re, s, n, off, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(c->t->re, s, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) {
            wq_add(c, s + off, n - off);
            return 0;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return err_set(c->err, "tokenizer: pre-tokenizer regex failed at byte %zu: %s", off, (char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t b = ov[0], e = ov[1];
        if (b > off) wq_add(c, s + off, b - off); /* unmatched gap */
        if (e == b) { /* empty match (not produced by this pattern): step one character */
            size_t l = utf8_seq(s + b, n - b, NULL);
            e = b + (l ? l : 1);
        }
        wq_add(c, s + b, e - b);
        off = e;
    }
    return 0;
}

/* A segment without special tokens: NFC each valid stretch, invalid bytes alone. */
static int encode_segment(enc_ctx *c, const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        bool need_nfc, ascii;
        size_t v = utf8_valid_prefix(c->t->nfc_inert, s + i, n - i, &need_nfc, &ascii);
        if (v > 0 && ascii) {
            for (size_t p = i, e; p < i + v; p = e) {
                e = p + ascii_pretoken_end(s + p, i + v - p, 0);
                wq_add(c, s + p, e - p);
            }
        } else if (v > 0) {
            int rc;
            utf8proc_uint8_t *norm = NULL;
            utf8proc_ssize_t nl = -1;
            if (need_nfc)
                nl = utf8proc_map(s + i, (utf8proc_ssize_t)v, &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (nl >= 0 && norm) rc = pretokenize(c, norm, (size_t)nl);
            else rc = pretokenize(c, s + i, v);
            wq_flush(c); /* before norm is freed */
            free(norm);
            if (rc) return -1;
        }
        i += v;
        if (i < n) {
            wq_flush(c);
            vec_push(&c->out, c->t->byte_id[s[i++]]);
        }
    }
    return 0;
}

/* Leftmost special token at or after from; returns its start (n if none). */
static size_t find_special(const tokenizer *t, const uint8_t *s, size_t n, size_t from, int32_t *id, size_t *len) {
    for (size_t i = from; i < n; i++) {
        if (t->spec_lead >= 0) { /* all specials start with one byte (Qwen: '<'): jump to it */
            const uint8_t *q = memchr(s + i, t->spec_lead, n - i);
            if (!q) return n;
            i = (size_t)(q - s);
        }
        uint32_t a = t->spec_start[s[i]], b = t->spec_start[s[i] + 1];
        for (uint32_t k = a; k < b; k++) {
            int32_t sid = t->spec[k];
            size_t l = piece_len(t, sid);
            if (l <= n - i && memcmp(s + i, t->pieces + t->off[sid], l) == 0) {
                *id = sid;
                *len = l;
                return i;
            }
        }
    }
    return n;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool parse_special, int32_t **ids,
                     size_t *n_ids, ditto_err *err) {
    enc_ctx c = {.t = t, .err = err};
    const uint8_t *s = (const uint8_t *)text;
    size_t pos = 0;
    int rc = 0;
    while (pos < len && rc == 0) {
        int32_t sid = -1;
        size_t sl = 0;
        size_t e = parse_special && t->n_spec ? find_special(t, s, len, pos, &sid, &sl) : len;
        if (e > pos) rc = encode_segment(&c, s + pos, e - pos);
        if (e < len) {
            wq_flush(&c);
            vec_push(&c.out, sid);
            e += sl;
        }
        pos = e;
    }
    wq_flush(&c);
    if (c.md) pcre2_match_data_free(c.md);
    scratch_free(&c.sc);
    if (rc) {
        free(c.out.p);
        *ids = NULL;
        *n_ids = 0;
        return -1;
    }
    *ids = c.out.p ? c.out.p : xmalloc(sizeof(int32_t));
    *n_ids = c.out.n;
    return 0;
}

/* ---- decode & queries ------------------------------------------------------ */

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *out_len, ditto_err *err) {
    size_t total = 0;
    *out = NULL;
    *out_len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return err_set(err, "token id %d at index %zu is out of range (vocabulary has %d tokens)", ids[i], i,
                           t->n_vocab);
        total += piece_len(t, ids[i]);
    }
    char *o = xmalloc(total + 1);
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = piece_len(t, ids[i]);
        memcpy(o + p, t->pieces + t->off[ids[i]], l);
        p += l;
    }
    o[p] = 0;
    *out = o;
    *out_len = p;
    return 0;
}

const char *tokenizer_piece(const tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = piece_len(t, id);
    return t->pieces + t->off[id];
}

size_t tokenizer_max_piece_len(const tokenizer *t) { return t->max_piece; }
int32_t tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_eos(const tokenizer *t) { return t->eos; }
int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int32_t tokenizer_pad(const tokenizer *t) { return t->pad; }

int tokenizer_token_type(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->type[id] : 0;
}

bool tokenizer_is_special(const tokenizer *t, int32_t id) {
    int ty = tokenizer_token_type(t, id);
    return ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER;
}

bool tokenizer_is_eog(const tokenizer *t, int32_t id) {
    return id >= 0 && (id == t->eos || id == t->im_end || id == t->endoftext);
}

int32_t tokenizer_find(const tokenizer *t, const char *s, size_t len) {
    if (len == 0) return -1;
    return vmap_get(t, (const uint8_t *)s, len);
}

int32_t tokenizer_byte_token(const tokenizer *t, uint8_t b) { return t->byte_id[b]; }

/* ---- streaming detokenizer ------------------------------------------------- */

static const char utf8_fffd[3] = {(char)0xef, (char)0xbf, (char)0xbd};

void detok_stream_init(detok_stream *ds, const tokenizer *tok) {
    memset(ds, 0, sizeof *ds);
    ds->tok = tok;
    /* output: every input byte may become a 3-byte U+FFFD; then the input scratch */
    size_t in_cap = tok->max_piece + sizeof ds->pend;
    ds->cap = 3 * in_cap;
    ds->buf = xmalloc(ds->cap + in_cap);
}

void detok_stream_free(detok_stream *ds) {
    free(ds->buf);
    memset(ds, 0, sizeof *ds);
}

const char *detok_stream_push(detok_stream *ds, int32_t id, size_t *len) {
    const tokenizer *t = ds->tok;
    DT_ASSERT(id >= 0 && id < t->n_vocab);
    DT_ASSERT(ds->n_pend < sizeof ds->pend);
    uint8_t *in = (uint8_t *)ds->buf + ds->cap;
    size_t pl = piece_len(t, id), n = ds->n_pend + pl;
    memcpy(in, ds->pend, ds->n_pend);
    memcpy(in + ds->n_pend, t->pieces + t->off[id], pl);
    ds->n_pend = 0;
    char *o = ds->buf;
    size_t p = 0;
    for (size_t i = 0; i < n;) {
        if (in[i] < 0x80) {
            o[p++] = (char)in[i++];
            continue;
        }
        bool incomplete;
        size_t l = utf8_seq(in + i, n - i, &incomplete);
        if (l) {
            memcpy(o + p, in + i, l);
            p += l;
            i += l;
        } else if (incomplete) { /* a valid prefix at the very end: hold it back */
            DT_ASSERT(n - i < sizeof ds->pend);
            memcpy(ds->pend, in + i, n - i);
            ds->n_pend = n - i;
            break;
        } else {
            memcpy(o + p, utf8_fffd, 3);
            p += 3;
            i += utf8_bad_len(in + i, n - i);
        }
    }
    DT_ASSERT(p <= ds->cap);
    *len = p;
    return ds->buf;
}

const char *detok_stream_flush(detok_stream *ds, size_t *len) {
    size_t p = 0;
    if (ds->n_pend) {
        memcpy(ds->buf, utf8_fffd, 3);
        p = 3;
        ds->n_pend = 0;
    }
    *len = p;
    return ds->buf;
}

/* ---- `ditto tokenize` -------------------------------------------------------- */

static void print_piece(FILE *o, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        if (c >= 0x80) {
            size_t l = utf8_seq(s + i, n - i, NULL);
            if (l) {
                fwrite(s + i, 1, l, o);
                i += l;
            } else {
                fprintf(o, "\\x%02x", c);
                i++;
            }
            continue;
        }
        if (c == '\n') fputs("\\n", o);
        else if (c == '\r') fputs("\\r", o);
        else if (c == '\t') fputs("\\t", o);
        else if (c == '\\') fputs("\\\\", o);
        else if (c < 0x20 || c == 0x7f) fprintf(o, "\\x%02x", c);
        else fputc(c, o);
        i++;
    }
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = xmalloc(cap);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(b, cap);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    *len = n;
    return b;
}

static int tokenize_usage(void) {
    fprintf(stderr, "usage: ditto tokenize [-m FILE] [--pieces] [--no-special] [--] [TEXT | -]\n"
                    "  prints the token ids of TEXT (stdin if absent or -), space-separated;\n"
                    "  --pieces      one \"id<TAB>piece\" line per token instead\n"
                    "  --no-special  treat <|im_start|> and other special token texts as plain text\n");
    return 2;
}

int tokenizer_cmd(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    bool pieces = false, special = true, opts = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts && (!strcmp(a, "-m") || !strcmp(a, "--model"))) {
            if (++i >= argc) return tokenize_usage();
            model = argv[i];
        } else if (opts && !strcmp(a, "--pieces")) {
            pieces = true;
        } else if (opts && !strcmp(a, "--no-special")) {
            special = false;
        } else if (opts && !strcmp(a, "--")) {
            opts = false;
        } else if (opts && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            tokenize_usage();
            return 0;
        } else if (opts && a[0] == '-' && a[1]) {
            fprintf(stderr, "ditto tokenize: unknown option '%s'\n", a);
            return tokenize_usage();
        } else if (!text) {
            text = a;
        } else {
            fprintf(stderr, "ditto tokenize: more than one TEXT argument (quote the text)\n");
            return tokenize_usage();
        }
    }
    if (!model) model = "models/tiny-qwen3moe-q4_k_m.gguf"; /* the shipped default */
    char *owned = NULL;
    size_t len;
    if (!text || !strcmp(text, "-")) {
        owned = read_all(stdin, &len);
        if (!owned) {
            fprintf(stderr, "ditto tokenize: cannot read stdin\n");
            return 1;
        }
        text = owned;
    } else {
        len = strlen(text);
    }
    ditto_err err = {{0}};
    gguf_file *f = NULL;
    tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    if (gguf_open(&f, model, &err) || tokenizer_load(&tok, f, &err) ||
        tokenizer_encode(tok, text, len, special, &ids, &n, &err)) {
        fprintf(stderr, "ditto tokenize: %s\n", err.msg);
    } else {
        for (size_t i = 0; i < n; i++) {
            if (pieces) {
                size_t pl;
                const char *p = tokenizer_piece(tok, ids[i], &pl);
                printf("%d\t", ids[i]);
                print_piece(stdout, (const uint8_t *)p, pl);
                putchar('\n');
            } else {
                printf(i ? " %d" : "%d", ids[i]);
            }
        }
        if (!pieces) putchar('\n');
        rc = fflush(stdout) ? 1 : 0;
    }
    free(ids);
    tokenizer_free(tok);
    if (f) gguf_close(f);
    free(owned);
    return rc;
}

enum chat_kind tokenizer_chat_kind(const tokenizer *t) { return t->chat; }
const char *tokenizer_chat_warning(const tokenizer *t) { return t->chat_warn[0] ? t->chat_warn : NULL; }
