/* main.c — the ditto command line. */
#include <stdio.h>
#include <string.h>

static void usage(void) {
    fprintf(stderr, "usage: ditto <info|run> [options]\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage();
        return 2;
    }
    usage();
    (void)argv;
    return 2;
}
