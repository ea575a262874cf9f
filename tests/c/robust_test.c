/*
 * Robustness of the C API (src/muon.h and the private src/muon_ffi.h): every function given NULL
 * pointers returns MU_EINVAL (or its documented neutral value) instead of
 * crashing; engine handles that are closed or foreign return MU_ESTATE;
 * a config cannot choose the status code of an mu_engine_* call; files
 * that are not regular files fail at once; concurrent saves of one path
 * never tear it. Each NULL call runs in a forked child, so a crash is one
 * failed test line, not the end of the run. TAP output; exit 1 on failure.
 */
#include "muon_ffi.h"
#include "tap.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dirent.h>
#include <stdint.h>

/* Shared fixtures for the NULL calls (made before any fork). */
static mu_tensor *T22, *T4;
static mu_comm *COMM;
static mu_engine *ENG;
static char dir[256], cfg_path[320], npy_path[320];

/* Runs `expr` (an int status) in a child: the child exits with a code
 * telling whether it returned `want`; a signal is a crash. */
#define NULL_CALL(want, expr) run_child(#expr, (want), __LINE__, ({                   \
        int child_status_ = -1;                                                      \
        pid_t pid_ = fork();                                                         \
        if (pid_ == 0) {                                                             \
            int rc_ = (int)(expr);                                                   \
            _exit(rc_ == (want) ? 0 : 100 + (rc_ < 0 ? -rc_ : 50));                  \
        }                                                                            \
        if (pid_ > 0) waitpid(pid_, &child_status_, 0);                              \
        child_status_;                                                               \
    }))
/* A void call: only "does not crash". */
#define VOID_CALL(expr) run_child(#expr, 0, __LINE__, ({                              \
        int child_status_ = -1;                                                      \
        pid_t pid_ = fork();                                                         \
        if (pid_ == 0) {                                                             \
            expr;                                                                    \
            _exit(0);                                                                \
        }                                                                            \
        if (pid_ > 0) waitpid(pid_, &child_status_, 0);                              \
        child_status_;                                                               \
    }))

static void run_child(const char *what, int want, int line, int status)
{
    if (WIFSIGNALED(status)) {
        ok(0, "line %d: %s crashed (signal %d)", line, what, WTERMSIG(status));
    } else if (!WIFEXITED(status)) {
        ok(0, "line %d: %s: no status", line, what);
    } else {
        int code = WEXITSTATUS(status);
        ok(code == 0, "line %d: %s -> %s%s", line, what, mu_errname(want),
           code == 0 ? "" : code == 150 ? " (got a positive value)" : " (got another code)");
        if (code >= 100 && code < 150)
            printf("# got %s\n", mu_errname(-(code - 100)));
    }
}

static void null_calls(void)
{
    int64_t shape[2] = {2, 2}, idx[2] = {0, 0}, off[1] = {0}, cnt[1] = {1};
    mu_tensor *out = NULL, *ts[1] = {T4}, *nts[1] = {NULL};
    double d, coeffs[15];
    int64_t w;
    int bad, nsteps;
    float buf[4] = {0};
    size_t len;
    uint64_t u;
    mu_map_args args = {.op = MU_MAP_ADD, .x = {T22, T22, NULL}, .alpha = 1};
    mu_map_args nullx = {.op = MU_MAP_ADD, .x = {NULL, NULL, NULL}, .alpha = 1};
    mu_ns_opts opts = {.steps = 1, .coeffs = NULL, .eps = 1e-7, .norm_scale = 1, .path = 0};
    mu_comm_stats stats;
    mu_comm_request *req;
    mu_comm *comm2;
    mu_engine *e;
    mu_st_reader *r;
    mu_ns_workspace *ws;
    mu_blas_info info;
    (void)len;

    /* tensors */
    NULL_CALL(MU_EINVAL, mu_tensor_new(MU_F32, 2, shape, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_new(MU_F32, 2, NULL, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_wrap(MU_F32, 2, shape, NULL, NULL, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_wrap(MU_F32, 2, NULL, NULL, buf, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_wrap(MU_F32, 2, shape, NULL, buf, NULL));
    VOID_CALL(mu_tensor_free(NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_numel(NULL));
    NULL_CALL(0, mu_tensor_is_contiguous(NULL));
    NULL_CALL(0, mu_tensor_same_storage(NULL, T22));
    NULL_CALL(0, mu_tensor_same_storage(T22, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_check(NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_view(NULL, 1, shape, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_view(T22, 1, NULL, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_view(T22, 1, shape, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_transpose(NULL, 0, 1, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_transpose(T22, 0, 1, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_narrow(NULL, 0, 0, 1, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_narrow(T22, 0, 0, 1, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_squeeze(NULL, 0, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_unsqueeze(NULL, 0, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_unsqueeze(T22, 0, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_contiguous(NULL, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_contiguous(T22, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_clone(NULL, -1, &out));
    NULL_CALL(MU_EINVAL, mu_tensor_clone(T22, -1, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_copy(NULL, T22));
    NULL_CALL(MU_EINVAL, mu_tensor_copy(T22, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_fill(NULL, 1.0));
    NULL_CALL(MU_EINVAL, mu_tensor_norm(NULL, &d));
    NULL_CALL(MU_EINVAL, mu_tensor_norm(T22, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_get(NULL, idx, &d));
    NULL_CALL(MU_EINVAL, mu_tensor_get(T22, NULL, &d));
    NULL_CALL(MU_EINVAL, mu_tensor_get(T22, idx, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_set(NULL, idx, 1.0));
    NULL_CALL(MU_EINVAL, mu_tensor_set(T22, NULL, 1.0));
    NULL_CALL(MU_EINVAL, mu_tensor_all_finite(NULL, &w));
    NULL_CALL(1, mu_tensor_all_finite(T22, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_map(NULL, T22));
    NULL_CALL(MU_EINVAL, mu_tensor_map(&args, NULL));
    NULL_CALL(MU_OK, mu_tensor_map(&nullx, T22)); /* NULL operands are scalars */
    NULL_CALL(MU_EINVAL, mu_tensor_reduce(NULL, MU_REDUCE_SUM, 0, T4));
    NULL_CALL(MU_EINVAL, mu_tensor_reduce(T22, MU_REDUCE_SUM, 0, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_reduce_all(NULL, MU_REDUCE_SUM, &d));
    NULL_CALL(MU_EINVAL, mu_tensor_reduce_all(T22, MU_REDUCE_SUM, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_matmul(NULL, T22, T22));
    NULL_CALL(MU_EINVAL, mu_tensor_matmul(T22, NULL, T22));
    NULL_CALL(MU_EINVAL, mu_tensor_matmul(T22, T22, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_softmax(NULL, 0, 0, T22));
    NULL_CALL(MU_EINVAL, mu_tensor_softmax(T22, 0, 0, NULL));
    NULL_CALL(MU_EINVAL, mu_tensor_gather(NULL, 0, T22, 0, T22));
    NULL_CALL(MU_EINVAL, mu_tensor_gather(T22, 0, NULL, 0, T22));
    NULL_CALL(MU_EINVAL, mu_tensor_gather(T22, 0, T22, 0, NULL));

    /* npy, safetensors */
    NULL_CALL(MU_EINVAL, mu_file_check(NULL, NULL, 0));
    NULL_CALL(MU_EINVAL, mu_npy_load(NULL, &out));
    NULL_CALL(MU_EINVAL, mu_npy_load(npy_path, NULL));
    NULL_CALL(MU_EINVAL, mu_npy_load_mem(NULL, 64, &out));
    NULL_CALL(MU_EINVAL, mu_npy_load_mem("\x93NUMPY", 6, NULL));
    NULL_CALL(MU_EINVAL, mu_npy_save(NULL, npy_path));
    NULL_CALL(MU_EINVAL, mu_npy_save(T22, NULL));
    NULL_CALL(MU_EINVAL, mu_st_reader_open(NULL, &r));
    NULL_CALL(MU_EINVAL, mu_st_reader_open(npy_path, NULL));
    NULL_CALL(0, mu_st_reader_header(NULL, &len) != NULL);
    NULL_CALL(0, mu_st_reader_header(NULL, NULL) != NULL);
    NULL_CALL(MU_EINVAL, mu_st_reader_data_size(NULL));
    NULL_CALL(MU_EINVAL, mu_st_reader_read(NULL, 0, 16, T22));
    VOID_CALL(mu_st_reader_close(NULL));
    NULL_CALL(MU_EINVAL, mu_st_write(NULL, "{}", 2, 1, ts));
    NULL_CALL(MU_EINVAL, mu_st_write(npy_path, NULL, 2, 1, ts));
    NULL_CALL(MU_EINVAL, mu_st_write(npy_path, "{}", 2, 1, NULL));
    NULL_CALL(MU_EINVAL, mu_st_write(npy_path, "{}", 2, 1, nts));
    NULL_CALL(MU_EINVAL, mu_st_checksum(1, NULL, &u));
    NULL_CALL(MU_EINVAL, mu_st_checksum(1, nts, &u));
    NULL_CALL(MU_EINVAL, mu_st_checksum(1, ts, NULL));
    NULL_CALL(MU_EINVAL, mu_st_checksum_bytes(NULL, 4, &u));
    NULL_CALL(MU_EINVAL, mu_st_checksum_bytes("abcd", 4, NULL));

    /* BLAS, Newton-Schulz */
    NULL_CALL(MU_EINVAL, mu_blas_get_info(NULL));
    NULL_CALL(MU_EINVAL, mu_ns_workspace_new(MU_F32, 2, 2, NULL));
    VOID_CALL(mu_ns_workspace_free(NULL));
    NULL_CALL(MU_EINVAL, mu_ns_zeropower(NULL, T22, &opts, NULL));
    NULL_CALL(MU_EINVAL, mu_ns_zeropower(T22, NULL, &opts, NULL));
    NULL_CALL(MU_EINVAL, mu_ns_zeropower(T22, T22, NULL, NULL));
    NULL_CALL(MU_EINVAL, mu_ns_zeropower(T22, T22, &opts, NULL)); /* opts.coeffs NULL */
    NULL_CALL(MU_EINVAL, mu_ns_preset(NULL, 0, coeffs, 5, &d, &nsteps));
    NULL_CALL(MU_EINVAL, mu_ns_preset("legacy", 0, NULL, 5, &d, &nsteps));
    NULL_CALL(MU_OK, mu_ns_preset("legacy", 0, coeffs, 5, NULL, NULL)); /* optional outputs */
    (void)ws;

    /* foreach */
    NULL_CALL(MU_EINVAL, mu_foreach_momentum(1, NULL, ts, ts, ts, 0.9, 0.9, 0, &bad));
    NULL_CALL(MU_EINVAL, mu_foreach_momentum(1, ts, nts, ts, ts, 0.9, 0.9, 0, NULL));
    NULL_CALL(MU_EINVAL, mu_foreach_momentum(1, ts, ts, NULL, NULL, 0.9, 0.9, 0, &bad)); /* nothing to write */
    NULL_CALL(MU_EINVAL, mu_foreach_momentum(1, ts, ts, nts, NULL, 0.9, 0.9, 0, &bad));
    NULL_CALL(MU_EINVAL, mu_foreach_momentum(1, ts, ts, NULL, nts, 0.9, 0.9, 0, &bad));
    NULL_CALL(MU_EINVAL, mu_foreach_apply(1, NULL, ts, NULL, 1, 1));
    NULL_CALL(MU_EINVAL, mu_foreach_apply(1, ts, nts, NULL, 1, 1));
    NULL_CALL(MU_EINVAL, mu_foreach_apply_cautious(1, nts, ts, NULL, 1, 1));
    NULL_CALL(MU_EINVAL, mu_foreach_scale(1, NULL, NULL, 2));
    NULL_CALL(MU_EINVAL, mu_foreach_scale(1, nts, NULL, 2));
    NULL_CALL(MU_EINVAL, mu_foreach_adamw(1, ts, NULL, ts, ts, 0.1, 0.9, 0.99, 1e-8, 0, 1));
    NULL_CALL(MU_EINVAL, mu_foreach_adamw_update(1, ts, ts, nts, ts, ts, ts, 0.1, 0.9, 0.99, 1e-8, 1, NULL, 1, 1, &bad));
    NULL_CALL(MU_EINVAL, mu_foreach_all_finite(1, NULL, &bad));
    NULL_CALL(MU_EINVAL, mu_foreach_all_finite(1, nts, &bad));
    NULL_CALL(MU_EINVAL, mu_foreach_pack(1, NULL, T4, off));
    NULL_CALL(MU_EINVAL, mu_foreach_pack(1, ts, NULL, off));
    NULL_CALL(MU_EINVAL, mu_foreach_pack(1, ts, T4, NULL));
    NULL_CALL(MU_EINVAL, mu_foreach_unpack(1, NULL, ts, off));
    NULL_CALL(MU_EINVAL, mu_foreach_unpack(1, T4, NULL, off));
    NULL_CALL(MU_EINVAL, mu_foreach_unpack(1, T4, ts, NULL));
    NULL_CALL(MU_EINVAL, mu__foreach_triad(NULL, T4, T4, 1));
    NULL_CALL(MU_EINVAL, mu__foreach_triad(T4, NULL, T4, 1));

    /* communicator (the single-process one: never starts MPI) */
    NULL_CALL(MU_EINVAL, mu_comm_world(NULL));
    NULL_CALL(MU_EINVAL, mu_comm_self(NULL));
    NULL_CALL(MU_EINVAL, mu_comm_from_handle(NULL, &comm2)); /* (not &COMM: a failed call NULLs *out) */
    NULL_CALL(MU_EINVAL, mu_comm_split(NULL, 0, 0, &comm2));
    NULL_CALL(MU_EINVAL, mu_comm_split(COMM, 0, 0, NULL));
    VOID_CALL(mu_comm_free(NULL));
    NULL_CALL(MU_EINVAL, mu_comm_rank(NULL));
    NULL_CALL(MU_EINVAL, mu_comm_size(NULL));
    NULL_CALL(MU_EINVAL, mu_comm_get_stats(NULL, &stats));
    NULL_CALL(MU_EINVAL, mu_comm_get_stats(COMM, NULL));
    VOID_CALL(mu_comm_reset_stats(NULL));
    NULL_CALL(MU_EINVAL, mu_comm_alltoallv(NULL, MU_F32, buf, cnt, off, buf, cnt, off));
    NULL_CALL(MU_EINVAL, mu_comm_alltoallv(COMM, MU_F32, NULL, cnt, off, buf, cnt, off));
    NULL_CALL(MU_EINVAL, mu_comm_alltoallv(COMM, MU_F32, buf, NULL, off, buf, cnt, off));
    NULL_CALL(MU_EINVAL, mu_comm_alltoallv(COMM, MU_F32, buf, cnt, off, buf, cnt, NULL));
    NULL_CALL(MU_EINVAL, mu_comm_ialltoallv(COMM, MU_F32, buf, cnt, off, buf, cnt, off, NULL));
    NULL_CALL(MU_EINVAL, mu_comm_allgatherv(NULL, MU_F32, buf, 1, buf, cnt, off));
    NULL_CALL(MU_EINVAL, mu_comm_allgatherv(COMM, MU_F32, buf, 1, NULL, cnt, off));
    NULL_CALL(MU_EINVAL, mu_comm_allgatherv(COMM, MU_F32, buf, 1, buf, NULL, off));
    NULL_CALL(MU_EINVAL, mu_comm_bcast(NULL, MU_F32, buf, 1, 0));
    NULL_CALL(MU_EINVAL, mu_comm_bcast(COMM, MU_F32, NULL, 1, 0));
    NULL_CALL(MU_EINVAL, mu_comm_bcast_bytes(COMM, NULL, 4, 0));
    NULL_CALL(MU_EINVAL, mu_comm_ibcast(COMM, MU_F32, buf, 1, 0, NULL));
    NULL_CALL(MU_EINVAL, mu_comm_ibcast(NULL, MU_F32, buf, 1, 0, &req));
    NULL_CALL(MU_OK, mu_comm_wait(NULL)); /* documented: NULL is ok */
    NULL_CALL(MU_EINVAL, mu_comm_allreduce_i64(NULL, off, 1, MU_COMM_SUM));
    NULL_CALL(MU_EINVAL, mu_comm_allreduce_i64(COMM, NULL, 1, MU_COMM_SUM));
    NULL_CALL(MU_EINVAL, mu_comm_allreduce_f64(COMM, NULL, 1, MU_COMM_SUM));
    NULL_CALL(MU_EINVAL, mu_comm_barrier(NULL));

    /* engine */
    NULL_CALL(MU_EINVAL, mu_engine_open(NULL, cfg_path));
    NULL_CALL(MU_EINVAL, mu_engine_open(&e, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_open_ex(&e, NULL, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_add_param(NULL, "w", MU_F32, 2, shape, buf, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_add_param(ENG, NULL, MU_F32, 2, shape, buf, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_add_param(ENG, "w", MU_F32, 2, NULL, buf, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_add_param(ENG, "w", MU_F32, 2, shape, NULL, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_add_param_sharded(NULL, "w", MU_F32, 2, shape, 0, NULL, buf, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_add_param_sharded(ENG, NULL, MU_F32, 2, shape, 0, NULL, buf, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_add_param_sharded(ENG, "w", MU_F32, 2, NULL, 0, NULL, buf, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_add_param_sharded(ENG, "w", MU_F32, 2, shape, 1, NULL, buf, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_set_comm(NULL, &w));
    NULL_CALL(MU_EINVAL, mu_engine_set_comm(ENG, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_step(NULL));
    NULL_CALL(MU_EINVAL, mu_engine_set(NULL, "lr_scale", 1));
    NULL_CALL(MU_EINVAL, mu_engine_set(ENG, NULL, 1));
    NULL_CALL(MU_EINVAL, mu_engine_get(NULL, "lr", &d));
    NULL_CALL(MU_EINVAL, mu_engine_get(ENG, NULL, &d));
    NULL_CALL(MU_EINVAL, mu_engine_get(ENG, "lr", NULL));
    NULL_CALL(MU_EINVAL, mu_engine_set_signal(NULL, "s", &d, 1));
    NULL_CALL(MU_EINVAL, mu_engine_set_signal(ENG, NULL, &d, 1));
    NULL_CALL(MU_EINVAL, mu_engine_set_signal(ENG, "s", NULL, 1));
    NULL_CALL(MU_EINVAL, mu_engine_save(NULL, npy_path));
    NULL_CALL(MU_EINVAL, mu_engine_save(ENG, NULL));
    NULL_CALL(MU_EINVAL, mu_engine_load(NULL, npy_path));
    NULL_CALL(MU_EINVAL, mu_engine_load(ENG, NULL));
    NULL_CALL(0, mu_engine_error(NULL) == NULL);
    VOID_CALL(mu_engine_close(NULL));
    NULL_CALL(MU_EINVAL, mu_script_run(NULL, 0, NULL, 0, NULL));
    NULL_CALL(MU_EINVAL, mu_script_run(cfg_path, 1, NULL, 0, NULL));
    NULL_CALL(MU_EINVAL, mu_script_run_module(NULL, 0, NULL, 0, NULL));
    NULL_CALL(MU_EINVAL, mu_blas_fix_core(NULL));
    (void)info;
    (void)e;
}

/* Runs `expr` in a child: it must return a negative status (an error). */
#define BAD_CALL(expr) run_bad(#expr, __LINE__, ({                                    \
        int child_status_ = -1;                                                      \
        pid_t pid_ = fork();                                                         \
        if (pid_ == 0) _exit((int)(expr) < 0 ? 0 : 1);                               \
        if (pid_ > 0) waitpid(pid_, &child_status_, 0);                              \
        child_status_;                                                               \
    }))

static int bad_fail;
static void run_bad(const char *what, int line, int status)
{
    if (WIFSIGNALED(status) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("# line %d: %s %s\n", line, what, WIFSIGNALED(status) ? "crashed" : "did not fail");
        bad_fail++;
    }
}

/* Handles whose fields were changed through the FFI (a Lua config cannot,
 * a trusted script can): every call taking tensors validates them first. */
static void hostile_tensors(void)
{
    static const char *const names[] = {"no storage", "huge dim", "negative stride", "huge offset",
                                        "bad dtype", "9 dims", "data moved", "-1 dims", "past the end"};
    for (int k = 0; k < (int)(sizeof names / sizeof *names); k++) {
        mu_tensor b = *T22, *bp = &b, *good[1] = {T4}, *bad1[1] = {&b};
        switch (k) {
        case 0: b.storage = NULL; break;
        case 1: b.dims[0] = (int64_t)1 << 40; break;
        case 2: b.strides[0] = -1; break;
        case 3: b.offset = INT64_MAX / 2; break;
        case 4: b.scalar = 7; break;
        case 5: b.ndim = 9; break;
        case 6: b.data = (char *)b.data + 4; break;
        case 7: b.ndim = -1; break;
        case 8: b.strides[0] = 3; break; /* (1*3 + 1) elements > 4 */
        }
        mu_tensor *out = NULL;
        int64_t idx[2] = {1, 1}, shape[1] = {4}, off[1] = {0}, w;
        double d;
        uint64_t u;
        mu_map_args m = {.op = MU_MAP_ADD, .x = {bp, T22, NULL}, .alpha = 1};
        mu_map_args m2 = {.op = MU_MAP_ADD, .x = {T22, T22, NULL}, .alpha = 1};
        double co[3] = {3.4445, -4.775, 2.0315};
        mu_ns_opts o = {.steps = 1, .coeffs = co, .eps = 1e-7, .norm_scale = 1, .path = 0};
        bad_fail = 0;
        BAD_CALL(mu_tensor_check(bp));
        BAD_CALL(mu_tensor_view(bp, 1, shape, &out));
        BAD_CALL(mu_tensor_transpose(bp, 0, 1, &out));
        BAD_CALL(mu_tensor_narrow(bp, 0, 0, 1, &out));
        BAD_CALL(mu_tensor_unsqueeze(bp, 0, &out));
        BAD_CALL(mu_tensor_contiguous(bp, &out));
        BAD_CALL(mu_tensor_clone(bp, -1, &out));
        BAD_CALL(mu_tensor_copy(bp, T22));
        BAD_CALL(mu_tensor_copy(T22, bp));
        BAD_CALL(mu_tensor_fill(bp, 1));
        BAD_CALL(mu_tensor_norm(bp, &d));
        BAD_CALL(mu_tensor_get(bp, idx, &d));
        BAD_CALL(mu_tensor_set(bp, idx, 1));
        BAD_CALL(mu_tensor_all_finite(bp, &w));
        BAD_CALL(mu_tensor_map(&m, T22));
        BAD_CALL(mu_tensor_map(&m2, bp));
        BAD_CALL(mu_tensor_reduce(bp, MU_REDUCE_SUM, 0, T4));
        BAD_CALL(mu_tensor_reduce_all(bp, MU_REDUCE_SUM, &d));
        BAD_CALL(mu_tensor_matmul(bp, T22, T22));
        BAD_CALL(mu_tensor_matmul(T22, T22, bp));
        BAD_CALL(mu_npy_save(bp, npy_path));
        BAD_CALL(mu_st_write(npy_path, "{}", 2, 1, bad1));
        BAD_CALL(mu_st_checksum(1, bad1, &u));
        BAD_CALL(mu_ns_zeropower(bp, T22, &o, NULL));
        BAD_CALL(mu_ns_zeropower(T22, bp, &o, NULL));
        BAD_CALL(mu_foreach_scale(1, bad1, NULL, 2));
        BAD_CALL(mu_foreach_all_finite(1, bad1, NULL));
        BAD_CALL(mu_foreach_apply(1, bad1, good, NULL, 1, 1));
        BAD_CALL(mu_foreach_momentum(1, good, good, good, bad1, 0.9, 0.9, 0, NULL));
        BAD_CALL(mu_foreach_pack(1, bad1, T4, off));
        BAD_CALL(mu_foreach_unpack(1, T4, bad1, off));
        BAD_CALL(mu__foreach_triad(bp, T4, T4, 1));
        (void)mu_tensor_numel(bp); /* queries: no crash */
        (void)mu_tensor_is_contiguous(bp);
        ok(bad_fail == 0, "hostile tensor (%s): every call fails cleanly (%d did not)", names[k], bad_fail);
    }
}

/* ------------------------------------------------------- engine handles */

static void engine_handles(void)
{
    mu_engine *e = NULL;
    float w[4] = {1, 0, 0, 1}, g[4] = {1, 2, 3, 4};
    int64_t shape[2] = {2, 2};
    double d;
    int rc = mu_engine_open(&e, cfg_path);
    ok(rc == MU_OK && e, "open an engine");
    ok(mu_engine_add_param(e, "w.0", MU_F32, 2, shape, w, g) == MU_OK, "add a parameter");
    ok(mu_engine_step(e) == MU_OK, "step");
    mu_engine_close(e);
    /* use after close: every call on the stale handle is MU_ESTATE */
    rc = mu_engine_step(e);
    ok(rc == MU_ESTATE && contains(mu_last_error(), "not an open engine"),
       "step after close: MU_ESTATE (%s): %s", mu_errname(rc), mu_last_error());
    ok(mu_engine_add_param(e, "x", MU_F32, 2, shape, w, g) == MU_ESTATE, "add_param after close: MU_ESTATE");
    ok(mu_engine_set(e, "lr_scale", 1) == MU_ESTATE, "set after close: MU_ESTATE");
    ok(mu_engine_get(e, "lr", &d) == MU_ESTATE, "get after close: MU_ESTATE");
    ok(mu_engine_set_signal(e, "s", &d, 1) == MU_ESTATE, "set_signal after close: MU_ESTATE");
    ok(mu_engine_save(e, npy_path) == MU_ESTATE, "save after close: MU_ESTATE");
    ok(mu_engine_load(e, npy_path) == MU_ESTATE, "load after close: MU_ESTATE");
    ok(mu_engine_set_comm(e, &d) == MU_ESTATE, "set_comm after close: MU_ESTATE");
    ok(mu_engine_add_param_sharded(e, "x", MU_F32, 2, shape, 0, NULL, w, g) == MU_ESTATE,
       "add_param_sharded after close: MU_ESTATE");
    const char *msg = mu_engine_error(e);
    ok(msg && contains(msg, "not an open engine"), "mu_engine_error after close: a message, not a crash: %s", msg);
    /* double close */
    mu_engine_close(e);
    ok(contains(mu_last_error(), "closed twice"), "double close: no crash, reported: %s", mu_last_error());

    /* a new engine does not answer to the old handle, even in the same slot */
    mu_engine *e2 = NULL;
    ok(mu_engine_open(&e2, cfg_path) == MU_OK, "open a second engine");
    ok(e2 != e, "the new handle differs from the closed one");
    ok(mu_engine_step(e) == MU_ESTATE, "the closed handle still fails while another engine is open");
    ok(mu_engine_add_param(e2, "w.0", MU_F32, 2, shape, w, g) == MU_OK && mu_engine_step(e2) == MU_OK,
       "the new engine works");

    /* foreign handles: an unrelated address, a forged value */
    int local;
    ok(mu_engine_step((mu_engine *)&local) == MU_ESTATE, "a pointer to unrelated memory: MU_ESTATE");
    ok(mu_engine_step((mu_engine *)(uintptr_t)0xdeadbeefULL) == MU_ESTATE, "an arbitrary value: MU_ESTATE");
    ok(mu_engine_step((mu_engine *)((uintptr_t)e2 ^ 1)) == MU_ESTATE, "a neighbour of a live handle: MU_ESTATE");
    mu_engine_close((mu_engine *)&local);
    ok(mu_engine_step(e2) == MU_OK, "closing a foreign value leaves the live engine alone");
    mu_engine_close(e2);
}

/* ------------------------------------------------ config-chosen codes */

static int hook_step(const char *raise_expr, int trusted)
{
    char text[1024];
    snprintf(text, sizeof text,
             "local function explode(p) error(%s, 0) end\n"
             "return { groups = { { optimizer = 'muon', match = '.*', lr = 0.1, post_update_fn = explode } } }\n",
             raise_expr);
    mu_engine *e = NULL;
    mu_engine_opts o = {.trusted = trusted, .lua_path = NULL};
    if (mu_engine_open_ex(&e, tap_write(dir, "raise.lua", text), &o) != MU_OK) return 999;
    float w[4] = {1, 0, 0, 1}, g[4] = {1, 2, 3, 4};
    int64_t shape[2] = {2, 2};
    mu_engine_add_param(e, "w.0", MU_F32, 2, shape, w, g);
    int rc = mu_engine_step(e);
    mu_engine_close(e);
    return rc;
}

static void config_codes(void)
{
    static const char *const raised[] = {
        "{ code = 0, msg = 'ok?' }",
        "{ code = -3, msg = 'pretend EIO' }",
        "{ code = 'EFORMAT', msg = 'by name' }",
        "{ code = 12345 }",
        "{ code = -1e300 }",
        "setmetatable({ code = -3, msg = 'forged' }, { __metatable = 'muon.error' })",
    };
    for (int trusted = 0; trusted <= 1; trusted++)
        for (size_t i = 0; i < sizeof raised / sizeof *raised; i++) {
            int rc = hook_step(raised[i], trusted);
            ok(rc == MU_ELUA, "%s config raising %s: MU_ELUA (got %s)", trusted ? "trusted" : "sandboxed",
               raised[i], mu_errname(rc));
        }
    /* the config file itself raising a table while it loads */
    mu_engine *e = NULL;
    mu_engine_opts o = {.trusted = 1, .lua_path = NULL};
    /* (a failing config is MU_EINVAL or MU_ELUA, never the code it raised) */
    int rc = mu_engine_open_ex(&e, tap_write(dir, "raise_open.lua", "error({ code = 0 })\n"), &o);
    ok((rc == MU_ELUA || rc == MU_EINVAL) && e == NULL, "a config raising { code = 0 } while loading: not MU_OK (got %s)",
       mu_errname(rc));
    rc = mu_engine_open_ex(&e, tap_write(dir, "raise_open2.lua", "error({ code = -3 })\n"), &o);
    ok((rc == MU_ELUA || rc == MU_EINVAL) && e == NULL,
       "a config raising { code = -3 } while loading: not MU_EIO (got %s)", mu_errname(rc));
}

/* ---------------------------------------------------------------- files */

static void files_not_regular(void)
{
    char fifo[320];
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    ok(mkfifo(fifo, 0600) == 0, "make a FIFO");
    alarm(20); /* a blocking open would hang the test: fail it instead */
    mu_tensor *t = NULL;
    int rc = mu_npy_load(fifo, &t);
    ok(rc == MU_EIO && t == NULL && contains(mu_last_error(), fifo) && contains(mu_last_error(), "not a regular file"),
       "npy load of a FIFO: MU_EIO naming it: %s", mu_last_error());
    mu_st_reader *r = NULL;
    rc = mu_st_reader_open(fifo, &r);
    ok(rc == MU_EIO && r == NULL && contains(mu_last_error(), fifo), "safetensors open of a FIFO: MU_EIO: %s",
       mu_last_error());
    rc = mu_npy_load(dir, &t);
    ok(rc == MU_EIO && contains(mu_last_error(), "not a regular file"), "npy load of a directory: MU_EIO: %s",
       mu_last_error());
    rc = mu_file_check(fifo, NULL, 0);
    ok(rc == MU_EIO && contains(mu_last_error(), "not a regular file"), "mu_file_check of a FIFO: MU_EIO");
    ok(mu_file_check(cfg_path, NULL, 0) == MU_OK, "mu_file_check of a file: MU_OK");
    rc = mu_st_reader_open("/dev/zero", &r);
    ok(rc == MU_EIO && contains(mu_last_error(), "not a regular file"), "safetensors open of /dev/zero: MU_EIO");
    alarm(0);
    unlink(fifo);
}

/* Threads saving one path at once: the file is always one writer's whole
 * file (its own temporary per call), never a mix. */
typedef struct {
    const char *path;
    float value;
    int safetensors;
    int failures;
} saver;

static void *save_loop(void *arg)
{
    saver *s = arg;
    int64_t shape[1] = {4096};
    mu_tensor *t;
    if (mu_tensor_new(MU_F32, 1, shape, &t) != MU_OK) return NULL;
    mu_tensor_fill(t, s->value);
    const char *hdr = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4096],\"data_offsets\":[0,16384]}}";
    for (int i = 0; i < 40; i++) {
        int rc = s->safetensors ? mu_st_write(s->path, hdr, strlen(hdr), 1, &t) : mu_npy_save(t, s->path);
        if (rc != MU_OK) s->failures++;
    }
    mu_tensor_free(t);
    return NULL;
}

static int whole_file(const char *path, int safetensors)
{
    mu_tensor *t = NULL;
    if (safetensors) {
        mu_st_reader *r;
        if (mu_st_reader_open(path, &r) != MU_OK) return 0;
        int64_t shape[1] = {4096};
        int good = mu_st_reader_data_size(r) == 16384 && mu_tensor_new(MU_F32, 1, shape, &t) == MU_OK &&
                   mu_st_reader_read(r, 0, 16384, t) == MU_OK;
        mu_st_reader_close(r);
        if (!good) { mu_tensor_free(t); return 0; }
    } else if (mu_npy_load(path, &t) != MU_OK) {
        return 0;
    }
    const float *p = t->data;
    int good = mu_tensor_numel(t) == 4096 && (p[0] == 1.0f || p[0] == 2.0f);
    for (int i = 1; good && i < 4096; i++) good = p[i] == p[0];
    mu_tensor_free(t);
    return good;
}

static int count_tmp(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static void concurrent_saves(void)
{
    for (int st = 0; st <= 1; st++) {
        char path[320];
        snprintf(path, sizeof path, "%s/shared.%s", dir, st ? "safetensors" : "npy");
        saver a = {path, 1.0f, st, 0}, b = {path, 2.0f, st, 0};
        pthread_t ta, tb;
        pthread_create(&ta, NULL, save_loop, &a);
        pthread_create(&tb, NULL, save_loop, &b);
        int torn = 0;
        for (int i = 0; i < 200; i++) {
            if (access(path, F_OK) == 0 && !whole_file(path, st)) torn++;
        }
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        ok(a.failures == 0 && b.failures == 0, "%s: two threads saving one path: every save succeeds",
           st ? "safetensors" : "npy");
        ok(torn == 0 && whole_file(path, st), "%s: the file is always one whole save (%d torn reads)",
           st ? "safetensors" : "npy", torn);
        ok(count_tmp() == 0, "%s: no temporary file left behind", st ? "safetensors" : "npy");
        unlink(path);
    }
    /* a 250-byte file name: the temporary name is cut to fit NAME_MAX */
    char name[251], path[600];
    memset(name, 'z', 250);
    name[250] = '\0';
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ok(mu_npy_save(T22, path) == MU_OK, "npy save to a 250-byte file name: %s", mu_last_error());
    mu_tensor *t = NULL;
    ok(mu_npy_load(path, &t) == MU_OK && mu_tensor_numel(t) == 4, "and it loads back");
    mu_tensor_free(t);
    unlink(path);
}

int main(void)
{
    unsetenv("LUA_PATH");
    unsetenv("MUON_LUA_PATH");
    snprintf(dir, sizeof dir, "/tmp/muon_robust_test.XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    snprintf(cfg_path, sizeof cfg_path, "%s", tap_write(dir, "cfg.lua",
        "return { groups = { { optimizer = 'muon', match = '.*', lr = 0.1 } } }\n"));
    snprintf(npy_path, sizeof npy_path, "%s/x.npy", dir);
    int64_t s22[2] = {2, 2}, s4[1] = {4};
    if (mu_tensor_new(MU_F32, 2, s22, &T22) || mu_tensor_new(MU_F32, 1, s4, &T4) || mu_comm_self(&COMM) ||
        mu_engine_open(&ENG, cfg_path)) {
        printf("Bail out! fixtures: %s\n", mu_last_error());
        return 1;
    }
    fflush(stdout);
    null_calls();
    hostile_tensors();
    engine_handles();
    config_codes();
    files_not_regular();
    concurrent_saves();
    mu_engine_close(ENG);
    mu_comm_free(COMM);
    mu_tensor_free(T22);
    mu_tensor_free(T4);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
    printf("1..%d\n", n_test);
    return n_fail ? 1 : 0;
}
