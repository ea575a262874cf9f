/*
 * The smallest C trainer: fit a 4x3 matrix W to a target T with the loss
 * ||W - T||^2 (gradient 2 (W - T)), the optimizer driven by a config file.
 *
 *   build/examples/minimal_trainer configs/muon.lua
 *   cc minimal_trainer.c $(pkg-config --cflags --libs muon)   (after make install)
 */
#include <muon.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    mu_blas_fix_core(argv); /* OpenBLAS's fast kernels for this CPU (may re-exec once) */
    const char *config = argc > 1 ? argv[1] : "configs/muon.lua";

    float w[12] = {0}, grad[12], target[12];
    for (int i = 0; i < 12; i++) target[i] = (float)(i % 5) - 2.0f;

    mu_engine *eng;
    if (mu_engine_open(&eng, config) != MU_OK) {
        fprintf(stderr, "%s\n", mu_last_error());
        return 1;
    }
    int64_t shape[2] = {4, 3};
    if (mu_engine_add_param(eng, "layers.0.w", MU_F32, 2, shape, w, grad) != MU_OK) {
        fprintf(stderr, "%s\n", mu_engine_error(eng));
        mu_engine_close(eng);
        return 1;
    }
    for (int step = 1; step <= 1000; step++) {
        double loss = 0;
        for (int i = 0; i < 12; i++) {
            float d = w[i] - target[i];
            loss += d * d;
            grad[i] = 2 * d;
        }
        if (step == 1 || step % 250 == 0) printf("step %3d  loss %.6f\n", step, loss);
        if (mu_engine_step(eng) != MU_OK) {
            fprintf(stderr, "%s\n", mu_engine_error(eng));
            break;
        }
    }
    if (mu_engine_save(eng, "build/minimal_opt.safetensors") != MU_OK)
        fprintf(stderr, "%s\n", mu_engine_error(eng));
    mu_engine_close(eng);
    return 0;
}
