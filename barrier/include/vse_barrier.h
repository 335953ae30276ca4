/* vse barrier hook: call vse_barrier_check() at every barrier of your program.
 *
 * Configuration comes from the environment set by vse inside the VM:
 *   VSE_BARRIER_SOCKET  socket of the guest agent's barrier channel (unset: the hook is inert)
 *   VSE_JOB_ID, VSE_VM_ID  identity of this rank's job and VM
 *   VSE_RANK (or OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID)  rank number
 *
 * Link with -lvse_barrier; MPI programs also link libvse_barrier_mpi.a, which defines
 * MPI_Barrier to call the hook and then PMPI_Barrier.
 */
#ifndef VSE_BARRIER_H
#define VSE_BARRIER_H
#ifdef __cplusplus
extern "C" {
#endif

#define VSE_BARRIER_GO 0        /* no migration pending: go on */
#define VSE_BARRIER_MIGRATED 1  /* blocked while this VM was migrated, now released */
#define VSE_BARRIER_RELEASED 2  /* blocked, then released without migration */
#define VSE_BARRIER_INACTIVE 3  /* not running under vse (VSE_BARRIER_SOCKET unset) */
#define VSE_BARRIER_ERROR (-1)  /* misconfigured or channel broken; see vse_barrier_last_error */

/* Connects to the channel. Optional: vse_barrier_check() connects on first use. */
int vse_barrier_init(void);
/* One non-blocking read when nothing is pending; blocks only when a notice is posted. */
int vse_barrier_check(void);
/* Number of barriers checked and of migrations this process went through. */
void vse_barrier_stats(unsigned long *checks, unsigned long *migrations);
/* The last error as text, or NULL. Valid until the next call. */
const char *vse_barrier_last_error(void);
void vse_barrier_finalize(void);

#ifdef __cplusplus
}
#endif
#endif
