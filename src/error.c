/* Status codes and the per-thread detail message behind mu_last_error(). */
#include "muon_internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char mu__last_error[1024];

const char *mu_strerror(int code)
{
    switch (code) {
    case MU_OK: return "ok";
    case MU_EINVAL: return "invalid argument";
    case MU_ENOMEM: return "out of memory";
    case MU_EIO: return "i/o error";
    case MU_EFORMAT: return "malformed or unsupported file";
    case MU_EDTYPE: return "unsupported or mismatched dtype";
    case MU_ESHAPE: return "shape mismatch";
    case MU_ENONFINITE: return "non-finite value";
    case MU_ESTATE: return "invalid state";
    case MU_ELUA: return "lua error";
    case MU_ECOMM: return "communication error";
    default: return "unknown error";
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
