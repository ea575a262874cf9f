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

int mu__fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mu__last_error, sizeof mu__last_error, fmt, ap);
    va_end(ap);
    return code;
}
