//! What `vse launch` may do under a stack of policies: resource limits, VMs per core, the job
//! network's range, the migration daemon's settings and the allowed hypervisors. Computed by
//! the same stacking ([`crate::merge::stack`]) and the same functions as the effective
//! environment of `vse check`, so a stack that `vse check` refuses (a later policy widening an
//! earlier one, say) is refused by `vse launch` with the same diagnostics.

use crate::env::{Checkpoint, EffectiveEnv, Limits, Migration, Origin, Sourced};
use crate::merge;
use crate::policy::{MigrationRules, Policy};
use crate::units::{HostnamePattern, Hypervisor};
use crate::yaml::{Diagnostic, Diagnostics};
use std::net::Ipv4Addr;

/// The job network's address range (IPv4), and where it was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRange {
    pub base: Ipv4Addr,
    pub prefix: u8,
    pub from: Origin,
}

/// Everything a launch must obey.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchRules {
    pub limits: Limits,
    /// `None`: no policy gives a range (the launcher's default range applies).
    pub network: Option<JobRange>,
    pub hypervisors: Sourced<Vec<Hypervisor>>,
    /// The hypervisor to use when the command line names none (the spec's, or a policy's
    /// `defaults.hypervisor`).
    pub preferred: Option<Sourced<Hypervisor>>,
    /// Each VM's hostname (`network.hostname`); `None`: the launcher's own names.
    pub hostname: Option<Sourced<HostnamePattern>>,
    /// The migration daemon's settings, when a policy has a `migration` section (without one,
    /// no daemon runs).
    pub migration: Option<Migration>,
    /// When the job checkpoints (the spec's mode and interval, the policies' rules).
    pub checkpoint: Checkpoint,
    /// May VMs start from the nodes' boot templates (`images.boot_templates`)?
    pub boot_templates: Sourced<bool>,
    /// May the job's command run as the guest's root (`users.allow_root`)?
    pub allow_root: Sourced<bool>,
    /// Which host directories the job may share, and which it gets unasked (`shares.*`).
    pub shares: crate::shares::ShareRules,
}

/// A launch request the rules forbid.
#[derive(Debug, thiserror::Error)]
pub enum LaunchRuleError {
    #[error("--vcpus {asked}: the policy allows at most {} ({})", .max.value, .max.from)]
    Vcpus { asked: u32, max: Sourced<u32> },
    #[error("--memory {asked_mib}: the policy allows at most {max_mib} MiB ({from})")]
    Memory {
        asked_mib: u64,
        max_mib: u64,
        from: Origin,
    },
    #[error(
        "--hypervisor {asked}: not allowed by the policy ({}: hypervisors.allowed = [{}]); hint: pick an allowed one",
        .allowed.from, names(&.allowed.value)
    )]
    Hypervisor {
        asked: Hypervisor,
        allowed: Sourced<Vec<Hypervisor>>,
    },
    #[error(
        "the policy allows none of the hypervisors `vse launch` drives (qemu, libvirt) ({}: hypervisors.allowed = [{}])",
        .0.from, names(&.0.value)
    )]
    NoHypervisor(Sourced<Vec<Hypervisor>>),
    #[error(
        "{asked}: the job's command runs as its user in the guest; running it as the guest's root needs users.allow_root, which is false ({from}); hint: ask the site's admins to grant it, or leave out {asked}"
    )]
    GuestRoot { asked: &'static str, from: Origin },
}

impl vse_exit::Classify for LaunchRuleError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

fn names(hs: &[Hypervisor]) -> String {
    hs.iter().map(|h| h.as_str()).collect::<Vec<_>>().join(", ")
}

impl LaunchRules {
    /// The rules of a policy stack (earliest first), as `vse launch IMAGE --policy ...` gets
    /// it. Every problem of the stack is reported, as `vse check` reports it.
    pub fn from_policies(policies: &[Policy]) -> Result<LaunchRules, Diagnostics> {
        let (st, mut diags) = merge::stack(policies);
        let migration = (st.migration != MigrationRules::default()).then(|| merge::migration(&st));
        let net = merge::network(&st);
        let (network, bad) = job_range(net.as_ref().map(|n| n.ip_range.clone()));
        diags.extend(bad);
        let rules = LaunchRules {
            limits: merge::limits(&st),
            network,
            hypervisors: merge::allowed_hypervisors(&st),
            preferred: (st.defaults.hypervisor.as_ref())
                .map(|h| Sourced::policy(h.value, h.at.clone())),
            hostname: net.map(|n| n.hostname),
            migration,
            checkpoint: merge::checkpoint(None, &st),
            boot_templates: merge::image_policy(&st).boot_templates,
            allow_root: merge::allow_root(&st),
            shares: crate::shares::ShareRules::from_policy(&merge::share_policy(&st)),
        };
        diags.into_result(rules)
    }

    /// The rules an effective environment carries (`vse launch SPEC`): its merge already
    /// checked the stack.
    pub fn from_env(env: &EffectiveEnv) -> Result<LaunchRules, Diagnostics> {
        let m = &env.migration;
        let from_policy = [
            &m.active_memory_threshold.from,
            &m.outlier_sigma.from,
            &m.persistence_k.from,
            &m.oversubscription_threshold.from,
            &m.consolidation.from,
            &m.cooldown.from,
            &m.max_concurrent.from,
            &m.barrier_deadline.from,
            &m.barrier_action.from,
        ]
        .iter()
        .any(|o| matches!(o, Origin::Policy { .. }));
        let (network, bad) = job_range(env.network.as_ref().map(|n| n.ip_range.clone()));
        let rules = LaunchRules {
            limits: env.limits.clone(),
            network,
            hypervisors: env.hypervisor.allowed.clone(),
            preferred: env.hypervisor.preferred.clone(),
            hostname: env.network.as_ref().map(|n| n.hostname.clone()),
            migration: from_policy.then(|| m.clone()),
            checkpoint: env.checkpoint.clone(),
            boot_templates: env.images.boot_templates.clone(),
            allow_root: env.allow_root.clone(),
            shares: crate::shares::ShareRules::from_env(env),
        };
        bad.into_result(rules)
    }

    /// Refuses a request (`asked`: the option that made it) to run the job's command as the
    /// guest's root unless a site policy grants it.
    pub fn check_guest_root(&self, asked: &'static str) -> Result<(), LaunchRuleError> {
        if self.allow_root.value {
            return Ok(());
        }
        Err(LaunchRuleError::GuestRoot {
            asked,
            from: self.allow_root.from.clone(),
        })
    }

    /// Checks one VM's size against the limits.
    pub fn check_vm(&self, vcpus: u32, memory_mib: u64) -> Result<(), LaunchRuleError> {
        if let Some(max) = self.limits.max_vcpus.as_ref().filter(|m| vcpus > m.value) {
            return Err(LaunchRuleError::Vcpus {
                asked: vcpus,
                max: max.clone(),
            });
        }
        if let Some(max) = &self.limits.max_memory {
            let max_mib = max.value.bytes() >> 20;
            if memory_mib > max_mib {
                return Err(LaunchRuleError::Memory {
                    asked_mib: memory_mib,
                    max_mib,
                    from: max.from.clone(),
                });
            }
        }
        Ok(())
    }

    /// The hypervisor the nodes should use for `wanted` (`None`: let each node pick): an
    /// explicit choice (the command line's, else the preferred one) must be allowed; with no
    /// choice and only one of qemu and libvirt allowed, that one.
    pub fn hypervisor(
        &self,
        wanted: Option<Hypervisor>,
    ) -> Result<Option<Hypervisor>, LaunchRuleError> {
        let allowed = &self.hypervisors.value;
        match wanted.or(self.preferred.as_ref().map(|p| p.value)) {
            Some(h) if allowed.contains(&h) => Ok(Some(h)),
            Some(h) => Err(LaunchRuleError::Hypervisor {
                asked: h,
                allowed: self.hypervisors.clone(),
            }),
            None => {
                let drivable: Vec<Hypervisor> = [Hypervisor::Qemu, Hypervisor::Libvirt]
                    .into_iter()
                    .filter(|h| allowed.contains(h))
                    .collect();
                match drivable[..] {
                    [] => Err(LaunchRuleError::NoHypervisor(self.hypervisors.clone())),
                    [one] => Ok(Some(one)),
                    _ => Ok(None),
                }
            }
        }
    }

    /// VMs per core, at least 1.
    pub fn vms_per_core(&self) -> u32 {
        self.limits.vms_per_core.value.max(1)
    }
}

/// The IPv4 range of a policy's `network.ip_range`; the job network has no IPv6.
fn job_range(range: Option<Sourced<ipnet::IpNet>>) -> (Option<JobRange>, Diagnostics) {
    let mut d = Diagnostics::default();
    let Some(r) = range else {
        return (None, d);
    };
    match r.value {
        ipnet::IpNet::V4(v4) => (
            Some(JobRange {
                base: v4.network(),
                prefix: v4.prefix_len(),
                from: r.from,
            }),
            d,
        ),
        ipnet::IpNet::V6(_) => {
            if let Origin::Policy { at } | Origin::User { at } = &r.from {
                d.push(
                    Diagnostic::new(
                        at.clone(),
                        format!(
                            "network.ip_range {}: the job network of `vse launch` is IPv4",
                            r.value
                        ),
                    )
                    .hint("give an IPv4 range"),
                );
            }
            (None, d)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::Source;

    fn source(name: &str, text: &str) -> Source {
        Source::from_bytes(name, std::path::Path::new(name), text.as_bytes().to_vec())
    }

    fn policy(name: &str, text: &str) -> Policy {
        crate::policy::parse_source(&source(name, text)).expect("valid policy")
    }

    const SITE: &str = "version: 1
name: site
limits:
  max_vcpus: 8
  max_memory: 4GiB
  vms_per_core: 2
network:
  ip_range: 10.20.0.0/16
  hostname: vm-{rank}
hypervisors:
  allowed: [qemu, libvirt]
";

    const PART: &str = "version: 1
name: part
limits:
  max_vcpus: 4
  vms_per_core: 1
network:
  ip_range: 10.20.8.0/21
  hostname: vm-{rank}
hypervisors:
  allowed: [qemu]
migration:
  max_concurrent: 1
";

    fn narrowing() -> [Policy; 2] {
        [
            policy("site.policy.yaml", SITE),
            policy("part.policy.yaml", PART),
        ]
    }

    #[test]
    fn a_narrowing_stack_gives_the_last_values() {
        let r = LaunchRules::from_policies(&narrowing()).unwrap();
        assert_eq!(r.limits.max_vcpus.as_ref().unwrap().value, 4);
        assert_eq!(r.limits.max_memory.as_ref().unwrap().value.bytes(), 4 << 30);
        assert_eq!(r.vms_per_core(), 1);
        let n = r.network.as_ref().unwrap();
        assert_eq!((n.base, n.prefix), (Ipv4Addr::new(10, 20, 8, 0), 21));
        assert!(
            n.from.to_string().starts_with("policy part.policy.yaml:"),
            "{}",
            n.from
        );
        assert_eq!(r.hypervisor(None).unwrap(), Some(Hypervisor::Qemu));
        assert!(r.hypervisor(Some(Hypervisor::Libvirt)).is_err());
        assert_eq!(r.migration.as_ref().unwrap().max_concurrent.value, 1);
        let e = r.check_vm(5, 256).unwrap_err().to_string();
        assert!(
            e.starts_with("--vcpus 5: the policy allows at most 4 (policy part.policy.yaml:"),
            "{e}"
        );
        assert!(r.check_vm(4, 4096).is_ok());
        assert!(r.check_vm(4, 4097).is_err());
    }

    /// Guest root: off by default; only a site policy grants it, a later one may take it back,
    /// a user's policy can neither grant it nor widen it again.
    #[test]
    fn guest_root_is_granted_by_the_site_only() {
        let grant = "version: 1\nname: site\nusers:\n  allow_root: true\n";
        let deny = "version: 1\nname: part\nusers:\n  allow_root: false\n";
        let r = LaunchRules::from_policies(&[]).unwrap();
        let e = r.check_guest_root("--guest-root").unwrap_err().to_string();
        assert!(
            e.starts_with("--guest-root: the job's command runs as its user")
                && e.contains("users.allow_root, which is false (default)"),
            "{e}"
        );
        let site = || policy("site.policy.yaml", grant).site();
        let r = LaunchRules::from_policies(&[site()]).unwrap();
        assert!(r.check_guest_root("--guest-root").is_ok());
        assert!(r.allow_root.from.to_string().contains("site.policy.yaml:4"));
        let r = LaunchRules::from_policies(&[site(), policy("part.policy.yaml", deny)]).unwrap();
        let e = r.check_guest_root("--guest-root").unwrap_err().to_string();
        assert!(e.contains("(policy part.policy.yaml:4"), "{e}");
        // A user's policy granting it: refused, with where and why.
        let d = LaunchRules::from_policies(&[policy("mine.policy.yaml", grant)]).unwrap_err();
        let d = d.to_string();
        assert!(
            d.contains("mine.policy.yaml:4") && d.contains("only the site's policies grant it"),
            "{d}"
        );
        // Taken back by the site's partition, not widened again by a user's.
        let three = [
            site(),
            policy("part.policy.yaml", deny).site(),
            policy("mine.policy.yaml", grant),
        ];
        let d = LaunchRules::from_policies(&three).unwrap_err().to_string();
        assert!(
            d.contains("mine.policy.yaml:4") && d.contains("widens"),
            "{d}"
        );
    }

    #[test]
    fn a_spec_launch_gets_the_rules_an_image_launch_gets() {
        let spec = source(
            "s.vse.yaml",
            "version: 1\nname: s\nbase:\n  distribution: debian\n  suite: bookworm\n",
        );
        let spec = crate::spec::parse_source(&spec).expect("valid spec");
        let env = merge::merge(&spec, &narrowing()).unwrap();
        assert_eq!(
            LaunchRules::from_env(&env).unwrap(),
            LaunchRules::from_policies(&narrowing()).unwrap()
        );
        let env = merge::merge(&spec, &[policy("site.policy.yaml", SITE)]).unwrap();
        assert!(LaunchRules::from_env(&env).unwrap().migration.is_none());
    }

    #[test]
    fn a_widening_stack_is_refused_like_the_merge_refuses_it() {
        let wide = policy(
            "wide.policy.yaml",
            "version: 1
name: wide
limits:
  max_vcpus: 64
network:
  ip_range: 10.0.0.0/8
  hostname: w-{rank}
",
        );
        let stack = [policy("site.policy.yaml", SITE), wide];
        let d = LaunchRules::from_policies(&stack).unwrap_err();
        let (_, want) = merge::stack(&stack);
        assert_eq!(d, want.sorted());
        assert_eq!(d.len(), 3, "{d}");
        assert!(
            d.to_string()
                .contains("wide.policy.yaml:4:14: limits.max_vcpus = 64 widens"),
            "{d}"
        );
        assert!(
            d.to_string()
                .contains("wide.policy.yaml:7:13: network.hostname = w-{rank} may not change"),
            "{d}"
        );
    }

    #[test]
    fn no_policy_allows_everything_and_runs_no_daemon() {
        let r = LaunchRules::from_policies(&[]).unwrap();
        assert!(r.limits.max_vcpus.is_none() && r.network.is_none() && r.migration.is_none());
        assert_eq!(r.vms_per_core(), 1);
        assert_eq!(r.hypervisor(None).unwrap(), None);
    }

    #[test]
    fn an_ipv6_job_range_is_refused_at_its_line() {
        let p = policy(
            "v6.policy.yaml",
            "version: 1\nname: v6\nnetwork:\n  ip_range: fd00::/64\n  hostname: v-{rank}\n",
        );
        let d = LaunchRules::from_policies(&[p]).unwrap_err().to_string();
        assert!(
            d.starts_with("v6.policy.yaml:4:13: network.ip_range fd00::/64"),
            "{d}"
        );
    }
}
