/*
 * mu_blas_fix_core: the C host's side of the OpenBLAS core choice made in
 * src/blas_core.c (its table, mu_blas_cpu_core). Apart from that file
 * because it asks the OpenBLAS already loaded which core it runs
 * (mu_blas_get_info), and src/blas_core.c also builds the CPU probe
 * library, which needs nothing but libc.
 */
#include "muon_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

extern char **environ;

/* Re-executes the program with OPENBLAS_CORETYPE set in a copy of the
 * environment (execve): the process's own environment is never changed,
 * so the OpenBLAS threads that already run (and any other) read it safely. */
int mu_blas_fix_core(char **argv)
{
    if (!argv || !argv[0]) return mu__fail(MU_EINVAL, "mu_blas_fix_core: argv is NULL or empty");
    const char *cur = getenv("OPENBLAS_CORETYPE");
    if ((cur && *cur) || getenv("MUON_BLAS_REEXEC")) return MU_OK;
    const char *want = mu_blas_cpu_core();
    if (!*want) return MU_OK;
    mu_blas_info info;
    if (mu_blas_get_info(&info) == MU_OK && strcasecmp(info.core, want) == 0) return MU_OK;
    size_t n = 0;
    while (environ && environ[n]) n++;
    char **env = malloc((n + 3) * sizeof *env);
    char *core = malloc(strlen("OPENBLAS_CORETYPE=") + strlen(want) + 1);
    if (env && core) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) /* an empty OPENBLAS_CORETYPE= is replaced */
            if (strncmp(environ[i], "OPENBLAS_CORETYPE=", 18) != 0) env[k++] = environ[i];
        sprintf(core, "OPENBLAS_CORETYPE=%s", want);
        env[k++] = core;
        env[k++] = "MUON_BLAS_REEXEC=1";
        env[k] = NULL;
        execve("/proc/self/exe", argv, env);
    }
    /* exec failed: continue with the current core */
    free(env);
    free(core);
    return MU_OK;
}
