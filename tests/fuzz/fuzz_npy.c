/* libFuzzer harness: the .npy reader (mu_npy_load_mem) on arbitrary bytes.
 * A successful load must describe exactly the bytes it was given. */
#include "muon_ffi.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mu_tensor *t = NULL;
    int rc = mu_npy_load_mem(data, size, &t);
    if (rc == MU_OK) {
        if (!t || !mu_tensor_is_contiguous(t)) abort();
        size_t nbytes = (size_t)mu_tensor_numel(t) * mu_dtype_size(t->scalar);
        if (nbytes > size) abort();
        /* the data is the file's tail, copied */
        if (nbytes && memcmp(t->data, data + size - nbytes, nbytes) != 0) abort();
        mu_tensor_free(t);
    } else if (t != NULL || mu_last_error()[0] == '\0') {
        abort(); /* failures leave *out NULL and say why */
    }
    return 0;
}
