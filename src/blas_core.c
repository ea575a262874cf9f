/*
 * The OpenBLAS core for this CPU, decided in one place.
 *
 * OpenBLAS picks its kernels once, when it is loaded (its library
 * constructor reads OPENBLAS_CORETYPE), and Debian's 0.3.21 picks a generic
 * core on some recent CPUs, where its sgemm runs several times slower. So
 * the choice has to be made before OpenBLAS is loaded, and the environment
 * may only be changed while no other thread can read it. This file depends
 * on libc alone: the build also links it (with src/error.c) into
 * build/libmuon-cpu.so, which a host that loads libmuon at run time (the
 * Lua loader, lua/muon/core.lua; Python) can load and ask first.
 */
#define _GNU_SOURCE /* dl_iterate_phdr */
#include "muon_internal.h"

#include <dirent.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

/* The table: the first row whose CPU features are all present (as this
 * process sees them: CPUID and the OS's register support, so under
 * valgrind, which hides AVX-512, the answer is Haswell). */
const char *mu_blas_cpu_core(void)
{
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2")) return "Haswell";
    return "";
}

static int mu__has_openblas(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    return info->dlpi_name && strstr(info->dlpi_name, "openblas") != NULL;
}

/* Threads of this process (/proc/self/task), or -1 when it cannot tell. */
static int mu__thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

int mu_blas_preset_core(void)
{
    const char *cur = getenv("OPENBLAS_CORETYPE");
    if (cur && *cur) return MU_OK; /* the user's choice */
    const char *want = mu_blas_cpu_core();
    if (!*want) return MU_OK; /* no faster core than OpenBLAS's own pick */
    if (dl_iterate_phdr(mu__has_openblas, NULL))
        return mu__fail(MU_ESTATE, "mu_blas_preset_core: OpenBLAS is already loaded (it read "
                        "OPENBLAS_CORETYPE then); export OPENBLAS_CORETYPE=%s before the program starts", want);
    int threads = mu__thread_count();
    if (threads != 1)
        return mu__fail(MU_ESTATE, "mu_blas_preset_core: the process runs %s, so changing the "
                        "environment is not safe; export OPENBLAS_CORETYPE=%s before the program starts",
                        threads < 0 ? "an unknown number of threads (no /proc/self/task)" : "more than one thread",
                        want);
    setenv("OPENBLAS_CORETYPE", want, 1); /* the one setenv of the library: one thread, before OpenBLAS */
    return MU_OK;
}
