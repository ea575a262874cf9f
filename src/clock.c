/*
 * mu_clock: seconds on the monotonic clock, for muon.clock() and the
 * step's timers (eng:stats()).
 */
#include "tensor_internal.h"

#include <time.h>

double mu_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
