/*
 * mu_blas_switch_core in a program that loaded OpenBLAS at start (linked):
 * its kernels are re-selected for this CPU unless OPENBLAS_CORETYPE says
 * otherwise. TAP output; exit 1 on any failure.
 */
#include "muon.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void test_switch_core(void)
{
    /* OpenBLAS is linked into this program, so already loaded: preset
     * refuses, switch re-selects its kernels (unless the variable is set,
     * which stays the user's choice) */
    const char *want = mu_blas_cpu_core();
    const char *env = getenv("OPENBLAS_CORETYPE");
    int user = env && *env;
    int rc = mu_blas_switch_core();
    mu_blas_info info;
    mu_blas_get_info(&info);
    if (user || !*want)
        ok(rc == MU_OK, "switch_core: nothing to do (OPENBLAS_CORETYPE=%s, cpu core '%s')", env ? env : "", want);
    else
        ok(rc == MU_OK && strcasecmp(info.core, want) == 0 && strcmp(getenv("OPENBLAS_CORETYPE"), want) == 0,
           "switch_core: OpenBLAS runs %s, the variable says it (%s)", want, info.core);
    ok(mu_blas_switch_core() == MU_OK, "switch_core: a second call has nothing to do");
}

int main(void)
{
    test_switch_core();
    return n_fail != 0;
}
