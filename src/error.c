/* Status codes and the per-thread detail message behind mu_last_error(). */
#include "muon_internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char mu__last_error[1024];

/* Both from the one table in muon.h (MU_ERRORS). */
const char *mu_strerror(int code)
{
    switch (code) {
#define MU__STRERROR_CASE(name, value, desc) \
    case MU_##name: return desc;
        MU_ERRORS(MU__STRERROR_CASE)
#undef MU__STRERROR_CASE
    default: return "unknown error";
    }
}

const char *mu_errname(int code)
{
    switch (code) {
#define MU__ERRNAME_CASE(name, value, desc) \
    case MU_##name: return #name;
        MU_ERRORS(MU__ERRNAME_CASE)
#undef MU__ERRNAME_CASE
    default: return "UNKNOWN";
    }
}

const char *mu_last_error(void) { return mu__last_error; }

void mu__clear_error(void) { mu__last_error[0] = '\0'; }

const char *mu__name_index(char *buf, size_t cap, const char *head, const char *open, long long i,
                           const char *close)
{
    if (cap == 0) return buf;
    char digits[24];
    int nd = 0;
    unsigned long long u = i < 0 ? 0ULL - (unsigned long long)i : (unsigned long long)i;
    do {
        digits[nd++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (i < 0) digits[nd++] = '-';
    size_t len = 0;
    for (const char *c = head; *c && len + 1 < cap; c++) buf[len++] = *c;
    for (const char *c = open; *c && len + 1 < cap; c++) buf[len++] = *c;
    while (nd > 0 && len + 1 < cap) buf[len++] = digits[--nd];
    for (const char *c = close; *c && len + 1 < cap; c++) buf[len++] = *c;
    buf[len] = '\0';
    return buf;
}

int mu__fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mu__last_error, sizeof mu__last_error, fmt, ap);
    va_end(ap);
    return code;
}
