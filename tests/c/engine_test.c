/*
 * The C embedding API (src/engine.c): every call, the error paths, and the
 * numbers of one Muon and one AdamW step against values computed here in
 * double precision. TAP output; exit 1 on any failure.
 */
#include "muon_ffi.h"
#include "tap.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first line of s (for TAP lines; an engine error may carry a traceback). */
static const char *line1(const char *s)
{
    static char bufs[4][240];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof bufs[0], "%.*s", (int)strcspn(s, "\n"), s);
    return b;
}

static char dir[256];

static const char *write_bytes(const char *name, const void *data, size_t len)
{
    static char paths[8][320];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 320, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, len, f) != len) { perror(p); exit(1); }
    fclose(f);
    return p;
}

/* The whole file in a malloc'd buffer (*len bytes), or exit. */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(1); }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Open cfg_text as a config with one 2x2 Muon parameter "w.0" and one
 * 3-vector AdamW parameter "b.0" (if the config routes them), step once,
 * and return the step's status; the engine's first error line goes to msg. */
static int step_status(const char *name, const char *cfg_text, int trusted, char *msg, size_t cap)
{
    float w[4] = {1, 0, 0, 1}, gw[4] = {1, 2, 3, 4}, b[3] = {1, 2, 3}, gb[3] = {1, 1, 1};
    int64_t s22[2] = {2, 2}, s3[1] = {3};
    mu_engine *e = NULL;
    mu_engine_opts o = {.trusted = trusted, .lua_path = NULL};
    int rc = mu_engine_open_ex(&e, tap_write(dir, name, cfg_text), &o);
    if (rc != MU_OK) {
        snprintf(msg, cap, "open failed (%s): %s", mu_errname(rc), mu_last_error());
        return 1; /* not a status code: the test fails */
    }
    mu_engine_add_param(e, "w.0", MU_F32, 2, s22, w, gw);
    mu_engine_add_param(e, "b.0", MU_F32, 1, s3, b, gb);
    rc = mu_engine_step(e);
    const char *err = mu_engine_error(e);
    snprintf(msg, cap, "%s", line1(err));
    mu_engine_close(e);
    return rc;
}

/* Muon lr 0.1, no decay, momentum 0.9 nesterov; AdamW lr 0.01 for b*. */
static const char *CONFIG =
    "return {\n"
    "  groups = {\n"
    "    { name = 'mats', optimizer = 'muon', match = '^w', min_dim = 2, lr = 0.1,\n"
    "      weight_decay = 0, momentum = 0.9, nesterov = true, matched_adamw_rms = 0.2 },\n"
    "    { name = 'vecs', optimizer = 'adamw', match = '^b', lr = 0.01, betas = {0.9, 0.99},\n"
    "      eps = 1e-8, weight_decay = 0.5 },\n"
    "  },\n"
    "}\n";

/* Muon output for W = G = 2*I (2x2): u = (1+m) G (nesterov, first step),
 * X = u / (||u||_F + eps) has both singular values s0 = 1/sqrt(2); each NS
 * step maps s -> a s + b s^3 + c s^5 with the preset's triples. */
static double muon_expected_diag(void)
{
    double coeffs[3 * 16], norm_scale = 1.0;
    int nsteps = 0;
    if (mu_ns_preset("asym5", 5, coeffs, 16, &norm_scale, &nsteps) != MU_OK) return NAN;
    double s = 1.0 / (norm_scale * sqrt(2.0));
    for (int i = 0; i < nsteps; i++) {
        double a = coeffs[3 * i], b = coeffs[3 * i + 1], c = coeffs[3 * i + 2];
        s = a * s + b * s * s * s + c * s * s * s * s * s;
    }
    return s;
}

int main(void)
{
    /* the engine must find its modules without help (tests/run.sh sets
     * LUA_PATH, which LuaJIT would append to package.path) */
    unsetenv("LUA_PATH");
    unsetenv("MUON_LUA_PATH");
    snprintf(dir, sizeof dir, "/tmp/muon_engine_test.XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    mu_engine *eng = (mu_engine *)&n_test; /* must be reset to NULL on failure */
    int rc;

    /* --- open: failures leave *out NULL and name the problem */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nope.lua", dir);
    rc = mu_engine_open(&eng, missing);
    ok(rc == MU_EIO && eng == NULL, "missing config: MU_EIO, out NULL (rc %d)", rc);
    ok(contains(mu_last_error(), "nope.lua"), "missing config: message names the file: %s", mu_last_error());
    ok(contains(mu_engine_error(NULL), "nope.lua"), "mu_engine_error(NULL) is mu_last_error()");

    eng = (mu_engine *)&n_test;
    rc = mu_engine_open(&eng, tap_write(dir, "syntax.lua", "return { groups = { \n"));
    ok(rc == MU_EFORMAT && eng == NULL, "syntax error: MU_EFORMAT, out NULL (rc %d)", rc);
    ok(contains(mu_last_error(), "syntax.lua"), "syntax error: message names the file: %s", mu_last_error());

    eng = (mu_engine *)&n_test;
    rc = mu_engine_open(&eng, tap_write(dir, "unknown.lua",
                                         "return { groups = { { optimizer = 'muon', match = '.*', lrr = 0.1 } } }\n"));
    ok(rc == MU_EINVAL && eng == NULL, "unknown group option: MU_EINVAL, out NULL (rc %d)", rc);
    ok(contains(mu_last_error(), "lrr"), "unknown group option: message names it: %s", mu_last_error());

    eng = (mu_engine *)&n_test;
    rc = mu_engine_open(&eng, dir);
    ok(rc == MU_EIO && eng == NULL, "config path is a directory: MU_EIO (rc %d: %s)", rc, mu_last_error());

    eng = (mu_engine *)&n_test;
    rc = mu_engine_open(&eng, tap_write(dir, "badvalue.lua",
                                         "return { groups = { { optimizer = 'adamw', match = '.*', lr = -1 } } }\n"));
    ok(rc == MU_EINVAL && eng == NULL && contains(mu_last_error(), "lr"),
       "bad option value (lr = -1): MU_EINVAL naming it (rc %d: %s)", rc, mu_last_error());

    eng = (mu_engine *)&n_test;
    rc = mu_engine_open(&eng, tap_write(dir, "bytecode.lua", "\033LJ\002junk"));
    ok(rc == MU_EFORMAT && eng == NULL && contains(mu_last_error(), "bytecode"),
       "precompiled config: MU_EFORMAT (rc %d: %s)", rc, mu_last_error());

    /* bytecode is refused before LuaJIT parses it: after a #! line, malformed,
     * valid (made by string.dump in a script), trusted or not */
    eng = (mu_engine *)&n_test;
    rc = mu_engine_open(&eng, tap_write(dir, "shebang_bc.lua", "#!/usr/bin/env muon\n\033LJ\002\377\377\377junk"));
    ok(rc == MU_EFORMAT && eng == NULL && contains(mu_last_error(), "bytecode is not accepted"),
       "malformed bytecode after a #! line: MU_EFORMAT (rc %d: %s)", rc, mu_last_error());
    char valid_bc[320], dump_script[600];
    snprintf(valid_bc, sizeof valid_bc, "%s/valid_bc.lua", dir);
    snprintf(dump_script, sizeof dump_script,
             "local f = assert(io.open(%s, 'wb'))\n"
             "f:write(string.dump(assert(loadstring(\"return { groups = { { optimizer = 'adamw' } } }\"))))\n"
             "f:close()\n", "...");
    {
        int st = 1;
        char *dargs[] = {valid_bc};
        rc = mu_script_run(tap_write(dir, "dump.lua", dump_script), 1, dargs, MU_SCRIPT_TRUSTED, &st);
        ok(rc == MU_OK && st == 0, "wrote a valid bytecode config (rc %d: %s)", rc, line1(mu_last_error()));
    }
    for (int trusted = 0; trusted <= 1; trusted++) {
        mu_engine_opts o = {.trusted = trusted, .lua_path = NULL};
        eng = (mu_engine *)&n_test;
        rc = mu_engine_open_ex(&eng, valid_bc, &o);
        ok(rc == MU_EFORMAT && eng == NULL && contains(mu_last_error(), "valid_bc.lua")
           && contains(mu_last_error(), "bytecode is not accepted"),
           "valid bytecode config (trusted %d): MU_EFORMAT naming it (rc %d: %s)", trusted, rc, mu_last_error());
    }

    /* not regular files: refused at once (a FIFO without a writer must not block) */
    char fifo[320];
    snprintf(fifo, sizeof fifo, "%s/fifo.lua", dir);
    if (mkfifo(fifo, 0600) == 0) {
        eng = (mu_engine *)&n_test;
        rc = mu_engine_open(&eng, fifo);
        ok(rc == MU_EIO && eng == NULL && contains(mu_last_error(), "fifo.lua")
           && contains(mu_last_error(), "not a regular file (a FIFO)"),
           "FIFO config: MU_EIO without blocking (rc %d: %s)", rc, mu_last_error());
    } else {
        ok(0, "mkfifo %s", fifo);
    }
    eng = (mu_engine *)&n_test;
    rc = mu_engine_open(&eng, dir);
    ok(rc == MU_EIO && contains(mu_last_error(), "Is a directory") && contains(mu_last_error(), dir),
       "directory config: MU_EIO naming the path and the reason: %s", mu_last_error());
    rc = mu_engine_open(&eng, missing);
    {
        char want[700];
        snprintf(want, sizeof want, "config '%s' (resolved %s): No such file or directory", missing, missing);
        ok(rc == MU_EIO && contains(mu_last_error(), want), "missing config: the path, resolved, and the OS reason: %s",
           mu_last_error());
    }

    eng = (mu_engine *)&n_test;
    rc = mu_engine_open(&eng, tap_write(dir, "notable.lua", "return 42\n"));
    ok(rc != MU_OK && eng == NULL && contains(mu_last_error(), "table"),
       "config returning a number: error (%d): %s", rc, mu_last_error());

    rc = mu_engine_open(NULL, missing);
    ok(rc == MU_EINVAL, "open with out NULL: MU_EINVAL");
    eng = (mu_engine *)&n_test;
    rc = mu_engine_open(&eng, NULL);
    ok(rc == MU_EINVAL && eng == NULL, "open with NULL path: MU_EINVAL");

    /* sandbox: a config using io is refused unless trusted */
    const char *io_cfg = tap_write(dir, "io.lua",
        "local f = io.open('/dev/null') if f then f:close() end\n"
        "return { groups = { { optimizer = 'adamw', match = '.*', lr = 0.1 } } }\n");
    eng = NULL;
    rc = mu_engine_open(&eng, io_cfg);
    ok(rc != MU_OK && eng == NULL && contains(mu_last_error(), "io"), "sandboxed config cannot use io: %s",
       mu_last_error());
    mu_engine_opts opts = {.trusted = 1, .lua_path = NULL};
    rc = mu_engine_open_ex(&eng, io_cfg, &opts);
    ok(rc == MU_OK && eng != NULL, "trusted config may use io (rc %d: %s)", rc, mu_last_error());
    mu_engine_close(eng);
    mu_engine_opts badpath = {.trusted = 0, .lua_path = "/nonexistent/lua"};
    eng = (mu_engine *)&n_test;
    rc = mu_engine_open_ex(&eng, io_cfg, &badpath);
    ok(rc != MU_OK && eng == NULL && contains(mu_last_error(), "muon.host"),
       "lua_path without the modules: error naming muon.host (rc %d)", rc);

    /* --- a working engine */
    const char *cfg = tap_write(dir, "cfg.lua", CONFIG);
    eng = NULL;
    rc = mu_engine_open(&eng, cfg);
    ok(rc == MU_OK && eng != NULL, "open a valid config (rc %d: %s)", rc, mu_last_error());
    if (!eng) {
        printf("1..%d\n", n_test);
        return 1;
    }
    ok(strcmp(mu_engine_error(eng), "") == 0, "fresh engine has no error");

    float w[4] = {1, 0, 0, 1}, gw[4] = {2, 0, 0, 2};
    float b[3] = {1, -2, 3}, gb[3] = {0.5f, -0.25f, 2.0f};
    float nog[2] = {7, 8};
    float one[3] = {1, 2, 3}, gone[3] = {0, 0, 0};
    int64_t s22[2] = {2, 2}, s3[1] = {3}, s2[1] = {2}, sneg[2] = {2, -1};

    rc = mu_engine_add_param(eng, "w.0", MU_F32, 2, s22, NULL, gw);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "w.0") && contains(mu_engine_error(eng), "data"),
       "NULL data: MU_EINVAL naming the parameter: %s", mu_engine_error(eng));
    ok(contains(mu_last_error(), "data is NULL"), "NULL data: also in mu_last_error()");
    rc = mu_engine_add_param(eng, "w.0", MU_F32, 2, sneg, w, gw);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "negative"), "negative dimension: MU_EINVAL: %s",
       mu_engine_error(eng));
    rc = mu_engine_add_param(eng, "w.0", 7, 2, s22, w, gw);
    ok(rc == MU_EDTYPE, "unknown dtype: MU_EDTYPE");
    rc = mu_engine_add_param(eng, "w.0", MU_F32, 9, s22, w, gw);
    ok(rc == MU_EINVAL, "ndim 9: MU_EINVAL");
    rc = mu_engine_add_param(eng, NULL, MU_F32, 2, s22, w, gw);
    ok(rc == MU_EINVAL, "NULL name: MU_EINVAL");
    rc = mu_engine_add_param(NULL, "w.0", MU_F32, 2, s22, w, gw);
    ok(rc == MU_EINVAL, "NULL engine: MU_EINVAL");
    { /* names: valid UTF-8 of at most MU_MAX_NAME bytes (checkpoints store them as text) */
        const char *bad[] = {"w.caf\xE9", "w.\xC0\xAF", "w.\xED\xA0\x80", "w.\xF4\x90\x80\x80", "w.\xE2\x82", "w.\xFF"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            rc = mu_engine_add_param(eng, bad[i], MU_F32, 2, s22, w, gw);
            ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "is not valid UTF-8"),
               "name %zu not UTF-8: MU_EINVAL: %s", i, mu_engine_error(eng));
            rc = mu_engine_add_param_sharded(eng, bad[i], MU_F32, 2, s22, 0, NULL, w, gw);
            ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "mu_engine_add_param_sharded: parameter name"),
               "name %zu not UTF-8, sharded: MU_EINVAL: %s", i, mu_engine_error(eng));
        }
        rc = mu_engine_add_param(eng, bad[0], MU_F32, 2, s22, w, gw);
        ok(contains(mu_engine_error(eng), "parameter name 'w.caf\\xE9' is not valid UTF-8 (byte 6 is 0xE9)"),
           "the message shows the bad byte escaped: %s", mu_engine_error(eng));
        static char long_name[MU_MAX_NAME + 2];
        memset(long_name, 'w', MU_MAX_NAME + 1);
        rc = mu_engine_add_param(eng, long_name, MU_F32, 2, s22, w, gw);
        ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "is longer than 65536 bytes (MU_MAX_NAME)") &&
               strlen(mu_engine_error(eng)) < 200,
           "a name of MU_MAX_NAME + 1 bytes: MU_EINVAL, shown cut: %s", mu_engine_error(eng));
        long_name[MU_MAX_NAME] = '\0';
        mu_engine *e2;
        float w2[4] = {0}, gw2[4] = {0};
        rc = mu_engine_open(&e2, tap_write(dir, "names.lua", CONFIG));
        ok(rc == MU_OK && mu_engine_add_param(e2, long_name, MU_F32, 2, s22, w, gw) == MU_OK &&
               mu_engine_add_param(e2, "w.caf\xC3\xA9", MU_F32, 2, s22, w2, gw2) == MU_OK,
           "MU_MAX_NAME bytes, and UTF-8 beyond ASCII, register: %s", e2 ? mu_engine_error(e2) : "");
        mu_engine_close(e2);
    }
    rc = mu_engine_add_param(eng, "x.0", MU_F32, 2, s22, w, gw);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "x.0") && contains(mu_engine_error(eng), "no group"),
       "parameter no group matches: MU_EINVAL: %s", mu_engine_error(eng));
    rc = mu_engine_add_param(eng, "w.vec", MU_F32, 1, s3, one, gone);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "w.vec") && contains(mu_engine_error(eng), "no group"),
       "1-D parameter kept out of the Muon group by min_dim matches no group: %s", mu_engine_error(eng));
    ok(!contains(mu_last_error(), "host.lua:") &&
           strncmp(mu_engine_error(eng), "mu_engine_add_param: parameter 'w.vec'", 38) == 0,
       "messages do not start with the glue's position");

    rc = mu_engine_add_param(eng, "w.0", MU_F32, 2, s22, w, gw);
    ok(rc == MU_OK, "add 2x2 Muon parameter (rc %d: %s)", rc, mu_engine_error(eng));
    rc = mu_engine_add_param(eng, "w.0", MU_F32, 2, s22, w, gw);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "already"), "duplicate name: MU_EINVAL");
    rc = mu_engine_add_param(eng, "b.0", MU_F32, 1, s3, b, gb);
    ok(rc == MU_OK, "add 1-D AdamW parameter");
    rc = mu_engine_add_param(eng, "b.nograd", MU_F32, 1, s2, nog, NULL);
    ok(rc == MU_OK, "add a parameter without a gradient");

    /* distributed registration on a config without a dist section */
    int fake_comm = 0;
    mu_placement pl[1] = {{MU_SHARD, 0}};
    ok(mu_engine_set_comm(NULL, &fake_comm) == MU_EINVAL, "set_comm with NULL engine: MU_EINVAL");
    ok(mu_engine_set_comm(eng, NULL) == MU_EINVAL, "set_comm with NULL communicator: MU_EINVAL");
    rc = mu_engine_set_comm(eng, &fake_comm);
    ok(rc == MU_ESTATE && contains(mu_engine_error(eng), "dist"), "set_comm without a dist config: MU_ESTATE: %s",
       mu_last_error());
    rc = mu_engine_add_param_sharded(eng, "w.s", MU_F32, 2, s22, 1, pl, w, gw);
    ok(rc == MU_ESTATE && contains(mu_engine_error(eng), "w.s"), "add_param_sharded without a dist config: MU_ESTATE");
    rc = mu_engine_add_param_sharded(eng, "w.s", MU_F32, 2, sneg, 1, pl, w, gw);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "negative"), "add_param_sharded negative dimension: MU_EINVAL");
    rc = mu_engine_add_param_sharded(eng, "w.s", MU_F32, 2, s22, 1, NULL, w, gw);
    ok(rc == MU_EINVAL, "add_param_sharded NULL placements: MU_EINVAL");

    /* --- one step, checked against double-precision references */
    rc = mu_engine_step(eng);
    ok(rc == MU_OK, "step (rc %d: %s)", rc, mu_engine_error(eng));
    double d = muon_expected_diag();
    double scale = sqrt(2.0) * 0.2; /* sqrt(max(A, B)) * matched_adamw_rms */
    double w_diag = 1.0 - 0.1 * scale * d, maxerr = 0.0;
    for (int i = 0; i < 4; i++) {
        double want = (i == 0 || i == 3) ? w_diag : 0.0;
        maxerr = fmax(maxerr, fabs(w[i] - want));
    }
    ok(maxerr < 1e-5, "Muon step matches the scalar NS reference (w00 %.7f want %.7f, err %.1e)", w[0], w_diag,
       maxerr);
    /* AdamW step 1: m_hat = g, v_hat = g^2: p = p (1 - lr wd) - lr g / (|g| + eps) */
    const double b0[3] = {1, -2, 3}, g0[3] = {0.5, -0.25, 2.0};
    maxerr = 0.0;
    for (int i = 0; i < 3; i++) {
        double want = b0[i] * (1 - 0.01 * 0.5) - 0.01 * g0[i] / (fabs(g0[i]) + 1e-8);
        maxerr = fmax(maxerr, fabs(b[i] - want));
    }
    ok(maxerr < 1e-6, "AdamW step matches the closed form (err %.1e)", maxerr);
    ok(nog[0] == 7 && nog[1] == 8, "parameter without a gradient is unchanged");

    /* --- runtime values */
    double v = -1;
    rc = mu_engine_get(eng, "step", &v);
    ok(rc == MU_OK && v == 1, "get step = 1 (%g)", v);
    rc = mu_engine_get(eng, "stepped", &v);
    ok(rc == MU_OK && v == 1, "get stepped = 1 after a step that stepped (%g)", v);
    rc = mu_engine_get(eng, "lr", &v);
    ok(rc == MU_OK && fabs(v - 0.1) < 1e-12, "get lr = 0.1 (%g)", v);
    rc = mu_engine_get(eng, "lr:vecs", &v);
    ok(rc == MU_OK && fabs(v - 0.01) < 1e-12, "get lr:vecs = 0.01 (%g)", v);
    /* state: the 2x2 Muon momentum of w.0 and the two AdamW moments of b.0
     * (3 each); b.nograd never stepped, so it holds none */
    rc = mu_engine_get(eng, "state_bytes", &v);
    ok(rc == MU_OK && v == 4 * (4 + 2 * 3), "get state_bytes = %d (%g)", 4 * (4 + 2 * 3), v);
    rc = mu_engine_get(eng, "scratch_bytes", &v);
    ok(rc == MU_OK && v > 0, "get scratch_bytes > 0 (%g)", v);
    /* signals for the config's hooks */
    double sig[3] = {1.5, 2.0, 250.0}, nan_sig[2] = {1.0, NAN};
    ok(mu_engine_set_signal(eng, "max_logit.0", sig, 3) == MU_OK, "set_signal: three values");
    ok(mu_engine_set_signal(eng, "empty", NULL, 0) == MU_OK, "set_signal: no values");
    rc = mu_engine_set_signal(eng, "max_logit.0", nan_sig, 2);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "values[2] = nan"), "set_signal NaN: MU_EINVAL naming it: %s",
       mu_engine_error(eng));
    ok(mu_engine_set_signal(eng, NULL, sig, 3) == MU_EINVAL && mu_engine_set_signal(eng, "x", NULL, 2) == MU_EINVAL &&
           mu_engine_set_signal(eng, "x", sig, -1) == MU_EINVAL && mu_engine_set_signal(NULL, "x", sig, 1) == MU_EINVAL,
       "set_signal: NULL name, NULL values, negative n, NULL engine: MU_EINVAL");
    rc = mu_engine_set(eng, "lr_scale", 0.5);
    ok(rc == MU_OK, "set lr_scale 0.5");
    rc = mu_engine_get(eng, "lr_scale", &v);
    ok(rc == MU_OK && v == 0.5, "get lr_scale = 0.5");
    rc = mu_engine_set(eng, "lr_scael", 1.0);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "lr_scael"), "set unknown key: MU_EINVAL naming it: %s",
       mu_engine_error(eng));
    rc = mu_engine_set(eng, "lr_scale", -1.0);
    ok(rc == MU_EINVAL, "set lr_scale -1: MU_EINVAL");
    v = 123;
    rc = mu_engine_get(eng, "nope", &v);
    ok(rc == MU_EINVAL && v == 123 && contains(mu_engine_error(eng), "nope"), "get unknown key: MU_EINVAL, out untouched");
    rc = mu_engine_get(eng, "lr", NULL);
    ok(rc == MU_EINVAL, "get with NULL out: MU_EINVAL");
    ok(mu_engine_set(NULL, "lr_scale", 1) == MU_EINVAL && mu_engine_get(NULL, "lr", &v) == MU_EINVAL &&
           mu_engine_step(NULL) == MU_EINVAL && mu_engine_save(NULL, "x") == MU_EINVAL &&
           mu_engine_load(NULL, "x") == MU_EINVAL,
       "NULL engine: every call returns MU_EINVAL");

    /* --- save / load roundtrip: state saved, step, restore, step again */
    char ckpt[320];
    snprintf(ckpt, sizeof ckpt, "%s/opt.safetensors", dir);
    rc = mu_engine_save(eng, ckpt);
    ok(rc == MU_OK && access(ckpt, R_OK) == 0, "save (rc %d: %s)", rc, mu_engine_error(eng));
    float w_saved[4], b_saved[3];
    memcpy(w_saved, w, sizeof w);
    memcpy(b_saved, b, sizeof b);
    gw[1] = 0.5f; gb[0] = -1.0f; /* a different gradient for step 2 */
    rc = mu_engine_step(eng);
    ok(rc == MU_OK, "second step");
    rc = mu_engine_get(eng, "lr", &v);
    ok(rc == MU_OK && fabs(v - 0.05) < 1e-12, "lr after set lr_scale 0.5 = 0.05 (%g)", v);
    float w_after[4], b_after[3];
    memcpy(w_after, w, sizeof w);
    memcpy(b_after, b, sizeof b);
    memcpy(w, w_saved, sizeof w);
    memcpy(b, b_saved, sizeof b);
    rc = mu_engine_set(eng, "lr_scale", 1.0);
    rc |= mu_engine_load(eng, ckpt);
    ok(rc == MU_OK, "load (rc %d: %s)", rc, mu_engine_error(eng));
    rc = mu_engine_get(eng, "step", &v);
    ok(rc == MU_OK && v == 1, "load restores the step count (%g)", v);
    rc = mu_engine_get(eng, "lr_scale", &v);
    ok(rc == MU_OK && v == 0.5, "load restores lr_scale (%g)", v);
    rc = mu_engine_step(eng);
    ok(rc == MU_OK && memcmp(w, w_after, sizeof w) == 0 && memcmp(b, b_after, sizeof b) == 0,
       "step after load reproduces the step after save bit for bit");

    /* the same through a sharded checkpoint (a directory) */
    {
        char sdir[320];
        snprintf(sdir, sizeof sdir, "%s/sharded", dir);
        memcpy(w, w_saved, sizeof w);
        memcpy(b, b_saved, sizeof b);
        rc = mu_engine_load(eng, ckpt);
        rc |= mu_engine_save_ex(eng, sdir, MU_SAVE_SHARDED);
        char index[340];
        snprintf(index, sizeof index, "%s/index.json", sdir);
        ok(rc == MU_OK && access(index, R_OK) == 0, "save_ex(MU_SAVE_SHARDED) writes a directory with index.json "
           "(rc %d: %s)", rc, line1(mu_engine_error(eng)));
        rc = mu_engine_step(eng);
        memcpy(w, w_saved, sizeof w);
        memcpy(b, b_saved, sizeof b);
        rc |= mu_engine_load(eng, sdir);
        rc |= mu_engine_step(eng);
        ok(rc == MU_OK && memcmp(w, w_after, sizeof w) == 0 && memcmp(b, b_after, sizeof b) == 0,
           "mu_engine_load of it: the step after it is the step after save, bit for bit");
        rc = mu_engine_save_ex(eng, sdir, 4);
        ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "flags"), "save_ex unknown flags: MU_EINVAL");
        ok(mu_engine_save_ex(NULL, sdir, MU_SAVE_SHARDED) == MU_EINVAL, "save_ex NULL engine: MU_EINVAL");
    }

    /* a checkpoint edited by another program (stale checksums): refused by
     * mu_engine_load, accepted by mu_engine_load_ex(MU_LOAD_NO_CHECKSUM) */
    {
        size_t len;
        char *bytes = read_all(ckpt, &len);
        const char *key = "\"muon.state_checksum\":\"xxh64:";
        char *at = NULL;
        for (size_t i = 0; bytes && !at && i + strlen(key) <= len; i++)
            if (memcmp(bytes + i, key, strlen(key)) == 0) at = bytes + i;
        ok(at != NULL, "checkpoint holds muon.state_checksum");
        if (at) {
            char *digit = at + strlen(key);
            *digit = *digit == '0' ? '1' : '0';
            char edited[340];
            snprintf(edited, sizeof edited, "%s/edited.safetensors", dir);
            FILE *f = fopen(edited, "wb");
            fwrite(bytes, 1, len, f);
            fclose(f);
            rc = mu_engine_load(eng, edited);
            /* (the C spelling of the fix, not the Lua option) */
            ok(rc == MU_EFORMAT && contains(mu_engine_error(eng), "mu_engine_load_ex(eng, path, MU_LOAD_NO_CHECKSUM)") &&
                   !contains(mu_engine_error(eng), "checksum = false"),
               "stale checksum: MU_EFORMAT, the message names the way out (%s)", line1(mu_engine_error(eng)));
            rc = mu_engine_load_ex(eng, edited, 2);
            ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "flags"), "load_ex unknown flags: MU_EINVAL");
            memcpy(w, w_saved, sizeof w);
            memcpy(b, b_saved, sizeof b);
            rc = mu_engine_load_ex(eng, edited, MU_LOAD_NO_CHECKSUM);
            ok(rc == MU_OK, "load_ex(MU_LOAD_NO_CHECKSUM) takes it (rc %d: %s)", rc, line1(mu_engine_error(eng)));
            rc = mu_engine_step(eng);
            ok(rc == MU_OK && memcmp(w, w_after, sizeof w) == 0 && memcmp(b, b_after, sizeof b) == 0,
               "and the step after it is the step after save, bit for bit");
        }
        free(bytes);
    }

    char bad[320];
    snprintf(bad, sizeof bad, "%s/missing.safetensors", dir);
    rc = mu_engine_load(eng, bad);
    ok(rc == MU_EIO && contains(mu_engine_error(eng), "missing.safetensors"),
       "load of a missing file: MU_EIO naming it (rc %d: %s)", rc, line1(mu_engine_error(eng)));
    rc = mu_engine_load(eng, dir);
    ok(rc == MU_EIO, "load of a directory: MU_EIO (rc %d: %s)", rc, line1(mu_engine_error(eng)));
    rc = mu_engine_save(eng, "/nonexistent-dir/x.safetensors");
    ok(rc == MU_EIO, "save into a missing directory: MU_EIO (rc %d: %s)", rc, line1(mu_engine_error(eng)));

    /* malformed checkpoints: MU_EFORMAT, and nothing changes */
    {
        size_t len;
        char *bytes = read_all(ckpt, &len);
        double step_before = -1, step_after = -2;
        mu_engine_get(eng, "step", &step_before);
        struct { const char *what; const char *path; } cases[6];
        int nc = 0;
        cases[nc].what = "truncated in the data";
        cases[nc++].path = write_bytes("trunc_data.safetensors", bytes, len - 3);
        cases[nc].what = "truncated in the header";
        cases[nc++].path = write_bytes("trunc_header.safetensors", bytes, 40);
        cases[nc].what = "shorter than its length field";
        cases[nc++].path = write_bytes("tiny.safetensors", bytes, 5);
        const char garbage[] = "this is not a safetensors file, just some text\n";
        cases[nc].what = "garbage";
        cases[nc++].path = write_bytes("garbage.safetensors", garbage, sizeof garbage - 1);
        char *flipped = malloc(len);
        memcpy(flipped, bytes, len);
        flipped[len - 1] ^= 0x10; /* a bit of the last tensor: checksum mismatch */
        cases[nc].what = "bit flip in the data (checksum)";
        cases[nc++].path = write_bytes("flipped.safetensors", flipped, len);
        memcpy(flipped, bytes, len);
        flipped[8] = '['; /* the header's '{' */
        cases[nc].what = "header not a JSON object";
        cases[nc++].path = write_bytes("badjson.safetensors", flipped, len);
        for (int i = 0; i < nc; i++) {
            rc = mu_engine_load(eng, cases[i].path);
            ok(rc == MU_EFORMAT, "load of a checkpoint %s: MU_EFORMAT (rc %d %s: %s)", cases[i].what, rc,
               mu_errname(rc), line1(mu_engine_error(eng)));
        }
        mu_engine_get(eng, "step", &step_after);
        ok(step_before == step_after, "failed loads change nothing (step %g)", step_after);
        free(flipped);
        free(bytes);
    }

    /* a checkpoint of another parameter set is refused */
    mu_engine *other = NULL;
    rc = mu_engine_open(&other, cfg);
    float w2[6] = {0}, gw2[6] = {0};
    int64_t s23[2] = {2, 3};
    rc |= mu_engine_add_param(other, "w.0", MU_F32, 2, s23, w2, gw2);
    ok(rc == MU_OK, "second engine on the same config");
    rc = mu_engine_load(other, ckpt);
    ok(rc == MU_EINVAL && contains(mu_engine_error(other), "w.0"),
       "load with a different shape: MU_EINVAL naming the parameter (rc %d %s: %s)", rc, mu_errname(rc),
       line1(mu_engine_error(other)));
    mu_engine_close(other);

    /* non-finite gradient: the step fails atomically */
    memcpy(w_saved, w, sizeof w);
    gw[2] = NAN;
    rc = mu_engine_step(eng);
    ok(rc == MU_ENONFINITE && memcmp(w, w_saved, sizeof w) == 0,
       "NaN gradient: MU_ENONFINITE, parameters unchanged (rc %d %s: %s)", rc, mu_errname(rc), line1(mu_engine_error(eng)));
    gw[2] = 0.0f;
    gb[1] = INFINITY;
    rc = mu_engine_step(eng);
    ok(rc == MU_ENONFINITE && memcmp(w, w_saved, sizeof w) == 0,
       "Inf gradient of an AdamW parameter: MU_ENONFINITE (rc %d %s: %s)", rc, mu_errname(rc), line1(mu_engine_error(eng)));
    gb[1] = 0.0f;
    mu_engine_close(eng);

    /* --- a hook that raises: traceback in the engine's error */
    const char *hook_cfg = tap_write(dir, "hook.lua",
        "local function explode(p) error('hook exploded on ' .. p.name) end\n"
        "return { groups = { { optimizer = 'muon', match = '.*', lr = 0.1, post_update_fn = explode } } }\n");
    eng = NULL;
    rc = mu_engine_open(&eng, hook_cfg);
    rc |= mu_engine_add_param(eng, "w.0", MU_F32, 2, s22, w, gw);
    ok(rc == MU_OK, "open a config whose hook raises");
    rc = mu_engine_add_param(eng, "w.vec", MU_F32, 1, s3, one, gone);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "w.vec") && contains(mu_engine_error(eng), "1D"),
       "1-D parameter routed to a Muon group: MU_EINVAL: %s", mu_engine_error(eng));
    rc = mu_engine_step(eng);
    const char *e = mu_engine_error(eng);
    char first[200];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(e, "\n"), e);
    ok(rc == MU_ELUA && contains(e, "hook exploded on w.0"), "raising hook: MU_ELUA with the message: %s", first);
    ok(contains(e, "stack traceback") && contains(e, "hook.lua:1"), "raising hook: traceback names the hook's line");
    ok(!contains(mu_last_error(), "stack traceback") && contains(mu_last_error(), "hook exploded"),
       "mu_last_error() has the message without the traceback");
    mu_engine_close(eng);
    mu_engine_close(NULL);
    ok(1, "mu_engine_close(NULL) is a no-op");

    /* --- whatever a function of the config raises at step time: MU_ELUA */
    {
        static const struct {
            const char *name, *what, *text, *needle;
            int trusted;
        } hooks[] = {
            {"h_hooks.lua", "hooks.post_update_fn raising a string",
             "return { groups = { { optimizer = 'muon', match = '^w', lr = 0.1 },\n"
             "  { optimizer = 'adamw', match = '^b' } },\n"
             "  hooks = { post_update_fn = function() error('boom') end } }\n",
             "boom", 0},
            {"h_trusted.lua", "a trusted config's hook raising a string",
             "return { groups = { { optimizer = 'muon', match = '^w', lr = 0.1 },\n"
             "  { optimizer = 'adamw', match = '^b' } },\n"
             "  hooks = { post_update_fn = function() error('trusted boom') end } }\n",
             "trusted boom", 1},
            {"h_sched.lua", "a schedule raising",
             "return { groups = { { optimizer = 'muon', match = '^w', lr = 0.1 },\n"
             "  { optimizer = 'adamw', match = '^b' } },\n"
             "  schedule = function(step) error('schedule boom') end }\n",
             "schedule boom", 0},
            {"h_table.lua", "a hook raising a table that names another code",
             "return { groups = { { optimizer = 'muon', match = '^w', lr = 0.1 },\n"
             "  { optimizer = 'adamw', match = '^b' } },\n"
             "  hooks = { post_update_fn = function() error({ code = -3, msg = 'forged EIO' }) end } }\n",
             "forged EIO", 0},
            {"h_muoncall.lua", "a hook whose muon call fails (MU_ESHAPE inside)",
             "return { groups = { { optimizer = 'muon', match = '^w', lr = 0.1 },\n"
             "  { optimizer = 'adamw', match = '^b' } },\n"
             "  hooks = { post_update_fn = function(p, w) w:view({7}) end } }\n",
             "view", 0},
            {"h_momentum.lua", "a momentum_update_fn raising",
             "return { groups = { { optimizer = 'muon', match = '^w', lr = 0.1 },\n"
             "  { optimizer = 'adamw', match = '^b' } },\n"
             "  hooks = { momentum_update_fn = function() error('momentum boom') end } }\n",
             "momentum boom", 0},
        };
        char msg[300];
        for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++) {
            rc = step_status(hooks[i].name, hooks[i].text, hooks[i].trusted, msg, sizeof msg);
            ok(rc == MU_ELUA && contains(msg, hooks[i].needle), "%s: MU_ELUA (rc %d %s: %s)", hooks[i].what, rc,
               mu_errname(rc), msg);
        }
        /* a match function raising, when the parameter is routed */
        const char *match_cfg = tap_write(dir, "h_match.lua",
            "return { groups = { { optimizer = 'adamw', match = function(name) error('match boom') end } } }\n");
        eng = NULL;
        rc = mu_engine_open(&eng, match_cfg);
        ok(rc == MU_OK, "open a config whose match function raises (rc %d: %s)", rc, mu_last_error());
        if (eng) {
            rc = mu_engine_add_param(eng, "b.0", MU_F32, 1, s3, b, gb);
            ok(rc == MU_ELUA && contains(mu_engine_error(eng), "match boom"),
               "a match function raising: MU_ELUA (rc %d %s: %s)", rc, mu_errname(rc), line1(mu_engine_error(eng)));
            mu_engine_close(eng);
        }
    }

    /* --- scripts */
    int status = -1;
    const char *script = tap_write(dir, "s.lua",
        "local muon = require('muon')\n"
        "assert(arg[0]:match('s.lua$') and arg[1] == 'x' and arg[2] == 'y')\n"
        "local t = muon.tensor.from({3, 4}, {2})\n"
        "return math.floor(t:norm() + 0.5)\n");
    char *args[2] = {"x", "y"};
    rc = mu_script_run(script, 2, args, 0, &status);
    ok(rc == MU_OK && status == 5, "mu_script_run: args, require('muon'), exit status from return (%d)", status);
    rc = mu_script_run(tap_write(dir, "e.lua", "local function f() error('script failed here') end\nf()\n"), 0, NULL, 0,
                       &status);
    ok(rc == MU_ELUA && status == 1 && contains(mu_last_error(), "script failed here") &&
           contains(mu_last_error(), "stack traceback"),
       "mu_script_run: a Lua error gives MU_ELUA, status 1, message + traceback");
    rc = mu_script_run_module("muon.nonexistent_module", 0, NULL, 0, &status);
    ok(rc == MU_ELUA && contains(mu_last_error(), "nonexistent_module"), "mu_script_run_module: missing module");
    rc = mu_script_run(NULL, 0, NULL, 0, &status);
    ok(rc == MU_EINVAL, "mu_script_run(NULL): MU_EINVAL");
    rc = mu_script_run(missing, 0, NULL, 0, &status);
    ok(rc != MU_OK && status == 1 && contains(mu_last_error(), "nope.lua") &&
           contains(mu_last_error(), "No such file or directory") && !strchr(mu_last_error(), '\n'),
       "mu_script_run on a missing script: one line, the path and the reason: %s", mu_last_error());
    ok(rc == MU_EIO, "mu_script_run on a missing script: MU_EIO, the code of muon's error object (%s)", mu_errname(rc));
    rc = mu_script_run(tap_write(dir, "r256.lua", "return 256\n"), 0, NULL, 0, &status);
    ok(rc == MU_EINVAL && status == 1 && contains(mu_last_error(), "returned 256"),
       "mu_script_run: a return value os.exit would truncate (256) is MU_EINVAL, status 1: %s", mu_last_error());
    rc = mu_script_run(tap_write(dir, "r7.lua", "return '7'\n"), 0, NULL, 0, &status);
    ok(rc == MU_OK && status == 7, "mu_script_run: a string holding an integer is that status (%d)", status);
    rc = mu_script_run(tap_write(dir, "deep.lua", "local function f() return 1 + f() end\nf()\n"), 0, NULL, 0, &status);
    ok(rc == MU_ENOMEM && status == 1 && contains(mu_last_error(), "out of Lua stack"),
       "mu_script_run: endless recursion is MU_ENOMEM naming the Lua stack: %s", line1(mu_last_error()));
    rc = mu_script_run("", 0, NULL, 0, &status);
    ok(rc == MU_EINVAL && status == 1 && contains(mu_last_error(), "empty"), "mu_script_run(\"\"): MU_EINVAL");
    rc = mu_script_run(valid_bc, 0, NULL, MU_SCRIPT_TRUSTED, &status);
    ok(rc != MU_OK && status == 1 && contains(mu_last_error(), "bytecode is not accepted") &&
           !strchr(mu_last_error(), '\n'),
       "mu_script_run on a bytecode file: refused in one line: %s", mu_last_error());

    ok(strcmp(mu_strerror(MU_ELUA), "lua error") == 0 && strcmp(mu_strerror(MU_EIO), "i/o error") == 0,
       "mu_strerror");
    {
        static const struct { int code; const char *name; } codes[] = {
            {MU_OK, "OK"}, {MU_EINVAL, "EINVAL"}, {MU_ENOMEM, "ENOMEM"}, {MU_EIO, "EIO"},
            {MU_EFORMAT, "EFORMAT"}, {MU_EDTYPE, "EDTYPE"}, {MU_ESHAPE, "ESHAPE"},
            {MU_ENONFINITE, "ENONFINITE"}, {MU_ESTATE, "ESTATE"}, {MU_ELUA, "ELUA"}, {MU_ECOMM, "ECOMM"},
        };
        int n = (int)(sizeof codes / sizeof codes[0]);
        for (int i = 0; i < n; i++) {
            ok(codes[i].code == -i && strcmp(mu_errname(codes[i].code), codes[i].name) == 0 &&
                   strcmp(mu_strerror(codes[i].code), "unknown error") != 0,
               "mu_errname(%d) = %s (%s)", codes[i].code, mu_errname(codes[i].code), mu_strerror(codes[i].code));
        }
        ok(strcmp(mu_errname(-n), "UNKNOWN") == 0 && strcmp(mu_errname(1), "UNKNOWN") == 0 &&
               strcmp(mu_strerror(-n), "unknown error") == 0,
           "mu_errname / mu_strerror of a value outside the table: UNKNOWN / unknown error");
    }
    ok(mu_blas_fix_core(NULL) == MU_EINVAL, "mu_blas_fix_core with NULL argv: MU_EINVAL, nothing done");

    /* --- nothing to step: no parameter has a gradient. MU_OK, and nothing
     * changes: the values, the step count (so the schedule) */
    {
        float w2[4] = {1, 2, 3, 4}, b2[3] = {1, 2, 3};
        int64_t s22[2] = {2, 2}, s3[1] = {3};
        mu_engine *e2 = NULL;
        rc = mu_engine_open(&e2, tap_write(dir, "nograd.lua", CONFIG));
        rc |= mu_engine_add_param(e2, "w.0", MU_F32, 2, s22, w2, NULL);
        rc |= mu_engine_add_param(e2, "b.0", MU_F32, 1, s3, b2, NULL);
        ok(rc == MU_OK, "open + two parameters without gradients (%s)", mu_last_error());
        double st = -1, stepped = -1;
        rc = mu_engine_step(e2);
        mu_engine_get(e2, "step", &st);
        mu_engine_get(e2, "stepped", &stepped);
        ok(rc == MU_OK && st == 0 && stepped == 0 && w2[0] == 1 && w2[3] == 4 && b2[2] == 3,
           "step with no gradient: MU_OK, step stays 0, stepped 0, values unchanged (rc %d, step %g, stepped %g)", rc,
           st, stepped);
        mu_engine_close(e2);
    }

    /* --- one registration per buffer (tied weights), and the gradient
     * helpers: zero_grad, clip_grad_norm (torch's formula), set_lr */
    {
        float emb[8] = {1, 2, 3, 4, 5, 6, 7, 8}, gemb[8] = {3, 0, 0, 4, 0, 0, 0, 0};
        float other[4] = {1, 1, 1, 1}, gother[4] = {0, 0, 0, 0};
        int64_t s42[2] = {4, 2}, s22[2] = {2, 2};
        mu_engine *e3 = NULL;
        rc = mu_engine_open(&e3, tap_write(dir, "tied.lua", CONFIG));
        rc |= mu_engine_add_param(e3, "w.embed", MU_F32, 2, s42, emb, gemb);
        ok(rc == MU_OK, "open + one 4x2 parameter (%s)", mu_last_error());
        rc = mu_engine_add_param(e3, "w.head", MU_F32, 2, s22, emb + 2, gother);
        ok(rc == MU_EINVAL && contains(mu_engine_error(e3), "parameter 'w.head': its value overlaps the value of "
                                                            "parameter 'w.embed'"),
           "a view into a registered value: MU_EINVAL naming both (%s)", line1(mu_engine_error(e3)));
        rc = mu_engine_add_param(e3, "w.head", MU_F32, 2, s22, other, gemb + 4);
        ok(rc == MU_EINVAL && contains(mu_engine_error(e3), "its grad overlaps the grad of parameter 'w.embed'"),
           "a grad inside a registered grad: MU_EINVAL naming both (%s)", line1(mu_engine_error(e3)));
        ok(mu_engine_add_param(e3, "w.head", MU_F32, 2, s22, other, gother) == MU_OK,
           "the name is free after the refusals; own buffers are accepted");
        double norm = -1;
        rc = mu_engine_clip_grad_norm(e3, 2.5, &norm);
        /* total = sqrt(3^2 + 4^2) = 5; coef = 2.5 / (5 + 1e-6) */
        double coef = 2.5 / (5 + 1e-6);
        ok(rc == MU_OK && norm == 5 && fabs(gemb[0] - 3 * coef) < 1e-6 && fabs(gemb[3] - 4 * coef) < 1e-6,
           "mu_engine_clip_grad_norm: norm 5, grads scaled by 2.5 / (5 + 1e-6) (norm %g, g %g %g)", norm, gemb[0],
           gemb[3]);
        rc = mu_engine_clip_grad_norm(e3, NAN, &norm);
        ok(rc == MU_EINVAL && norm == 0 && contains(mu_engine_error(e3), "max_norm must be a finite number >= 0"),
           "mu_engine_clip_grad_norm(NaN): MU_EINVAL, *norm = 0 (%s)", line1(mu_engine_error(e3)));
        double lr = -1;
        rc = mu_engine_set_lr(e3, "mats", 0.25);
        mu_engine_get(e3, "lr:mats", &lr);
        ok(rc == MU_OK && lr == 0.25, "mu_engine_set_lr: lr:mats = %g", lr);
        ok(mu_engine_set_lr(e3, "nope", 0.1) == MU_EINVAL && mu_engine_set_lr(e3, "mats", -1) == MU_EINVAL &&
               mu_engine_set_lr(e3, NULL, 0.1) == MU_EINVAL,
           "mu_engine_set_lr: unknown group, negative lr, NULL group: MU_EINVAL");
        ok(mu_engine_zero_grad(e3) == MU_OK && gemb[0] == 0 && gemb[3] == 0 && emb[0] == 1,
           "mu_engine_zero_grad: grads 0, values untouched");
        mu_engine_close(e3);
        ok(mu_engine_zero_grad(NULL) != MU_OK && mu_engine_clip_grad_norm(NULL, 1, NULL) != MU_OK &&
               mu_engine_set_lr(NULL, "mats", 1) != MU_OK,
           "the helpers on a NULL engine fail");
    }

    /* clean up */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    printf("1..%d\n", n_test);
    return n_fail ? 1 : 0;
}
