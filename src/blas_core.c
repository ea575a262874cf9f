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
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NOLOAD */
#include "muon_internal.h"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

/*
 * Re-selecting the kernels of an OpenBLAS that is already loaded. A
 * DYNAMIC_ARCH build (Debian's) keeps its kernels in one table pointer,
 * chosen by gotoblas_dynamic_init() from OPENBLAS_CORETYPE (else CPUID)
 * when the library loads; gotoblas_dynamic_quit() clears the pointer, so
 * quit, set the variable, init runs that same choice again, as the load
 * would have with the variable set (0.3.21 driver/others/dynamic.c; the
 * memory buffers are sized at build time for every core, and nothing else
 * depends on the core chosen). The library is found by its file name
 * (dl_iterate_phdr) and its symbols through a handle of its own: a host
 * may have loaded it RTLD_LOCAL (Python extensions are), out of reach of
 * dlsym(RTLD_DEFAULT).
 */
typedef struct mu__switch {
    const char *want;
    int n, failed;
    char paths[8][512]; /* the OpenBLAS files loaded (dlopen'd after the walk, not inside it) */
    char detail[640];
} mu__switch;

static int mu__find_openblas(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    mu__switch *s = data;
    if (info->dlpi_name && strstr(info->dlpi_name, "openblas") != NULL && s->n < 8)
        snprintf(s->paths[s->n++], sizeof s->paths[0], "%s", info->dlpi_name);
    return 0;
}

static void mu__switch_one(const char *path, mu__switch *s)
{
    void *h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return;
    const char *(*corename)(void) = (const char *(*)(void))dlsym(h, "openblas_get_corename");
    void (*quit)(void) = (void (*)(void))dlsym(h, "gotoblas_dynamic_quit");
    void (*init)(void) = (void (*)(void))dlsym(h, "gotoblas_dynamic_init");
    if (corename && strcasecmp(corename(), s->want) != 0) {
        if (!quit || !init) {
            s->failed = 1;
            snprintf(s->detail, sizeof s->detail, "%s runs the %s core and is not a DYNAMIC_ARCH build (no "
                     "gotoblas_dynamic_init): its kernels cannot change", path, corename());
        } else {
            quit();
            setenv("OPENBLAS_CORETYPE", s->want, 1); /* what init reads */
            init();
            if (strcasecmp(corename(), s->want) != 0) {
                s->failed = 1;
                snprintf(s->detail, sizeof s->detail, "%s runs the %s core after re-selecting %s", path,
                         corename(), s->want);
            }
        }
    }
    dlclose(h);
}

int mu_blas_switch_core(void)
{
    const char *cur = getenv("OPENBLAS_CORETYPE");
    if (cur && *cur) return MU_OK; /* the user's choice */
    mu__switch s = {.want = mu_blas_cpu_core()};
    if (!*s.want) return MU_OK; /* no faster core than OpenBLAS's own pick */
    dl_iterate_phdr(mu__find_openblas, &s);
    for (int i = 0; i < s.n; i++) mu__switch_one(s.paths[i], &s);
    if (s.failed)
        return mu__fail(MU_ESTATE, "mu_blas_switch_core: %s; export OPENBLAS_CORETYPE=%s before the program "
                        "starts", s.detail, s.want);
    return MU_OK;
}
