/* MPI message checker for migration tests: every step each rank sends a sequence-numbered,
 * checksummed message to its right neighbour (still in flight when it enters MPI_Barrier, where
 * vse may hold it while its VM migrates), exchanges one checksummed message with every rank
 * (all-to-all), then receives from its left neighbour and checks everything: order, no gap,
 * no duplicate, payload intact. Plain MPI, no vse header: the barrier hook comes from LD_PRELOAD.
 *
 * Usage: mpicheck STEPS [PAUSE_US [LOG_DIR]]. Rank 0 prints one line
 *   MPICHECK ranks=N steps=S messages=M bad=B
 * and every rank exits 1 if any message anywhere was wrong. With LOG_DIR, each rank also
 * appends "rank R step S" to LOG_DIR/rank-R.log after every step, through one descriptor
 * opened at the start (a file a migration must keep open and whole). */
#include <mpi.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

static long sum(long a, long b, long c)
{
    unsigned long x = (unsigned long)a * 0x9e3779b97f4a7c15ul ^ (unsigned long)b * 0xc2b2ae3d27d4eb4ful ^
                      (unsigned long)c * 0x165667b19e3779f9ul;
    return (long)(x ^ (x >> 29));
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long steps = argc > 1 ? atol(argv[1]) : 100;
    long pause_us = argc > 2 ? atol(argv[2]) : 0;
    int log = -1;
    if (argc > 3) {
        char path[4096];
        snprintf(path, sizeof path, "%s/rank-%d.log", argv[3], rank);
        log = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (log < 0) {
            perror(path);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    int right = (rank + 1) % size, left = (rank - 1 + size) % size;
    long bad = 0, messages = 0;
    long *out = malloc(sizeof(long) * 3 * size), *in = malloc(sizeof(long) * 3 * size);
    for (long s = 0; s < steps; s++) {
        long ring[3] = {rank, s, sum(rank, right, s)}, got[3] = {-1, -1, -1};
        MPI_Request req;
        MPI_Status st;
        MPI_Isend(ring, 3, MPI_LONG, right, (int)(s % 30000), MPI_COMM_WORLD, &req);
        for (int d = 0; d < size; d++) {
            out[3 * d] = rank;
            out[3 * d + 1] = s;
            out[3 * d + 2] = sum(rank, d, s);
        }
        MPI_Alltoall(out, 3, MPI_LONG, in, 3, MPI_LONG, MPI_COMM_WORLD);
        for (int f = 0; f < size; f++) {
            messages++;
            if (in[3 * f] != f || in[3 * f + 1] != s || in[3 * f + 2] != sum(f, rank, s)) {
                fprintf(stderr, "rank %d step %ld: all-to-all from %d wrong\n", rank, s, f);
                bad++;
            }
        }
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Recv(got, 3, MPI_LONG, left, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        messages++;
        if (got[0] != left || got[1] != s || got[2] != sum(left, rank, s) || st.MPI_TAG != (int)(s % 30000)) {
            fprintf(stderr, "rank %d step %ld: ring message (%ld,%ld) tag %d wrong\n", rank, s, got[0],
                    got[1], st.MPI_TAG);
            bad++;
        }
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        if (log >= 0) {
            char line[64];
            int n = snprintf(line, sizeof line, "rank %d step %ld\n", rank, s);
            if (write(log, line, (size_t)n) != n) {
                perror("log");
                bad++;
            }
        }
        if (pause_us)
            usleep((useconds_t)pause_us);
    }
    if (log >= 0 && close(log) != 0) {
        perror("log");
        bad++;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    int extra = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &extra, MPI_STATUS_IGNORE);
    if (extra) {
        fprintf(stderr, "rank %d: a duplicated message is pending\n", rank);
        bad++;
    }
    long mine[2] = {messages, bad}, all[2] = {0, 0};
    MPI_Allreduce(mine, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("MPICHECK ranks=%d steps=%ld messages=%ld bad=%ld\n", size, steps, all[0], all[1]);
    fflush(stdout);
    MPI_Finalize();
    return all[1] ? 1 : 0;
}
