/* The communicator API on a one-process communicator (mu_comm_self): copies,
 * counters, argument checks. The multi-rank behaviour is in tests/mpi/. */
#include <stdio.h>
#include <string.h>

#include "muon_ffi.h"
#include "tap.h"

int main(void) {
    mu_comm *c = NULL;
    ok(mu_comm_self(&c) == MU_OK && c != NULL, "mu_comm_self");
    ok(mu_comm_rank(c) == 0 && mu_comm_size(c) == 1, "rank 0 of 1");

    float s[4] = {1, 2, 3, 4}, r[6] = {0};
    int64_t sc[1] = {3}, sd[1] = {1}, rc[1] = {3}, rd[1] = {2};
    ok(mu_comm_alltoallv(c, MU_F32, s, sc, sd, r, rc, rd) == MU_OK && r[2] == 2 && r[3] == 3 && r[4] == 4 &&
           r[1] == 0 && r[5] == 0,
       "alltoallv copies with displacements");
    int64_t bad[1] = {2};
    ok(mu_comm_alltoallv(c, MU_F32, s, sc, sd, r, bad, rd) == MU_ESHAPE &&
           strstr(mu_last_error(), "recvcounts[0]") != NULL,
       "alltoallv: mismatched counts name recvcounts[0]");
    int64_t neg[1] = {-1};
    ok(mu_comm_alltoallv(c, MU_F32, s, neg, sd, r, rc, rd) == MU_EINVAL, "alltoallv: negative count refused");
    ok(mu_comm_alltoallv(c, 7, s, sc, sd, r, rc, rd) == MU_EDTYPE, "alltoallv: bad dtype refused");

    double g[3] = {0}, gs[3] = {5, 6, 7};
    int64_t gc[1] = {3}, gd[1] = {0};
    ok(mu_comm_allgatherv(c, MU_F64, gs, 3, g, gc, gd) == MU_OK && g[0] == 5 && g[2] == 7, "allgatherv copies");
    ok(mu_comm_allgatherv(c, MU_F64, gs, 2, g, gc, gd) == MU_ESHAPE, "allgatherv: sendcount must match");

    int64_t v[2] = {3, -4};
    ok(mu_comm_allreduce_i64(c, v, 2, MU_COMM_SUM) == MU_OK && v[0] == 3 && v[1] == -4, "allreduce i64 (identity)");
    double dv[1] = {2.5};
    ok(mu_comm_allreduce_f64(c, dv, 1, MU_COMM_MAX) == MU_OK && dv[0] == 2.5, "allreduce f64 (identity)");
    ok(mu_comm_allreduce_f64(c, dv, 1, 9) == MU_EINVAL, "allreduce: bad op refused");

    ok(mu_comm_bcast(c, MU_F32, s, 4, 0) == MU_OK, "bcast root 0");
    ok(mu_comm_bcast(c, MU_F32, s, 4, 1) == MU_EINVAL && strstr(mu_last_error(), "root 1") != NULL,
       "bcast: root outside the communicator");
    mu_comm_request *q = NULL;
    ok(mu_comm_ibcast(c, MU_F64, g, 3, 0, &q) == MU_OK && q && mu_comm_wait(q) == MU_OK, "ibcast + wait");
    int done = 0;
    ok(mu_comm_ialltoallv(c, MU_F32, s, sc, sd, r, rc, rd, &q) == MU_OK && mu_comm_test(q, &done) == MU_OK &&
           done == 1 && mu_comm_wait(q) == MU_OK,
       "ialltoallv + test (done at once on one process) + wait");
    ok(mu_comm_test(NULL, &done) == MU_EINVAL, "test(NULL) refused");
    ok(mu_comm_wait(NULL) == MU_OK, "wait(NULL)");
    ok(mu_comm_barrier(c) == MU_OK, "barrier");

    mu_comm *sub = NULL;
    ok(mu_comm_split(c, 0, 0, &sub) == MU_OK && mu_comm_size(sub) == 1, "split");
    mu_comm *sub2 = c;
    ok(mu_comm_split(c, -1, 0, &sub2) == MU_EINVAL && sub2 == NULL, "split: negative color refused");

    mu_comm_stats st;
    ok(mu_comm_get_stats(c, &st) == MU_OK && st.calls == 9 && st.bytes_sent == 0 && st.bytes_recv == 0 &&
           st.seconds >= 0 && st.nonblocking == 2 && st.done_before_wait == 2,
       "stats: 9 counted calls (2 non-blocking, done before their wait), no bytes between ranks");
    mu_comm_reset_stats(c);
    ok(mu_comm_get_stats(c, &st) == MU_OK && st.calls == 0, "reset_stats");
    mu_comm_free(sub);
    mu_comm_free(c);
    mu_comm_free(NULL);
    ok(mu_comm_from_handle(NULL, &c) == MU_EINVAL, "from_handle(NULL) refused");
    ok(mu_comm_finalize() == MU_OK && mu_comm_finalize() == MU_OK, "finalize twice is harmless");
    mu_comm_abort(1); /* no MPI world with > 1 rank: returns */
    ok(1, "abort returns outside a multi-rank job");
    return n_fail ? 1 : 0;
}
