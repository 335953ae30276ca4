//! `vse check SPEC [--policy P]... [--explain] [--json]`: validate a spec against stacked
//! policies and print the effective environment (with `--explain`: where each value came
//! from, and where each field takes effect). Exit 0 valid, 2 invalid (every problem listed), 1 internal error.

use crate::exit::Failure;
use anyhow::Result;
use clap::Args;
use std::fmt::Display;
use std::path::PathBuf;
use std::process::ExitCode;
use vsec::env::{CheckpointMode, EffectiveEnv, Sourced};
use vsec::policy::Policy;
use vsec::site::{PolicyStack, SiteEnv, StackError};
use vsec::yaml::{Diagnostics, YamlError};

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vse check specs/minimal.vse.yaml
  vse check specs/mpi-lammps.vse.yaml --policy specs/site.policy.yaml --policy specs/partition.policy.yaml
  vse check specs/mpi-lammps.vse.yaml --policy specs/site.policy.yaml --explain
  vse check specs/minimal.vse.yaml --json | jq .env_hash")]
pub struct CheckArgs {
    /// The environment spec (`*.vse.yaml`).
    spec: PathBuf,
    /// An admin policy (`*.policy.yaml`); repeat to stack: site first, then partition.
    #[arg(long = "policy", value_name = "POLICY")]
    policies: Vec<PathBuf>,
    /// Show where each value came from: the spec, which policy line, or a default.
    #[arg(long)]
    explain: bool,
    /// Print one JSON document (the effective environment, or the problems) on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: CheckArgs) -> Result<ExitCode> {
    let (env, policies) = match merged(&a)? {
        Ok(merged) => merged,
        Err(problems) => {
            let n = problems.len();
            if a.json {
                let doc = serde_json::json!({"valid": false, "problems": problems});
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                eprintln!("{problems}");
            }
            let noun = if n == 1 { "problem" } else { "problems" };
            return Err(Failure::invalid(format!("{}: {n} {noun} found", a.spec.display())).into());
        }
    };
    if a.json {
        let labels: Vec<_> = (policies.iter())
            .map(|p| {
                serde_json::json!({"name": p.name.value.as_str(), "description": p.description, "file": &*p.file})
            })
            .collect();
        let doc = serde_json::json!({"valid": true, "env_hash": env.env_hash(), "environment": env, "policies": labels});
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", render(&env, &policies, a.explain));
    }
    Ok(ExitCode::SUCCESS)
}

/// The spec under the command's policy stack; every problem of the spec, the policies and
/// their stacking collected.
fn merged(a: &CheckArgs) -> Result<Result<(EffectiveEnv, Vec<Policy>), Diagnostics>> {
    let mut problems = Diagnostics::default();
    let spec = match vsec::spec::load(&a.spec) {
        Ok(s) => Some(s),
        Err(YamlError::Invalid(d)) => {
            problems.extend(d);
            None
        }
        Err(e) => return Err(e.into()),
    };
    let stack = match PolicyStack::load(&SiteEnv::from_process(), &[], &a.policies) {
        Ok(s) => Some(s),
        Err(StackError::Invalid(d)) => {
            problems.extend(d);
            None
        }
        Err(e) => return Err(super::site::unread(e)),
    };
    Ok(match (spec, stack) {
        (Some(spec), Some(stack)) if problems.is_empty() => {
            stack.merge(&spec).map(|env| (env, stack.policies))
        }
        _ => Err(problems),
    })
}

struct Out {
    text: String,
    explain: bool,
    /// Fields whose effect `--explain` has told (once per field, not per list item).
    told: std::collections::BTreeSet<&'static str>,
}

impl Out {
    fn row<T: Display>(&mut self, key: &str, v: &Sourced<T>) {
        self.line(key, &v.value, Some(&v.from));
    }

    fn line(&mut self, key: &str, v: &dyn Display, from: Option<&vsec::env::Origin>) {
        use std::fmt::Write as _;
        let _ = match (self.explain, from) {
            (true, Some(f)) => writeln!(self.text, "  {key:<26} {v}    <- {f}"),
            _ => writeln!(self.text, "  {key:<26} {v}"),
        };
        if let Some(e) = vsec::fields::effect_of(key).filter(|_| self.explain)
            && self.told.insert(e.key)
        {
            let _ = writeln!(self.text, "  {:<26} takes effect: {}", "", e.applied);
        }
    }

    fn list<T>(&mut self, key: &str, items: &[Sourced<T>], show: impl Fn(&T) -> String) {
        if self.explain {
            for (i, it) in items.iter().enumerate() {
                self.line(&format!("{key}[{i}]"), &show(&it.value), Some(&it.from));
            }
        } else if !items.is_empty() {
            let all: Vec<_> = items.iter().map(|i| show(&i.value)).collect();
            self.line(key, &all.join(", "), None);
        }
    }
}

fn render(env: &EffectiveEnv, policies: &[Policy], explain: bool) -> String {
    let mut o = Out {
        text: format!(
            "valid: environment `{}` ({})\n",
            env.name.value,
            env.env_hash()
        ),
        explain,
        told: Default::default(),
    };
    if let Some(d) = &env.description {
        o.line("description", d, None);
    }
    // Each policy by its name, in stacking order (site first): what the labels are for.
    for p in policies {
        let about = p
            .description
            .as_deref()
            .map_or(String::new(), |d| format!(": {d}"));
        o.line(
            "policy",
            &format!("{} ({}){about}", p.name.value.as_str(), p.file),
            None,
        );
    }
    let b = &env.base;
    o.row("base.distribution", &b.distribution);
    o.row("base.suite", &b.suite);
    o.row("base.architecture", &b.architecture);
    o.line(
        "base.components",
        &b.components
            .value
            .iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        Some(&b.components.from),
    );
    match &b.mirror {
        Some(m) => o.row("base.mirror", m),
        None => o.line("base.mirror", &"the host's apt sources", None),
    }
    if let Some(r) = b
        .requested_mirror
        .as_ref()
        .filter(|r| explain || Some(*r) != b.mirror.as_ref())
    {
        o.row("base.requested_mirror", r);
    }
    if let Some(a) = &b.allowed_mirrors {
        let list: Vec<String> = a.value.iter().map(|m| m.to_string()).collect();
        o.line("repositories.allowed", &list.join(", "), Some(&a.from));
    }
    if let Some(s) = &b.snapshot {
        o.row("base.snapshot", s);
    }
    o.line(
        "base.variant",
        &format!("{:?}", b.variant.value).to_lowercase(),
        Some(&b.variant.from),
    );
    o.row("base.install_recommends", &b.install_recommends);
    o.line(
        "base.keyrings",
        &b.keyrings
            .value
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        Some(&b.keyrings.from),
    );
    o.row("kernel", &env.kernel);
    o.list("packages", &env.packages, |r| r.to_string());
    o.list("required_packages", &env.required_packages, |r| {
        r.to_string()
    });
    o.list("forbidden", &env.forbidden, |p| p.to_string());
    o.list("files", &env.files, |f| {
        format!("{} ({} {}:{})", f.path, f.mode, f.owner, f.group)
    });
    o.list("groups", &env.groups, |g| format!("{} ({})", g.name, g.gid));
    o.list("users", &env.users, |u| format!("{} ({})", u.name, u.uid));
    o.list("environment", &env.environment, |e| {
        format!("{}={}", e.name, e.value)
    });
    o.list("post_install", &env.post_install, |c| c.clone());
    o.row("resources.vcpus", &env.resources.vcpus);
    o.row("resources.memory", &env.resources.memory);
    if let Some(l) = &env.limits.max_vcpus {
        o.row("limits.max_vcpus", l);
    }
    if let Some(l) = &env.limits.max_memory {
        o.row("limits.max_memory", l);
    }
    o.row("limits.vms_per_core", &env.limits.vms_per_core);
    if let Some(l) = &env.limits.cache_max_size {
        o.row("cache.max_size", l);
    }
    if let Some(l) = &env.limits.cache_max_age {
        o.row("cache.max_age", l);
    }
    if let Some(n) = &env.network {
        o.row("network.ip_range", &n.ip_range);
        o.row("network.hostname", &n.hostname);
    }
    let c = &env.checkpoint;
    o.line(
        "checkpoint.mode",
        &c.mode.value.as_str(),
        Some(&c.mode.from),
    );
    if let Some(i) = &c.interval {
        o.row("checkpoint.interval", i);
    }
    o.row("checkpoint.at_walltime_end", &c.at_walltime_end);
    if let Some(m) = &c.min_interval {
        o.row("checkpoint.min_interval", m);
    }
    if let Some(g) = &c.attach_grace {
        o.row("checkpoint.attach_grace", g);
        if explain {
            o.line(
                "checkpoint.attach_grace.enforced_by",
                &"vse launch's node agents: when the launch process dies they keep the job's VMs this long for `vse attach --job ID`, then stop them and exit (0: at once)",
                None,
            );
        }
    }
    if explain && (c.at_walltime_end.value || c.mode.value != CheckpointMode::Never) {
        o.line(
            "checkpoint.enforced_by",
            &"vse launch: every VM paused, then saved into --checkpoint-dir (default ./vse-checkpoints/<job>) before the walltime ends (Slurm's time left, PBS's walltime, or --walltime) and every interval (at least min_interval); also on SIGTERM and `vse checkpoint --job ID`",
            None,
        );
    }
    match &env.hypervisor.preferred {
        Some(h) => o.row("hypervisor.preferred", h),
        None => o.line("hypervisor.preferred", &"any allowed", None),
    }
    let allowed: Vec<_> = env
        .hypervisor
        .allowed
        .value
        .iter()
        .map(|h| h.as_str())
        .collect();
    o.line(
        "hypervisor.allowed",
        &allowed.join(", "),
        Some(&env.hypervisor.allowed.from),
    );
    let m = &env.migration;
    o.row("migration.active_memory", &m.active_memory_threshold);
    o.row("migration.outlier_sigma", &m.outlier_sigma);
    o.line(
        "migration.persistence",
        &format!("{} of {}", m.persistence_k.value, m.persistence_m.value),
        Some(&m.persistence_k.from),
    );
    o.row("migration.oversubscription", &m.oversubscription_threshold);
    o.row("migration.consolidation", &m.consolidation);
    o.row("migration.cooldown", &m.cooldown);
    o.row("migration.max_concurrent", &m.max_concurrent);
    o.row("migration.barrier_deadline", &m.barrier_deadline);
    o.line(
        "migration.barrier_action",
        &format!("{:?}", m.barrier_action.value).to_lowercase(),
        Some(&m.barrier_action.from),
    );
    o.row("images.allow_imported", &env.images.allow_imported);
    o.row(
        "images.require_dpkg_database",
        &env.images.require_dpkg_database,
    );
    o.row("images.boot_templates", &env.images.boot_templates);
    o.row("users.allow_root", &env.allow_root);
    o.list("shares", &env.shares, |s| {
        let guest = s.guest.as_ref().map_or(String::new(), |g| format!(":{g}"));
        format!("{}{guest}{}", s.host, if s.ro { ":ro" } else { "" })
    });
    let p = &env.share_policy;
    match &p.allowed {
        Some(a) => o.list("shares.allowed", &a.value, |e| {
            format!("{}{}", e.path, if e.ro { ":ro" } else { "" })
        }),
        None => o.line("shares.allowed", &"any directory you can read", None),
    }
    o.list("shares.forbidden", &p.forbidden, |f| f.to_string());
    match &p.default {
        Some(d) => o.list("shares.default", &d.value, |e| e.to_string()),
        None => o.line("shares.default", &"cwd", None),
    }
    for k in &env.images.signed_by {
        let keys: Vec<_> = k.value.iter().map(|p| p.to_string()).collect();
        o.line("images.signed_by", &keys.join(", "), Some(&k.from));
    }
    o.text
}
