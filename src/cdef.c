/* The FFI declarations (generated from muon_ffi.h, muon.h included, by the
 * build) and the version. */
#include "muon_internal.h"

static const char mu__cdef_text[] =
#include "cdef.inc"
    ;

const char *mu_cdef(void) { return mu__cdef_text; }

const char *mu_version(void) { return "0.2.0"; }
