/*
 * Preloaded into the ranks of simcluster.sh when MPICH runs over UCX (ch4:ucx), to get past a
 * deadlock in MPI_Finalize over TCP.
 *
 * MPICH 4.0.x finalizes UCX by closing every endpoint in flush mode (ucp_disconnect_nb), spinning
 * until all the closes complete, then entering a PMI barrier. Over UCX's tcp transport a flush can
 * need an acknowledgement from the peer, which only comes while the peer still drives UCX
 * progress. A rank that finished its own closes first waits in the PMI barrier and stops driving
 * progress, so a slower rank waits forever for its acknowledgement: the job hangs after its work
 * is done (seen here in about half of all runs of 3 ranks on 3 nodes).
 *
 * This makes the per-endpoint close a no-op that reports immediate completion. Nothing is lost:
 * by the time MPI_Finalize runs, every rank has completed all its communication, and the PMI
 * barrier that follows makes every rank wait until all got there; ucp_worker_destroy then closes
 * the endpoints that are left. (Newer MPICH releases enter the barrier before the closes.)
 * It only ever runs inside the simulated cluster; reshard itself is not changed by it.
 */
#include <stddef.h>

void *ucp_disconnect_nb(void *ep)
{
    (void)ep;
    return NULL; /* UCS_OK: completed, nothing for MPI_Finalize to wait for */
}
