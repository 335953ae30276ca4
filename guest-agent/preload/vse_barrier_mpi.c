/* The MPI_Barrier hook the guest agent preloads into an `vse launch --mpi` job's ranks
 * (LD_PRELOAD, exported by mpirun to the ranks only): before the real barrier, a rank whose VM
 * is about to be live-migrated blocks until the controller says the VM has moved, so the job
 * is quiet while its VM moves and no message is lost.
 *
 * It speaks the barrier library's line protocol (barrier/src/client.rs) on the guest agent's
 * socket: HELLO <job> <vm> <rank>; the controller pushes NOTICE <id>; at its next barrier the
 * rank answers READY <id> and waits for ACK <id> <outcome>. With no notice pending a barrier
 * costs one non-blocking read. It is written in C with no MPI header and no link to libmpi so
 * that one build serves every MPI and every glibc the guest may have: PMPI_Barrier is a weak
 * reference resolved in the process (a program without MPI never calls it), and the
 * communicator is passed through untouched (a pointer for Open MPI, an int for MPICH: both
 * travel in the same register on x86-64). Any failure turns the hook off with one message;
 * the barrier itself always runs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

extern int PMPI_Barrier(void *comm) __attribute__((weak));

enum { UNSET, ACTIVE, OFF };
static int state = UNSET;
static int fd = -1;
static long notice = -1;
static char buf[512];
static size_t len;
static unsigned long migrations;

static void off(const char *why)
{
    fprintf(stderr, "vse-barrier: %s; barriers continue without migration support\n", why);
    if (fd >= 0)
        close(fd);
    fd = -1;
    state = OFF;
}

static int valid_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 128)
        return 0;
    for (; *s; s++)
        if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') || ('0' <= *s && *s <= '9') ||
              strchr("._:@-", *s)))
            return 0;
    return 1;
}

static const char *rank_env(void)
{
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "VSE_RANK"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = getenv(names[i]);
        if (v && *v && strspn(v, "0123456789") == strlen(v) && strlen(v) < 10)
            return v;
    }
    return "0";
}

static int send_all(const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

static void init(void)
{
    const char *sock = getenv("VSE_BARRIER_SOCKET");
    const char *job = getenv("VSE_JOB_ID"), *vm = getenv("VSE_VM_ID");
    if (!sock || !job || !vm) {
        state = OFF; /* not a vse job: nothing to do, nothing to say */
        return;
    }
    if (!valid_id(job) || !valid_id(vm) || strlen(sock) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        off("VSE_JOB_ID, VSE_VM_ID or VSE_BARRIER_SOCKET is malformed");
        return;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, sock);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        off("cannot reach the guest agent's barrier socket");
        return;
    }
    char hello[400];
    snprintf(hello, sizeof hello, "HELLO %s %s %s\n", job, vm, rank_env());
    if (send_all(hello) != 0) {
        off("cannot write to the barrier socket");
        return;
    }
    state = ACTIVE;
}

/* Reads what is there (or waits for something when blocking); -1 when the channel closed. */
static int fill(int blocking)
{
    if (len == sizeof buf) {
        off("protocol line too long");
        return -1;
    }
    ssize_t n = recv(fd, buf + len, sizeof buf - len, blocking ? 0 : MSG_DONTWAIT);
    if (n > 0) {
        len += (size_t)n;
        return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    return -1;
}

/* Consumes complete lines; returns 1 when the ACK of the pending notice arrived. */
static int lines(int *migrated)
{
    char *nl;
    while ((nl = memchr(buf, '\n', len))) {
        *nl = 0;
        long id = -1;
        char outcome[32] = "";
        if (sscanf(buf, "NOTICE %ld", &id) == 1) {
            notice = id;
        } else if (sscanf(buf, "ACK %ld %31s", &id, outcome) >= 1) {
            if (id == notice) {
                notice = -1;
                *migrated = strcmp(outcome, "migrated") == 0;
                size_t used = (size_t)(nl - buf) + 1;
                memmove(buf, nl + 1, len - used);
                len -= used;
                return 1;
            }
        } else {
            off("unexpected line from the controller");
            return -1;
        }
        size_t used = (size_t)(nl - buf) + 1;
        memmove(buf, nl + 1, len - used);
        len -= used;
    }
    return 0;
}

static void check(void)
{
    if (state == UNSET)
        init();
    if (state != ACTIVE)
        return;
    int migrated = 0, r;
    while ((r = fill(0)) > 0) {
    }
    if (r < 0 && state == ACTIVE) {
        close(fd); /* the controller went away: its successor rolls notices back */
        fd = -1;
        state = OFF;
        return;
    }
    if (lines(&migrated) < 0 || notice < 0)
        return;
    char ready[64];
    snprintf(ready, sizeof ready, "READY %ld\n", notice);
    if (send_all(ready) != 0) {
        off("cannot write to the barrier socket");
        return;
    }
    for (;;) {
        r = lines(&migrated);
        if (r != 0)
            break;
        if (fill(1) < 0) {
            notice = -1;
            close(fd);
            fd = -1;
            state = OFF;
            return;
        }
    }
    if (r > 0 && migrated) {
        migrations++;
        fprintf(stderr, "vse-barrier: rank %s held at a barrier while its VM migrated (%lu)\n",
                rank_env(), migrations);
    }
}

int MPI_Barrier(void *comm)
{
    check();
    if (!PMPI_Barrier) {
        fprintf(stderr, "vse-barrier: MPI_Barrier called in a process without MPI\n");
        abort();
    }
    return PMPI_Barrier(comm);
}
