/*
 * The foreach kernels of one instruction set (FE_ISA, defined by the
 * includer and undefined here) for each dtype, as Torch7's
 * THGenerateFloatTypes.h: src/foreach_vec.h once per type (float, double,
 * float with bfloat16 state).
 */
#define FE_F64 0
#include "foreach_vec.h"
#undef FE_F64
#define FE_F64 1
#include "foreach_vec.h"
#undef FE_F64
#define FE_F64 0
#define FE_BF16 1 /* float32 maths, bfloat16 state */
#include "foreach_vec.h"
#undef FE_F64
#undef FE_BF16
#undef FE_ISA
