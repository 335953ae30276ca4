/* Message-passing check program: every iteration each rank posts a sequence-numbered message
 * to its right neighbour, enters MPI_Barrier (the vse hook may block it there while its VM
 * migrates) and only then receives from the left, so a message is in flight across every
 * barrier. Any lost, reordered or duplicated message makes the program fail. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "vse_barrier.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int iters = argc > 1 ? atoi(argv[1]) : 100;
    int pause_us = argc > 2 ? atoi(argv[2]) : 0;
    int right = (rank + 1) % size, left = (rank - 1 + size) % size;
    long errors = 0, received = 0;
    for (int i = 0; i < iters; i++) {
        long out[2] = {rank, i}, in[2] = {-1, -1};
        MPI_Request req;
        MPI_Status st;
        MPI_Isend(out, 2, MPI_LONG, right, i, MPI_COMM_WORLD, &req);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Recv(in, 2, MPI_LONG, left, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        if (in[0] != left || in[1] != i || st.MPI_TAG != i) {
            fprintf(stderr, "rank %d: iteration %d got (%ld,%ld) tag %d\n", rank, i, in[0], in[1], st.MPI_TAG);
            errors++;
        }
        received++;
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        if (pause_us)
            usleep(pause_us);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    int extra = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &extra, MPI_STATUS_IGNORE);
    if (extra) {
        fprintf(stderr, "rank %d: a duplicated message is pending\n", rank);
        errors++;
    }
    unsigned long checks = 0, migrations = 0;
    vse_barrier_stats(&checks, &migrations);
    printf("rank %d received %ld errors %ld checks %lu migrations %lu\n", rank, received, errors, checks, migrations);
    MPI_Finalize();
    return errors ? 1 : 0;
}
