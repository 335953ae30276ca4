//! `vse launch --mpi`: the command rank 0's VM runs. It writes a hostfile of the job's VMs
//! and starts mpirun on it, with Open MPI told to reach the other VMs through the guest
//! agent's rsh service (no sshd in the images) and to use only the job network.

use crate::net::JobNet;
use std::collections::BTreeMap;

/// Where the hostfile lands in rank 0's VM.
pub const HOSTFILE: &str = "/run/vse-hostfile";
/// The guest agent inside every image (see imgbuild), called as `vse-agent rsh HOST CMD`.
pub const RSH_AGENT: &str = "/usr/lib/vse/vse-agent rsh";

/// What the VMs other than rank 0's run while they host mpirun's processes.
pub const HOLD: [&str; 3] = ["sh", "-c", "while :; do sleep 3600; done"];

/// The hostfile: every VM with `slots` slots (its vCPUs), in rank order.
pub fn hostfile(hosts: &[String], slots: usize) -> String {
    hosts
        .iter()
        .map(|h| format!("{h} slots={}\n", slots.max(1)))
        .collect()
}

/// (argv, env) for rank 0: `sh` writes the hostfile (passed as `$0`, so no quoting of
/// names is involved) and execs mpirun with the user's command as its arguments.
pub fn mpirun_command(
    cmd: &[String],
    hosts: &[String],
    slots: usize,
    net: &JobNet,
    mut env: BTreeMap<String, String>,
) -> (Vec<String>, BTreeMap<String, String>) {
    let script = format!(
        "printf '%s' \"$0\" > {HOSTFILE}.tmp && mv {HOSTFILE}.tmp {HOSTFILE} && \
         exec mpirun --hostfile {HOSTFILE} \"$@\""
    );
    let mut argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        script,
        hostfile(hosts, slots),
    ];
    argv.extend(cmd.iter().cloned());
    let cidr = format!("{}/{}", net.base, net.prefix);
    for (k, v) in [
        ("OMPI_MCA_plm_rsh_agent", RSH_AGENT),
        // Every daemon is started from rank 0: no rsh hop between other VMs is needed.
        ("OMPI_MCA_plm_rsh_no_tree_spawn", "1"),
        ("OMPI_MCA_oob_tcp_if_include", &cidr),
        ("OMPI_MCA_btl_tcp_if_include", &cidr),
        // The ranks (only: not mpirun, not its daemons) get the barrier hook the guest agent
        // installed, so a VM of the job can migrate while its ranks wait at MPI_Barrier.
        (
            "OMPI_MCA_mca_base_env_list",
            &format!("LD_PRELOAD={}", vse_guest_agent::preload::GUEST_PRELOAD),
        ),
        // Waiting ranks yield their vCPU: VMs often share cores (and a rank held at a barrier
        // while a VM moves would otherwise make every other rank spin).
        ("OMPI_MCA_mpi_yield_when_idle", "1"),
        // The guests run commands as root (the agent is PID 1); the VM is the boundary.
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
    ] {
        env.insert(k.to_string(), v.to_string());
    }
    (argv, env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostfile_and_mpirun_line() {
        let net = JobNet::new(
            "10.251.0.0".parse().unwrap(),
            16,
            "127.0.0.1:9".parse().unwrap(),
            2,
        )
        .unwrap();
        let hosts = vec!["j1-r0".to_string(), "j1-r1".to_string()];
        let (argv, env) = mpirun_command(
            &["lmp".into(), "-in".into(), "x".into()],
            &hosts,
            2,
            &net,
            BTreeMap::new(),
        );
        assert_eq!(argv[3], "j1-r0 slots=2\nj1-r1 slots=2\n");
        assert_eq!(&argv[4..], ["lmp", "-in", "x"]);
        assert!(argv[2].ends_with("exec mpirun --hostfile /run/vse-hostfile \"$@\""));
        assert_eq!(env["OMPI_MCA_btl_tcp_if_include"], "10.251.0.0/16");
        assert_eq!(env["OMPI_MCA_plm_rsh_agent"], RSH_AGENT);
        // A real shell runs the script: the hostfile content arrives intact as $0.
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                "printf '%s' \"$0\"; echo \"|$*\"",
                &argv[3],
                "a b",
                "c",
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "j1-r0 slots=2\nj1-r1 slots=2\n|a b c\n"
        );
    }
}
