/* TAP output for the C tests: ok(cond, fmt, ...) prints "ok N - ..." or
 * "not ok N - ..." and counts; a test's main returns n_fail != 0. */
#ifndef MU_TESTS_TAP_H
#define MU_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_test, n_fail;

static void ok(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    n_test++;
    printf("%s %d - ", cond ? "ok" : "not ok", n_test);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout); /* tests that fork or crash keep every line */
    if (!cond) n_fail++;
}

/* Whether s (may be NULL) contains needle. */
static inline int contains(const char *s, const char *needle) { return s && strstr(s, needle) != NULL; }

/* Write text to the file dir/name; returns its path (one of 16 buffers
 * used in turn). Exits on failure: a test cannot go on without it. */
static inline const char *tap_write(const char *dir, const char *name, const char *text)
{
    static char paths[16][320];
    static int next;
    char *p = paths[next++ % 16];
    snprintf(p, 320, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (!f) {
        perror(p);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return p;
}

#endif
