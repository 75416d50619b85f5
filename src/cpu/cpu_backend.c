/* cpu_backend.c — the CPU forward pass over a batch (qwen3moe / qwen3).
 *
 * Every row's arithmetic follows docs/arithmetic.md and depends only on that
 * row's token, position and KV contents: work is split over output rows,
 * tokens, heads and expert pairs, never over a reduction, so batch company and
 * thread count cannot change a bit. */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend.h"
#include "cpu/attn.h"
#include "cpu/claim.h"
#include "cpu/cpu_prof.h"
#include "cpu/cpu_quant.h"
#include "cpu/prefetch.h"
#include "cpu/prepared.h"
#include "cpu/vec.h"
#include "cpu/repack.h"
#include "mathx.h"
#include "pool.h"
#include "quant.h"

#define GEMM_UNIT 16   /* rows per work unit of a repacked matrix (one REPACK_ROWS group) */
#define GEMM_UNIT_BYTES 16384 /* a float matrix's unit: as many rows as fit, 1..GEMM_UNIT */
#define GEMM_FINE_TOK 4       /* ... for calls of up to this many tokens (more: each call re-reads them all) */
#define ONE_JOB_MAX_THREADS 8 /* the one-job solo step's default reach (see cpu_create) */
#define MAX_JOBS 1024
#define SOLO_BARRIERS 9 /* solo_task: eight a layer, then one before the output head */

typedef struct gemm_job {
    quant_gemm_fn fn;
    repack_gemm_next_fn fn_nx; /* the repacked kernel told what follows the call, or NULL */
    const void *w;
    size_t row_bytes;
    int rows, k;
    const void *act;
    size_t act_bytes;
    int n_tok;
    float *out;
    size_t out_stride;
    int unit_rows;      /* rows per work unit */
    size_t unit_stride; /* weight bytes from one unit to the next */
    size_t w_row_bytes; /* a row's bytes in the model's format (what the calls profile counts) */
} gemm_job;

/* What one thread requests into its L2 while it waits in the pool (pool_run_idle): the first
 * CPU_AHEAD_BYTES of its own segment of the gemm stage that comes next, in the order its kernel
 * calls will read them. Each thread's on its own cache lines: only that thread writes `done`. */
typedef struct ahead_thr {
    cpu_next r;
    size_t done; /* bytes of r requested so far */
} __attribute__((aligned(64))) ahead_thr;

/* A job of the plan being built: what ahead_finish needs of a gemm_job. */
typedef struct ahead_job {
    const uint8_t *w;
    size_t unit_stride;
    int units;
} ahead_job;

/* Activations of one input width in every format a weight may ask for. */
typedef struct act_set {
    int width;
    float *f32;       /* [rows][width] (points at the source) */
    uint8_t *q32;     /* [rows][width/32 blocks] */
    uint8_t *q256;    /* [rows][width/256 blocks] (NULL if width % 256) */
    size_t b32, b256; /* bytes per row */
} act_set;

typedef struct cpu_state {
    const model *m;
    kv_arena *kv;
    pool *pool;
    int nth, max_rows, level;
    int stream; /* enum cpu_stream of the one-token kernels */
    size_t ahead_bytes; /* of the next gemm stage, each waiting thread requests (ahead_finish) */
    bool prfchw; /* the CPU has PREFETCHW */
    char desc[160];
    quant_gemm_fn gemm[QT_COUNT];
    repack_gemm_next_fn gemm_rp[QT_COUNT];  /* kernels on repacked matrices */
    const cpu_prepared *prep;
    float *rope_cos, *rope_sin; /* [ctx][head_dim/2] */
    float attn_scale;
    /* scratch, sized for max_rows rows */
    float *x, *xn, *q, *k, *v, *att, *tmp;  /* [R][...] */
    act_set a_embd, a_att, a_ff;            /* inputs of width n_embd, n_head*hd, ffn */
    float *router;                          /* [R][n_expert] */
    int32_t *sel;                           /* [R][n_used] expert ids by rank */
    float *selw;                            /* [R][n_used] weights */
    int32_t *pair_row, *pair_of;            /* pair p -> row; (row, rank) -> pair */
    int *exp_cnt, *exp_off;                 /* per expert */
    uint8_t *xg;                            /* [P][act bytes] gathered expert inputs */
    float *g, *u, *h, *y;                   /* [P][ffn] / [P][n_embd] */
    float *scores;                          /* [nth][scratch_stride] attention scratch */
    size_t scratch_stride;                  /* attn_scratch_floats for a GQA group at full ctx, rounded to 64 B */
    attn_fn attn;
    vec_swiglu_fn swiglu;
    vec_rmsnorm_fn rmsnorm;
    int ffn;                                /* n_ff_exp or n_ff */
    int n_pairs_max;
    gemm_job jobs[MAX_JOBS];
    int n_jobs;
    int job_unit0[MAX_JOBS + 1];            /* first global unit of each job; [n_jobs] = total */
    claim_set claim;                        /* the units of the running jobs, over the threads */
    cpu_next warm;                          /* inputs of the stage after the running jobs (thread 0 runs it) */
    ahead_thr *ahead[2];                    /* [nth] each: the plan published to the pool, and the next */
    int ahead_cur;                          /* which of the two is published */
    bool ahead_new;                         /* ahead[!ahead_cur] holds a plan to publish with the next pool job */
    ahead_job ahead_jobs[MAX_JOBS];         /* the next plan's jobs, while it is built */
    int n_ahead_jobs;
    /* the solo step as one pool job (solo_task): on, and each thread's copies of the rows every
     * thread computes whole (the norms' outputs, the routing) */
    bool one_job;
    int runs_solo, runs_batch; /* claim_set.runs in steps of one row / of more (cpu_tune) */
    float *xn_t, *xr_t;                     /* [nth][n_embd]: the norms' outputs, x + the o projection */
    act_set *a_t;                           /* [nth]: one row of width n_embd, f32 = xn_t's */
    act_set *aat_t;                         /* [nth]: one row of width n_head * head_dim (f32 = att) */
    bool att_whole;                         /* a KV-head group's attention output is whole Q8_K blocks */
    int32_t *sel_t;                         /* [nth][n_used] */
    float *selw_t;                          /* [nth][n_used] */
    uint64_t weight_bytes, kv_bytes; /* read so far (bench counters) */
    cpu_prof prof; /* the optional step profile (backend_ops.profile, .calls) */
} cpu_state;

/* ---- activation sets ----------------------------------------------------------- */

static void act_set_init(act_set *a, int width, int rows) {
    a->width = width;
    a->b32 = width % QK32 == 0 ? quant_act_bytes(QA_Q8_32, width) : 0;
    a->b256 = width % QK_K == 0 ? quant_act_bytes(QA_Q8_256, width) : 0;
    a->q32 = a->b32 ? xaligned(a->b32 * (size_t)rows) : NULL;
    a->q256 = a->b256 ? xaligned(a->b256 * (size_t)rows) : NULL;
}
static void act_set_free(act_set *a) {
    free(a->q32);
    free(a->q256);
}

/* Quantizes row r of src (width floats) into every format in mask (bit = enum quant_act). */
static void act_row(const cpu_state *st, act_set *a, const float *src, int r, unsigned mask) {
    if ((mask & (1u << QA_Q8_32)) && a->q32)
        cpu_quant_act_row(QA_Q8_32, src, a->q32 + (size_t)r * a->b32, a->width, st->level);
    if ((mask & (1u << QA_Q8_256)) && a->q256)
        cpu_quant_act_row(QA_Q8_256, src, a->q256 + (size_t)r * a->b256, a->width, st->level);
}

static unsigned act_mask(const model_weight *w) { return 1u << quant_traits_of(w->type)->act; }

/* Pointer and row stride of the activations weight w reads. */
static const void *act_for(const act_set *a, const model_weight *w, size_t *bytes) {
    switch (quant_traits_of(w->type)->act) {
    case QA_Q8_32: *bytes = a->b32; return a->q32;
    case QA_Q8_256: *bytes = a->b256; return a->q256;
    default: *bytes = (size_t)a->width * sizeof(float); return a->f32;
    }
}

/* ---- gemm jobs: all rows of all queued jobs split over threads ------------------------ */

/* The bytes a gemm over matrix mat of w reads: the prepared copy where there is one (repacked,
 * or plain on huge pages), else the file's; its work units: *unit_rows rows (GEMM_UNIT, the
 * quantized kernels' row group; for a float matrix, whose kernels go row by row, as many as
 * fit GEMM_UNIT_BYTES, so one of long rows — the f32 router, 8 units of 16 rows — still splits
 * finely between threads; at more than GEMM_FINE_TOK tokens, GEMM_UNIT rows halved down to 4
 * until there are two units a thread, so that many threads share the router: on 16 threads its
 * 8 units of 16 rows kept half of them idle) and *unit_stride bytes apart; *pw = the prepared
 * copy or NULL. */
static const uint8_t *job_weights(const cpu_state *st, const model_weight *w, int mat, int n_tok, int *unit_rows,
                                  size_t *unit_stride, const prep_weight **pw) {
    *pw = cpu_prepared_find(st->prep, w);
    const bool fl = quant_type_is_float(w->type);
    if (fl && n_tok <= GEMM_FINE_TOK)
        *unit_rows = (int)DT_MAX((size_t)1, DT_MIN((size_t)GEMM_UNIT, GEMM_UNIT_BYTES / w->row_bytes));
    else
        for (*unit_rows = GEMM_UNIT; fl && *unit_rows > 4 && (w->rows + *unit_rows - 1) / *unit_rows < 2 * st->nth;)
            *unit_rows /= 2;
    if (*pw && (*pw)->repacked)
        *unit_stride = (*pw)->group_bytes * (GEMM_UNIT / REPACK_ROWS);
    else
        *unit_stride = w->row_bytes * (size_t)*unit_rows;
    return *pw ? (*pw)->data + (size_t)mat * (*pw)->mat_stride : (const uint8_t *)w->data + (size_t)mat * w->mat_bytes;
}

static void job_add(cpu_state *st, const model_weight *w, int mat, const void *act, size_t act_bytes,
                    int n_tok, float *out, size_t out_stride) {
    DT_ASSERT(st->n_jobs < MAX_JOBS);
    gemm_job *j = &st->jobs[st->n_jobs++];
    const prep_weight *pw;
    j->w = job_weights(st, w, mat, n_tok, &j->unit_rows, &j->unit_stride, &pw);
    j->fn_nx = NULL;
    if (pw && pw->repacked) {
        j->fn = NULL;
        j->fn_nx = st->gemm_rp[w->type];
        j->row_bytes = pw->group_bytes;
    } else {
        j->fn = st->gemm[w->type];
        j->row_bytes = w->row_bytes;
    }
    j->rows = w->rows;
    j->w_row_bytes = w->row_bytes;
    j->k = w->cols;
    j->act = act;
    j->act_bytes = act_bytes;
    j->n_tok = n_tok;
    j->out = out;
    j->out_stride = out_stride;
    st->weight_bytes += (uint64_t)w->rows * w->row_bytes;
}

/* The job holding unit u (hint: a nearby job index). */
static int job_of(const cpu_state *st, int u, int hint) {
    while (st->job_unit0[hint + 1] <= u) hint++;
    while (st->job_unit0[hint] > u) hint--;
    return hint;
}

/* The stream form (cpu/prefetch.h) in which job j's kernel requests its weights: the host's
 * for the one-token kernels on repacked matrices, CPU_STREAM_NEAR_FAR for the rest. */
static int job_form(const cpu_state *st, const gemm_job *j) {
    return j->fn_nx && j->n_tok == 1 ? st->stream : CPU_STREAM_NEAR_FAR;
}

/* Prefetches the start of a stream at p with `left` bytes to its end, read in stream form f, that
 * no earlier call of this thread streams on into (a run's first call), so the kernel that starts
 * there does not wait a full memory latency for its first lines: the first CPU_FORM_DIST bytes into
 * L1 and the lines up to CPU_FORM_FAR into L2 — the kernel's own requests run that far ahead of it.
 * (Without it, on the Zen 5 host, the solo step read 0.998x: ditto bench --switch, forty-eighth
 * session.) */
static void stream_prefetch(const char *p, size_t left, int f) {
    const size_t n = DT_MIN((size_t)CPU_FORM_DIST(f), left);
    for (size_t o = 0; o < n; o += 64) _mm_prefetch(p + o, CPU_PF_HINT);
    for (size_t o = n; o < DT_MIN((size_t)CPU_FORM_FAR(f), left); o += 64) _mm_prefetch(p + o, CPU_PF_FAR_HINT);
}

/* The stream at p (left bytes to its end, form f), its first CPU_FORM_SPAN bytes: where the kernel
 * before it keeps streaming once its own rows end, so the next call finds its first lines requested
 * at the kernel's own lead. (Before, the thread requested the next call's first CPU_FORM_DIST bytes
 * in one burst before each call and the kernel streamed on past them: on the Zen 5 host the burst's
 * 64 back-to-back requests held the core ~2.5% of its time (perf), and without it the solo step
 * read 1.009-1.013x, ditto bench --switch, three runs of 250-300 pairs, and a batch of 6 streams
 * lost nothing: bench/cpu-speed-log.md, forty-eighth session. Not measured on a near-far host (Intel);
 * plain and touch make no requests, so Zen 4 is unchanged.) */
static void stream_next(const uint8_t *p, size_t left, int f, cpu_next *nx) {
    nx->n = 0;
    if (left && CPU_FORM_SPAN(f)) {
        nx->p[0] = p;
        nx->len[0] = DT_MIN((size_t)CPU_FORM_SPAN(f), left);
        nx->n = 1;
    }
}

/* stream_prefetch / stream_next for job ji's weights from unit u on. */
static void job_prefetch(const cpu_state *st, int u, int ji) {
    const gemm_job *j = &st->jobs[ji];
    stream_prefetch((const char *)j->w + (size_t)(u - st->job_unit0[ji]) * j->unit_stride,
                    (size_t)(st->job_unit0[ji + 1] - u) * j->unit_stride, job_form(st, j));
}
static void job_next(const cpu_state *st, int u, int ji, cpu_next *nx) {
    const gemm_job *j = &st->jobs[ji];
    stream_next((const uint8_t *)j->w + (size_t)(u - st->job_unit0[ji]) * j->unit_stride,
                (size_t)(st->job_unit0[ji + 1] - u) * j->unit_stride, job_form(st, j), nx);
}

/* Every work unit of every queued job, handed out by claim_next (cpu/claim.h: each thread
 * its own segment of the units, then stealing). Each run is cut at job boundaries into
 * kernel calls; a run's first call (the thread's first, or a stolen one) has its start
 * prefetched, and each repacked kernel streams on past its own rows into what most likely
 * follows (job_next: the next job in the run, or the units after an own-segment run); thread 0's
 * last own call streams on into st->warm, the inputs of the stage it runs next. Which thread
 * computes a row never affects its bits. */
static void jobs_task(void *ctx, int ith, int nth) {
    cpu_state *st = ctx;
    (void)nth;
    int a, b, ji = 0;
    bool own, first = true;
    const int end = claim_seg_end(&st->claim, ith);
    while (claim_next(&st->claim, ith, &a, &b, &own)) {
        if (first || !own) job_prefetch(st, a, ji = job_of(st, a, ji));
        first = false;
        for (int u = a; u < b;) {
            ji = job_of(st, u, ji);
            const gemm_job *j = &st->jobs[ji];
            int e = DT_MIN(b, st->job_unit0[ji + 1]);
            cpu_next nx = {0};
            if (e < b || (own && e < end))
                job_next(st, e, job_of(st, e, ji), &nx);
            else if (ith == 0 && own && e == end)
                nx = st->warm;
            int r0 = (u - st->job_unit0[ji]) * j->unit_rows, r1 = DT_MIN((e - st->job_unit0[ji]) * j->unit_rows, j->rows);
            const double t0 = st->prof.on ? time_now() : 0.0;
            if (j->fn_nx)
                j->fn_nx(j->w, j->row_bytes, r0, r1, j->k, j->act, j->act_bytes, j->n_tok, j->out, j->out_stride, &nx);
            else
                j->fn(j->w, j->row_bytes, r0, r1, j->k, j->act, j->act_bytes, j->n_tok, j->out, j->out_stride);
            if (st->prof.on) cpu_prof_call(&st->prof, ith, j->n_tok, (size_t)(r1 - r0) * j->w_row_bytes, t0);
            u = e;
        }
    }
    if (st->prof.on) st->prof.fin[ith] = time_now();
}

/* ---- requests ahead: the next gemm stage's weights, while a thread waits ---------------- */

/* Starts the plan for the gemm stage after the next pool job: ahead_add its jobs in the order
 * job_add will queue them, then ahead_finish. A plan with no jobs requests nothing. */
static void ahead_start(cpu_state *st) { st->n_ahead_jobs = 0; }

static void ahead_add(cpu_state *st, const model_weight *w, int mat, int n_tok) {
    if (st->nth == 1) return; /* one thread never waits */
    DT_ASSERT(st->n_ahead_jobs < MAX_JOBS);
    ahead_job *a = &st->ahead_jobs[st->n_ahead_jobs++];
    const prep_weight *pw;
    int unit_rows;
    a->w = job_weights(st, w, mat, n_tok, &unit_rows, &a->unit_stride, &pw);
    a->units = (w->rows + unit_rows - 1) / unit_rows;
}

/* Each thread's part of the plan: from the front of its claim segment (claim_reset's cut of the
 * same units) at most st->ahead_bytes, to the segment's end, in up to CPU_NEXT_MAX regions. */
static void ahead_finish(cpu_state *st) {
    if (st->nth == 1) return;
    ahead_thr *t = st->ahead[!st->ahead_cur];
    int total = 0;
    for (int i = 0; i < st->n_ahead_jobs; i++) total += st->ahead_jobs[i].units;
    for (int th = 0; th < st->nth; th++) {
        cpu_next *r = &t[th].r;
        r->n = 0;
        t[th].done = 0;
        int u = claim_cut(total, st->nth, th), end = claim_cut(total, st->nth, th + 1), u0 = 0;
        size_t left = st->ahead_bytes;
        for (int i = 0; i < st->n_ahead_jobs && u < end && left && r->n < CPU_NEXT_MAX; i++) {
            const ahead_job *a = &st->ahead_jobs[i];
            if (u < u0 + a->units) {
                const int e = DT_MIN(end, u0 + a->units);
                r->p[r->n] = a->w + (size_t)(u - u0) * a->unit_stride;
                r->len[r->n] = DT_MIN(left, (size_t)(e - u) * a->unit_stride);
                left -= r->len[r->n++];
                u = e;
            }
            u0 += a->units;
        }
    }
    st->ahead_new = true;
}

/* pool_idle_fn: the next AHEAD_CHUNK bytes of thread ith's plan into its L2. */
#define AHEAD_CHUNK 512
static bool ahead_idle(void *ctx, int ith) {
    ahead_thr *t = (ahead_thr *)ctx + ith;
    size_t o = t->done;
    for (int i = 0; i < t->r.n; o -= t->r.len[i], i++) {
        if (o >= t->r.len[i]) continue;
        const size_t e = DT_MIN(t->r.len[i], o + AHEAD_CHUNK);
        for (size_t b = o; b < e; b += 64) _mm_prefetch((const char *)t->r.p[i] + b, CPU_AHEAD_HINT);
        t->done += e - o;
        return true;
    }
    return false;
}

/* pool_run with the newest plan: published now if it is new (the threads follow the one they
 * were given until this job starts, so the other buffer is free once pool_run returns). */
static void pool_go(cpu_state *st, pool_fn fn, void *ctx) {
    if (st->ahead_new) st->ahead_cur = !st->ahead_cur, st->ahead_new = false;
    pool_run_idle(st->pool, fn, ctx, ahead_idle, st->ahead[st->ahead_cur]);
}

static void jobs_run(cpu_state *st) {
    if (!st->n_jobs) return;
    st->job_unit0[0] = 0;
    for (int i = 0; i < st->n_jobs; i++)
        st->job_unit0[i + 1] = st->job_unit0[i] + (st->jobs[i].rows + st->jobs[i].unit_rows - 1) / st->jobs[i].unit_rows;
    claim_reset(&st->claim, st->job_unit0[st->n_jobs]);
    if (st->nth == 1)
        jobs_task(st, 0, 1);
    else
        pool_go(st, jobs_task, st); /* pool_run publishes the claims and job_unit0 (release) */
    if (st->prof.on && st->nth > 1) cpu_prof_spread(&st->prof, st->prof.fin, st->nth); /* pool_run's return orders the stores */
    st->n_jobs = 0;
    st->warm.n = 0;
}

/* Adds `bytes` at p to the inputs of the stage after the next jobs_run (see jobs_task). */
static void warm_add(cpu_state *st, const void *p, size_t bytes) {
    if (st->warm.n < CPU_NEXT_MAX) {
        st->warm.p[st->warm.n] = p;
        st->warm.len[st->warm.n++] = bytes;
    }
}

/* Runs a per-item task: on the calling thread alone when there is one item or the work
 * is small (a pool barrier costs more than the work), else split over the pool. Either way each item
 * is computed by the same code, so the choice cannot change a bit. */
static void run_items(cpu_state *st, pool_fn fn, void *ctx, long items, long work) {
    if (items <= 1 || work <= 16384)
        fn(ctx, 0, 1);
    else
        pool_go(st, fn, ctx);
}

/* ---- per-row tasks ----------------------------------------------------------------- */

typedef struct step_ctx {
    cpu_state *st;
    const engine_batch *b;
    int layer;
    const model_weight *w0, *w1, *w2; /* weights whose activation formats are needed */
    const float *norm;
    int n_out;
    const int32_t *out_rows;
} step_ctx;

static unsigned mask3(const step_ctx *c) {
    unsigned m = 0;
    if (c->w0) m |= act_mask(c->w0);
    if (c->w1) m |= act_mask(c->w1);
    if (c->w2) m |= act_mask(c->w2);
    return m;
}

/* xn = rmsnorm(x) and its quantized forms, rows split over threads. */
static void norm_task(void *ctx, int ith, int nth) {
    step_ctx *c = ctx;
    cpu_state *st = c->st;
    int E = st->m->hp.n_embd, r0, r1;
    pool_split(c->b->n, 1, ith, nth, &r0, &r1);
    unsigned mask = mask3(c);
    for (int r = r0; r < r1; r++) {
        float *xn = st->xn + (size_t)r * E;
        st->rmsnorm(xn, st->x + (size_t)r * E, c->norm, E, st->m->hp.rms_eps);
        act_row(st, &st->a_embd, xn, r, mask);
    }
}

static inline fp16_t f2h(float f) { return (fp16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

/* Asks for the line at p in a state to be written (PREFETCHW; only where CPUID reports it: st->prfchw). */
static inline void prefetch_w(const void *p) { __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p)); }

/* Q/K norm + RoPE of row r's query heads that share KV head h and of its K; K and V stored to
 * the arena as fp16 (qk_task: items (row, KV head)). The arena lines the item stores to are cold
 * (the whole model streamed through the caches since the last step; K's position-grouped
 * layout spreads one position over hd/2 lines): they are asked for first, so their fetches
 * overlap the query heads' work. */
static void qk_item(cpu_state *st, int layer, const engine_batch *b, int r, int h) {
    const model_hparams *hp = &st->m->hp;
    const model_layer *L = &st->m->layers[layer];
    int hd = hp->head_dim, half = hd / 2, H = hp->n_head * hd, HKV = hp->n_head_kv * hd;
    int group = hp->n_head / hp->n_head_kv;
    int pos = b->pos[r], slot = b->slot[r];
    const float *cs = st->rope_cos + (size_t)pos * half, *sn = st->rope_sin + (size_t)pos * half;
    fp16_t *kd = kv_ptr(st->kv, slot, layer, 0, h);
    fp16_t *vd = kv_ptr(st->kv, slot, layer, 1, h) + (size_t)pos * hd;
    if (st->prfchw) {
        for (int d = 0; d < hd; d += 64 / (KV_POS_GROUP * (int)sizeof(fp16_t))) prefetch_w(kd + kv_k_index(pos, d, hd));
        for (int d = 0; d < hd; d += 64 / (int)sizeof(fp16_t)) prefetch_w(vd + d);
    }
    for (int g = h * group; g < (h + 1) * group; g++) {
        float *qh = st->q + (size_t)r * H + (size_t)g * hd;
        st->rmsnorm(qh, qh, L->q_norm, hd, hp->rms_eps);
        vec_rope(qh, cs, sn, half);
    }
    float *kh = st->k + (size_t)r * HKV + (size_t)h * hd;
    const float *vh = st->v + (size_t)r * HKV + (size_t)h * hd;
    st->rmsnorm(kh, kh, L->k_norm, hd, hp->rms_eps);
    vec_rope(kh, cs, sn, half);
    for (int d = 0; d < hd; d++) {
        kd[kv_k_index(pos, d, hd)] = f2h(kh[d]);
        vd[d] = f2h(vh[d]);
    }
}
static void qk_task(void *ctx, int ith, int nth) {
    step_ctx *c = ctx;
    const int nkv = c->st->m->hp.n_head_kv;
    int i0, i1;
    pool_split(c->b->n * nkv, 1, ith, nth, &i0, &i1);
    for (int i = i0; i < i1; i++) qk_item(c->st, c->layer, c->b, i / nkv, i % nkv);
}

/* Parts each (row, KV head) item of a batch is cut into: 1, or where there are fewer items than
 * threads as many as spread them over the threads (at most the group's query heads), so a lone
 * stream's four KV heads do not leave twelve of sixteen threads idle. Each part runs a contiguous
 * range of the group's query heads, and a head's result does not depend on which heads share its
 * call (attn.h), so the parts never change a bit. */
static int attn_parts(const cpu_state *st, const engine_batch *b) {
    const int items = b->n * st->m->hp.n_head_kv, group = st->m->hp.n_head / st->m->hp.n_head_kv;
    return items >= st->nth ? 1 : DT_MIN(group, (st->nth + items - 1) / items);
}

/* Thread ith's items [*i0, *i1) of a batch's n rows x nkv KV heads x parts, cut by work: an item of
 * row r costs pos[r] + 1 positions plus ATTN_ITEM_FIXED, and goes to the thread whose share of the
 * total holds its middle, so the shares are contiguous and every item has one thread. Cut by count, a
 * prompt's rows (positions 0..n-1 of one slot) left the second of two threads ~3x the first's work:
 * attention was 16% of a 512-token prefill (bench/cpu-speed-log.md, thirtieth session). */
#define ATTN_ITEM_FIXED 16
static void attn_split(const engine_batch *b, int per_row, int ith, int nth, int *i0, int *i1) {
    long total = 0;
    for (int r = 0; r < b->n; r++) total += (long)(b->pos[r] + 1 + ATTN_ITEM_FIXED) * per_row;
    const long lo = total * ith / nth, hi = total * (ith + 1) / nth;
    long acc = 0;
    *i0 = *i1 = 0;
    bool any = false;
    for (int i = 0; i < b->n * per_row; i++) {
        const long w = b->pos[i / per_row] + 1 + ATTN_ITEM_FIXED, mid = acc + w / 2;
        if (mid >= lo && mid < hi) {
            if (!any) *i0 = i, any = true;
            *i1 = i + 1;
        }
        acc += w;
    }
}

/* Attention of row r's query heads [g0, g1) of those that share KV head kvh, into st->att. */
static void attn_item(cpu_state *st, int layer, const engine_batch *b, int r, int kvh, int g0, int g1, float *scratch) {
    const model_hparams *hp = &st->m->hp;
    int hd = hp->head_dim, H = hp->n_head * hd, group = hp->n_head / hp->n_head_kv;
    const fp16_t *K = kv_ptr(st->kv, b->slot[r], layer, 0, kvh);
    const fp16_t *V = kv_ptr(st->kv, b->slot[r], layer, 1, kvh);
    size_t o = (size_t)r * H + ((size_t)kvh * group + (size_t)g0) * hd;
    st->attn(st->q + o, g1 - g0, K, V, b->pos[r], hd, st->attn_scale, st->att + o, scratch);
}

/* Items: (row, KV head, part) triples, each with its part of the query heads that share the KV head. */
static void attn_task(void *ctx, int ith, int nth) {
    step_ctx *c = ctx;
    cpu_state *st = c->st;
    const int nkv = st->m->hp.n_head_kv, group = st->m->hp.n_head / nkv, parts = attn_parts(st, c->b);
    int i0, i1;
    attn_split(c->b, nkv * parts, ith, nth, &i0, &i1);
    float *scratch = st->scores + (size_t)ith * st->scratch_stride;
    for (int i = i0; i < i1; i++) {
        const int p = i % parts, kvh = i / parts % nkv;
        attn_item(st, c->layer, c->b, i / (parts * nkv), kvh, group * p / parts, group * (p + 1) / parts, scratch);
    }
}

static void act_att_task(void *ctx, int ith, int nth) {
    step_ctx *c = ctx;
    cpu_state *st = c->st;
    int H = st->m->hp.n_head * st->m->hp.head_dim, r0, r1;
    pool_split(c->b->n, 1, ith, nth, &r0, &r1);
    for (int r = r0; r < r1; r++) act_row(st, &st->a_att, st->att + (size_t)r * H, r, mask3(c));
}

/* x += tmp; xn = rmsnorm(x, ffn_norm); quantize. Items: rows. */
static void ffn_in_task(void *ctx, int ith, int nth) {
    step_ctx *c = ctx;
    cpu_state *st = c->st;
    const model_hparams *hp = &st->m->hp;
    const model_layer *L = &st->m->layers[c->layer];
    int E = hp->n_embd, r0, r1;
    pool_split(c->b->n, 1, ith, nth, &r0, &r1);
    unsigned mask = mask3(c);
    for (int r = r0; r < r1; r++) {
        float *x = st->x + (size_t)r * E, *t = st->tmp + (size_t)r * E, *xn = st->xn + (size_t)r * E;
        vec_add(x, t, E);
        st->rmsnorm(xn, x, L->ffn_norm, E, hp->rms_eps);
        act_row(st, &st->a_embd, xn, r, mask);
    }
}

/* Top-k of one row's router logits lg by (value desc, index asc) into sel; weights
 * e_i = exp(l_i - l_max) summed in rank order, then divided, into w. */
static void route_row(const model_hparams *hp, const float *lg, int32_t *sel, float *w) {
    mathx_topk(lg, hp->n_expert, hp->n_expert_used, sel);
    float lmax = lg[sel[0]], sum = 0.0f;
    for (int i = 0; i < hp->n_expert_used; i++) {
        w[i] = mathx_exp(lg[sel[i]] - lmax);
        sum = sum + w[i];
    }
    for (int i = 0; i < hp->n_expert_used; i++) w[i] = w[i] / sum;
}
/* route_row over rows. Items: rows. */
static void route_task(void *ctx, int ith, int nth) {
    step_ctx *c = ctx;
    cpu_state *st = c->st;
    const model_hparams *hp = &st->m->hp;
    int r0, r1;
    pool_split(c->b->n, 1, ith, nth, &r0, &r1);
    for (int r = r0; r < r1; r++)
        route_row(hp, st->router + (size_t)r * hp->n_expert, st->sel + (size_t)r * hp->n_expert_used,
                  st->selw + (size_t)r * hp->n_expert_used);
}

/* h = silu(g) * u, quantized for the down projection. Items: pairs. */
static void swiglu_task(void *ctx, int ith, int nth) {
    step_ctx *c = ctx;
    cpu_state *st = c->st;
    int F = st->ffn, p0, p1;
    pool_split(c->n_out, 1, ith, nth, &p0, &p1);
    for (int p = p0; p < p1; p++) {
        float *g = st->g + (size_t)p * F, *u = st->u + (size_t)p * F, *h = st->h + (size_t)p * F;
        st->swiglu(g, u, h, F);
        act_row(st, &st->a_ff, h, p, mask3(c));
    }
}

/* x += sum over ranks of w_i * y_i (fma chain in rank order). Items: rows. */
static void combine_task(void *ctx, int ith, int nth) {
    step_ctx *c = ctx;
    cpu_state *st = c->st;
    const model_hparams *hp = &st->m->hp;
    int E = hp->n_embd, r0, r1;
    pool_split(c->b->n, 1, ith, nth, &r0, &r1);
    const int K = hp->n_expert_used;
    const float *y[K > 0 ? K : 1];
    for (int r = r0; r < r1; r++) {
        float *x = st->x + (size_t)r * E;
        if (hp->arch != MODEL_ARCH_QWEN3MOE) {
            vec_add(x, st->y + (size_t)r * E, E);
            continue;
        }
        for (int i = 0; i < K; i++) y[i] = st->y + (size_t)st->pair_of[r * K + i] * E;
        vec_combine(x, y, st->selw + (size_t)r * K, K, E);
    }
}

/* Final norm of the rows that want logits, gathered to rows [0, n_out). */
static void out_norm_task(void *ctx, int ith, int nth) {
    step_ctx *c = ctx;
    cpu_state *st = c->st;
    int E = st->m->hp.n_embd, i0, i1;
    pool_split(c->n_out, 1, ith, nth, &i0, &i1);
    for (int i = i0; i < i1; i++) {
        float *xn = st->xn + (size_t)i * E;
        st->rmsnorm(xn, st->x + (size_t)c->out_rows[i] * E, st->m->output_norm, E, st->m->hp.rms_eps);
        act_row(st, &st->a_embd, xn, i, mask3(c));
    }
}

/* ---- the step ---------------------------------------------------------------------- */

/* Groups (row, rank) pairs by expert: pairs of expert e are [exp_off[e], +exp_cnt[e]), rows ascending. */
static int group_pairs(cpu_state *st, int n) {
    const model_hparams *hp = &st->m->hp;
    int K = hp->n_expert_used;
    memset(st->exp_cnt, 0, sizeof(int) * (size_t)hp->n_expert);
    for (int i = 0; i < n * K; i++) st->exp_cnt[st->sel[i]]++;
    int off = 0;
    for (int e = 0; e < hp->n_expert; e++) {
        st->exp_off[e] = off;
        off += st->exp_cnt[e];
        st->exp_cnt[e] = 0;
    }
    for (int r = 0; r < n; r++)
        for (int i = 0; i < K; i++) {
            int e = st->sel[r * K + i], p = st->exp_off[e] + st->exp_cnt[e]++;
            st->pair_row[p] = r;
            st->pair_of[r * K + i] = p;
        }
    return n * K;
}

/* The down projection is followed by the combine (the residual rows) and the next layer's
 * attention norm (or the output norm): their inputs, for jobs_task's warm list. */
static void warm_after_down(cpu_state *st, const step_ctx *c) {
    const model *m = st->m;
    const int E = m->hp.n_embd;
    warm_add(st, st->x, sizeof(float) * (size_t)c->b->n * (size_t)E);
    warm_add(st, c->layer + 1 < m->hp.n_layer ? m->layers[c->layer + 1].attn_norm : m->output_norm,
             sizeof(float) * (size_t)E);
}

/* Adds layer L's q/k/v gemm stage over n rows to the plan being built. */
static void ahead_add_qkv(cpu_state *st, const model_layer *L, int n) {
    ahead_add(st, &L->wq, 0, n);
    ahead_add(st, &L->wk, 0, n);
    ahead_add(st, &L->wv, 0, n);
}

/* Plans the stage after the down projection: the next layer's q/k/v, or the output head. */
static void ahead_after_down(cpu_state *st, const step_ctx *c) {
    const model *m = st->m;
    ahead_start(st);
    if (c->layer + 1 < m->hp.n_layer)
        ahead_add_qkv(st, &m->layers[c->layer + 1], c->b->n);
    else
        ahead_add(st, &m->output, 0, 1); /* logits: the last rows only, as a rule */
    ahead_finish(st);
}

/* Runs the queued gate/up jobs, then SwiGLU over their n_out output rows, quantized for w_down. */
static void ffn_gate_up_swiglu(cpu_state *st, step_ctx *c, const model_weight *w_down, int n_out) {
    jobs_run(st);
    cpu_prof_mark(&st->prof, CS_GATE_UP, st->weight_bytes);
    c->w0 = w_down;
    c->w1 = c->w2 = NULL;
    c->n_out = n_out;
    run_items(st, swiglu_task, c, c->n_out, (long)c->n_out * st->ffn);
    cpu_prof_mark(&st->prof, CS_SWIGLU, st->weight_bytes);
}

/* Runs the queued down jobs, with what follows them planned (warm list, next stage's requests). */
static void ffn_down_run(cpu_state *st, step_ctx *c) {
    warm_after_down(st, c);
    ahead_after_down(st, c);
    jobs_run(st);
    cpu_prof_mark(&st->prof, CS_DOWN, st->weight_bytes);
}

static void ffn_moe(cpu_state *st, step_ctx *c, int n) {
    const model_hparams *hp = &st->m->hp;
    const model_layer *L = &st->m->layers[c->layer];
    int F = st->ffn, E = hp->n_embd;
    int P = group_pairs(st, n);
    size_t ab;
    const uint8_t *act = act_for(&st->a_embd, &L->gate_exps, &ab);
    /* gate and up share one gathered activation buffer (model_load checks their formats match) */
    for (int p = 0; p < P; p++) memcpy(st->xg + (size_t)p * ab, act + (size_t)st->pair_row[p] * ab, ab);
    for (int e = 0; e < hp->n_expert; e++) {
        if (!st->exp_cnt[e]) continue;
        size_t o = (size_t)st->exp_off[e];
        job_add(st, &L->gate_exps, e, st->xg + o * ab, ab, st->exp_cnt[e], st->g + o * F, (size_t)F);
        job_add(st, &L->up_exps, e, st->xg + o * ab, ab, st->exp_cnt[e], st->u + o * F, (size_t)F);
    }
    ahead_start(st);
    for (int e = 0; e < hp->n_expert; e++)
        if (st->exp_cnt[e]) ahead_add(st, &L->down_exps, e, st->exp_cnt[e]);
    ahead_finish(st);
    ffn_gate_up_swiglu(st, c, &L->down_exps, P);
    const uint8_t *hq = act_for(&st->a_ff, &L->down_exps, &ab);
    for (int e = 0; e < hp->n_expert; e++) {
        if (!st->exp_cnt[e]) continue;
        size_t o = (size_t)st->exp_off[e];
        job_add(st, &L->down_exps, e, hq + o * ab, ab, st->exp_cnt[e], st->y + o * E, (size_t)E);
    }
    ffn_down_run(st, c);
}

/* One row: each selected expert reads the row's activations in place (matrix-vector). */
static void ffn_moe_solo(cpu_state *st, step_ctx *c) {
    const model_hparams *hp = &st->m->hp;
    const model_layer *L = &st->m->layers[c->layer];
    int F = st->ffn, E = hp->n_embd, K = hp->n_expert_used;
    size_t ab;
    const uint8_t *act = act_for(&st->a_embd, &L->gate_exps, &ab);
    for (int i = 0; i < K; i++) {
        st->pair_of[i] = i;
        job_add(st, &L->gate_exps, st->sel[i], act, ab, 1, st->g + (size_t)i * F, (size_t)F);
        job_add(st, &L->up_exps, st->sel[i], act, ab, 1, st->u + (size_t)i * F, (size_t)F);
    }
    ahead_start(st);
    for (int i = 0; i < K; i++) ahead_add(st, &L->down_exps, st->sel[i], 1);
    ahead_finish(st);
    ffn_gate_up_swiglu(st, c, &L->down_exps, K);
    const uint8_t *hq = act_for(&st->a_ff, &L->down_exps, &ab);
    for (int i = 0; i < K; i++)
        job_add(st, &L->down_exps, st->sel[i], hq + (size_t)i * ab, ab, 1, st->y + (size_t)i * E, (size_t)E);
    ffn_down_run(st, c);
}

static void ffn_dense(cpu_state *st, step_ctx *c, int n) {
    const model_layer *L = &st->m->layers[c->layer];
    int F = st->ffn, E = st->m->hp.n_embd;
    size_t ab;
    const void *act = act_for(&st->a_embd, &L->ffn_gate, &ab);
    job_add(st, &L->ffn_gate, 0, act, ab, n, st->g, (size_t)F);
    act = act_for(&st->a_embd, &L->ffn_up, &ab);
    job_add(st, &L->ffn_up, 0, act, ab, n, st->u, (size_t)F);
    ahead_start(st);
    ahead_add(st, &L->ffn_down, 0, n);
    ahead_finish(st);
    ffn_gate_up_swiglu(st, c, &L->ffn_down, n);
    act = act_for(&st->a_ff, &L->ffn_down, &ab);
    job_add(st, &L->ffn_down, 0, act, ab, n, st->y, (size_t)E);
    ffn_down_run(st, c);
}


/* ---- the solo step as one pool job ------------------------------------------------- */

/* Requests the lines of [p, p + bytes) into L1: the small stages' cold inputs (norm weights),
 * asked for before a barrier so their fetch overlaps the wait. */
static void prefetch_l1(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

/* Elements [off, off + len) of row r of src (whole blocks of every format in mask) quantized into
 * row r of a: the same bytes act_row writes there, blocks being independent. */
static void act_range(const cpu_state *st, act_set *a, const float *src, int r, int off, int len, unsigned mask) {
    if ((mask & (1u << QA_Q8_32)) && a->q32)
        cpu_quant_act_row(QA_Q8_32, src + off, a->q32 + (size_t)r * a->b32 + quant_act_bytes(QA_Q8_32, off), len,
                          st->level);
    if ((mask & (1u << QA_Q8_256)) && a->q256)
        cpu_quant_act_row(QA_Q8_256, src + off, a->q256 + (size_t)r * a->b256 + quant_act_bytes(QA_Q8_256, off), len,
                          st->level);
}

/* ---- diagnostic: loads only (backend_opts.cpu_loads_only) ----------------------------------
 * Every gemm call reads its weight bytes as the probe's first pattern does (one ascending stream
 * of 256-bit loads, no software prefetch; on a two-l1 host the repacked one-token calls in that
 * form's pattern, loads_only_rp_two) and computes nothing: the step's structure (its stages,
 * barriers, claims, small stages and jumps between matrices) at no kernel cost. Outputs are zero,
 * but a row-major (f32 router) call's are a hash of (matrix, row, token), so routing still picks
 * scattered experts, as real activations do (zeros would pick experts 0..7, one contiguous run). */
__attribute__((target("avx2"))) static void loads_only(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t o = 0; o + 64 <= n; o += 64) {
        a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(const void *)(p + o)));
        b = _mm256_xor_si256(b, _mm256_loadu_si256((const __m256i *)(const void *)(p + o + 32)));
    }
    __asm__ volatile("" : : "x"(a), "x"(b));
}
static void loads_only_rp(const void *w, size_t gb, int r0, int r1, int k, const void *act, size_t ab, int n_tok,
                          float *out, size_t os, const struct cpu_next *nx) {
    (void)k, (void)act, (void)ab, (void)nx;
    const int g0 = r0 / REPACK_ROWS, g1 = (r1 + REPACK_ROWS - 1) / REPACK_ROWS;
    loads_only((const uint8_t *)w + (size_t)g0 * gb, (size_t)(g1 - g0) * gb);
    for (int t = 0; t < n_tok; t++) memset(out + (size_t)t * os + r0, 0, sizeof(float) * (size_t)(r1 - r0));
}
/* loads_only_rp in the two-l1 form's pattern (cpu/prefetch.h), as the one-token kernels stream on
 * a host whose form it is: the call's groups in two halves read in lockstep, about a 256-weight
 * block's bytes at a time (rounded down to whole lines: a Q6_K group's header makes gb / nb
 * uneven), each line requested CPU_PF2_DIST ahead into L1; an odd last group after them, alone,
 * the same way. Every byte of the call's groups is loaded once (gb is a whole number of lines);
 * the requests, unlike the kernels', run past the call's end instead of into its continuation.
 * Calls of more than one token stream as loads_only_rp (their kernels use near-far requests). */
/* One line of loads_only_rp_two: requested CPU_PF2_DIST ahead into L1, loaded into a and b. */
__attribute__((target("avx2"))) static inline void loads_l1_line(const uint8_t *q, __m256i *a, __m256i *b) {
    _mm_prefetch((const char *)q + CPU_PF2_DIST, _MM_HINT_T0);
    *a = _mm256_xor_si256(*a, _mm256_loadu_si256((const __m256i *)(const void *)q));
    *b = _mm256_xor_si256(*b, _mm256_loadu_si256((const __m256i *)(const void *)(q + 32)));
}
__attribute__((target("avx2"))) static void loads_only_rp_two(const void *w, size_t gb, int r0, int r1, int k,
                                                              const void *act, size_t ab, int n_tok, float *out,
                                                              size_t os, const struct cpu_next *nx) {
    if (n_tok != 1) {
        loads_only_rp(w, gb, r0, r1, k, act, ab, n_tok, out, os, nx);
        return;
    }
    DT_ASSERT(gb % 64 == 0);
    const int g0 = r0 / REPACK_ROWS, g1 = (r1 + REPACK_ROWS - 1) / REPACK_ROWS, h = (g1 - g0) / 2;
    const size_t nb = k >= QK_K ? (size_t)(k / QK_K) : 1, blk = DT_MAX((size_t)64, (gb / nb) & ~(size_t)63);
    const size_t half = (size_t)h * gb, tail = (size_t)(g1 - g0 - 2 * h) * gb;
    const uint8_t *const p[3] = {(const uint8_t *)w + (size_t)g0 * gb, p[0] + half, p[1] + half};
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t c = 0; c < half; c += blk)
        for (int s = 0; s < 2; s++)
            for (size_t o = c; o < DT_MIN(c + blk, half); o += 64) loads_l1_line(p[s] + o, &a, &b);
    for (size_t o = 0; o < tail; o += 64) loads_l1_line(p[2] + o, &a, &b);
    __asm__ volatile("" : : "x"(a), "x"(b));
    memset(out + r0, 0, sizeof(float) * (size_t)(r1 - r0));
}
static void loads_only_rm(const void *w, size_t rb, int r0, int r1, int k, const void *act, size_t ab, int n_tok,
                          float *out, size_t os) {
    (void)k, (void)act, (void)ab;
    loads_only((const uint8_t *)w + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
    const uint32_t salt = (uint32_t)((uintptr_t)w >> 6) * 0x9e3779b9u;
    for (int t = 0; t < n_tok; t++)
        for (int r = r0; r < r1; r++)
            out[(size_t)t * os + r] = (float)((((uint32_t)r + 7919u * (uint32_t)t) * 2654435761u ^ salt) >> 8) * 0x1p-24f;
}

/* Whether a solo step of this model can run as solo_task: a MoE model whose heads' rows and
 * residual slices are whole row units. */
static bool solo_job_fits(const model_hparams *hp) {
    const int G = hp->n_head_kv ? hp->n_head / hp->n_head_kv : 0;
    return hp->arch == MODEL_ARCH_QWEN3MOE && G >= 1 && hp->head_dim % GEMM_UNIT == 0 && hp->n_embd % GEMM_UNIT == 0 &&
           hp->n_expert_used >= 1;
}

/* solo_task's barrier k (0..SOLO_BARRIERS-1); profiled, the time from the first thread there to
 * the last goes to the stage thread 0 marks next (its "ends"). Thread 0 reads the others'
 * arrival times right after the barrier: none can store to slot k again before thread 0 reaches
 * the next barrier. */
static void solo_barrier(cpu_state *st, int k, int ith) {
    double *t = st->prof.bar + (size_t)k * st->nth;
    if (st->prof.on) t[ith] = time_now();
    pool_barrier(st->pool);
    if (st->prof.on && ith == 0) cpu_prof_spread(&st->prof, t, st->nth);
}

/* One matrix's rows [r0, r0 + rows) in a gemm stage of solo_task (one token): units of unit_rows
 * rows, unit k's weights at wp + k * us. */
typedef struct solo_job {
    const model_weight *w;
    const uint8_t *wp;
    size_t us;
    bool repacked;
    int form; /* the kernel's stream form (job_form) */
    const void *act;
    size_t ab;
    float *out;
    int r0, rows, unit_rows, units;
} solo_job;

/* r0: a multiple of the matrix's unit rows. */
static void solo_job_set(const cpu_state *st, solo_job *j, const model_weight *w, int mat, const void *act, size_t ab,
                         float *out, int r0, int rows) {
    int ur;
    size_t us;
    const prep_weight *pw;
    const uint8_t *p = job_weights(st, w, mat, 1, &ur, &us, &pw);
    DT_ASSERT(r0 % ur == 0);
    const bool rp = pw && pw->repacked;
    *j = (solo_job){w,   p + (size_t)(r0 / ur) * us, us, rp, rp ? st->stream : CPU_STREAM_NEAR_FAR, act, ab, out,
                    r0,  rows,
                    ur,  (rows + ur - 1) / ur};
}

/* stream_prefetch / stream_next for j's weights from unit k on. */
static void solo_prefetch(const solo_job *j, int k) {
    stream_prefetch((const char *)j->wp + (size_t)k * j->us, (size_t)(j->units - k) * j->us, j->form);
}
static void solo_next(const solo_job *j, int k, cpu_next *nx) {
    stream_next(j->wp + (size_t)k * j->us, (size_t)(j->units - k) * j->us, j->form, nx);
}

/* Units [k0, k1) of j, told what the thread reads next (nx). */
static void solo_call(cpu_state *st, int ith, const solo_job *j, int k0, int k1, const cpu_next *nx) {
    const model_weight *w = j->w;
    const int r0 = k0 * j->unit_rows, r1 = DT_MIN(k1 * j->unit_rows, j->rows);
    float *out = j->out + j->r0;
    const double t0 = st->prof.on ? time_now() : 0.0;
    if (j->repacked)
        st->gemm_rp[w->type](j->wp, j->us / (size_t)(j->unit_rows / REPACK_ROWS), r0, r1, w->cols, j->act, j->ab, 1, out,
                             0, nx);
    else
        st->gemm[w->type](j->wp, w->row_bytes, r0, r1, w->cols, j->act, j->ab, 1, out, 0);
    if (st->prof.on) cpu_prof_call(&st->prof, ith, 1, (size_t)(r1 - r0) * w->row_bytes, t0);
}

/* Thread ith's part of a gemm stage over jobs[0..n) (every thread passes the same list): the
 * units handed out by st->claim (its own segment front to back, then stealing), so a thread
 * slowed by the host leaves the rest to the others. */
static void solo_gemm(cpu_state *st, const solo_job *jobs, int n, int ith) {
    int total = 0;
    for (int i = 0; i < n; i++) total += jobs[i].units;
    claim_reset_own(&st->claim, total, ith);
    const int end = claim_seg_end(&st->claim, ith);
    int a, b, ji = 0, u0 = 0; /* u0: the first unit of job ji */
    bool own, first = true;
    while (claim_next(&st->claim, ith, &a, &b, &own)) {
        while (u0 > a) u0 -= jobs[--ji].units;
        while (a >= u0 + jobs[ji].units) u0 += jobs[ji++].units;
        if (first || !own) solo_prefetch(&jobs[ji], a - u0);
        first = false;
        for (int u = a; u < b;) {
            while (u >= u0 + jobs[ji].units) u0 += jobs[ji++].units;
            const solo_job *j = &jobs[ji];
            const int e = DT_MIN(b, u0 + j->units);
            cpu_next nx = {0};
            if (e < b || (own && e < end)) { /* what this thread reads next: unit e */
                int jn = ji, v0 = u0;
                while (e >= v0 + jobs[jn].units) v0 += jobs[jn++].units;
                solo_next(&jobs[jn], e - v0, &nx);
            }
            solo_call(st, ith, j, u - u0, e - u0, &nx);
            u = e;
        }
    }
}

typedef struct solo_ctx {
    cpu_state *st;
    const engine_batch *b;
} solo_ctx;

/* One row's whole step on every thread, with spin barriers (eight a layer) where a stage needs
 * what all threads wrote, instead of a pool job per stage. The gemm stages' units are claimed
 * (solo_gemm); the q/k/v jobs go KV-head group by group, so a thread's own segment is about its
 * heads' rows. Thread t owns KV heads [h0, h1) (q/k norm, RoPE, K/V store, attention and the
 * quantization of their output), expert ranks [k0, k1) (SwiGLU) and elements [o0, o1) of the
 * residual (the combine); the norms and the routing, which need whole rows, run on every
 * thread into its own copies. Each value is computed by the same code as in the pool-job path
 * (which thread computes a row never changes a bit). The output head runs as jobs_task. */
static void solo_task(void *ctx, int ith, int nth) {
    const solo_ctx *c = ctx;
    cpu_state *st = c->st;
    const model *m = st->m;
    const model_hparams *hp = &m->hp;
    const int E = hp->n_embd, hd = hp->head_dim, G = hp->n_head / hp->n_head_kv, K = hp->n_expert_used, F = st->ffn;
    const int nkv = hp->n_head_kv;
    const bool t0 = ith == 0;
    float *xn = st->xn_t + (size_t)ith * E, *xr = st->xr_t + (size_t)ith * E;
    act_set *a = &st->a_t[ith];
    int32_t *sel = st->sel_t + (size_t)ith * K;
    float *selw = st->selw_t + (size_t)ith * K;
    float *scratch = st->scores + (size_t)ith * st->scratch_stride;
    int h0, h1, o0, o1, k0, k1;
    pool_split(nkv, 1, ith, nth, &h0, &h1);
    pool_split(E, GEMM_UNIT, ith, nth, &o0, &o1);
    pool_split(K, 1, ith, nth, &k0, &k1);
    solo_job jobs[DT_MAX(3 * nkv, 2 * K)];
    size_t ab;
    for (int l = 0; l < hp->n_layer; l++) {
        const model_layer *L = &m->layers[l];
        st->rmsnorm(xn, st->x, L->attn_norm, E, hp->rms_eps);
        act_row(st, a, xn, 0, act_mask(&L->wq) | act_mask(&L->wk) | act_mask(&L->wv));
        if (t0) cpu_prof_mark(&st->prof, CS_NORM, st->weight_bytes);
        for (int h = 0; h < nkv; h++) {
            const void *act = act_for(a, &L->wq, &ab);
            solo_job_set(st, &jobs[3 * h], &L->wq, 0, act, ab, st->q, h * G * hd, G * hd);
            act = act_for(a, &L->wk, &ab);
            solo_job_set(st, &jobs[3 * h + 1], &L->wk, 0, act, ab, st->k, h * hd, hd);
            act = act_for(a, &L->wv, &ab);
            solo_job_set(st, &jobs[3 * h + 2], &L->wv, 0, act, ab, st->v, h * hd, hd);
        }
        solo_gemm(st, jobs, 3 * nkv, ith);
        if (t0)
            st->weight_bytes += (uint64_t)L->wq.rows * L->wq.row_bytes + (uint64_t)L->wk.rows * L->wk.row_bytes +
                                (uint64_t)L->wv.rows * L->wv.row_bytes;
        solo_barrier(st, 0, ith);
        if (t0) cpu_prof_mark(&st->prof, CS_QKV, st->weight_bytes);
        for (int h = h0; h < h1; h++) qk_item(st, l, c->b, 0, h);
        if (t0) cpu_prof_mark(&st->prof, CS_QK_ROPE, st->weight_bytes);
        for (int h = h0; h < h1; h++) attn_item(st, l, c->b, 0, h, 0, hp->n_head / nkv, scratch);
        if (t0) {
            st->kv_bytes += (uint64_t)(c->b->pos[0] + 1) * nkv * hd * 2 * sizeof(fp16_t);
            cpu_prof_mark(&st->prof, CS_ATTN, st->weight_bytes);
        }
        /* the attention output quantized: each thread its groups' blocks where a group is whole
         * blocks, else every thread all of it into its own copy, after the barrier */
        const act_set *aa = &st->a_att;
        if (st->att_whole)
            act_range(st, &st->a_att, st->att, 0, h0 * G * hd, (h1 - h0) * G * hd, act_mask(&L->wo));
        solo_barrier(st, 1, ith);
        if (!st->att_whole) {
            act_row(st, &st->aat_t[ith], st->att, 0, act_mask(&L->wo));
            aa = &st->aat_t[ith];
        }
        if (t0) cpu_prof_mark(&st->prof, CS_ACT_ATT, st->weight_bytes);
        const void *act = act_for(aa, &L->wo, &ab);
        solo_job_set(st, &jobs[0], &L->wo, 0, act, ab, st->tmp, 0, E);
        solo_gemm(st, jobs, 1, ith);
        if (t0) st->weight_bytes += (uint64_t)L->wo.rows * L->wo.row_bytes;
        prefetch_l1(L->ffn_norm, sizeof(float) * (size_t)E);
        solo_barrier(st, 2, ith);
        if (t0) cpu_prof_mark(&st->prof, CS_O, st->weight_bytes);
        vec_sum(xr, st->x, st->tmp, E);
        st->rmsnorm(xn, xr, L->ffn_norm, E, hp->rms_eps);
        act_row(st, a, xn, 0, act_mask(&L->gate_exps) | act_mask(&L->up_exps) | act_mask(&L->gate_inp));
        if (t0) cpu_prof_mark(&st->prof, CS_FFN_IN, st->weight_bytes);
        act = act_for(a, &L->gate_inp, &ab);
        solo_job_set(st, &jobs[0], &L->gate_inp, 0, act, ab, st->router, 0, hp->n_expert);
        solo_gemm(st, jobs, 1, ith);
        if (t0) st->weight_bytes += (uint64_t)L->gate_inp.rows * L->gate_inp.row_bytes;
        solo_barrier(st, 3, ith);
        if (t0) cpu_prof_mark(&st->prof, CS_ROUTER, st->weight_bytes);
        route_row(hp, st->router, sel, selw);
        if (t0) cpu_prof_mark(&st->prof, CS_ROUTE, st->weight_bytes);
        act = act_for(a, &L->gate_exps, &ab);
        for (int i = 0; i < K; i++) {
            solo_job_set(st, &jobs[2 * i], &L->gate_exps, sel[i], act, ab, st->g + (size_t)i * F, 0, F);
            solo_job_set(st, &jobs[2 * i + 1], &L->up_exps, sel[i], act, ab, st->u + (size_t)i * F, 0, F);
        }
        solo_gemm(st, jobs, 2 * K, ith);
        if (t0) st->weight_bytes += (uint64_t)K * F * (L->gate_exps.row_bytes + L->up_exps.row_bytes);
        solo_barrier(st, 4, ith);
        if (t0) cpu_prof_mark(&st->prof, CS_GATE_UP, st->weight_bytes);
        for (int i = k0; i < k1; i++) {
            float *g = st->g + (size_t)i * F, *u = st->u + (size_t)i * F, *h = st->h + (size_t)i * F;
            st->swiglu(g, u, h, F);
            act_row(st, &st->a_ff, h, i, act_mask(&L->down_exps));
        }
        solo_barrier(st, 5, ith);
        if (t0) cpu_prof_mark(&st->prof, CS_SWIGLU, st->weight_bytes);
        const uint8_t *hq = act_for(&st->a_ff, &L->down_exps, &ab);
        for (int i = 0; i < K; i++)
            solo_job_set(st, &jobs[i], &L->down_exps, sel[i], hq + (size_t)i * ab, ab, st->y + (size_t)i * E, 0, E);
        solo_gemm(st, jobs, K, ith);
        if (t0) st->weight_bytes += (uint64_t)K * E * L->down_exps.row_bytes;
        solo_barrier(st, 6, ith);
        if (t0) cpu_prof_mark(&st->prof, CS_DOWN, st->weight_bytes);
        const float *y[K];
        for (int i = 0; i < K; i++) y[i] = st->y + (size_t)i * E + o0;
        memcpy(st->x + o0, xr + o0, sizeof(float) * (size_t)(o1 - o0));
        vec_combine(st->x + o0, y, selw, K, o1 - o0);
        if (l + 1 < hp->n_layer) {
            const model_layer *N = &m->layers[l + 1];
            prefetch_l1(N->attn_norm, sizeof(float) * (size_t)E);
            prefetch_l1(N->q_norm, sizeof(float) * (size_t)hd);
            prefetch_l1(N->k_norm, sizeof(float) * (size_t)hd);
        } else
            prefetch_l1(m->output_norm, sizeof(float) * (size_t)E);
        solo_barrier(st, 7, ith);
        if (t0) cpu_prof_mark(&st->prof, CS_COMBINE, st->weight_bytes);
    }
    if (t0 && st->n_jobs) out_norm_task(&(step_ctx){.st = st, .b = c->b, .n_out = 1, .out_rows = (const int32_t[]){0},
                                                    .w0 = &m->output}, 0, 1);
    solo_barrier(st, 8, ith);
    claim_reset_own(&st->claim, st->n_jobs ? st->job_unit0[1] : 0, ith);
    jobs_task(st, ith, nth);
}

/* cpu_forward for one row when st->one_job: the output head queued as a job (solo_task claims
 * its units as jobs_task does in any gemm stage), then solo_task on the pool. */
static void solo_forward(cpu_state *st, const engine_batch *b, float *logits) {
    const model *m = st->m;
    size_t ab;
    cpu_prof_start(&st->prof, st->weight_bytes);
    model_embed(m, b->token[0], st->x);
    st->weight_bytes += m->tok_embd.row_bytes;
    cpu_prof_mark(&st->prof, CS_EMBED, st->weight_bytes);
    const uint64_t wb = st->weight_bytes;
    st->n_jobs = 0;
    st->warm.n = 0;
    if (b->want_logits[0]) {
        const void *act = act_for(&st->a_embd, &m->output, &ab);
        job_add(st, &m->output, 0, act, ab, 1, logits, (size_t)m->hp.n_vocab);
        st->job_unit0[0] = 0;
        st->job_unit0[1] = (st->jobs[0].rows + st->jobs[0].unit_rows - 1) / st->jobs[0].unit_rows;
    }
    claim_reset(&st->claim, 0); /* every segment empty: solo_task's stages set up their own (claim_reset_own) */
    const uint64_t out_bytes = st->weight_bytes - wb; /* counted with the output stage, below */
    st->weight_bytes = wb;
    solo_ctx c = {st, b};
    pool_run(st->pool, solo_task, &c);
    st->weight_bytes += out_bytes;
    st->n_jobs = 0;
    if (st->prof.on) { /* pool_run's return orders the workers' prof_fin stores */
        cpu_prof_spread(&st->prof, st->prof.fin, st->nth);
        cpu_prof_mark(&st->prof, CS_OUTPUT, st->weight_bytes);
    }
}

/* Attention work of a batch: positions x query-head elements. */
static long attn_work(const engine_batch *b, int H) {
    long w = 0;
    for (int r = 0; r < b->n; r++) w += (long)(b->pos[r] + 1) * H;
    return w;
}

static void cpu_forward(void *state, const engine_batch *b, bool solo, float *logits) {
    cpu_state *st = state;
    const model *m = st->m;
    const model_hparams *hp = &m->hp;
    int n = b->n, E = hp->n_embd, H = hp->n_head * hp->head_dim, HKV = hp->n_head_kv * hp->head_dim;
    DT_ASSERT(n >= 1 && n <= st->max_rows);
    st->claim.runs = n == 1 ? st->runs_solo : st->runs_batch; /* read at each claim_reset */
    st->prof.step_rows = n;
    if (solo && n == 1 && st->one_job) {
        solo_forward(st, b, logits);
        return;
    }
    cpu_prof_start(&st->prof, st->weight_bytes);
    for (int r = 0; r < n; r++) model_embed(m, b->token[r], st->x + (size_t)r * E);
    st->weight_bytes += (uint64_t)n * m->tok_embd.row_bytes;
    cpu_prof_mark(&st->prof, CS_EMBED, st->weight_bytes);
    step_ctx c = {.st = st, .b = b};
    size_t ab;
    for (int l = 0; l < hp->n_layer; l++) {
        const model_layer *L = &m->layers[l];
        c.layer = l;
        c.norm = L->attn_norm;
        c.w0 = &L->wq, c.w1 = &L->wk, c.w2 = &L->wv;
        run_items(st, norm_task, &c, n, 2L * n * E); /* work: the norm and the quantization pass */
        cpu_prof_mark(&st->prof, CS_NORM, st->weight_bytes);
        const void *act = act_for(&st->a_embd, &L->wq, &ab);
        job_add(st, &L->wq, 0, act, ab, n, st->q, (size_t)H);
        act = act_for(&st->a_embd, &L->wk, &ab);
        job_add(st, &L->wk, 0, act, ab, n, st->k, (size_t)HKV);
        act = act_for(&st->a_embd, &L->wv, &ab);
        job_add(st, &L->wv, 0, act, ab, n, st->v, (size_t)HKV);
        ahead_start(st);
        ahead_add(st, &L->wo, 0, n);
        ahead_finish(st);
        jobs_run(st);
        cpu_prof_mark(&st->prof, CS_QKV, st->weight_bytes);
        /* work x4: the K/V stores go to arena lines that are cold at every step */
        run_items(st, qk_task, &c, (long)n * hp->n_head_kv, 4L * n * (H + HKV));
        cpu_prof_mark(&st->prof, CS_QK_ROPE, st->weight_bytes);
        run_items(st, attn_task, &c, (long)n * hp->n_head_kv * attn_parts(st, b), attn_work(b, H));
        cpu_prof_mark(&st->prof, CS_ATTN, st->weight_bytes);
        for (int r = 0; r < n; r++) st->kv_bytes += (uint64_t)(b->pos[r] + 1) * HKV * 2 * sizeof(fp16_t);
        c.w0 = &L->wo, c.w1 = c.w2 = NULL;
        run_items(st, act_att_task, &c, n, (long)n * H);
        cpu_prof_mark(&st->prof, CS_ACT_ATT, st->weight_bytes);
        act = act_for(&st->a_att, &L->wo, &ab);
        job_add(st, &L->wo, 0, act, ab, n, st->tmp, (size_t)E);
        warm_add(st, st->x, sizeof(float) * (size_t)n * (size_t)E); /* the residual + ffn norm's inputs */
        warm_add(st, L->ffn_norm, sizeof(float) * (size_t)E);
        ahead_start(st);
        if (hp->arch == MODEL_ARCH_QWEN3MOE)
            ahead_add(st, &L->gate_inp, 0, n);
        else
            ahead_add(st, &L->ffn_gate, 0, n), ahead_add(st, &L->ffn_up, 0, n);
        ahead_finish(st);
        jobs_run(st);
        cpu_prof_mark(&st->prof, CS_O, st->weight_bytes);
        if (hp->arch == MODEL_ARCH_QWEN3MOE) {
            c.w0 = &L->gate_exps, c.w1 = &L->up_exps, c.w2 = &L->gate_inp;
        } else {
            c.w0 = &L->ffn_gate, c.w1 = &L->ffn_up, c.w2 = NULL;
        }
        run_items(st, ffn_in_task, &c, n, (long)n * E * 2);
        cpu_prof_mark(&st->prof, CS_FFN_IN, st->weight_bytes);
        if (hp->arch == MODEL_ARCH_QWEN3MOE) { /* router: one gemm over all rows, then top-k */
            act = act_for(&st->a_embd, &L->gate_inp, &ab);
            job_add(st, &L->gate_inp, 0, act, ab, n, st->router, (size_t)hp->n_expert);
            ahead_start(st); /* the experts are not known before the routing */
            ahead_finish(st);
            jobs_run(st);
            cpu_prof_mark(&st->prof, CS_ROUTER, st->weight_bytes);
            run_items(st, route_task, &c, n, (long)n * hp->n_expert * hp->n_expert_used);
            cpu_prof_mark(&st->prof, CS_ROUTE, st->weight_bytes);
        }
        if (hp->arch == MODEL_ARCH_QWEN3MOE && solo)
            ffn_moe_solo(st, &c);
        else if (hp->arch == MODEL_ARCH_QWEN3MOE)
            ffn_moe(st, &c, n);
        else
            ffn_dense(st, &c, n);
        run_items(st, combine_task, &c, n, (long)n * E * (hp->n_expert_used + 1));
        cpu_prof_mark(&st->prof, CS_COMBINE, st->weight_bytes);
    }
    int32_t out_rows[st->max_rows];
    int n_out = 0;
    for (int r = 0; r < n; r++)
        if (b->want_logits[r]) out_rows[n_out++] = r;
    if (!n_out) return;
    c.n_out = n_out;
    c.out_rows = out_rows;
    c.w0 = &m->output, c.w1 = c.w2 = NULL;
    run_items(st, out_norm_task, &c, n_out, 2L * n_out * E);
    const void *act = act_for(&st->a_embd, &m->output, &ab);
    job_add(st, &m->output, 0, act, ab, n_out, logits, (size_t)hp->n_vocab);
    ahead_start(st); /* the next step's first stage, most likely over as many rows */
    ahead_add_qkv(st, &m->layers[0], n);
    ahead_finish(st);
    jobs_run(st);
    cpu_prof_mark(&st->prof, CS_OUTPUT, st->weight_bytes);
}

/* ---- lifecycle ------------------------------------------------------------------- */

/* The checks of o's run-time choices (cpu_tune), each refusal naming its field. */
static int cpu_tune_check(const backend_opts *o, ditto_err *err) {
    if (o->cpu_stream < -1 || o->cpu_stream >= CPU_STREAM_COUNT)
        return err_set(err, "cpu stream form = %d (must be -1..%d)", o->cpu_stream, CPU_STREAM_COUNT - 1);
    if (o->cpu_float_form < -1 || o->cpu_float_form >= CPU_STREAM_COUNT)
        return err_set(err, "cpu float form = %d (must be -1..%d)", o->cpu_float_form, CPU_STREAM_COUNT - 1);
    if (o->cpu_claim_runs < -1 || o->cpu_claim_runs == 0 || o->cpu_claim_runs > CLAIM_RUNS_MAX)
        return err_set(err, "cpu claim runs = %d (must be -1 or 1..%d)", o->cpu_claim_runs, CLAIM_RUNS_MAX);
    if (o->cpu_ahead < -1 || o->cpu_ahead > (1L << 30))
        return err_set(err, "cpu ahead bytes = %ld (must be -1..2^30)", o->cpu_ahead);
    if (o->cpu_loads_only && cpu_level_hw() < CPU_AVX2) return err_set(err, "cpu loads-only diagnostic needs AVX2");
    return 0;
}

/* Applies o's run-time choices to st (checked by cpu_tune_check; st->level, nth and m set): the
 * requests ahead, the one-token and float kernels' stream forms and their tables, the solo step's
 * form, the claimed-run cap, the loads-only diagnostic, and the description naming them. None
 * changes a result bit (the loads-only diagnostic aside, whose results are not the model's). */
static void cpu_tune(cpu_state *st, const backend_opts *o) {
    st->ahead_bytes = o->cpu_ahead < 0 ? (size_t)CPU_AHEAD_BYTES : (size_t)o->cpu_ahead;
    st->stream = (int)cpu_stream_select((enum cpu_level)st->level, o->cpu_stream);
    const bool forms = st->level >= CPU_AVX2 && cpu_level_hw() >= CPU_AVX2; /* kernels with a form */
    /* by default where the one-token kernels stream plain (Zen 4, where it was measured at two threads) and at
     * up to ONE_JOB_MAX_THREADS threads: its eight barriers a layer cost more as threads are added (on a 16-core
     * Xeon, forced, 1.005x the pool-job path at 8 threads, 0.960x at 16); elsewhere on request */
    st->one_job = (o->cpu_one_job > 0 ||
                   (o->cpu_one_job < 0 && cpu_stream_no_requests(st->stream) && st->nth <= ONE_JOB_MAX_THREADS)) &&
                  st->nth > 1 && solo_job_fits(&st->m->hp);
    const int ff = o->cpu_float_form >= 0 ? o->cpu_float_form : st->stream; /* the float kernels' form */
    for (uint32_t t = 0; t < QT_COUNT; t++) {
        st->gemm[t] = NULL, st->gemm_rp[t] = NULL;
        if (quant_traits_of(t) && quant_traits_of(t)->supported)
            st->gemm[t] = cpu_quant_gemm_form(t, st->level, (enum cpu_stream)(quant_type_is_float(t) ? ff : st->stream));
        if (repack_supported(t)) st->gemm_rp[t] = repack_gemm_next(t, st->level, st->stream);
    }
    if (o->cpu_loads_only)
        for (uint32_t t = 0; t < QT_COUNT; t++) {
            if (st->gemm_rp[t]) st->gemm_rp[t] = st->stream == CPU_STREAM_TWO_L1 ? loads_only_rp_two : loads_only_rp;
            if (st->gemm[t]) st->gemm[t] = loads_only_rm;
        }
    st->runs_batch = o->cpu_claim_runs > 0 ? o->cpu_claim_runs : CLAIM_RUNS;
    st->runs_solo = o->cpu_claim_runs > 0                ? o->cpu_claim_runs
                    : st->stream == CPU_STREAM_TWO_L1 ? CLAIM_RUNS_TWO_L1_SOLO
                                                      : CLAIM_RUNS;
    /* the float kernels have forms at AVX-512 only (cpu_quant_gemm_form) */
    const bool ff_own = forms && st->level >= CPU_AVX512 && cpu_level_hw() >= CPU_AVX512 && ff != st->stream;
    snprintf(st->desc, sizeof st->desc, "cpu %s%s, %d thread%s%s%s%s%s%s%s", cpu_level_name(st->level),
             st->level == CPU_AVX2 && cpu_avx_vnni() ? " (avx-vnni)" : "", st->nth, st->nth > 1 ? "s" : "",
             forms ? ", weight stream " : "", forms ? cpu_stream_name(st->stream) : "",
             ff_own ? ", float kernels " : "", ff_own ? cpu_stream_name((enum cpu_stream)ff) : "",
             st->one_job ? ", solo step as one pool job" : "", o->cpu_loads_only ? ", gemm calls load only (diagnostic)" : "");
}

static int cpu_create(void **state, model *m, kv_arena *kv, const backend_opts *o, ditto_err *err) {
    const model_hparams *hp = &m->hp;
    if (o->n_threads < 1 || o->n_threads > 256) return err_set(err, "threads = %d (must be 1..256)", o->n_threads);
    if (o->max_rows < 1) return err_set(err, "max rows per step = %d (must be >= 1)", o->max_rows);
    if (cpu_tune_check(o, err)) return -1;
    cpu_state *st = xcalloc(1, sizeof *st);
    st->m = m;
    st->kv = kv;
    st->nth = o->n_threads;
    st->max_rows = o->max_rows;
    cpu_prof_init(&st->prof, o->profile, st->nth, SOLO_BARRIERS);
    for (int i = 0; i < 2; i++) st->ahead[i] = xaligned(sizeof(ahead_thr) * (size_t)st->nth);
    st->level = o->cpu_level < 0 ? (int)cpu_level_detect() : o->cpu_level;
    unsigned ea, eb, ec, ed;
    st->prfchw = __get_cpuid(0x80000001u, &ea, &eb, &ec, &ed) && ((ec >> 8) & 1);
    claim_init(&st->claim, st->nth);
    cpu_tune(st, o);
    int R = o->max_rows, E = hp->n_embd, hd = hp->head_dim, H = hp->n_head * hd, HKV = hp->n_head_kv * hd;
    int ctx = kv->key.ctx, half = hd / 2;
    st->rope_cos = xmalloc(sizeof(float) * (size_t)ctx * half);
    st->rope_sin = xmalloc(sizeof(float) * (size_t)ctx * half);
    for (int p = 0; p < ctx; p++)
        for (int i = 0; i < half; i++) {
            double freq = pow((double)hp->rope_base, -2.0 * i / (double)hd);
            double th = (double)p * freq;
            st->rope_cos[(size_t)p * half + i] = (float)cos(th);
            st->rope_sin[(size_t)p * half + i] = (float)sin(th);
        }
    st->attn_scale = 1.0f / sqrtf((float)hd);
    st->ffn = hp->arch == MODEL_ARCH_QWEN3MOE ? hp->n_ff_exp : hp->n_ff;
    int K = hp->arch == MODEL_ARCH_QWEN3MOE ? hp->n_expert_used : 1;
    int P = R * K, F = st->ffn;
    st->n_pairs_max = P;
    st->x = xaligned(sizeof(float) * (size_t)R * E);
    st->xn = xaligned(sizeof(float) * (size_t)R * E);
    st->tmp = xaligned(sizeof(float) * (size_t)R * E);
    st->q = xaligned(sizeof(float) * (size_t)R * H);
    st->att = xaligned(sizeof(float) * (size_t)R * H);
    st->k = xaligned(sizeof(float) * (size_t)R * HKV);
    st->v = xaligned(sizeof(float) * (size_t)R * HKV);
    act_set_init(&st->a_embd, E, R);
    st->a_embd.f32 = st->xn;
    act_set_init(&st->a_att, H, R);
    st->a_att.f32 = st->att;
    act_set_init(&st->a_ff, F, P);
    st->g = xaligned(sizeof(float) * (size_t)P * F);
    st->u = xaligned(sizeof(float) * (size_t)P * F);
    st->h = xaligned(sizeof(float) * (size_t)P * F);
    st->a_ff.f32 = st->h;
    st->y = xaligned(sizeof(float) * (size_t)P * E);
    size_t abmax = DT_MAX((size_t)E * sizeof(float), DT_MAX(st->a_embd.b32, st->a_embd.b256));
    st->xg = xaligned(abmax * (size_t)P);
    int NE = DT_MAX(hp->n_expert, 1);
    st->router = xaligned(sizeof(float) * (size_t)R * NE);
    st->sel = xcalloc((size_t)P, sizeof(int32_t));
    st->selw = xcalloc((size_t)P, sizeof(float));
    st->pair_row = xcalloc((size_t)P, sizeof(int32_t));
    st->pair_of = xcalloc((size_t)P, sizeof(int32_t));
    st->exp_cnt = xcalloc((size_t)NE, sizeof(int));
    st->exp_off = xcalloc((size_t)NE, sizeof(int));
    st->scratch_stride = (attn_scratch_floats(hp->n_head / hp->n_head_kv, ctx - 1, hd) + 15) & ~(size_t)15;
    st->scores = xaligned(sizeof(float) * (size_t)st->nth * st->scratch_stride);
    if (st->nth > 1 && solo_job_fits(hp)) { /* solo_task's per-thread copies (cpu_tune may turn the form on later) */
        st->att_whole = (hp->n_head / hp->n_head_kv * hd) % QK_K == 0;
        st->xn_t = xaligned(sizeof(float) * (size_t)st->nth * E);
        st->xr_t = xaligned(sizeof(float) * (size_t)st->nth * E);
        st->a_t = xcalloc((size_t)st->nth, sizeof(act_set));
        st->aat_t = xcalloc((size_t)st->nth, sizeof(act_set));
        for (int t = 0; t < st->nth; t++) {
            act_set_init(&st->a_t[t], E, 1);
            st->a_t[t].f32 = st->xn_t + (size_t)t * E;
            if (st->att_whole) continue; /* each thread quantizes its own groups into a_att */
            act_set_init(&st->aat_t[t], H, 1);
            st->aat_t[t].f32 = st->att;
        }
        st->sel_t = xcalloc((size_t)st->nth * K, sizeof(int32_t));
        st->selw_t = xcalloc((size_t)st->nth * K, sizeof(float));
    }
    st->attn = attn_select(st->level, hd);
    st->swiglu = vec_swiglu_select(st->level);
    st->rmsnorm = vec_rmsnorm_select(st->level);
    st->pool = pool_create(st->nth);
    st->prep = cpu_prepared_get(m, st->pool);
    *state = st;
    return 0;
}

/* backend_ops.retune: o's run-time choices on a live state; the shape (threads, rows, kernel level,
 * profiling) must be the one it was created with. */
static int cpu_retune(void *state, const backend_opts *o, ditto_err *err) {
    cpu_state *st = state;
    if (o->n_threads != st->nth) return err_set(err, "threads = %d (the backend runs %d)", o->n_threads, st->nth);
    if (o->max_rows != st->max_rows)
        return err_set(err, "max rows per step = %d (the backend runs %d)", o->max_rows, st->max_rows);
    if ((o->cpu_level < 0 ? (int)cpu_level_detect() : o->cpu_level) != st->level)
        return err_set(err, "cpu level = %d (the backend runs %s)", o->cpu_level, cpu_level_name(st->level));
    if (o->profile != st->prof.on) return err_set(err, "profile = %d (the backend was made with %d)", o->profile, st->prof.on);
    if (cpu_tune_check(o, err)) return -1;
    cpu_tune(st, o);
    return 0;
}

static void cpu_counters(void *state, uint64_t *weight_bytes, uint64_t *kv_bytes) {
    const cpu_state *st = state;
    *weight_bytes = st->weight_bytes;
    *kv_bytes = st->kv_bytes;
}

static int cpu_profile(void *state, backend_stage *out, int cap) {
    return cpu_prof_stages(&((const cpu_state *)state)->prof, out, cap);
}

static int cpu_calls(void *state, backend_calls *out, int cap) {
    return cpu_prof_calls(&((const cpu_state *)state)->prof, out, cap);
}

static const char *cpu_describe(void *state) { return ((cpu_state *)state)->desc; }

static void cpu_memory(void *state, char *buf, size_t cap) {
    const cpu_state *st = state;
    const model *m = st->m;
    const double mib = 1024.0 * 1024.0;
    const size_t prep = cpu_prepared_bytes(st->prep);
    char emb[64] = "token embedding read in place";
    if (m->embd_copy) snprintf(emb, sizeof emb, "token embedding copied %.1f MiB", (double)m->tok_embd.mat_bytes / mib);
    if (prep)
        snprintf(buf, cap, "weights prepared in memory %.1f MiB (%.0f%% on huge pages), %s", (double)prep / mib,
                 100.0 * (double)cpu_prepared_huge_bytes(st->prep) / (double)prep, emb);
    else
        snprintf(buf, cap, "weights read from the file mapping (%.1f MiB), %s", (double)m->gguf->size / mib, emb);
}

static void cpu_destroy(void *state) {
    cpu_state *st = state;
    if (!st) return;
    pool_free(st->pool);
    claim_free(&st->claim);
    cpu_prof_free(&st->prof);
    act_set_free(&st->a_embd);
    act_set_free(&st->a_att);
    act_set_free(&st->a_ff);
    for (int t = 0; st->a_t && t < st->nth; t++) act_set_free(&st->a_t[t]), act_set_free(&st->aat_t[t]);
    free(st->a_t);
    free(st->aat_t);
    void *bufs[] = {st->rope_cos, st->rope_sin, st->x,     st->xn,       st->tmp,     st->q,       st->att,
                    st->k,        st->v,        st->g,     st->u,        st->h,       st->y,       st->xg,
                    st->router,   st->sel,      st->selw,  st->pair_row, st->pair_of, st->exp_cnt, st->exp_off,
                    st->scores,   st->ahead[0], st->ahead[1], st->xn_t, st->xr_t, st->sel_t, st->selw_t};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(st);
}

static void cpu_host_parallel(void *s, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    cpu_state *st = s;
    pool_go(st, fn, ctx); /* the idle threads keep requesting the next step's weights after it */
}

const backend_ops cpu_backend_ops = {.name = "cpu",
                                     .create = cpu_create,
                                     .retune = cpu_retune,
                                     .forward = cpu_forward,
                                     .counters = cpu_counters,
                                     .profile = cpu_profile,
                                     .calls = cpu_calls,
                                     .describe = cpu_describe,
                                     .memory = cpu_memory,
                                     .host_parallel = cpu_host_parallel,
                                     .destroy = cpu_destroy};
