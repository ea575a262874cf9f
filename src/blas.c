/* Which OpenBLAS core and how many threads this process runs with. */
#include "dnnl.h"
#include "muon_internal.h"

#include <cblas.h>
#include <stdio.h>
#include <string.h>

int mu_blas_get_info(mu_blas_info *out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    memset(out, 0, sizeof *out);
    snprintf(out->core, sizeof out->core, "%s", openblas_get_corename());
    snprintf(out->config, sizeof out->config, "%s", openblas_get_config());
    out->threads = openblas_get_num_threads();
    mu__dnnl_describe(out->bf16, sizeof out->bf16);
    return MU_OK;
}

int mu_blas_set_threads(int threads)
{
    if (threads < 1) return mu__fail(MU_EINVAL, "threads must be >= 1, got %d", threads);
    openblas_set_num_threads(threads);
    return MU_OK;
}
