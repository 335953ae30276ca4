/*
 * vse_spank.so: `srun --vse=IMAGE|SPEC CMD` runs each task's CMD inside a VM on its node.
 *
 * A thin shim: it registers the options and hands every decision to the `vse` binary, so the
 * policy logic, the VM handling and the error messages live in one place (the vse-spank
 * crate). Per context:
 *
 *   srun, sbatch, salloc   init_post_opt: `vse spank check` validates the request (image or
 *                          spec, the site's policies, vCPUs and memory); a bad value fails
 *                          the command before any allocation or step exists.
 *   slurmstepd (root)      init_post_opt: forks `vse spank node`, the node's VM service for
 *                          this step (one VM per node holding the node's tasks). It reads a
 *                          lifeline pipe whose write end only this slurmstepd holds, so it
 *                          also ends when slurmstepd dies without calling us.
 *   task (job user)        task_init: execs `vse spank task`, which runs the task's argv in
 *                          the node's VM with the task's environment and working directory
 *                          and exits with its status.
 *   slurmstepd (root)      exit: closes the lifeline and runs `vse spank stop`, which kills
 *                          whatever of the step is left (also after scancel or a time limit,
 *                          when Slurm has already killed the step's processes) and removes
 *                          the step's directory.
 *
 * plugstack.conf arguments: `vse=PATH` (the binary, default /usr/local/bin/vse); every other
 * argument (policy=, run_dir=, cache=, accel=) is passed to `vse spank` as --plugin-arg and
 * checked there.
 *
 * Batch, extern and interactive steps are left alone: `#SBATCH --vse=...` reaches the job's
 * srun steps through the environment, which is where the VMs belong.
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(vse, 1);

#define DEFAULT_VSE "/usr/local/bin/vse"
#define DEFAULT_RUN_DIR "/run/vse/spank"
#define MAX_ARGS 64

static struct {
	char *image;
	char *policies;
	char *vcpus;
	char *memory;
	char *shares;
	const char *vse;
	const char *run_dir;
	int plugin_ac;
	char **plugin_av;
	int enabled;
	char dir[PATH_MAX];
	int lifeline;
} ctx = { .lifeline = -1 };

/* Slurm may call a callback twice with the same value (command line, then environment):
 * the last value wins. */
static int keep(char **slot, const char *optarg)
{
	if (optarg == NULL || *optarg == '\0') {
		slurm_error("vse: the option needs a value");
		return -1;
	}
	free(*slot);
	*slot = strdup(optarg);
	return *slot == NULL ? -1 : 0;
}

static int opt_image(int val, const char *optarg, int remote)
{
	return keep(&ctx.image, optarg);
}

static int opt_policy(int val, const char *optarg, int remote)
{
	return keep(&ctx.policies, optarg);
}

static int opt_vcpus(int val, const char *optarg, int remote)
{
	return keep(&ctx.vcpus, optarg);
}

static int opt_memory(int val, const char *optarg, int remote)
{
	return keep(&ctx.memory, optarg);
}

static int opt_share(int val, const char *optarg, int remote)
{
	return keep(&ctx.shares, optarg);
}

static struct spank_option options[] = {
	{ "vse", "IMAGE|SPEC",
	  "[vse] run each task inside a VM of this image directory (vse build) or spec "
	  "(*.vse.yaml, built on the node); one VM per node holds the node's tasks",
	  1, 0, opt_image },
	{ "vse-policy", "POLICY[,POLICY...]",
	  "[vse] further policies after the site's (they can only narrow it)", 1, 0,
	  opt_policy },
	{ "vse-vcpus", "N", "[vse] vCPUs of each node's VM (default: the node's tasks x cpus-per-task)",
	  1, 0, opt_vcpus },
	{ "vse-memory", "MIB", "[vse] memory of each node's VM in MiB (default: the spec's, else 512)",
	  1, 0, opt_memory },
	{ "vse-share", "HOST[:GUEST][:ro][,...]",
	  "[vse] share host directories with the VMs (the site's shares.* policy bounds them; "
	  "the working directory is shared by default)",
	  1, 0, opt_share },
	SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	ctx.vse = DEFAULT_VSE;
	ctx.run_dir = DEFAULT_RUN_DIR;
	ctx.plugin_ac = 0;
	ctx.plugin_av = calloc((size_t)ac + 1, sizeof(char *));
	if (ctx.plugin_av == NULL)
		return -1;
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "vse=", 4) == 0) {
			ctx.vse = av[i] + 4;
			continue;
		}
		if (strncmp(av[i], "run_dir=", 8) == 0)
			ctx.run_dir = av[i] + 8;
		ctx.plugin_av[ctx.plugin_ac++] = av[i];
	}
	if (spank_context() == S_CTX_SLURMD || spank_context() == S_CTX_JOB_SCRIPT)
		return 0;
	for (struct spank_option *o = options; o->name != NULL; o++) {
		spank_err_t rc = spank_option_register(sp, o);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("vse: cannot register --%s: %s", o->name, spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

/* argv of `vse spank PHASE ...` with the user's options and the plugin arguments; the caller
 * appends its own. Returns the count, or -1 when it does not fit. */
static int base_argv(char **argv, const char *phase)
{
	int n = 0;
	argv[n++] = (char *)ctx.vse;
	argv[n++] = "spank";
	argv[n++] = (char *)phase;
	argv[n++] = "--image";
	argv[n++] = ctx.image;
	if (ctx.policies != NULL) {
		argv[n++] = "--policies";
		argv[n++] = ctx.policies;
	}
	if (ctx.vcpus != NULL) {
		argv[n++] = "--vcpus";
		argv[n++] = ctx.vcpus;
	}
	if (ctx.memory != NULL) {
		argv[n++] = "--memory";
		argv[n++] = ctx.memory;
	}
	if (ctx.shares != NULL) {
		argv[n++] = "--shares";
		argv[n++] = ctx.shares;
	}
	for (int i = 0; i < ctx.plugin_ac; i++) {
		if (n + 2 >= MAX_ARGS - 22) /* room for start_node's 20 and NULL */
			return -1;
		argv[n++] = "--plugin-arg";
		argv[n++] = ctx.plugin_av[i];
	}
	return n;
}

/* Runs argv to completion; its output goes to Slurm's error log (srun shows it). */
static int run_reporting(char **argv)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0) {
		slurm_error("vse: pipe: %s", strerror(errno));
		return -1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		slurm_error("vse: fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);
		if (null >= 0)
			dup2(null, 0);
		dup2(fds[1], 1);
		dup2(fds[1], 2);
		execv(argv[0], argv);
		dprintf(2, "cannot run %s: %s (set vse=PATH in plugstack.conf)\n", argv[0],
			strerror(errno));
		_exit(127);
	}
	close(fds[1]);
	FILE *out = fdopen(fds[0], "r");
	char line[4096];
	while (out != NULL && fgets(line, sizeof(line), out) != NULL) {
		line[strcspn(line, "\n")] = '\0';
		/* Slurm says "error:" already. */
		const char *msg = strncmp(line, "error: ", 7) == 0 ? line + 7 : line;
		slurm_error("vse: %s", msg);
	}
	if (out != NULL)
		fclose(out);
	else
		close(fds[0]);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int check_request(spank_t sp)
{
	char *argv[MAX_ARGS];
	char cwd[PATH_MAX];
	if (ctx.image == NULL) {
		if (ctx.policies || ctx.vcpus || ctx.memory || ctx.shares) {
			slurm_error("vse: --vse-policy, --vse-vcpus, --vse-memory and --vse-share need "
				    "--vse=IMAGE|SPEC");
			return -1;
		}
		return 0;
	}
	int n = base_argv(argv, "check");
	if (n < 0) {
		slurm_error("vse: too many plugin arguments");
		return -1;
	}
	if (getcwd(cwd, sizeof(cwd)) != NULL) {
		argv[n++] = "--cwd";
		argv[n++] = cwd;
	}
	argv[n] = NULL;
	return run_reporting(argv);
}

static int step_is_for_vms(spank_t sp)
{
	uint32_t step = 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS)
		return 0;
	return step != SLURM_BATCH_SCRIPT && step != SLURM_EXTERN_CONT &&
	       step != SLURM_INTERACTIVE_STEP;
}

static int start_node(spank_t sp)
{
	uint32_t job = 0, step = 0, node = 0, tasks = 0, cpt = 1;
	uid_t uid = 0;
	gid_t gid = 0;
	char pwd[PATH_MAX] = "/";
	char s_uid[16], s_gid[16], s_tasks[16], s_cpt[16], s_fd[16], s_job[16];
	char *argv[MAX_ARGS];
	gid_t *gids = NULL;
	int ngids = 0;

	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_NODEID, &node) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &tasks) != ESPANK_SUCCESS) {
		slurm_error("vse: cannot read the step's identity from Slurm");
		return -1;
	}
	/* The groups Slurm gives the job's tasks: the node service drops to exactly these, so
	 * the VM's QEMU can open what the job user's groups may (and nothing a group the user
	 * lacks may). */
	if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &ngids) != ESPANK_SUCCESS ||
	    ngids < 0) {
		slurm_error("vse: cannot read the job's supplementary groups from Slurm");
		return -1;
	}
	if (spank_get_item(sp, S_STEP_CPUS_PER_TASK, &cpt) != ESPANK_SUCCESS || cpt == 0)
		cpt = 1;
	spank_getenv(sp, "PWD", pwd, sizeof(pwd));
	/* Several slurmd of a test cluster share one host: the node id keeps them apart. */
	if (snprintf(ctx.dir, sizeof(ctx.dir), "%s/%u.%u.%u", ctx.run_dir, job, step, node) >=
	    (int)sizeof(ctx.dir)) {
		slurm_error("vse: run_dir is too long");
		return -1;
	}
	int n = base_argv(argv, "node");
	if (n < 0) {
		slurm_error("vse: too many plugin arguments");
		return -1;
	}
	snprintf(s_uid, sizeof(s_uid), "%u", (unsigned)uid);
	snprintf(s_gid, sizeof(s_gid), "%u", (unsigned)gid);
	snprintf(s_tasks, sizeof(s_tasks), "%u", tasks);
	snprintf(s_cpt, sizeof(s_cpt), "%u", cpt);
	snprintf(s_fd, sizeof(s_fd), "%d", 3);
	char *s_groups = calloc((size_t)ngids + 1, 12);
	if (s_groups == NULL) {
		slurm_error("vse: out of memory");
		return -1;
	}
	for (int i = 0, at = 0; i < ngids; i++)
		at += snprintf(s_groups + at, 12, "%s%u", i ? "," : "", (unsigned)gids[i]);
	snprintf(s_job, sizeof(s_job), "%u", job);
	/* --job: the node looks the job's partition up from slurmctld (the job's environment is
	 * the user's to write). */
	char *extra[] = { "--dir", ctx.dir, "--cwd", pwd, "--uid", s_uid, "--gid", s_gid,
			  "--groups", s_groups, "--tasks", s_tasks, "--cpus-per-task", s_cpt,
			  "--lifeline-fd", s_fd, "--job", s_job };
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0) {
		slurm_error("vse: pipe: %s", strerror(errno));
		free(s_groups);
		return -1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		slurm_error("vse: fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		free(s_groups);
		return -1;
	}
	if (pid == 0) {
		/* dup2 clears close-on-exec on the copy: fd 3 survives the exec. */
		if (dup2(fds[0], 3) < 0)
			_exit(127);
		int null = open("/dev/null", O_RDWR);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			dup2(null, 2);
		}
		setpgid(0, 0);
		/* slurmstepd's own SLURM_CONF (not the job's), for scontrol's lookup of the job. */
		static char conf[PATH_MAX + 16];
		const char *c = getenv("SLURM_CONF");
		char *envp[] = { "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				 NULL, NULL };
		if (c != NULL && snprintf(conf, sizeof(conf), "SLURM_CONF=%s", c) < (int)sizeof(conf))
			envp[1] = conf;
		execve(argv[0], argv, envp);
		_exit(127);
	}
	close(fds[0]);
	free(s_groups);
	ctx.lifeline = fds[1];
	ctx.enabled = 1;
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return check_request(sp);
	case S_CTX_REMOTE:
		if (ctx.image == NULL || !step_is_for_vms(sp))
			return 0;
		return start_node(sp);
	default:
		return 0;
	}
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	int argc = 0;
	char **job_argv = NULL, **job_env = NULL;
	if (!ctx.enabled)
		return 0;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &job_argv) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ENV, &job_env) != ESPANK_SUCCESS) {
		slurm_error("vse: cannot read the task's command and environment");
		return -1;
	}
	char **argv = calloc((size_t)argc + 8, sizeof(char *));
	if (argv == NULL)
		return -1;
	int n = 0;
	argv[n++] = (char *)ctx.vse;
	argv[n++] = "spank";
	argv[n++] = "task";
	argv[n++] = "--dir";
	argv[n++] = ctx.dir;
	argv[n++] = "--";
	for (int i = 0; i < argc; i++)
		argv[n++] = job_argv[i];
	argv[n] = NULL;
	/* The task becomes the client of the node's VM: its status is the command's. */
	execve(argv[0], argv, job_env);
	slurm_error("vse: cannot run %s: %s", argv[0], strerror(errno));
	free(argv);
	return -1;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	int rc = 0;
	if (spank_context() == S_CTX_REMOTE && ctx.enabled) {
		char *argv[] = { (char *)ctx.vse, "spank", "stop", "--dir", ctx.dir, NULL };
		close(ctx.lifeline);
		ctx.lifeline = -1;
		rc = run_reporting(argv);
		ctx.enabled = 0;
	}
	free(ctx.image);
	free(ctx.policies);
	free(ctx.vcpus);
	free(ctx.memory);
	free(ctx.plugin_av);
	ctx.image = ctx.policies = ctx.vcpus = ctx.memory = NULL;
	ctx.plugin_av = NULL;
	return rc;
}
