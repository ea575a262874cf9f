/*
 * muon -- command-line host for the muon engine.
 *
 *   muon run script.lua [args...]           run a Lua script with muon loaded
 *   muon check config.lua --params shapes   show which parameter lands where
 *   muon info                                version, BLAS core, MPI
 *   muon plot FILE.csv [--out FILE.svg] ...  a CSV (a run's log) as an SVG plot
 *   muon help API | NAME                     the API reference, or one entry
 *   muon --version, muon --help, muon COMMAND --help
 *
 * The host embeds LuaJIT through the library (mu_script_run*), so this file
 * never touches the Lua API itself.
 */
#include "muon.h"

#include <stdio.h>
#include <string.h>

static const char usage_text[] =
    "usage: muon <command> [args]\n"
    "\n"
    "commands:\n"
    "  run [--trust] SCRIPT.lua [ARGS...]   run a Lua script with the muon modules on\n"
    "                                       package.path (arg[1..] = ARGS); works under mpirun;\n"
    "                                       --trust: configs it opens run with full Lua\n"
    "  check [--trust] CONFIG.lua --params SHAPES\n"
    "                                       print which parameter lands in which group,\n"
    "                                       with optimizer and options, and every problem;\n"
    "                                       SHAPES has lines 'name dim1 dim2 ...'; exit 1 on problems\n"
    "  info                                 version, BLAS core and threads, MPI availability\n"
    "  plot FILE.csv [--y COL]... [--out F]  a CSV file's columns as an SVG plot (a run's log:\n"
    "                                       config log = { every = N, file = 'run.csv' })\n"
    "  help API | NAME                      the API reference (Lua modules, C headers), or\n"
    "                                       the entries of one name (Tensor:add, zeropower,\n"
    "                                       mu_engine_step, MU_F32, mu_engine_opts, trusted)\n"
    "\n"
    "options:\n"
    "  -h, --help                           this text (muon COMMAND --help: the command's)\n"
    "  --version                            print the version\n"
    "\n"
    "environment: MUON_LUA_PATH (Lua module directory), MUON_LIB, OPENBLAS_CORETYPE,\n"
    "OPENBLAS_NUM_THREADS\n";

static const char run_usage[] =
    "usage: muon run [--trust] SCRIPT.lua [ARGS...]\n"
    "  Run a Lua script with the muon modules on package.path; arg[0] is the script,\n"
    "  arg[1..] (and ...) are ARGS. Exit status: what the script returns, read as\n"
    "  os.exit reads it (nothing or true: 0, false: 1, an integer 0..255 itself); any\n"
    "  other value (256, -1, 3.5, NaN, a table) is an error naming it: 1. A Lua error\n"
    "  exits 1 (message and traceback on stderr). Under mpirun an error on one rank\n"
    "  aborts the job.\n"
    "  --trust   engines the script opens run their configs with full Lua (default: sandboxed)\n";

static const char info_usage[] =
    "usage: muon info\n"
    "  Print the version, the library and Lua module paths, the OpenBLAS core and threads,\n"
    "  and whether MPI is built in.\n";

/* "-h" or "--help" as a subcommand's first argument. */
static int wants_help(int argc, char **argv)
{
    return argc > 2 && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0);
}

static int usage_error(const char *fmt, const char *what)
{
    fputs("muon: ", stderr);
    fprintf(stderr, fmt, what);
    fputs("\n\n", stderr);
    fputs(usage_text, stderr);
    return 2;
}

static int report(int rc, int status, int printed)
{
    if (rc != MU_OK) {
        if (!printed) fprintf(stderr, "muon: %s\n", mu_last_error());
        return status ? status : 1;
    }
    return status;
}

int main(int argc, char **argv)
{
    mu_blas_fix_core(argv); /* may re-exec with OPENBLAS_CORETYPE set */

    if (argc < 2) return usage_error("%s", "missing command");
    const char *cmd = argv[1];
    int status = 1;

    if (strcmp(cmd, "help") == 0 && argc > 2) {
        int rc = mu_script_run_module("muon.reference:main", argc - 2, argv + 2, 0, &status);
        return report(rc, status, 0);
    }
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("muon %s\n", mu_version());
        return 0;
    }
    if (strcmp(cmd, "run") == 0) {
        if (wants_help(argc, argv)) {
            fputs(run_usage, stdout);
            return 0;
        }
        int first = 2, flags = MU_SCRIPT_MPI;
        if (argc > first && strcmp(argv[first], "--trust") == 0) {
            flags |= MU_SCRIPT_TRUSTED;
            first++;
        }
        if (argc <= first) return usage_error("%s", "run: missing script");
        if (argv[first][0] == '\0') return usage_error("%s", "run: the script path is empty");
        if (argv[first][0] == '-')
            return usage_error("run: unknown option '%s' (the script's options go after the script)",
                               argv[first]);
        int rc = mu_script_run(argv[first], argc - first - 1, argv + first + 1, flags, &status);
        return report(rc, status, 1);
    }
    if (strcmp(cmd, "plot") == 0) {
        int rc = mu_script_run_module("muon.plot", argc - 2, argv + 2, 0, &status);
        return report(rc, status, 0);
    }
    if (strcmp(cmd, "check") == 0) {
        int rc = mu_script_run_module("muon.check", argc - 2, argv + 2, 0, &status);
        return report(rc, status, 0);
    }
    if (strcmp(cmd, "info") == 0) {
        if (wants_help(argc, argv)) {
            fputs(info_usage, stdout);
            return 0;
        }
        int rc = mu_script_run_module("muon.host:info", argc - 2, argv + 2, 0, &status);
        return report(rc, status, 0);
    }
    if (cmd[0] == '-') return usage_error("unknown option '%s'", cmd);
    return usage_error("unknown command '%s'", cmd);
}
