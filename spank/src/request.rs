//! A `--vse` request checked against the site's policies. The same checks run in srun/sbatch
//! (before anything starts, with the user's privileges) and on the node (authoritatively,
//! whatever the user's side did).
//!
//! The node builds a spec as root, so a spec or a user's policy may not bring anything that
//! would run or read on the host with root's privileges: no `post_install` commands and no
//! `files` taken from host paths in the spec, no repositories or keyrings and no host files
//! in a user's policy. Such a spec is built by the user (`vse build`) and passed as an image.

use crate::{RequestArgs, SpankError};
use std::path::{Path, PathBuf};
use vsec::env::{EffectiveEnv, FileContent, Origin};
use vsec::policy::{Layer, Policy};
use vsec::site::{PolicyStack, SiteEnv, StackError};
use vsec::units::Hypervisor;
use vsec::yaml::{Diagnostics, YamlError};

/// How V2M picks the accelerator (`accel=` in plugstack.conf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// KVM when a functional check passes, else TCG.
    Auto,
    Kvm,
    Tcg,
}

/// The plugin's arguments in plugstack.conf: the site's side of every request.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConf {
    /// The site's policy stack (the site directory's, then `policy=`, repeated): always applied.
    pub site_policies: Vec<PathBuf>,
    /// Where step directories go (`run_dir=`).
    pub run_dir: PathBuf,
    /// The node-local cache specs are built into (`cache=`; VSE_CACHE).
    pub cache: Option<PathBuf>,
    pub accel: Accel,
}

impl PluginConf {
    pub fn parse(args: &[String]) -> Result<Self, SpankError> {
        let mut c = PluginConf {
            site_policies: Vec::new(),
            run_dir: "/run/vse/spank".into(),
            cache: None,
            accel: Accel::Auto,
        };
        let bad = |a: &str, why: &str| {
            SpankError::Invalid(format!(
                "plugstack.conf: vse_spank.so argument `{a}`: {why}; expected vse=PATH, \
                 policy=FILE, run_dir=DIR, cache=DIR or accel=auto|kvm|tcg"
            ))
        };
        for a in args {
            let (k, v) = a.split_once('=').ok_or_else(|| bad(a, "not KEY=VALUE"))?;
            let abs = || {
                Path::new(v)
                    .is_absolute()
                    .then(|| PathBuf::from(v))
                    .ok_or_else(|| bad(a, "the path must be absolute"))
            };
            match k {
                "policy" => c.site_policies.push(abs()?),
                "run_dir" => c.run_dir = abs()?,
                "cache" => c.cache = Some(abs()?),
                "accel" => {
                    c.accel = match v {
                        "auto" => Accel::Auto,
                        "kvm" => Accel::Kvm,
                        "tcg" => Accel::Tcg,
                        _ => return Err(bad(a, "unknown accelerator")),
                    }
                }
                _ => return Err(bad(a, "unknown key")),
            }
        }
        Ok(c)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An image directory written by `vse build`.
    Image(PathBuf),
    /// A spec, built on the node under the site's policies.
    Spec(PathBuf),
}

/// A request that passed every check.
#[derive(Debug, Clone)]
pub struct Checked {
    pub conf: PluginConf,
    pub source: Source,
    /// The site's policies, then the user's.
    pub policies: Vec<PathBuf>,
    /// `--vse-vcpus` / `--vse-memory` (MiB), within the policies' limits.
    pub vcpus: Option<u32>,
    pub memory_mib: Option<u64>,
    /// A spec's vCPUs and memory (MiB) after the policies.
    pub spec_resources: Option<(u32, u64)>,
    pub max_vcpus: Option<u32>,
    pub max_memory_mib: Option<u64>,
    /// The stack's combined rules (`images.signed_by` for the node's admission).
    pub rules: vsec::merge::Stack,
    /// What the step shares with its VMs (resolved as the user: in srun here, on the node by
    /// the service after its drop).
    pub shares: crate::shares::StepShares,
}

/// The smallest VM that boots an image's kernel and agent comfortably.
pub const MIN_MEMORY_MIB: u64 = 128;
/// Memory of a node's VM when neither the user nor a spec says.
pub const DEFAULT_MEMORY_MIB: u64 = 512;

impl Checked {
    /// The node's VM: the user's value, else the spec's, else one vCPU per CPU of the node's
    /// tasks (and [`DEFAULT_MEMORY_MIB`]); a default never exceeds the policies' limits.
    pub fn vm_size(&self, tasks: u32, cpus_per_task: u32) -> (u32, u64) {
        let (spec_v, spec_m) = self.spec_resources.unzip();
        let vcpus = self.vcpus.or(spec_v).unwrap_or_else(|| {
            let want = tasks.max(1).saturating_mul(cpus_per_task.max(1));
            self.max_vcpus.map_or(want, |m| want.min(m))
        });
        let memory = self.memory_mib.or(spec_m).unwrap_or_else(|| {
            self.max_memory_mib
                .map_or(DEFAULT_MEMORY_MIB, |m| DEFAULT_MEMORY_MIB.min(m))
        });
        (vcpus, memory)
    }
}

fn invalid(msg: impl Into<String>) -> SpankError {
    SpankError::Invalid(msg.into())
}

fn diags(e: YamlError) -> SpankError {
    invalid(e.to_string())
}

/// Checks a request: the plugin's arguments, the image or spec, the policy stack (the site's
/// directory with the job's partition, plugstack.conf's `policy=`, then the user's
/// `--vse-policy`; `vsec::site::PolicyStack`, as every vse command builds it), vCPUs, memory
/// and the hypervisor against it.
pub fn check(a: &RequestArgs) -> Result<Checked, SpankError> {
    let conf = PluginConf::parse(&a.plugin_args)?;
    let env = site_env(a)?;
    let value = a.image.trim();
    if value.is_empty() {
        return Err(invalid("--vse: expected an image directory or a spec"));
    }
    let path = a.cwd.join(value);
    let source = if path.is_dir() {
        check_image(value, &path)?;
        Source::Image(path)
    } else if path.is_file() && is_spec_name(&path) {
        Source::Spec(path)
    } else if path.exists() {
        return Err(invalid(format!(
            "--vse={value}: {} is neither an image directory (`vse build SPEC -o DIR`) nor a spec \
             (*.vse.yaml)",
            path.display()
        )));
    } else {
        return Err(invalid(format!(
            "--vse={value}: {} does not exist; expected an image directory written by \
             `vse build` or a spec (*.vse.yaml) visible on the nodes",
            path.display()
        )));
    };
    let user: Vec<PathBuf> = a
        .policies
        .iter()
        .flat_map(|p| p.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| a.cwd.join(p))
        .collect();
    let stack = PolicyStack::load(&env, &conf.site_policies, &user).map_err(|e| match e {
        StackError::Read(YamlError::Read { path, source }) if user.contains(&path) => invalid(
            format!("--vse-policy: cannot read {}: {source}", path.display()),
        ),
        StackError::Read(e) => invalid(format!("site policy: {e}")),
        e => invalid(e.to_string()),
    })?;
    let rules = stack.rules().map_err(|d| invalid(d.to_string()))?;
    // The node writes a step's audit record to the site's file only.
    let user_audit = (stack.policies.iter().filter(|p| p.layer == Layer::User))
        .find_map(|p| p.audit_file.as_ref());
    if let Some(f) = user_audit {
        return Err(invalid(format!(
            "{}: --vse-policy: audit.file is the site's to set; hint: drop it",
            f.at
        )));
    }
    if matches!(source, Source::Spec(_)) {
        for p in stack.policies.iter().filter(|p| p.layer == Layer::User) {
            refuse_host_reach(p)?;
        }
    }
    let launch = stack.launch_rules().map_err(|d| invalid(d.to_string()))?;
    // The node boots with QEMU, whatever the request.
    launch
        .hypervisor(Some(Hypervisor::Qemu))
        .map_err(|e| invalid(format!("--vse: the node's VMs run under QEMU: {e}")))?;
    let mut spec_env = None;
    let spec_resources = match &source {
        Source::Spec(spec) => {
            let env = check_spec(spec, &stack)?;
            let r = (env.resources.vcpus.value, env.resources.memory.value.mib());
            spec_env = Some(env);
            Some(r)
        }
        Source::Image(dir) => {
            // Checked against the stack in force now, not the one it was built under.
            let image = vse_image::ImageDir::open(dir).map_err(|e| invalid(e.to_string()))?;
            vsec::admit::admit(dir, image.manifest(), &rules)
                .map_err(|e| invalid(format!("--vse={value}: {e}")))?;
            None
        }
    };
    let max_vcpus = rules.max_vcpus.as_ref();
    let max_mem = rules.max_memory.as_ref();
    let vcpus = a.vcpus.as_deref().map(parse_vcpus).transpose()?;
    let memory_mib = a.memory.as_deref().map(parse_memory).transpose()?;
    if let (Some(v), Some(m)) = (vcpus, max_vcpus)
        && v > m.value
    {
        return Err(invalid(format!(
            "--vse-vcpus={v}: the policy allows at most {} ({})",
            m.value, m.at
        )));
    }
    if let (Some(v), Some(m)) = (memory_mib, max_mem)
        && v > m.value.mib()
    {
        return Err(invalid(format!(
            "--vse-memory={v}M: the policy allows at most {} ({})",
            m.value, m.at
        )));
    }
    let shares = crate::shares::requested(a.shares.as_deref(), spec_env.as_ref(), &rules)?;
    if a.job.is_none() {
        // srun's side, as the user: a share the node would refuse fails before anything starts.
        let home = vse_guest_agent::protocol::GuestUser::current().home;
        crate::shares::resolve(&shares, &a.cwd, Path::new(&home))?;
    }
    let mut conf = conf;
    conf.site_policies = stack.site_files().to_vec();
    Ok(Checked {
        shares,
        max_vcpus: max_vcpus.map(|m| m.value),
        max_memory_mib: max_mem.map(|m| m.value.mib()),
        conf,
        source,
        policies: stack.files.clone(),
        vcpus,
        memory_mib,
        spec_resources,
        rules,
    })
}

/// The site as this request sees it. On the user's side (srun, sbatch) the process's view,
/// partition included (`SLURM_JOB_PARTITION`). On the node, whose only environment is `PATH`,
/// the partition is the controller's record of the job (`--job`), never what the job's
/// environment claims; it is looked up only when the site has partition policies.
fn site_env(a: &RequestArgs) -> Result<SiteEnv, SpankError> {
    let mut env = SiteEnv::from_process();
    if let Some(job) = a.job {
        env.partition = None;
        if vsec::site::has_partition_policies(&env).map_err(|e| invalid(e.to_string()))? {
            env.partition = Some(job_partition(job)?);
        }
    }
    Ok(env)
}

/// The partition slurmctld runs `job` in (`scontrol show job`).
fn job_partition(job: u32) -> Result<String, SpankError> {
    let out = std::process::Command::new("scontrol")
        .args(["show", "job", "-o", &job.to_string()])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(SpankError::io("running scontrol for the job's partition"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    partition_of(&text).ok_or_else(|| {
        invalid(format!(
            "job {job}: cannot learn its partition from slurmctld (scontrol show job: {}); \
             hint: the site's partition policies need it",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })
}

fn partition_of(scontrol: &str) -> Option<String> {
    scontrol
        .split_whitespace()
        .find_map(|f| f.strip_prefix("Partition="))
        .filter(|p| !p.is_empty() && *p != "(null)")
        .map(str::to_string)
}

fn is_spec_name(p: &Path) -> bool {
    matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

/// A complete image whose parts are plain files inside its directory.
fn check_image(value: &str, dir: &Path) -> Result<(), SpankError> {
    vse_image::ImageDir::open(dir)
        .map(drop)
        .map_err(|e| invalid(format!("--vse={value}: {e}")))
}

/// A user's policy may narrow the site's, but not choose what a root build downloads,
/// trusts or copies from the host.
fn refuse_host_reach(p: &Policy) -> Result<(), SpankError> {
    let at = p
        .mirror
        .as_ref()
        .map(|m| (&m.at, "repositories.mirror"))
        .or(p
            .keyrings
            .as_ref()
            .map(|k| (&k.at, "repositories.keyrings")))
        .or(p
            .required_files
            .iter()
            .find(|f| matches!(f.value.content, FileContent::Source(_)))
            .map(|f| (&f.at, "files.required with a host `source`")));
    match at {
        Some((at, what)) => Err(invalid(format!(
            "{at}: --vse-policy: {what} is the site's to set when the node builds a spec as \
             root; hint: drop it, or build the image yourself (`vse build`) and pass --vse=IMAGE"
        ))),
        None => Ok(()),
    }
}

/// Merges the spec with the stack; returns its vCPUs and memory (MiB).
fn check_spec(spec: &Path, stack: &PolicyStack) -> Result<EffectiveEnv, SpankError> {
    let s = vsec::spec::load(spec).map_err(|e| match e {
        YamlError::Read { path, source } => {
            invalid(format!("--vse: cannot read {}: {source}", path.display()))
        }
        e => diags(e),
    })?;
    let env = stack
        .merge(&s)
        .map_err(|d: Diagnostics| invalid(d.to_string()))?;
    refuse_root_commands(&env)?;
    Ok(env)
}

fn refuse_root_commands(env: &EffectiveEnv) -> Result<(), SpankError> {
    let user_at = |o: &Origin| match o {
        Origin::User { at } => Some(at.to_string()),
        _ => None,
    };
    let hit = env
        .post_install
        .iter()
        .find_map(|c| user_at(&c.from).map(|at| (at, "post_install runs commands")))
        .or_else(|| {
            env.files
                .iter()
                .filter(|f| matches!(f.value.content, FileContent::Source(_)))
                .find_map(|f| {
                    user_at(&f.from).map(|at| (at, "files with a host `source` read files"))
                })
        });
    match hit {
        Some((at, what)) => Err(invalid(format!(
            "{at}: {what} as root on the node when the plugin builds the spec; hint: build the \
             image yourself (`vse build SPEC -o DIR`) and pass --vse=DIR"
        ))),
        None => Ok(()),
    }
}

fn parse_vcpus(s: &str) -> Result<u32, SpankError> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(invalid(format!(
            "--vse-vcpus={s}: expected a whole number of vCPUs from 1 to 1024"
        ))),
    }
}

/// MiB, or a number with Slurm's K/M/G/T suffix (`--mem` style).
fn parse_memory(s: &str) -> Result<u64, SpankError> {
    let t = s.trim();
    let (num, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, "M"),
    };
    let kib: Option<u64> = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "K" => Some(1),
        "M" => Some(1 << 10),
        "G" => Some(1 << 20),
        "T" => Some(1 << 30),
        _ => None,
    };
    let mib = num
        .parse::<u64>()
        .ok()
        .zip(kib)
        .and_then(|(n, k)| n.checked_mul(k))
        .map(|k| k >> 10);
    match mib {
        Some(m) if m >= MIN_MEMORY_MIB => Ok(m),
        _ => Err(invalid(format!(
            "--vse-memory={s}: expected at least {MIN_MEMORY_MIB} MiB, as MiB or with a K/M/G/T \
             suffix (e.g. 2048 or 2G)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_takes_slurm_suffixes() {
        assert_eq!(parse_memory("2048").unwrap(), 2048);
        assert_eq!(parse_memory("2G").unwrap(), 2048);
        assert_eq!(parse_memory("512M").unwrap(), 512);
        assert_eq!(parse_memory("1GiB").unwrap(), 1024);
        for bad in ["", "64", "2X", "-1", "G", "99999999999999999999"] {
            let e = parse_memory(bad).unwrap_err().to_string();
            assert!(e.contains("--vse-memory"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_partition_is_the_controller_s() {
        let line = "JobId=7 JobName=x UserId=u(1) Partition=gpu AllocNode:Sid=h:1\n";
        assert_eq!(partition_of(line).as_deref(), Some("gpu"));
        assert_eq!(partition_of("JobId=7 Partition=(null)"), None);
        assert_eq!(partition_of("slurm_load_jobs error: Invalid job id"), None);
    }

    #[test]
    fn vcpus_are_bounded() {
        assert_eq!(parse_vcpus("4").unwrap(), 4);
        for bad in ["0", "abc", "2000", "1.5"] {
            assert!(parse_vcpus(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plugin_arguments_are_checked() {
        let c = PluginConf::parse(&[
            "policy=/etc/vse/site.policy.yaml".into(),
            "run_dir=/run/x".into(),
            "accel=tcg".into(),
        ])
        .unwrap();
        assert_eq!(
            c.site_policies,
            vec![PathBuf::from("/etc/vse/site.policy.yaml")]
        );
        assert_eq!(c.run_dir, PathBuf::from("/run/x"));
        assert_eq!(c.accel, Accel::Tcg);
        for bad in [
            "policy=relative.yaml",
            "colour=red",
            "accel=fast",
            "noequals",
        ] {
            let e = PluginConf::parse(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains("plugstack.conf") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn defaults_follow_tasks_and_limits() {
        let c = Checked {
            conf: PluginConf::parse(&[]).unwrap(),
            source: Source::Image("/i".into()),
            policies: vec![],
            vcpus: None,
            memory_mib: None,
            spec_resources: None,
            max_vcpus: Some(4),
            max_memory_mib: Some(256),
            rules: Default::default(),
            shares: Default::default(),
        };
        assert_eq!(c.vm_size(3, 2), (4, 256));
        assert_eq!(c.vm_size(1, 1), (1, 256));
        let c = Checked {
            spec_resources: Some((2, 384)),
            vcpus: Some(3),
            ..c
        };
        assert_eq!(c.vm_size(8, 1), (3, 384));
    }
}
