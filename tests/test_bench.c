/* test_bench.c — `ditto bench` on the shipped tiny model: the report's rows and probe line
 * are there, --paired runs the solo and the unify path step by step and finds their logits
 * bitwise equal (split by the probe beside each step; --trace: a row per step), and likewise
 * a solo stream and row 0 of a 2-stream batch with its prompt (with --profile, the batch's
 * aggregate ratio over all steps and its per-stage table beside the solo stream's), and
 * (--forms) the one-token kernels' two weight stream forms, (--form-ab) one form against this host's,
 * (--loads-only-ab) the step against its gemm calls loading only, (--unify-ab) the solo path against the
 * batched path at one row; bad arguments are refused.
 * Timings are printed, never asserted. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "cpu/claim.h"
#include "cpu/cpu_quant.h"
#include "test.h"

/* Runs bench_cmd on argv with stdout captured into buf; returns its exit code. */
static int run_bench(int argc, char **argv, char *buf, size_t cap) {
    fflush(stdout);
    FILE *tmp = tmpfile();
    if (!tmp) return -1;
    const int saved = dup(STDOUT_FILENO);
    dup2(fileno(tmp), STDOUT_FILENO);
    const int rc = bench_cmd(argc, argv);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    rewind(tmp);
    const size_t n = fread(buf, 1, cap - 1, tmp);
    buf[n] = 0;
    fclose(tmp);
    return rc;
}

/* ditto bench on the tiny model (one stream, 3 paired solo steps) with the n options opt: true where
 * it exits 0 and prints a line starting with head, and every string of want (NULL-ended) follows it. */
static bool ab_line(char *const *opt, int n, const char *head, const char *const *want, char *out, size_t cap) {
    char *argv[24] = {"bench", "-m", "models/tiny-qwen3moe-q4_k_m.gguf", "--streams", "1", "--prompt-len", "8",
                      "--gen-len", "2", "--threads", "2", "--paired", "3"};
    int argc = 13;
    for (int i = 0; i < n && argc < 24; i++) argv[argc++] = opt[i];
    if (run_bench(argc, argv, out, cap) != 0) return false;
    const char *l = strstr(out, head);
    if (!l || (l > out && l[-1] != '\n')) return false;
    for (; *want; want++)
        if (!strstr(l, *want)) return false;
    return true;
}

/* The step counts of a paired split's four parts in the line from `from` on: after each key,
 * "… (N steps)" or "no steps" (0); all 0 where from is NULL. */
static void split_steps(const char *from, const char *const keys[4], int steps[4]) {
    for (int i = 0; i < 4; i++) {
        const char *k = from ? strstr(from, keys[i]) : NULL;
        const char *paren = k ? strchr(k, '(') : NULL;
        steps[i] = k && strncmp(k + strlen(keys[i]), "no steps", 8) && paren ? atoi(paren + 1) : 0;
    }
}

int main(void) {
    static char out[1 << 16];
    char *ok[] = {"bench", "-m", "models/tiny-qwen3moe-q4_k_m.gguf", "--streams", "1,2", "--prompt-len", "8",
                  "--gen-len", "2", "--threads", "2", "--paired", "3", "--trace"};
    int rc = run_bench(14, ok, out, sizeof out);
    CHECK(rc == 0, "bench exit %d", rc);
    CHECK(strstr(out, "best of 36)") != NULL, "the probe line names its 36 passes (12 patterns x 3)");
    const char *cpu = strstr(out, "\ncpu: ");
    CHECK(cpu && strstr(cpu, " family ") && strstr(cpu, "CPUs online\nbackend: "),
          "the header names the CPU (model, vendor, family, model number) and the CPUs online before the backend");
    CHECK(strstr(out, "| 1 | solo |") && strstr(out, "| 2 | batched |") && strstr(out, "| 1 | unify (batched) |"),
          "solo, batched and unify rows");
    CHECK(strstr(out, "| solo | ") && strstr(out, "| unify (batched) | "), "the paired table has both paths");
    CHECK(strstr(out, "logits bitwise equal at every step: yes") != NULL,
          "paired: the solo and the unify path's logits are bitwise equal at every step");
    /* paired batches: the 2-stream row, whose last cell says whether batch row 0 (the solo
     * stream's prompt) had the solo stream's logits, bitwise, at every step */
    const char *pb = strstr(out, "paired batches (");
    const char *row2 = pb ? strstr(pb, "\n| 2 | ") : NULL;
    char cells[512] = "";
    if (row2) snprintf(cells, sizeof cells, "%.*s", (int)strcspn(row2 + 1, "\n"), row2 + 1);
    const size_t cl = strlen(cells);
    CHECK(cl > 8 && !strcmp(cells + cl - 7, "| yes |"),
          "paired batches: row 0 of a 2-stream batch equals the solo stream bitwise (%s)", cells);
    /* the phase split: every path's 3 steps fall below or above the probes' midpoint */
    const char *ph = strstr(out, "by the probe right after each pair, split at ");
    const char *const keys[4] = {"solo below: ", "solo above: ", "unify below: ", "unify above: "};
    int steps[4];
    split_steps(ph, keys, steps);
    CHECK(ph && steps[0] + steps[1] == 3 && steps[2] + steps[3] == 3,
          "phase split: %d + %d solo, %d + %d unify steps, want 3 each", steps[0], steps[1], steps[2], steps[3]);
    /* the placement split: the threads' round trip after each pair, and every path's 3 steps near or far */
    const char *pl = strstr(out, "by the threads' placement (a cache line's round trip between two probe threads");
    const char *pr = pl ? strstr(pl, "right after each pair, ") : NULL;
    const double rtt_lo = pr ? atof(pr + strlen("right after each pair, ")) : 0.0;
    const char *const pkeys[4] = {"solo near: ", "solo far: ", "unify near: ", "unify far: "};
    int place[4];
    split_steps(pl, pkeys, place);
    CHECK(pl && rtt_lo > 0.0 && place[0] + place[1] == 3 && place[2] + place[3] == 3,
          "placement split: round trip from %g ns, %d + %d solo, %d + %d unify steps, want 3 each", rtt_lo, place[0],
          place[1], place[2], place[3]);
    /* --trace: one row per paired step and path (3 steps x solo, unify), right after its header */
    int trace_rows = 0;
    const char *q = strstr(out, "\n| trace: path |");
    while (q && (q = strstr(q + 1, "\n| ")) && (!strncmp(q, "\n| solo | ", 10) || !strncmp(q, "\n| unify | ", 11)))
        trace_rows++;
    CHECK(trace_rows == 6, "--trace: %d step rows, want 6", trace_rows);
    /* the load-only pass of a step's bytes after each pair: both paths against it, and it
     * against the best pattern, as positive percentages */
    const char *lo = strstr(out, "against one load-only pass of a solo step's bytes right after each pair");
    double cs = 0, cu = 0, cp = 0;
    const char *cq = lo ? strstr(lo, "): solo ") : NULL, *cv = lo ? strstr(lo, ", unify ") : NULL,
               *cw = lo ? strstr(lo, "the pass itself read ") : NULL;
    if (cq) cs = atof(cq + strlen("): solo "));
    if (cv) cu = atof(cv + strlen(", unify "));
    if (cw) cp = atof(cw + strlen("the pass itself read "));
    CHECK(cs > 0 && cu > 0 && cp > 0 && cs < 1e6 && cu < 1e6 && cp < 1e6,
          "the load-only pass: solo %g%%, unify %g%%, the pass %g%% of the best pattern", cs, cu, cp);
    const char *p = strstr(out, "median of the per-step paired ratios: ");
    double ratio = p ? atof(p + strlen("median of the per-step paired ratios: ")) : 0.0;
    CHECK(ratio > 0.0 && ratio < 100.0, "a finite unify/solo ratio (%g)", ratio);
    const char *line = strstr(out, "paired (");
    if (line) printf("%.*s\n", (int)strcspn(line, "\n"), line);
    printf("unify / solo per-step ratio: %.3f\n", ratio);

    /* paired batches with --profile: the aggregate ratio over all steps, and a per-stage table
     * of the solo and the batch steps whose last row sums the stages */
    char *pp[] = {"bench", "-m", "models/tiny-qwen3moe-q4_k_m.gguf", "--streams", "1,2", "--prompt-len", "8",
                  "--gen-len", "2", "--threads", "2", "--paired", "3", "--profile", "--trace"};
    rc = run_bench(15, pp, out, sizeof out);
    CHECK(rc == 0, "bench --paired --profile exit %d", rc);
    pb = strstr(out, "paired batches (");
    row2 = pb ? strstr(pb, "\n| 2 | ") : NULL;
    double x_all = 0.0; /* the cell before the last: "| x_all | yes |" */
    if (row2) {
        const char *end = row2 + 1 + strcspn(row2 + 1, "\n"), *c = end;
        int bars = 0;
        while (c > row2 && bars < 3) bars += *--c == '|';
        x_all = atof(c + 1);
    }
    CHECK(x_all > 0.0 && x_all < 100.0, "paired batches: a finite aggregate ratio over all steps (%g)", x_all);
    const char *ps = strstr(out, "\npaired batches per stage (means over the 3 steps");
    int stage_rows = 0;
    const char *sr = ps ? strstr(ps, "\n| stage | solo | 2 streams | x |\n|---|") : NULL;
    for (const char *l = sr ? strstr(sr + 1, "\n| ") : NULL; l && strncmp(l, "\n| sum of stages |", 18);
         l = strstr(l + 1, "\n| "))
        stage_rows++;
    CHECK(stage_rows == 15, "paired per-stage table: %d stage rows, want 15", stage_rows);
    /* --profile: the rows' gemm kernel calls by kind; the solo row's one-token calls and the 2-stream
     * row's two-token dense gemms, each counted with a positive rate */
    const char *ct = strstr(out, "\ngemm kernel calls in the rows above");
    double n1 = 0, g1 = 0, n2 = 0, g2 = 0, kib = 0;
    const char *r1 = ct ? strstr(ct, "\n| 1 token, steps of one row | ") : NULL;
    const char *r2 = ct ? strstr(ct, "\n| 2 tokens | ") : NULL;
    if (r1) sscanf(r1, "\n| 1 token, steps of one row | %lf | %*f | %*f | %*f | %lf |", &n1, &g1);
    if (r2) sscanf(r2, "\n| 2 tokens | %lf | %*f | %lf | %*f | %lf |", &n2, &kib, &g2);
    CHECK(n1 > 0 && g1 > 0 && n2 > 0 && kib > 0 && g2 > 0, "calls table: one-row steps %g calls at %g GB/s, two tokens %g at %g",
          n1, g1, n2, g2);
    /* and the paired steps' calls, per batch size */
    const char *pt = strstr(out, "\ngemm kernel calls in the paired steps of one stream and of 2 ");
    const char *p2 = pt ? strstr(pt, "\n| 2 tokens | ") : NULL;
    double pn2 = 0;
    if (p2) sscanf(p2, "\n| 2 tokens | %lf |", &pn2);
    CHECK(pn2 > 0, "paired calls table: %g two-token calls", pn2);
    const char *sum = ps ? strstr(ps, "\n| sum of stages | ") : NULL;
    double so = 0, ba = 0, xs = 0;
    if (sum) sscanf(sum, "\n| sum of stages | %lf | %lf | %lf |", &so, &ba, &xs);
    /* each cell is rounded to two decimals: the ratio of the rounded sums may differ from the
     * printed ratio by what half a unit in the last place of each allows */
    CHECK(so > 0.005 && ba > 0 && xs + 0.005 >= 0.99 * (ba - 0.005) / (so + 0.005) &&
              xs - 0.005 <= 1.01 * (ba + 0.005) / (so - 0.005),
          "paired per-stage sums: solo %g ms, batch %g ms, x %g (their ratio)", so, ba, xs);
    /* --trace with --profile: the summary's row per path and stage, a gemm stage's weight rate as a
     * positive % of the probe in the placement its steps ran in, a small stage's without one */
    const char *ts = strstr(out, "\ntrace summary: per stage");
    int sum_rows = 0, qkv_pct = 0, attn_pct = 0;
    for (const char *l = ts ? strstr(ts, "|---|---|---:|---:|---:|---:|\n") : NULL; l && (l = strstr(l + 1, "\n| "));) {
        if (strncmp(l, "\n| solo | ", 10) && strncmp(l, "\n| unify | ", 11)) break;
        sum_rows++;
        char row[256], *cell[8];
        int nc = 0;
        snprintf(row, sizeof row, "%.*s", (int)strcspn(l + 1, "\n"), l + 1);
        for (char *c = strtok(row, "|"); c && nc < 8; c = strtok(NULL, "|")) cell[nc++] = c;
        /* cells: path, stage, near ms, near %, far ms, far % */
        const bool pcts = nc == 6 && (atof(cell[3]) > 0.0 || atof(cell[5]) > 0.0);
        if (nc == 6 && !strcmp(cell[1], " q/k/v gemm ")) qkv_pct += pcts;
        if (nc == 6 && !strcmp(cell[1], " attention ")) attn_pct += pcts || strchr(cell[3], '%') || strchr(cell[5], '%');
    }
    CHECK(sum_rows == 30 && qkv_pct == 2 && attn_pct == 0,
          "trace summary: %d rows (want 15 stages x 2 paths), q/k/v with a %% in %d of 2, attention in %d", sum_rows, qkv_pct,
          attn_pct);

    /* --prefill-chunk: the prompt in forward calls of that many rows */
    char *pc[] = {"bench", "-m", "models/tiny-qwen3moe-q4_k_m.gguf", "--streams", "1", "--prompt-len", "20",
                  "--gen-len", "1", "--threads", "2", "--prefill-chunk", "7"};
    rc = run_bench(13, pc, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "\nprefill: 20 tokens in ") && strstr(out, " tok/s (chunks of 7)\n"),
          "--prefill-chunk 7: exit %d, the prefill line names its chunks of 7", rc);

    /* --forms: solo steps in each stream form in turn, their logits bitwise equal at every step */
    char *fm[] = {"bench", "-m", "models/tiny-qwen3moe-q4_k_m.gguf", "--streams", "1", "--prompt-len", "8",
                  "--gen-len", "2", "--threads", "2", "--paired", "3", "--forms"};
    rc = run_bench(14, fm, out, sizeof out);
    CHECK(rc == 0, "bench --forms exit %d", rc);
    const char *sf = strstr(out, "\nstream forms (3 solo steps");
    /* one row per form other than near-far (each paired with near-far): its backend, and its
     * logits bitwise equal to near-far's at every step */
    for (int f = 1; f < CPU_STREAM_COUNT; f++) {
        const char *name = cpu_stream_name((enum cpu_stream)f);
        char key[64], row[512] = "";
        snprintf(key, sizeof key, "\n| %s | cpu ", name);
        const char *r = sf ? strstr(sf, key) : NULL;
        if (r) snprintf(row, sizeof row, "%.*s", (int)strcspn(r + 1, "\n"), r + 1);
        CHECK(r != NULL, "--forms: a row for %s", name);
        /* the description may go on (", solo step as one pool job") */
        snprintf(key, sizeof key, "| %s | cpu avx512, 2 threads, weight stream %s", name, name);
        if (cpu_level_detect() >= CPU_AVX512)
            CHECK(strstr(row, key) == row && (row[strlen(key)] == ' ' || row[strlen(key)] == ','),
                  "--forms: %s runs its own form (%s)", name, row);
        const size_t n = strlen(row);
        CHECK(n > 7 && !strcmp(row + n - 7, "| yes |"), "--forms: %s's logits bitwise equal to near-far's at every step (%s)",
              name, row);
        printf("%s\n", row);
    }

    /* the paired A/Bs: each prints its line; a stream-changing option never changes the logits */
    CHECK(ab_line((char *[]){"--ahead", "0", "--ahead-ab", "65536"}, 4,
                  "requests ahead (3 solo steps, A with 0 bytes and B with 65536, ",
                  (const char *[]){"logits bitwise equal at every step: yes", NULL}, out, sizeof out),
          "--ahead-ab: its line, logits bitwise equal");
    CHECK(ab_line((char *[]){"--form-ab", "two-l1"}, 2, "stream form (3 solo steps, A in this host's form and B in two-l1, ",
                  (const char *[]){"logits bitwise equal at every step: yes", "B: cpu", NULL}, out, sizeof out),
          "--form-ab: its line, logits bitwise equal, the engines named");
    /* --loads-only-ab: the same solo steps with gemm calls that only load their weights */
    CHECK(ab_line((char *[]){"--loads-only-ab"}, 1,
                  "the step's structure (3 solo steps, A as it runs and B with its gemm calls loading only",
                  (const char *[]){"logits not compared", "gemm calls load only (diagnostic)", NULL}, out, sizeof out),
          "--loads-only-ab: its line and B's engine named");
    /* with --trace an A/B profiles both engines and sums each one's stages up (the trace summary) */
    CHECK(ab_line((char *[]){"--claim-runs-ab", "1", "--trace"}, 3, "claimed runs (3 solo steps, ",
                  (const char *[]){"logits bitwise equal at every step: yes", NULL}, out, sizeof out) &&
              strstr(out, "\n| A | q/k/v gemm | ") && strstr(out, "\n| B | router gemm | "),
          "--claim-runs-ab 1 --trace: A's and B's stages in the trace summary");

    /* --float-form-ab: the f32 router's one-token form alone; --ab-streams: any A/B over batches */
    /* where the float kernels have forms (AVX-512) and this host's is not near-far, B runs its own */
    const bool ff_named = cpu_level_detect() >= CPU_AVX512 && cpu_stream_detect() != CPU_STREAM_NEAR_FAR;
    CHECK(ab_line((char *[]){"--float-form-ab", "near-far"}, 2,
                  "float kernels' form (3 solo steps, A in this host's form and B in near-far, ",
                  (const char *[]){"logits bitwise equal at every step: yes",
                                   ff_named ? ", float kernels near-far" : "B: cpu", NULL},
                  out, sizeof out),
          "--float-form-ab: its line, logits bitwise equal, B's float form named where it has one");
    char head[200];
    const int solo_runs =
        cpu_stream_select(cpu_level_detect(), -1) == CPU_STREAM_TWO_L1 ? CLAIM_RUNS_TWO_L1_SOLO : CLAIM_RUNS;
    snprintf(head, sizeof head,
             "claimed runs (3 decode steps of a batch of 10 streams, A the default runs (1/%d of a segment in a solo step,"
             " 1/%d in a batch) and B runs of 1/1, ",
             solo_runs, CLAIM_RUNS);
    /* 10 streams: more rows a step than the prompt's 8 (the run's max_rows) */
    CHECK(ab_line((char *[]){"--ab-streams", "10", "--claim-runs-ab", "1"}, 4, head,
                  (const char *[]){"per-step rate ratio B / A, median", "over all steps",
                                   "logits bitwise equal at every step: yes", "B: cpu", NULL},
                  out, sizeof out),
          "--ab-streams 10 --claim-runs-ab 1: a batch A/B line, logits bitwise equal");

    /* --switch N: the A/B on one engine, its options switched between consecutive steps (solo, or a batch) */
    CHECK(ab_line((char *[]){"--switch", "5", "--ahead-ab", "0"}, 4,
                  "requests ahead, switched (5 pairs of solo steps on one engine, A with the default ",
                  (const char *[]){"per-pair rate ratio B / A, median", "over all steps", "A: cpu", "; B: cpu", NULL},
                  out, sizeof out),
          "--switch 5 --ahead-ab 0: a switched solo A/B line, both engines' settings named");
    CHECK(ab_line((char *[]){"--switch", "3", "--ab-streams", "10", "--claim-runs-ab", "1"}, 6,
                  "claimed runs, switched (3 pairs of decode steps of a batch of 10 streams on one engine, ",
                  (const char *[]){"per-pair rate ratio B / A, median", NULL}, out, sizeof out),
          "--switch 3 --ab-streams 10 --claim-runs-ab 1: a switched batch A/B line");
    /* --unify-ab: the solo path against the batched path at one row. Paired on two engines their logits
     * are bitwise equal at every step, B never takes the solo path, and each measured pair follows a
     * warm-up pair (warm_pair: the step right after a probe pass reads slow); switched on one engine, the
     * decode steps split evenly between the paths (3 pairs and 4 warm-up pairs). */
    CHECK(ab_line((char *[]){"--unify-ab"}, 1,
                  "unify (3 solo steps, A on the solo path and B on the batched path (--unify), ",
                  (const char *[]){"logits bitwise equal at every step: yes",
                                   "A 6 on the solo path, 1 on the batched path; B 0 on the solo path, 7 on the batched"
                                   " path\n",
                                   NULL},
                  out, sizeof out),
          "--unify-ab: its line, the paths' logits bitwise equal, B on the batched path only, each side's 3 steps"
          " after 3 warm-up steps (and its prefill)");
    CHECK(ab_line((char *[]){"--switch", "3", "--unify-ab"}, 3,
                  "unify, switched (3 pairs of solo steps on one engine, A on the solo path and B on the batched path",
                  (const char *[]){"decode steps by path: 7 on the solo path, 7 on the batched path\n", NULL}, out,
                  sizeof out),
          "--switch 3 --unify-ab: a switched line, the decode steps split evenly between the paths");
    /* --batch-ab S (switched only): solo steps of one stream against steps of a batch of S others */
    CHECK(ab_line((char *[]){"--switch", "3", "--batch-ab", "2"}, 4,
                  "aggregate decode rate, switched (3 pairs of decode steps on one engine, A one stream and B a batch of 2 streams, ",
                  (const char *[]){"per-pair rate ratio B / A, median",
                                   "decode steps by path: 7 on the solo path, 7 on the batched path\n", NULL},
                  out, sizeof out),
          "--switch 3 --batch-ab 2: its line, one side on each path");
    char *bad_sw[][7] = {{"bench", "--switch", "0"},
                         {"bench", "--switch", "2001"},
                         {"bench", "--switch", "5"},
                         {"bench", "--switch", "5", "--ahead-ab", "0", "--trace"},
                         {"bench", "--switch", "5", "--ahead-ab", "0", "--place", "far"},
                         {"bench", "--batch-ab", "2"},
                         {"bench", "--switch", "5", "--batch-ab", "1"},
                         {"bench", "--switch", "5", "--batch-ab", "2", "--ab-streams", "2"}};
    const int bad_sw_n[] = {3, 3, 3, 6, 7, 3, 5, 7};
    for (int i = 0; i < 8; i++) {
        rc = run_bench(bad_sw_n[i], bad_sw[i], out, sizeof out);
        CHECK(rc == 2, "--switch case %d: exit %d, want 2", i, rc);
    }

    char *bad[][3] = {{"bench", "--paired", "-1"}, {"bench", "--paired", "101"}, {"bench", "--paired", "x"},
                      {"bench", "--ahead", "-1"},  {"bench", "--ahead-ab", "x"}, {"bench", "--place", "middle"},
                      {"bench", "--form-ab", "fast"}, {"bench", "--float-form-ab", "x"}, {"bench", "--ab-streams", "0"},
                      {"bench", "--ab-streams", "65"}};
    for (int i = 0; i < 10; i++) {
        rc = run_bench(3, bad[i], out, sizeof out);
        CHECK(rc == 2, "%s %s: exit %d, want 2", bad[i][1], bad[i][2], rc);
    }
    /* batch A/Bs wait for no placement, and the float form has nothing to change in a batch */
    char *combo[][5] = {{"bench", "--ab-streams", "2", "--place", "far"},
                        {"bench", "--ab-streams", "2", "--float-form-ab", "plain"},
                        {"bench", "--ab-streams", "2", "--unify-ab"}};
    const int combo_n[] = {5, 5, 4};
    for (int i = 0; i < 3; i++) {
        rc = run_bench(combo_n[i], combo[i], out, sizeof out);
        CHECK(rc == 2, "--ab-streams 2 %s %s: exit %d, want 2", combo[i][3], combo_n[i] > 4 ? combo[i][4] : "", rc);
    }
    return test_summary();
}
