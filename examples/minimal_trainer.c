/*
 * The smallest C trainer: fit a 4x3 matrix W to a target T, loss ||W - T||^2
 * (gradient 2 (W - T)), the optimizer driven by a config file. It saves the
 * optimizer state to CHECKPOINT (default: ./minimal_opt.safetensors).
 *   minimal_trainer CONFIG.lua [CHECKPOINT]
 * Every muon call is checked: on a failure it prints the message, exits 1.
 */
#include <muon.h>
#include <stdio.h>

/* Report the failure (its message names the call; eng NULL: no engine yet), close, status 1. */
static int fail(mu_engine *eng)
{
    fprintf(stderr, "minimal_trainer: %s\n", eng ? mu_engine_error(eng) : mu_last_error());
    mu_engine_close(eng);
    return 1;
}

int main(int argc, char **argv)
{
    if (mu_blas_fix_core(argv) != MU_OK) /* OpenBLAS's fast kernels (may re-exec once) */
        return fail(NULL);
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: minimal_trainer CONFIG.lua [CHECKPOINT]\n");
        return 2;
    }
    const char *config = argv[1];
    const char *checkpoint = argc > 2 ? argv[2] : "minimal_opt.safetensors";

    float w[12] = {0}, grad[12], target[12];
    for (int i = 0; i < 12; i++) target[i] = (float)(i % 5) - 2.0f;

    mu_engine *eng = NULL;
    if (mu_engine_open(&eng, config) != MU_OK) return fail(NULL);
    int64_t shape[2] = {4, 3};
    if (mu_engine_add_param(eng, "layers.0.w", MU_F32, 2, shape, w, grad) != MU_OK)
        return fail(eng);
    for (int step = 1; step <= 1000; step++) {
        double loss = 0;
        for (int i = 0; i < 12; i++) {
            float d = w[i] - target[i];
            loss += d * d;
            grad[i] = 2 * d;
        }
        if (step == 1 || step % 250 == 0) printf("step %4d  loss %.6f\n", step, loss);
        if (mu_engine_step(eng) != MU_OK) return fail(eng);
    }
    if (mu_engine_save(eng, checkpoint) != MU_OK) return fail(eng);
    printf("saved %s\n", checkpoint);
    mu_engine_close(eng);
    return 0;
}
