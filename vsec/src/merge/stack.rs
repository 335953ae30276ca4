//! Stacking policies (site, then partition...): each later policy may only narrow what the
//! earlier ones allow. The result is one view where every rule keeps the position of the
//! policy line that set it.

use crate::policy::{IdRange, Layer, MergeRule, NetworkRule, Policy, PolicyRules, rule};
use crate::units::AbsPath;
use crate::yaml::{Diagnostic, Diagnostics, Loc};
use std::cmp::Ordering;

/// The combined rules of a policy stack: the same shape as one policy's rules.
pub type Stack = PolicyRules;

/// Stacks policies by the rules of [`MERGE_RULES`]: every field names its row, and the
/// row decides what a later policy may do to it.
struct Stacker {
    d: Diagnostics,
    /// The layer of the policy being stacked.
    layer: Layer,
    /// The last site policy stacked so far, by its `name:` (a user's policy is refused a
    /// trust root the site left unset, naming it).
    site: Option<crate::yaml::SrcPos>,
    /// Keys stacked (a test checks every row of the table is).
    #[cfg(test)]
    visited: Vec<&'static str>,
}

impl Stacker {
    fn rule(&mut self, key: &'static str) -> MergeRule {
        #[cfg(test)]
        self.visited.push(key);
        rule(key)
    }

    /// A value with an order under its row's rule: Min, Max, Fixed, TrustRoot or Default.
    fn scalar<T: Clone + PartialOrd>(
        &mut self,
        key: &'static str,
        cur: &mut Option<Loc<T>>,
        new: &Option<Loc<T>>,
        show: impl Fn(&T) -> String,
    ) {
        self.set(key, cur, new, show, Some(T::partial_cmp));
    }

    /// A permission off by default (Grant): a user's policy may not be the first to turn it on.
    fn grant(&mut self, key: &'static str, cur: &mut Option<Loc<bool>>, new: &Option<Loc<bool>>) {
        if let Some(n) = new.as_ref().filter(|n| n.value)
            && cur.is_none()
            && self.layer == Layer::User
        {
            self.rule(key);
            self.d.push(
                Diagnostic::new(
                    n.at.clone(),
                    format!("{key} = true: only the site's policies grant it"),
                )
                .hint(format!(
                    "remove {key} from this policy, or ask the site's admins to grant it"
                )),
            );
            return;
        }
        self.scalar(key, cur, new, disp);
    }

    /// A value without an order: Fixed, TrustRoot or Default.
    fn fixed<T: Clone + PartialEq>(
        &mut self,
        key: &'static str,
        cur: &mut Option<Loc<T>>,
        new: &Option<Loc<T>>,
        show: impl Fn(&T) -> String,
    ) {
        self.set(key, cur, new, show, None);
    }

    fn set<T: Clone + PartialEq>(
        &mut self,
        key: &'static str,
        cur: &mut Option<Loc<T>>,
        new: &Option<Loc<T>>,
        show: impl Fn(&T) -> String,
        order: Option<fn(&T, &T) -> Option<Ordering>>,
    ) {
        let r = self.rule(key);
        let Some(n) = new else { return };
        let Some(c) = cur.as_ref() else {
            if r == MergeRule::TrustRoot
                && self.layer == Layer::User
                && let Some(site) = &self.site
            {
                self.d.push(
                    Diagnostic::new(
                        n.at.clone(),
                        format!(
                            "{key} = {}: a user's policy may not choose what the site trusts",
                            show(&n.value)
                        ),
                    )
                    .note(
                        "site policy",
                        site,
                        format!("leaves {key} to the built-in default"),
                    )
                    .hint(format!(
                        "remove {key} from this policy; only the site's policies set it"
                    )),
                );
                return;
            }
            *cur = Some(n.clone());
            return;
        };
        let cmp = |o: fn(&T, &T) -> Option<Ordering>| o(&n.value, &c.value);
        let ok = match (r, order) {
            (MergeRule::Min | MergeRule::Grant, Some(o)) => {
                matches!(cmp(o), Some(Ordering::Less | Ordering::Equal))
            }
            (MergeRule::Max, Some(o)) => {
                matches!(cmp(o), Some(Ordering::Greater | Ordering::Equal))
            }
            (MergeRule::Fixed | MergeRule::TrustRoot, _) => n.value == c.value,
            (MergeRule::Default, _) => true,
            (other, _) => unreachable!("{key}: {other:?} is not a rule for this value"),
        };
        if ok {
            *cur = Some(n.clone());
            return;
        }
        let (what, hint) = match r {
            MergeRule::Min | MergeRule::Grant if is_bool::<T>() => {
                ("widens", "keep it `false`".to_string())
            }
            MergeRule::Max if is_bool::<T>() => ("widens", "keep it `true`".to_string()),
            MergeRule::Min => ("widens", format!("set at most {}", show(&c.value))),
            MergeRule::Max => ("widens", format!("set at least {}", show(&c.value))),
            _ => (
                "may not change",
                format!("restate {} or leave {key} out", show(&c.value)),
            ),
        };
        let d = changed(
            key,
            what,
            &show(&n.value),
            &n.at,
            &show(&c.value),
            &c.at,
            hint,
        );
        self.d.push(d);
    }
}

fn is_bool<T>() -> bool {
    std::any::type_name::<T>() == "bool"
}

fn disp<T: std::fmt::Display>(v: &T) -> String {
    v.to_string()
}

fn changed(
    key: &str,
    what: &str,
    new: &str,
    at: &crate::yaml::SrcPos,
    old: &str,
    old_at: &crate::yaml::SrcPos,
    hint: String,
) -> Diagnostic {
    let message = match what {
        "widens" => format!("{key} = {new} widens the limit of an earlier policy"),
        _ => format!("{key} = {new} may not change what an earlier policy set"),
    };
    Diagnostic::new(at.clone(), message)
        .note("earlier policy", old_at, format!("{key} = {old}"))
        .hint(format!(
            "a later policy may only narrow the ones before it: {hint}"
        ))
}

fn widens<T: std::fmt::Display>(key: &str, new: &Loc<T>, old: &Loc<T>, hint: String) -> Diagnostic {
    changed(
        key,
        "widens",
        &new.value.to_string(),
        &new.at,
        &old.value.to_string(),
        &old.at,
        hint,
    )
}

fn paths(v: &[AbsPath]) -> String {
    format!("[{}]", join(v.iter()))
}

pub fn stack(policies: &[Policy]) -> (Stack, Diagnostics) {
    let (s, st) = stack_all(policies);
    (s, st.d)
}

fn stack_all(policies: &[Policy]) -> (Stack, Stacker) {
    let mut s = Stack::default();
    let mut st = Stacker {
        d: Diagnostics::default(),
        layer: Layer::Site,
        site: None,
        #[cfg(test)]
        visited: vec![],
    };
    for p in policies {
        st.layer = p.layer;
        st.scalar("limits.max_vcpus", &mut s.max_vcpus, &p.max_vcpus, disp);
        st.scalar("limits.max_memory", &mut s.max_memory, &p.max_memory, disp);
        st.scalar(
            "limits.vms_per_core",
            &mut s.vms_per_core,
            &p.vms_per_core,
            disp,
        );
        within(&mut st, "users.uid_range", &mut s.uid_range, &p.uid_range);
        within(&mut st, "users.gid_range", &mut s.gid_range, &p.gid_range);
        st.grant("users.allow_root", &mut s.allow_root, &p.allow_root);
        st.scalar(
            "checkpoint.at_walltime_end",
            &mut s.checkpoint_at_walltime_end,
            &p.checkpoint_at_walltime_end,
            disp,
        );
        st.scalar(
            "checkpoint.min_interval",
            &mut s.checkpoint_min_interval,
            &p.checkpoint_min_interval,
            disp,
        );
        st.scalar(
            "checkpoint.attach_grace",
            &mut s.checkpoint_attach_grace,
            &p.checkpoint_attach_grace,
            disp,
        );
        st.scalar(
            "cache.max_size",
            &mut s.cache_max_size,
            &p.cache_max_size,
            disp,
        );
        st.scalar(
            "cache.max_age",
            &mut s.cache_max_age,
            &p.cache_max_age,
            disp,
        );
        let (si, pi) = (&mut s.images, &p.images);
        st.scalar(
            "images.allow_imported",
            &mut si.allow_imported,
            &pi.allow_imported,
            disp,
        );
        st.scalar(
            "images.require_dpkg_database",
            &mut si.require_dpkg_database,
            &pi.require_dpkg_database,
            disp,
        );
        st.scalar(
            "images.boot_templates",
            &mut si.boot_templates,
            &pi.boot_templates,
            disp,
        );
        union(
            &mut st,
            "images.signed_by",
            &mut si.signed_by,
            &pi.signed_by,
        );
        stack_network(&mut st, &mut s.network, &p.network);
        for (key, r) in [
            ("shares.allowed", MergeRule::SubsetOf),
            ("shares.forbidden", MergeRule::Union),
            ("shares.default", MergeRule::Default),
        ] {
            let got = st.rule(key);
            debug_assert_eq!(got, r);
        }
        super::shares::stack(&mut st.d, &mut s.shares, &p.shares);
        stack_lists(&mut st, &mut s, p);
        st.fixed("repositories.mirror", &mut s.mirror, &p.mirror, disp);
        st.fixed("repositories.keyrings", &mut s.keyrings, &p.keyrings, |k| {
            paths(k)
        });
        st.fixed("audit.file", &mut s.audit_file, &p.audit_file, disp);
        st.fixed(
            "authority.admin_group",
            &mut s.admin_group,
            &p.admin_group,
            disp,
        );
        union(
            &mut st,
            "packages.required",
            &mut s.required_packages,
            &p.required_packages,
        );
        union(
            &mut st,
            "packages.forbidden",
            &mut s.forbidden_packages,
            &p.forbidden_packages,
        );
        union(
            &mut st,
            "files.protected",
            &mut s.protected_paths,
            &p.protected_paths,
        );
        st.rule("files.required");
        for f in &p.required_files {
            match s
                .required_files
                .iter()
                .find(|e| e.value.path == f.value.path)
            {
                Some(prev) => st.d.push(
                    Diagnostic::new(
                        f.at.clone(),
                        format!(
                            "required file {} is already required by an earlier policy",
                            f.value.path
                        ),
                    )
                    .note("earlier policy", &prev.at, "required here")
                    .hint("a later policy cannot replace a required file; remove one of them"),
                ),
                None => s.required_files.push(f.clone()),
            }
        }
        let (sd, pd) = (&mut s.defaults, &p.defaults);
        st.scalar("defaults.vcpus", &mut sd.vcpus, &pd.vcpus, disp);
        st.scalar("defaults.memory", &mut sd.memory, &pd.memory, disp);
        let lower = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
        st.fixed("defaults.variant", &mut sd.variant, &pd.variant, |v| {
            lower(v)
        });
        st.scalar(
            "defaults.hypervisor",
            &mut sd.hypervisor,
            &pd.hypervisor,
            disp,
        );
        st.fixed(
            "defaults.checkpoint",
            &mut sd.checkpoint,
            &pd.checkpoint,
            |c| c.as_str().to_string(),
        );
        let (sm, pm) = (&mut s.migration, &p.migration);
        st.scalar(
            "migration.active_memory_threshold",
            &mut sm.active_memory_threshold,
            &pm.active_memory_threshold,
            disp,
        );
        st.scalar(
            "migration.outlier_sigma",
            &mut sm.outlier_sigma,
            &pm.outlier_sigma,
            disp,
        );
        st.scalar(
            "migration.persistence",
            &mut sm.persistence,
            &pm.persistence,
            |p| format!("{} of {}", p.0, p.1),
        );
        st.scalar(
            "migration.oversubscription_threshold",
            &mut sm.oversubscription_threshold,
            &pm.oversubscription_threshold,
            disp,
        );
        st.scalar(
            "migration.consolidation",
            &mut sm.consolidation,
            &pm.consolidation,
            disp,
        );
        st.scalar("migration.cooldown", &mut sm.cooldown, &pm.cooldown, disp);
        st.scalar(
            "migration.max_concurrent",
            &mut sm.max_concurrent,
            &pm.max_concurrent,
            disp,
        );
        st.scalar(
            "migration.barrier.deadline",
            &mut sm.barrier_deadline,
            &pm.barrier_deadline,
            disp,
        );
        st.fixed(
            "migration.barrier.action",
            &mut sm.barrier_action,
            &pm.barrier_action,
            |a| lower(a),
        );
        if p.layer == Layer::Site {
            st.site = Some(p.name.at.clone());
        }
    }
    self_consistency(&mut st.d, &s);
    super::shares::self_consistency(&mut st.d, &s.shares);
    (s, st)
}

/// A range under [`MergeRule::Within`].
fn within(
    st: &mut Stacker,
    key: &'static str,
    cur: &mut Option<Loc<IdRange>>,
    new: &Option<Loc<IdRange>>,
) {
    let r = st.rule(key);
    debug_assert_eq!(r, MergeRule::Within);
    let Some(n) = new else { return };
    if let Some(c) = cur.as_ref()
        && !n.value.within(c.value)
    {
        st.d.push(widens(key, n, c, format!("stay within {}", c.value)));
        return;
    }
    *cur = Some(n.clone());
}

/// Entries under [`MergeRule::Union`]: every policy's hold.
fn union<T: Clone>(st: &mut Stacker, key: &'static str, cur: &mut Vec<T>, new: &[T]) {
    let r = st.rule(key);
    debug_assert_eq!(r, MergeRule::Union);
    cur.extend(new.iter().cloned());
}

/// The job network: its range under [`MergeRule::Within`], its hostnames [`MergeRule::Fixed`].
fn stack_network(st: &mut Stacker, cur: &mut Option<NetworkRule>, new: &Option<NetworkRule>) {
    let r = st.rule("network.ip_range");
    debug_assert_eq!(r, MergeRule::Within);
    let Some(n) = new else {
        st.rule("network.hostname");
        return;
    };
    let Some(c) = cur.as_mut() else {
        st.rule("network.hostname");
        *cur = Some(n.clone());
        return;
    };
    if !c.ip_range.value.contains(&n.ip_range.value) {
        st.d.push(widens(
            "network.ip_range",
            &n.ip_range,
            &c.ip_range,
            format!("use a range inside {}", c.ip_range.value),
        ));
    } else {
        c.ip_range = n.ip_range.clone();
    }
    let mut host = Some(c.hostname.clone());
    st.fixed(
        "network.hostname",
        &mut host,
        &Some(n.hostname.clone()),
        disp,
    );
    c.hostname = host.expect("set before");
}

fn stack_lists(st: &mut Stacker, s: &mut Stack, p: &Policy) {
    for key in [
        "hypervisors.allowed",
        "repositories.allowed",
        "distributions.name",
        "distributions.suites",
        "distributions.architectures",
        "distributions.components",
    ] {
        let r = st.rule(key);
        debug_assert_eq!(r, MergeRule::SubsetOf);
    }
    let d = &mut st.d;
    if let Some(new) = &p.hypervisors {
        if let Some(cur) = &s.hypervisors {
            for h in &new.value {
                if !cur.value.iter().any(|c| c.value == h.value) {
                    d.push(
                        Diagnostic::new(
                            h.at.clone(),
                            format!(
                                "hypervisors.allowed: `{}` is not allowed by an earlier policy",
                                h.value
                            ),
                        )
                        .note(
                            "earlier policy",
                            &cur.at,
                            format!(
                                "hypervisors.allowed = [{}]",
                                join(cur.value.iter().map(|c| c.value))
                            ),
                        )
                        .hint("a later policy may only narrow the ones before it"),
                    );
                }
            }
        }
        s.hypervisors = Some(new.clone());
    }
    if let Some(new) = &p.allowed_mirrors {
        if let Some(cur) = &s.allowed_mirrors {
            for m in &new.value {
                if !cur.value.iter().any(|c| m.value.is_within(&c.value)) {
                    d.push(
                        Diagnostic::new(
                            m.at.clone(),
                            format!(
                                "repositories.allowed: `{}` is not allowed by an earlier policy",
                                m.value
                            ),
                        )
                        .note(
                            "earlier policy",
                            &cur.at,
                            format!(
                                "repositories.allowed = [{}]",
                                join(cur.value.iter().map(|c| &c.value))
                            ),
                        )
                        .hint("a later policy may only narrow the ones before it"),
                    );
                }
            }
        }
        s.allowed_mirrors = Some(new.clone());
    }
    if let Some(new) = &p.distributions {
        let mut new = new.clone();
        if let Some(cur) = &s.distributions {
            for rule in &mut new.value {
                let old = cur.value.iter().find(|o| o.name.value == rule.name.value);
                let bad = |at: &crate::yaml::SrcPos, what: String| {
                    Diagnostic::new(
                        at.clone(),
                        format!("distributions: {what} is not allowed by an earlier policy"),
                    )
                    .note("earlier policy", &cur.at, "distributions allowed here")
                    .hint("a later policy may only narrow the ones before it")
                };
                let Some(old) = old else {
                    d.push(bad(&rule.name.at, format!("`{}`", rule.name.value)));
                    continue;
                };
                for su in &rule.suites {
                    if !old.suites.iter().any(|o| o.value == su.value) {
                        d.push(bad(&su.at, format!("suite `{}`", su.value)));
                    }
                }
                sub_list(
                    d,
                    &rule.architectures,
                    &old.architectures,
                    "architecture",
                    &bad,
                );
                sub_list(d, &rule.components, &old.components, "component", &bad);
                // What the later rule leaves open stays as narrow as the earlier rule.
                if rule.architectures.is_none() {
                    rule.architectures.clone_from(&old.architectures);
                }
                if rule.components.is_none() {
                    rule.components.clone_from(&old.components);
                }
            }
        }
        s.distributions = Some(new);
    }
}

fn sub_list<T: PartialEq + std::fmt::Display>(
    d: &mut Diagnostics,
    new: &Option<Vec<Loc<T>>>,
    old: &Option<Vec<Loc<T>>>,
    what: &str,
    bad: &impl Fn(&crate::yaml::SrcPos, String) -> Diagnostic,
) {
    if let (Some(new), Some(old)) = (new, old) {
        for n in new {
            if !old.iter().any(|o| o.value == n.value) {
                d.push(bad(&n.at, format!("{what} `{}`", n.value)));
            }
        }
    }
}

pub(crate) fn join<T: std::fmt::Display>(it: impl Iterator<Item = T>) -> String {
    it.map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// A policy's defaults must obey the stack's own limits; required packages must not be
/// forbidden.
fn self_consistency(d: &mut Diagnostics, s: &Stack) {
    let exceeds = |key: &str,
                   val: &dyn std::fmt::Display,
                   at: &crate::yaml::SrcPos,
                   lkey: &str,
                   lim: &dyn std::fmt::Display,
                   lat: &crate::yaml::SrcPos| {
        Diagnostic::new(
            at.clone(),
            format!("{key} = {val} exceeds the policy limit"),
        )
        .note("policy", lat, format!("{lkey} = {lim}"))
        .hint("a policy default must be allowed by the limits of the whole stack")
    };
    if let (Some(v), Some(l)) = (&s.defaults.vcpus, &s.max_vcpus)
        && v.value > l.value
    {
        d.push(exceeds(
            "defaults.vcpus",
            &v.value,
            &v.at,
            "limits.max_vcpus",
            &l.value,
            &l.at,
        ));
    }
    if let (Some(v), Some(l)) = (&s.defaults.memory, &s.max_memory)
        && v.value > l.value
    {
        d.push(exceeds(
            "defaults.memory",
            &v.value,
            &v.at,
            "limits.max_memory",
            &l.value,
            &l.at,
        ));
    }
    if let (Some(h), Some(allowed)) = (&s.defaults.hypervisor, &s.hypervisors)
        && !allowed.value.iter().any(|a| a.value == h.value)
    {
        d.push(
            Diagnostic::new(
                h.at.clone(),
                format!(
                    "defaults.hypervisor = {} is not an allowed hypervisor",
                    h.value
                ),
            )
            .note(
                "policy",
                &allowed.at,
                format!(
                    "hypervisors.allowed = [{}]",
                    join(allowed.value.iter().map(|a| a.value))
                ),
            )
            .hint("pick a default from the allowed list"),
        );
    }
    for r in &s.required_packages {
        for f in &s.forbidden_packages {
            if f.value.constraint.is_none() && f.value.matches_name(&r.value.name) {
                d.push(
                    Diagnostic::new(
                        r.at.clone(),
                        format!("required package `{}` is forbidden", r.value.name),
                    )
                    .note(
                        "policy",
                        &f.at,
                        format!("packages.forbidden: `{}`", f.value),
                    )
                    .hint("a package cannot be both required and forbidden; remove one rule"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{MERGE_RULES, parse_source};
    use crate::yaml::Source;

    fn pol(name: &str, text: &str) -> Policy {
        parse_source(&Source::from_bytes(
            name,
            std::path::Path::new(name),
            text.as_bytes().to_vec(),
        ))
        .unwrap_or_else(|d| panic!("{name}: {d}"))
    }

    /// Every field of the format set, so that stacking it twice visits every row.
    const FULL: &str = "version: 1
name: full
description: every field
distributions:
  - name: debian
    suites: [bookworm]
    architectures: [amd64]
    components: [main]
repositories:
  allowed: [http://deb.example.org/debian]
  mirror: http://deb.example.org/debian
  keyrings: [/usr/share/keyrings/site.gpg]
packages:
  required: [libnuma1]
  forbidden: [telnetd]
limits: {max_vcpus: 8, max_memory: 8GiB, vms_per_core: 1}
defaults: {vcpus: 1, memory: 1GiB, variant: minbase, hypervisor: qemu, checkpoint: never}
files:
  required:
    - {path: /etc/site.conf, content: \"x\\n\"}
  protected: [/etc/munge]
users:
  uid_range: {min: 20000, max: 30000}
  gid_range: {min: 20000, max: 30000}
network: {ip_range: 10.20.0.0/16, hostname: \"vm-{job}-{rank}\"}
checkpoint: {at_walltime_end: true, min_interval: 1m, attach_grace: 1m}
hypervisors: {allowed: [qemu]}
migration:
  active_memory_threshold: 0.5
  outlier_sigma: 2.0
  persistence: {k: 3, m: 5}
  oversubscription_threshold: 0.5
  consolidation: false
  cooldown: 5m
  max_concurrent: 1
  barrier: {deadline: 30s, action: migrate}
images:
  allow_imported: false
  require_dpkg_database: true
  signed_by: [/etc/vse/build.asc]
  boot_templates: false
shares:
  allowed: [{path: /home}, {path: /scratch, mode: ro}]
  default: [cwd, home, /scratch]
  forbidden: [/home/secret]
audit:
  file: /var/log/vse/audit.jsonl
";

    #[test]
    fn stacking_follows_every_row_of_the_table() {
        let full = pol("full.policy.yaml", FULL);
        let mut again = full.clone();
        again.rules.required_files.clear();
        let (_, st) = stack_all(&[full, again]);
        assert!(st.d.is_empty(), "restating every field is fine: {}", st.d);
        let missed: Vec<_> = (MERGE_RULES.iter())
            .filter(|(k, r)| *r != MergeRule::Own && !st.visited.contains(k))
            .collect();
        assert!(missed.is_empty(), "rows stack() never applies: {missed:?}");
    }

    const SITE: &str = "version: 1
name: site
repositories:
  mirror: http://deb.example.org/debian
  keyrings: [/usr/share/keyrings/site.gpg]
network: {ip_range: 10.20.0.0/16, hostname: \"vm-{job}-{rank}\"}
audit:
  file: /var/log/vse/audit.jsonl
";

    fn refused(site: Policy, user: &str, want: &[&str]) {
        let user = pol("user.policy.yaml", user);
        let (_, d) = stack(&[site, user]);
        let text = d.to_string();
        for w in want {
            assert!(text.contains(w), "want `{w}` in\n{text}");
        }
        assert!(text.contains("hint: "), "every refusal has a hint:\n{text}");
    }

    #[test]
    fn a_later_policy_cannot_replace_a_trust_root() {
        let site = || pol("site.policy.yaml", SITE).site();
        refused(
            site(),
            "version: 1\nname: u\nrepositories:\n  keyrings: [/home/u/mine.gpg]\n",
            &[
                "user.policy.yaml:4:13: repositories.keyrings = [/home/u/mine.gpg] may not change what an earlier policy set",
                "earlier policy site.policy.yaml:5:13: repositories.keyrings = [/usr/share/keyrings/site.gpg]",
            ],
        );
        refused(
            site(),
            "version: 1\nname: u\nrepositories:\n  mirror: http://evil.example.org/debian\n",
            &[
                "user.policy.yaml:4:11: repositories.mirror = http://evil.example.org/debian may not change",
                "earlier policy site.policy.yaml:4:11:",
            ],
        );
        refused(
            site(),
            "version: 1\nname: u\nnetwork: {ip_range: 10.20.1.0/24, hostname: \"login{rank}\"}\n",
            &[
                "user.policy.yaml:3:45: network.hostname = login{rank} may not change",
                "earlier policy site.policy.yaml:6:",
            ],
        );
        refused(
            site(),
            "version: 1\nname: u\naudit:\n  file: /home/u/audit.jsonl\n",
            &[
                "user.policy.yaml:4:9: audit.file = /home/u/audit.jsonl may not change what an earlier policy set",
                "earlier policy site.policy.yaml:8:9: audit.file = /var/log/vse/audit.jsonl",
            ],
        );
        // Nor may a later site policy (a partition's) move the site's audit file.
        let part = pol(
            "part.policy.yaml",
            "version: 1\nname: p\naudit:\n  file: /var/log/vse/gpu.jsonl\n",
        )
        .site();
        let text = stack(&[site(), part]).1.to_string();
        assert!(
            text.contains(
                "part.policy.yaml:4:9: audit.file = /var/log/vse/gpu.jsonl may not change"
            ) && text.contains("hint: "),
            "{text}"
        );
        // Restating the site's values is no change.
        let same = pol(
            "user.policy.yaml",
            "version: 1\nname: u\nrepositories:\n  keyrings: [/usr/share/keyrings/site.gpg]\n",
        );
        assert!(stack(&[site(), same]).1.is_empty());
        let same = pol(
            "user.policy.yaml",
            "version: 1\nname: u\naudit:\n  file: /var/log/vse/audit.jsonl\n",
        );
        let (s, d) = stack(&[site(), same]);
        assert!(d.is_empty(), "{d}");
        let file = crate::merge::audit_file(&s).map(|f| f.to_string());
        assert_eq!(file.as_deref(), Some("/var/log/vse/audit.jsonl"));
    }

    #[test]
    fn a_user_policy_cannot_set_a_trust_root_the_site_left_unset() {
        let site = pol("site.policy.yaml", "version: 1\nname: site\n").site();
        refused(
            site.clone(),
            "version: 1\nname: u\nrepositories:\n  keyrings: [/home/u/mine.gpg]\n",
            &[
                "user.policy.yaml:4:13: repositories.keyrings = [/home/u/mine.gpg]: a user's policy may not choose what the site trusts",
                "site policy site.policy.yaml:2:7: leaves repositories.keyrings to the built-in default",
            ],
        );
        // The site's own later file may (a partition's, say), and so may a user with no site.
        let part = pol(
            "part.policy.yaml",
            "version: 1\nname: p\nrepositories:\n  keyrings: [/etc/vse/part.gpg]\n",
        );
        assert!(stack(&[site.clone(), part.clone().site()]).1.is_empty());
        assert!(stack(&[part]).1.is_empty());
    }

    #[test]
    fn a_user_policy_cannot_choose_the_audit_file_the_site_left_unset() {
        let site = pol("site.policy.yaml", "version: 1\nname: site\n").site();
        let user = "version: 1\nname: u\naudit:\n  file: /home/u/audit.jsonl\n";
        refused(
            site.clone(),
            user,
            &[
                "user.policy.yaml:4:9: audit.file = /home/u/audit.jsonl: a user's policy may not choose what the site trusts",
                "site policy site.policy.yaml:2:7: leaves audit.file to the built-in default",
                "hint: remove audit.file from this policy; only the site's policies set it",
            ],
        );
        let (s, _) = stack(&[site.clone(), pol("user.policy.yaml", user)]);
        assert_eq!(
            crate::merge::audit_file(&s),
            None,
            "the refused value is not kept"
        );
        // The site's own later file may set it (a partition's, say).
        let part = pol(
            "part.policy.yaml",
            "version: 1\nname: p\naudit:\n  file: /var/log/vse/gpu.jsonl\n",
        )
        .site();
        let (s, d) = stack(&[site, part]);
        assert!(d.is_empty(), "{d}");
        let file = crate::merge::audit_file(&s).map(|f| f.to_string());
        assert_eq!(file.as_deref(), Some("/var/log/vse/gpu.jsonl"));
    }

    #[test]
    fn a_later_policy_may_only_tighten_the_cache_bounds() {
        let site = "version: 1\nname: site\ncache:\n  max_size: 10GiB\n  max_age: 7d\n";
        let site = pol("site.policy.yaml", site).site();
        refused(
            site.clone(),
            "version: 1\nname: u\ncache:\n  max_size: 20GiB\n",
            &["user.policy.yaml:4:13: cache.max_size", "widens"],
        );
        let user = "version: 1\nname: u\ncache:\n  max_size: 5GiB\n  max_age: 1d\n";
        let (s, d) = stack(&[site, pol("user.policy.yaml", user)]);
        assert!(d.is_empty(), "{d}");
        let limits = crate::merge::limits(&s).cache();
        assert_eq!(limits.max_bytes, Some(5 << 30));
        assert_eq!(limits.max_age_s, Some(86_400));
    }

    #[test]
    fn only_the_site_names_the_admin_group() {
        let site = pol("site.policy.yaml", "version: 1\nname: site\n").site();
        let user = "version: 1\nname: u\nauthority:\n  admin_group: friends\n";
        refused(
            site.clone(),
            user,
            &[
                "user.policy.yaml:4:16: authority.admin_group = friends: a user's policy may not choose what the site trusts",
            ],
        );
        let (s, _) = stack(&[site, pol("user.policy.yaml", user)]);
        assert!(crate::merge::admin_group(&s).is_none());
        let site = "version: 1\nname: site\nauthority:\n  admin_group: hpc-admins\n";
        let (s, d) = stack(&[pol("site.policy.yaml", site).site()]);
        assert!(d.is_empty(), "{d}");
        let g = crate::merge::admin_group(&s).expect("kept");
        assert_eq!(
            (g.value.to_string(), g.at.to_string()),
            ("hpc-admins".into(), "site.policy.yaml:4:16".into())
        );
    }

    #[test]
    fn a_later_distribution_rule_stays_as_narrow_as_the_earlier() {
        let site = pol(
            "site.policy.yaml",
            "version: 1\nname: s\ndistributions:\n  - {name: debian, suites: [bookworm], architectures: [amd64]}\n",
        );
        let user = pol(
            "user.policy.yaml",
            "version: 1\nname: u\ndistributions:\n  - {name: debian, suites: [bookworm]}\n",
        );
        let (s, d) = stack(&[site, user]);
        assert!(d.is_empty(), "{d}");
        let rule = &s.distributions.unwrap().value[0];
        let archs: Vec<_> = rule
            .architectures
            .iter()
            .flatten()
            .map(|a| a.value.to_string())
            .collect();
        assert_eq!(archs, ["amd64"]);
    }

    #[test]
    fn tuning_set_earlier_is_fixed_and_limits_only_narrow() {
        let site = pol(
            "site.policy.yaml",
            "version: 1\nname: s\nmigration: {outlier_sigma: 2.0, cooldown: 5m, max_concurrent: 2}\nimages: {boot_templates: false}\n",
        );
        refused(
            site.clone(),
            "version: 1\nname: u\nmigration: {outlier_sigma: 9.0}\n",
            &["migration.outlier_sigma = 9 may not change"],
        );
        refused(
            site.clone(),
            "version: 1\nname: u\nmigration: {cooldown: 1s}\n",
            &["migration.cooldown = 1s widens", "set at least 5m"],
        );
        refused(
            site,
            "version: 1\nname: u\nimages: {boot_templates: true}\n",
            &["images.boot_templates = true widens", "keep it `false`"],
        );
    }
}
