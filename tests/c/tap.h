/* TAP output for the C tests: ok(cond, fmt, ...) prints "ok N - ..." or
 * "not ok N - ..." and counts; a test's main returns n_fail != 0. */
#ifndef MU_TESTS_TAP_H
#define MU_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>
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

#endif
