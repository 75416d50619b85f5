/* test_noblas.c — the ditto binary links no BLAS / LAPACK / MKL library. */
#include <string.h>

#include "test.h"

int main(void) {
    const char *build = getenv("BUILD");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ldd %s/ditto 2>&1", build && *build ? build : "build");
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL, "run %s", cmd);
    char line[512];
    int n = 0, bad = 0;
    while (p && fgets(line, sizeof line, p)) {
        n++;
        for (char *c = line; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
        if (strstr(line, "blas") || strstr(line, "lapack") || strstr(line, "mkl") || strstr(line, "not a dynamic")) {
            bad++;
            fprintf(stderr, "unexpected: %s", line);
        }
    }
    if (p) pclose(p);
    CHECK(n >= 2, "ldd printed %d lines", n);
    CHECK(bad == 0, "%d BLAS-like libraries linked", bad);
    printf("ldd: %d libraries, none BLAS/LAPACK/MKL\n", n);
    return test_summary();
}
