/*
 * muon.h -- the public C API of the muon engine: what a host (a C trainer,
 * the muon CLI, a Python package) embeds. It is the installed header and
 * the library's stable ABI: every function here is exported under the
 * symbol version MUON_0 of libmuon.so.0; an incompatible change to it bumps
 * the SONAME's major number, an addition the minor version (the README's
 * "The C API").
 *
 * The Lua FFI declarations are generated from this header and the
 * library's private one (the kernels the Lua layer calls): the build runs
 * both through the C preprocessor with MU_FFI_CDEF defined and compiles
 * the result into the library, so Lua never keeps a second copy. Keep
 * everything between the includes and the end guard digestible by
 * LuaJIT's ffi.cdef: plain typedefs, enums, structs and prototypes, no
 * macros that Lua needs to see.
 *
 * Conventions: fallible calls return int (MU_OK = 0, negative on error) and
 * put their result in the last out-parameter (NULL on failure); a detail
 * message for the last error of the calling thread is in mu_last_error().
 * Dimensions and indices are 0-based.
 */
#ifndef MUON_H
#define MUON_H

#ifndef MU_FFI_CDEF
#include <stddef.h>
#include <stdint.h>
#if defined(MU_BUILDING) && defined(__GNUC__)
#define MU_API __attribute__((visibility("default")))
#else
#define MU_API
#endif
#ifdef __cplusplus
extern "C" {
#endif
#else
#define MU_API
#endif

/* ---------------------------------------------------------------- errors */

/*
 * The status codes, in one table: X(name, value, description). It generates
 * the enum below (MU_OK, MU_EINVAL, ...), mu_strerror (the description) and
 * mu_errname (the name: "EINVAL") in src/error.c; the Lua side
 * (lua/muon/errors.lua) builds its table of codes from mu_errname. Values
 * are 0 and then -1, -2, ... without gaps; new codes go at the end.
 */
#define MU_ERRORS(X)                                                                            \
    X(OK, 0, "ok")                                                                              \
    X(EINVAL, -1, "invalid argument")                /* bad argument, option or value */        \
    X(ENOMEM, -2, "out of memory")                   /* allocation failed */                    \
    X(EIO, -3, "i/o error")                          /* file missing, unreadable, unwritable */ \
    X(EFORMAT, -4, "malformed or unsupported file")  /* bad file contents */                    \
    X(EDTYPE, -5, "unsupported or mismatched dtype")                                            \
    X(ESHAPE, -6, "shape mismatch")                  /* shapes or sizes disagree */             \
    X(ENONFINITE, -7, "non-finite value")            /* NaN or Inf where finite is required */  \
    X(ESTATE, -8, "invalid state")                   /* object not in a state for the call */   \
    X(ELUA, -9, "lua error")                         /* raised by the user's Lua (hook) */      \
    X(ECOMM, -10, "communication error")             /* MPI failure */

/* The status codes: MU_OK = 0, MU_EINVAL = -1, ... MU_ECOMM = -10. */
#define MU__ERROR_ENUM(name, value, desc) MU_##name = value,
enum { MU_ERRORS(MU__ERROR_ENUM) };
#undef MU__ERROR_ENUM

/* Static description of a status code ("invalid argument"; "unknown error"
 * for a value outside the table). */
MU_API const char *mu_strerror(int code);
/* Name of a status code without the MU_ prefix ("OK", "EINVAL", ...;
 * "UNKNOWN" for a value outside the table). Never NULL. */
MU_API const char *mu_errname(int code);
/* Detail message of the last failed call on this thread ("" if none). */
MU_API const char *mu_last_error(void);
/* The library's version ("0.2.0"), a static string. */
MU_API const char *mu_version(void);

/* The dtypes of a trainer's buffers (mu_engine_add_param): MU_F32 (float)
 * and MU_F64 (double). */
enum { MU_F32 = 0, MU_F64 = 1 };
/* The most dims a parameter has. */
enum { MU_MAX_DIMS = 8 };
/* The longest parameter name, in bytes (names are valid UTF-8: checkpoints
 * store them as text). */
enum { MU_MAX_NAME = 65536 };

/* --------------------------------------------------------------- engine */

/*
 * Embedding API for C trainers (src/engine.c). An engine owns a LuaJIT state
 * running lua/muon/engine.lua with one config file; the trainer registers
 * its parameter and gradient buffers (wrapped, never copied) and calls
 * mu_engine_step after each backward pass. Every call is protected: Lua
 * errors come back as status codes, never as exits or longjmps. The detail
 * of the last failure is in mu_engine_error(eng) and in mu_last_error(). Only
 * when a config hook raised does it carry a traceback (the config's frames
 * only); MUON_TRACEBACK=1 adds one to every failure, for reporting a bug.
 * Use an engine from one thread at a time: a call made while another call
 * on the same engine runs returns MU_ESTATE.
 *
 * Running out of memory or of Lua stack anywhere in the engine's Lua (a
 * hook, the config) is MU_ENOMEM with a message naming what ran out. The
 * engine's Lua runs on a C stack of its own (128 MB reserved, pages used
 * only as deep as a call goes), on the calling thread, whatever stack that
 * thread has: a config that re-enters C library functions without end
 * (a string.gsub replacement that calls gsub) meets LuaJIT's Lua-stack
 * limit, a clean error, before that stack runs out (x86-64; elsewhere the
 * caller's stack is used). A host that loaded libmuon with
 * dlopen(RTLD_LOCAL) works too: the first engine makes libmuon's LuaJIT
 * symbols global, so that the Lua C modules it loads find them.
 *
 * The Lua modules are found through, in order: opts->lua_path, the
 * environment variable MUON_LUA_PATH (a directory holding muon/init.lua, or
 * a package.path template containing '?'), the install prefix of the code
 * holding this library (<prefix>/share/lua/5.1), a source tree (<dir>/lua
 * above the executable or library), then LuaJIT's default package.path.
 *
 * OpenBLAS picks its kernels when the program starts: a host should call
 * mu_blas_fix_core(argv) first thing in main (see below).
 */
typedef struct mu_engine mu_engine;

/* Options of mu_engine_open_ex (zero-initialize, then set). */
typedef struct mu_engine_opts {
    int trusted;          /* nonzero: the config runs with full Lua (io, os) */
    const char *lua_path; /* directory holding muon/init.lua; NULL = search */
} mu_engine_opts;

/* Open an engine on a config file (a Lua chunk returning a table). On
 * failure *out is NULL and the detail is in mu_last_error(): MU_EIO for a
 * missing or unreadable file, MU_EFORMAT for a syntax error, MU_EINVAL for
 * a bad config (the message names the option), MU_ELUA otherwise. */
MU_API int mu_engine_open(mu_engine **out, const char *config_path);
/* mu_engine_open with options (opts may be NULL: the defaults): trusted
 * runs the config with full Lua, lua_path names the directory of the Lua
 * modules. The same return codes. */
MU_API int mu_engine_open_ex(mu_engine **out, const char *config_path, const mu_engine_opts *opts);
/* mu_engine_open_ex on a config given as Lua source text (a host that
 * builds its config, such as the Python package's keyword options): source
 * runs as a config file would (sandboxed unless opts->trusted); name (NULL
 * or "": "<string>") stands for the file in messages. The same return codes
 * but MU_EIO. */
MU_API int mu_engine_open_source(mu_engine **out, const char *source, const char *name,
                                 const mu_engine_opts *opts);
/* Register a parameter: data (and grad, NULL = no gradient, the parameter
 * is skipped) point at C-contiguous buffers of shape[0..ndim-1] elements
 * (ndim 0..MU_MAX_DIMS) of dtype (MU_F32 or MU_F64) that stay valid until
 * mu_engine_close. The
 * engine updates data in place at each step and only reads grad (except
 * mu_engine_reduce_grads, which writes it). */
MU_API int mu_engine_add_param(mu_engine *eng, const char *name, int dtype, int ndim,
                               const int64_t *shape, void *data, void *grad);
/* Re-point registered parameters' gradients between steps, all at once
 * (hosts whose framework reallocates gradients, as torch does after
 * zero_grad(set_to_none=True)): grads[i] becomes the gradient of parameter
 * names[i], a buffer as mu_engine_add_param takes it (the parameter's dtype
 * and shape; of a sharded parameter, its local shard) valid until it is
 * re-pointed again or mu_engine_close, or NULL: no gradient (steps skip
 * the parameter). The old gradients of these parameters are let go first;
 * the new ones must not overlap each other or any registered value or
 * grad. MU_EINVAL for an unknown or repeated name or an overlap (the
 * message names both); nothing changes on failure. */
MU_API int mu_engine_set_grads(mu_engine *eng, int64_t n, const char *const *names, void *const *grads);
/* One optimizer step over every registered parameter. Atomic: on any
 * failure, a hook's included (post_update_fn too), nothing changes: the
 * parameters, the optimizer state, the hooks' state and the step counter
 * are as they were, on every rank of a mesh. MU_ENONFINITE for a NaN/Inf
 * gradient, MU_EINVAL for a bad value (a schedule's weight_decay = NaN
 * names the group, key and value), MU_ELUA when a config function (hook,
 * schedule) raised. Parameters without a grad are skipped; when no parameter has one there is
 * nothing to step: MU_OK, and nothing changes (the "step" count, hence the
 * schedule, stays; get "stepped" gives 0). */
MU_API int mu_engine_step(mu_engine *eng);
/* The ops of mu_engine_reduce_grads: the sum or the mean over the
 * replicas. */
enum { MU_REDUCE_SUM = 0, MU_REDUCE_MEAN = 1 };
/* Gradient reduction for HSDP trainers, after the backward pass and before
 * mu_engine_step: every registered gradient becomes the mean (op
 * MU_REDUCE_MEAN) or the sum (MU_REDUCE_SUM; other values are refused) of
 * that gradient over the ranks holding the same box of its parameter (the replicate axes of its
 * placement), in place, in a fixed order: replica gradients g_0, g_1, ...
 * (rank order) are added left to right and, for the mean, divided by their
 * count, so every replica gets the same bits. Collective: every rank of the
 * mesh calls it. Its bytes show in the data counters (comm_stats). Without a
 * dist section nothing changes (MU_OK). MU_EINVAL for an unknown op, for
 * ops that differ across ranks (every rank fails, naming both), or when a
 * parameter has a grad on some ranks holding a box of it and none on others
 * (every rank fails, naming the parameter and the ranks); no grad changes
 * then. The grad buffers are written (mu_engine_add_param's grad). */
MU_API int mu_engine_reduce_grads(mu_engine *eng, int op);
/* Runtime values: set "lr_scale" (multiplies every group's lr); get "lr",
 * "step", "stepped" (1 if the last mu_engine_step stepped, 0 if it had
 * nothing to step or none ran yet), "lr_scale", "lr:<group index or name>", and "state_bytes" /
 * "scratch_bytes" (optimizer state and step scratch held by this rank). */
MU_API int mu_engine_set(mu_engine *eng, const char *key, double value);
/* Read one of the keys above into *out. MU_EINVAL for an unknown key or
 * group (the message lists the valid ones); MU_ESTATE for a closed
 * handle. */
MU_API int mu_engine_get(mu_engine *eng, const char *key, double *out);
/* Per-step values from the trainer for the config's hooks (ctx.signals[name],
 * a list of n numbers, e.g. the max attention logit of each head for
 * QK-clip); kept until set again. values may be NULL when n is 0; every
 * value must be finite (else MU_EINVAL). On a mesh every rank must pass the
 * same values: they are agreed at each step like the schedule's. */
MU_API int mu_engine_set_signal(mu_engine *eng, const char *name, const double *values, int64_t n);
/* Set every registered gradient buffer to 0, in place (parameters
 * registered without a grad are skipped). MU_OK, or MU_EINVAL for a NULL
 * eng. (The Lua side's eng:zero_grad.) */
MU_API int mu_engine_zero_grad(mu_engine *eng);
/* Clip the registered gradients by their global L2 norm, as
 * torch.nn.utils.clip_grad_norm_: total_norm = sqrt(sum of g^2 over every
 * element of every grad), computed exactly (each float32 square is exact,
 * the sum is rounded once) and the same bits on any mesh; then with
 * clip_coef = max_norm / (total_norm + 1e-6), every grad is multiplied
 * by clip_coef when clip_coef < 1 (grads are untouched otherwise, and when
 * total_norm is NaN or Inf). *norm receives total_norm before clipping,
 * 0 on failure (norm may be NULL). On a mesh every rank calls it (a collective): the
 * norm is over the whole parameters, each piece counted once (by the rank
 * that keeps its optimizer state: replicas must hold the same grads, i.e.
 * reduce them first); ranks in another collective call fail with
 * MU_ESTATE, and a bad max_norm on one rank, or a max_norm that differs
 * across ranks, fails it on every rank.
 * MU_EINVAL for max_norm not a finite number >= 0 (nothing changes). */
MU_API int mu_engine_clip_grad_norm(mu_engine *eng, double max_norm, double *norm);
/* Set the lr of a group (its index "1", "2", ... or its name in the
 * config): it replaces the config's lr, the group's base value. A schedule
 * still runs on top of it: a schedule returning an lr overrides it (it
 * sees it as base_lr), and lr_scale multiplies the result. Takes effect at
 * the next step; mu_engine_get "lr:<group>" shows it until then. On a mesh
 * every rank sets the same value. MU_EINVAL for an unknown group (the
 * message lists them) or lr not a finite number >= 0 (nothing changes). */
MU_API int mu_engine_set_lr(mu_engine *eng, const char *group, double lr);
/* Optimizer state as safetensors (save is atomic; load checks names and
 * shapes against the registered parameters and changes nothing on error).
 * A path that is a directory or not a regular file, itself or through a
 * symbolic link, is MU_EIO (through a link to a file, that file is
 * replaced). */
MU_API int mu_engine_save(mu_engine *eng, const char *path);
/* mu_engine_save with flags: MU_SAVE_SHARDED writes path as a directory
 * (made if needed) where each rank writes the state boxes it holds, one
 * safetensors file per rank, and rank 0 an index.json last: nothing is
 * gathered, and mu_engine_load reads it on any number of ranks and mesh.
 * On a mesh every rank passes the same flags. A failure on any rank fails
 * every rank and leaves the previous checkpoint in path whole. */
enum { MU_SAVE_SHARDED = 1 };
/* mu_engine_save with flags (0 or MU_SAVE_SHARDED), the same codes. */
MU_API int mu_engine_save_ex(mu_engine *eng, const char *path, int flags);
/* Load a checkpoint of mu_engine_save (a file, or a directory of
 * MU_SAVE_SHARDED, saved on any number of ranks): MU_EIO when the file cannot be
 * read, MU_EFORMAT for a malformed one (truncated, bad header, checksum
 * mismatch), MU_EINVAL when it does not match the registered parameters;
 * nothing changes on failure. */
MU_API int mu_engine_load(mu_engine *eng, const char *path);
/* mu_engine_load with flags: MU_LOAD_NO_CHECKSUM accepts a checkpoint
 * without checksums or with stale ones (written or edited by another
 * program, e.g. Python); names, dtypes, shapes, values and the metadata are
 * still validated. */
enum { MU_LOAD_NO_CHECKSUM = 1 };
/* mu_engine_load with flags (0 or MU_LOAD_NO_CHECKSUM), the same codes. On
 * a mesh every rank passes the same flags and loads the same file (else
 * MU_EINVAL on every rank); a rank that cannot read its file fails every
 * rank with its own error ("rank 1: cannot open ..."). */
MU_API int mu_engine_load_ex(mu_engine *eng, const char *path, int flags);
/* Structured answers as JSON text: *len gets the text's length (without
 * the NUL), and the text is copied into buf (cap bytes) when *len < cap,
 * else buf gets "" (buf NULL with cap 0 asks for the length). what
 * "groups": a list with one object per config group: index (from 1), name
 * (absent when the config names none), optimizer ("muon", "adamw",
 * "lion"), step (the steps it took), options (its values: the config's,
 * with mu_engine_set_lr applied; hooks left out), hooks (the names of the
 * hooks it runs) and params (its parameters' names in registration order).
 * MU_EINVAL for another key. */
MU_API int mu_engine_query(mu_engine *eng, const char *what, char *buf, size_t cap, size_t *len);
/* Detail of the last failed call on eng ("" if none); NULL eng gives
 * mu_last_error(). Valid until the next call on eng (from any thread): a
 * host whose other threads may call eng meanwhile uses
 * mu_engine_error_copy. */
MU_API const char *mu_engine_error(const mu_engine *eng);
/* The detail of mu_engine_error copied into buf (n bytes; cut to n - 1 at
 * a UTF-8 character boundary; always NUL-terminated when n > 0). Safe while
 * other threads call eng, close it included: the copy is the message
 * before or after any such call, never freed memory. NULL eng copies this
 * thread's mu_last_error(). MU_OK; MU_ESTATE for a closed or foreign handle
 * (buf gets that message); MU_EINVAL for a NULL buf with n > 0. */
MU_API int mu_engine_error_copy(const mu_engine *eng, char *buf, size_t n);
/* Free the engine and its Lua state (the trainer's buffers are untouched).
 * NULL is a no-op. A handle is a token checked on every call: after close,
 * every call on it (close included) returns MU_ESTATE, as does a value
 * that is not a handle from mu_engine_open, or a call made while another
 * call on the same engine runs (another thread, or its own hook). */
MU_API void mu_engine_close(mu_engine *eng);

/* ------------------------------------------------- distributed engines */

/* For a config with dist = { mesh = {...} } (see lua/muon/dist.lua). */
enum { MU_REPLICATE = 0, MU_SHARD = 1 };
/* Placement of a parameter on one mesh axis: MU_REPLICATE, or MU_SHARD
 * along tensor dim `dim` (0-based); local shards follow torch.chunk. */
typedef struct mu_placement {
    int kind; /* MU_REPLICATE or MU_SHARD */
    int dim;  /* the sharded tensor dim (0-based); ignored for MU_REPLICATE */
} mu_placement;
/* Use the caller's communicator (mpi_comm_ptr points at an MPI_Comm; the
 * engine keeps a duplicate) instead of MPI_COMM_WORLD. Call it before the
 * first mu_engine_add_param*. */
MU_API int mu_engine_set_comm(mu_engine *eng, void *mpi_comm_ptr);
/* Register this rank's shard of a parameter of global shape global_shape,
 * with one placement per mesh axis (naxes = the mesh's axes). local_data and
 * local_grad hold the local shard (C order, its torch.chunk shape).
 * local_data may be NULL when the local shard is empty; local_grad NULL
 * means "no gradient" and must be so on every rank (for an empty shard of a
 * parameter with a gradient pass any non-NULL pointer; it is not read). */
MU_API int mu_engine_add_param_sharded(mu_engine *eng, const char *name, int dtype, int ndim,
                                       const int64_t *global_shape, int naxes,
                                       const mu_placement *placements, void *local_data,
                                       void *local_grad);

/* -------------------------------------------------------------- scripts */

/* Run a Lua script file (or, with mu_script_run_module, a module function:
 * "muon.check" calls require("muon.check").main(args), "mod:fn" calls
 * require("mod").fn(args)) in a fresh LuaJIT state set
 * up like an engine's; argv[0..argc-1] become the global arg[1..argc] (arg[0]
 * is the script) or main's args table. *status gets the script's exit status:
 * what it returns, read as LuaJIT's os.exit reads its argument (nothing, nil
 * or true: 0; false: 1; an integer 0..255, or a string holding one: itself),
 * or 1 on an error (the message and traceback in mu_last_error()): a Lua
 * error (MU_ELUA, or the code of muon's error object: MU_EIO for a missing
 * script), memory or Lua stack exhausted (MU_ENOMEM), a return value that
 * os.exit would refuse or truncate, such as 256, -1, 3.5, NaN or a table
 * (MU_EINVAL, naming it), an empty path (MU_EINVAL). With flags
 * MU_SCRIPT_MPI: on error print the message to stderr and abort the MPI job
 * if it runs more than one rank (MPI_Abort), and finalize MPI at the end
 * (MPI_Finalize, when the library initialized MPI). With MU_SCRIPT_TRUSTED, engines the script opens load
 * their configs with full Lua unless it passes { trusted = false }. */
enum { MU_SCRIPT_MPI = 1, MU_SCRIPT_TRUSTED = 2 };
/* Run the script file at path (see above); what `muon run` does. */
MU_API int mu_script_run(const char *path, int argc, char **argv, int flags, int *status);
/* Call module.main(args), or module:fn as "mod:fn" (see above); what `muon
 * check`, `muon info` and `muon help` do. */
MU_API int mu_script_run_module(const char *module, int argc, char **argv, int flags, int *status);

/* ----------------------------------------------------------------- BLAS */

/*
 * OpenBLAS picks its kernels once, when it is loaded, from the variable
 * OPENBLAS_CORETYPE (or its own CPU detection, which picks a generic core on
 * some recent CPUs). The choice is made in one place (src/blas_core.c):
 *
 * mu_blas_cpu_core: the fastest core this CPU supports by muon's table
 * ("SkylakeX" for AVX-512 F+BW+VL, "Haswell" for AVX2; "" for none), as
 * this process sees the CPU. Pure; safe from any thread.
 *
 * mu_blas_fix_core (hosts that link OpenBLAS, first thing in main; argv
 * NULL: MU_EINVAL): when OPENBLAS_CORETYPE is unset or empty and the running
 * core is not mu_blas_cpu_core(), re-execute /proc/self/exe with argv and
 * the variable set in a copy of the environment (the process's own is not
 * changed); once, guarded by MUON_BLAS_REEXEC. MU_OK when nothing needed
 * doing or the exec failed (the program goes on with the running core).
 *
 * mu_blas_preset_core (hosts that load libmuon at run time, before they
 * load it: the Lua loader, Python): when OPENBLAS_CORETYPE is unset or
 * empty, set it to mu_blas_cpu_core(). It refuses (MU_ESTATE, nothing changed) when that is too late or unsafe:
 * OpenBLAS is already loaded, or the process runs more than one thread.
 * MU_OK otherwise (a value you set always stays).
 *
 * mu_blas_switch_core (hosts that find OpenBLAS already loaded, e.g.
 * Python after `import torch`): when OPENBLAS_CORETYPE is unset or empty
 * and a loaded OpenBLAS runs another core than mu_blas_cpu_core(), set the
 * variable and re-run that OpenBLAS's own core selection
 * (gotoblas_dynamic_quit, then gotoblas_dynamic_init, of a DYNAMIC_ARCH
 * build such as Debian's): its kernels become those it loads with the
 * variable set. Safe only while no other thread is inside OpenBLAS or reads
 * the environment; the caller guarantees it (Python: at import, with one
 * Python thread). MU_OK when switched or nothing to do (the variable set,
 * no OpenBLAS loaded, the core already right); MU_ESTATE when an OpenBLAS
 * cannot switch (not DYNAMIC_ARCH) or runs another core afterwards.
 *
 * These two are the library's only setenv calls. build/libmuon-cpu.so
 * (installed as <prefix>/lib/libmuon-cpu.so) exports the BLAS core calls
 * and the error calls (mu_strerror, mu_errname, mu_last_error), and needs
 * nothing but libc, so it can be loaded and asked before libmuon.
 */
MU_API const char *mu_blas_cpu_core(void);
/* Re-execute once with OPENBLAS_CORETYPE set when the running core is not
 * mu_blas_cpu_core() (see above); first thing in main. */
MU_API int mu_blas_fix_core(char **argv);
/* Set OPENBLAS_CORETYPE before OpenBLAS is loaded (see above); MU_ESTATE
 * when too late. */
MU_API int mu_blas_preset_core(void);
/* Re-select the kernels of an OpenBLAS loaded before the core could be
 * preset (see above); MU_ESTATE when it cannot. */
MU_API int mu_blas_switch_core(void);

/* What mu_blas_get_info reports. */
typedef struct mu_blas_info {
    char core[64];    /* OpenBLAS core name, e.g. "SkylakeX" */
    char config[160]; /* openblas_get_config(): version and build options */
    int threads;      /* OpenBLAS's thread count */
    char bf16[96];    /* the path of Newton-Schulz's bfloat16 products (ns_dtype):
                       * "oneDNN 2.6.3 cpu_isa_avx512_core_bf16 (AVX512_BF16
                       * instructions)", "... (emulated on AVX-512, ...)", "... (no
                       * bf16 kernels here: widened to float32, OpenBLAS sgemm)" or
                       * "none (libdnnl.so.2 not loadable)" */
} mu_blas_info;

/* The OpenBLAS this process runs: core, configuration and threads, and the
 * path of the bfloat16 products (it opens and closes oneDNN to ask it),
 * into *out (MU_EINVAL for NULL). */
MU_API int mu_blas_get_info(mu_blas_info *out);
/* Set OpenBLAS's thread count (threads >= 1, else MU_EINVAL); Newton-Schulz
 * calls that start afterwards use that many workers (unless MU_NS_THREADS
 * is set). */
MU_API int mu_blas_set_threads(int threads);

#ifndef MU_FFI_CDEF
#ifdef __cplusplus
}
#endif
#endif
#endif /* MUON_H */
