/* MPI_Barrier PMPI wrapper (seed 002 §3): the vse hook runs first, so a rank whose VM is to
 * be migrated blocks here until the controller acknowledges; then the real barrier. */
#include <mpi.h>
#include <stdio.h>
#include "vse_barrier.h"

int MPI_Barrier(MPI_Comm comm)
{
    static int warned;
    if (vse_barrier_check() == VSE_BARRIER_ERROR && !warned) {
        const char *e = vse_barrier_last_error();
        fprintf(stderr, "vse_barrier: %s; barriers continue without migration support\n",
                e ? e : "unknown error");
        warned = 1;
    }
    return PMPI_Barrier(comm);
}
