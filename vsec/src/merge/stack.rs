//! Stacking policies (site, then partition...): each later policy may only narrow what the
//! earlier ones allow. The result is one view where every rule keeps the position of the
//! policy line that set it.

use crate::policy::{NetworkRule, Policy, PolicyRules};
use crate::yaml::{Diagnostic, Diagnostics, Loc};

/// The combined rules of a policy stack: the same shape as one policy's rules.
pub type Stack = PolicyRules;

fn widens<T: std::fmt::Display>(key: &str, new: &Loc<T>, old: &Loc<T>, hint: String) -> Diagnostic {
    Diagnostic::new(
        new.at.clone(),
        format!(
            "{key} = {} widens the limit of an earlier policy",
            new.value
        ),
    )
    .note("earlier policy", &old.at, format!("{key} = {}", old.value))
    .hint(format!(
        "a later policy may only narrow the ones before it: {hint}"
    ))
}

/// Replaces `cur` by `new` when set, reporting when `narrower(new, cur)` is false.
fn narrow<T: Clone + std::fmt::Display>(
    diags: &mut Diagnostics,
    key: &str,
    cur: &mut Option<Loc<T>>,
    new: &Option<Loc<T>>,
    narrower: impl Fn(&T, &T) -> bool,
    hint: impl Fn(&T) -> String,
) {
    let Some(n) = new else { return };
    if let Some(c) = cur.as_ref()
        && !narrower(&n.value, &c.value)
    {
        diags.push(widens(key, n, c, hint(&c.value)));
        return;
    }
    *cur = Some(n.clone());
}

fn override_opt<T: Clone>(cur: &mut Option<Loc<T>>, new: &Option<Loc<T>>) {
    if new.is_some() {
        cur.clone_from(new);
    }
}

pub fn stack(policies: &[Policy]) -> (Stack, Diagnostics) {
    let mut s = Stack::default();
    let mut d = Diagnostics::default();
    for p in policies {
        narrow(
            &mut d,
            "limits.max_vcpus",
            &mut s.max_vcpus,
            &p.max_vcpus,
            |n, c| n <= c,
            |c| format!("set at most {c}"),
        );
        narrow(
            &mut d,
            "limits.max_memory",
            &mut s.max_memory,
            &p.max_memory,
            |n, c| n <= c,
            |c| format!("set at most {c}"),
        );
        narrow(
            &mut d,
            "limits.vms_per_core",
            &mut s.vms_per_core,
            &p.vms_per_core,
            |n, c| n <= c,
            |c| format!("set at most {c}"),
        );
        narrow(
            &mut d,
            "users.uid_range",
            &mut s.uid_range,
            &p.uid_range,
            |n, c| n.within(*c),
            |c| format!("stay within {c}"),
        );
        narrow(
            &mut d,
            "users.gid_range",
            &mut s.gid_range,
            &p.gid_range,
            |n, c| n.within(*c),
            |c| format!("stay within {c}"),
        );
        narrow(
            &mut d,
            "checkpoint.at_walltime_end",
            &mut s.checkpoint_at_walltime_end,
            &p.checkpoint_at_walltime_end,
            |n, c| *n || !*c,
            |_| "keep it `true`".into(),
        );
        narrow(
            &mut d,
            "checkpoint.min_interval",
            &mut s.checkpoint_min_interval,
            &p.checkpoint_min_interval,
            |n, c| n >= c,
            |c| format!("set at least {c}"),
        );
        narrow(
            &mut d,
            "checkpoint.attach_grace",
            &mut s.checkpoint_attach_grace,
            &p.checkpoint_attach_grace,
            |n, c| n <= c,
            |c| format!("set at most {c}"),
        );
        narrow(
            &mut d,
            "images.allow_imported",
            &mut s.images.allow_imported,
            &p.images.allow_imported,
            |n, c| !*n || *c,
            |_| "keep it `false`".into(),
        );
        narrow(
            &mut d,
            "images.require_dpkg_database",
            &mut s.images.require_dpkg_database,
            &p.images.require_dpkg_database,
            |n, c| *n || !*c,
            |_| "keep it `true`".into(),
        );
        narrow(
            &mut d,
            "images.boot_templates",
            &mut s.images.boot_templates,
            &p.images.boot_templates,
            |n, c| !*n || *c,
            |_| "keep it `false`".into(),
        );
        s.images
            .signed_by
            .extend(p.images.signed_by.iter().cloned());
        stack_network(&mut d, &mut s.network, &p.network);
        stack_lists(&mut d, &mut s, p);
        override_opt(&mut s.mirror, &p.mirror);
        override_opt(&mut s.keyrings, &p.keyrings);
        s.required_packages
            .extend(p.required_packages.iter().cloned());
        s.forbidden_packages
            .extend(p.forbidden_packages.iter().cloned());
        s.protected_paths.extend(p.protected_paths.iter().cloned());
        for f in &p.required_files {
            match s
                .required_files
                .iter()
                .find(|e| e.value.path == f.value.path)
            {
                Some(prev) => d.push(
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
        override_opt(&mut sd.vcpus, &pd.vcpus);
        override_opt(&mut sd.memory, &pd.memory);
        override_opt(&mut sd.variant, &pd.variant);
        override_opt(&mut sd.hypervisor, &pd.hypervisor);
        override_opt(&mut sd.checkpoint, &pd.checkpoint);
        let (sm, pm) = (&mut s.migration, &p.migration);
        override_opt(&mut sm.active_memory_threshold, &pm.active_memory_threshold);
        override_opt(&mut sm.outlier_sigma, &pm.outlier_sigma);
        override_opt(&mut sm.persistence, &pm.persistence);
        override_opt(
            &mut sm.oversubscription_threshold,
            &pm.oversubscription_threshold,
        );
        override_opt(&mut sm.consolidation, &pm.consolidation);
        override_opt(&mut sm.cooldown, &pm.cooldown);
        override_opt(&mut sm.max_concurrent, &pm.max_concurrent);
        override_opt(&mut sm.barrier_deadline, &pm.barrier_deadline);
        override_opt(&mut sm.barrier_action, &pm.barrier_action);
    }
    self_consistency(&mut d, &s);
    (s, d)
}

fn stack_network(d: &mut Diagnostics, cur: &mut Option<NetworkRule>, new: &Option<NetworkRule>) {
    let Some(n) = new else { return };
    if let Some(c) = cur.as_ref()
        && !c.ip_range.value.contains(&n.ip_range.value)
    {
        d.push(widens(
            "network.ip_range",
            &n.ip_range,
            &c.ip_range,
            format!("use a range inside {}", c.ip_range.value),
        ));
        return;
    }
    *cur = Some(n.clone());
}

fn stack_lists(d: &mut Diagnostics, s: &mut Stack, p: &Policy) {
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
        if let Some(cur) = &s.distributions {
            for rule in &new.value {
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
            }
        }
        s.distributions = Some(new.clone());
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
