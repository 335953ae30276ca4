//! The spec checked against the stacked policy: one diagnostic per violation, each naming
//! the spec line and the policy line.

use super::default_kernel;
use super::stack::{Stack, join};
use crate::deb::{Arch, PackageName, VersionOp};
use crate::spec::Spec;
use crate::yaml::{Diagnostic, Diagnostics, Loc, SrcPos};
use std::collections::BTreeMap;

pub fn check(spec: &Spec, st: &Stack) -> Diagnostics {
    let mut d = Diagnostics::default();
    base(&mut d, spec, st);
    packages(&mut d, spec, st);
    files(&mut d, spec, st);
    accounts(&mut d, spec, st);
    resources(&mut d, spec, st);
    checkpoint(&mut d, spec, st);
    hypervisor(&mut d, spec, st);
    let shares: Vec<_> = spec.shares.iter().map(super::user).collect();
    let rules = crate::shares::ShareRules::from_policy(&super::share_policy(st));
    d.extend(crate::shares::check_shares(&shares, &rules));
    d
}

fn violation(
    at: &SrcPos,
    msg: String,
    pat: &SrcPos,
    rule: String,
    hint: impl Into<String>,
) -> Diagnostic {
    Diagnostic::new(at.clone(), msg)
        .note("policy", pat, rule)
        .hint(hint)
}

fn base(d: &mut Diagnostics, spec: &Spec, st: &Stack) {
    let b = &spec.base;
    if let Some(dists) = &st.distributions {
        let names = join(dists.value.iter().map(|r| &r.name.value));
        match dists
            .value
            .iter()
            .find(|r| r.name.value == b.distribution.value)
        {
            None => d.push(violation(
                &b.distribution.at,
                format!(
                    "base.distribution `{}` is not allowed",
                    b.distribution.value
                ),
                &dists.at,
                format!("distributions allows: {names}"),
                format!("use one of: {names}"),
            )),
            Some(rule) => {
                let suites = join(rule.suites.iter().map(|s| &s.value));
                if !rule.suites.iter().any(|s| s.value == b.suite.value) {
                    d.push(violation(
                        &b.suite.at,
                        format!("base.suite `{}` is not allowed", b.suite.value),
                        &rule.name.at,
                        format!("{} suites: {suites}", rule.name.value),
                        format!("use one of: {suites}"),
                    ));
                }
                if let Some(archs) = &rule.architectures {
                    let arch = b.architecture.as_ref().map(|a| a.value.clone());
                    let arch = arch.unwrap_or_else(|| {
                        Arch::new(super::defaults::ARCH).expect("valid literal")
                    });
                    if !archs.iter().any(|a| a.value == arch) {
                        let at = b
                            .architecture
                            .as_ref()
                            .map_or(&b.distribution.at, |a| &a.at);
                        d.push(violation(
                            at,
                            format!("base.architecture `{arch}` is not allowed"),
                            &rule.name.at,
                            format!(
                                "{} architectures: {}",
                                rule.name.value,
                                join(archs.iter().map(|a| &a.value))
                            ),
                            "build for an allowed architecture",
                        ));
                    }
                }
                if let (Some(allowed), Some(comps)) = (&rule.components, &b.components) {
                    for c in &comps.value {
                        if !allowed.iter().any(|a| a.value == c.value) {
                            d.push(violation(
                                &c.at,
                                format!("base.components: `{}` is not allowed", c.value),
                                &rule.name.at,
                                format!(
                                    "{} components: {}",
                                    rule.name.value,
                                    join(allowed.iter().map(|a| &a.value))
                                ),
                                "remove it, or ask your admin",
                            ));
                        }
                    }
                }
            }
        }
    }
    // Without a mirror in the spec the host's apt sources are used; they are checked against
    // the same list when the lock is resolved (they are not known before).
    if let (Some(allowed), Some(m)) = (&st.allowed_mirrors, &b.mirror) {
        let (url, at) = (m.value.clone(), &m.at);
        if !allowed.value.iter().any(|a| url.is_within(&a.value)) {
            d.push(violation(
                at,
                format!("base.mirror `{url}` is not an allowed repository"),
                &allowed.at,
                format!(
                    "repositories.allowed = [{}]",
                    join(allowed.value.iter().map(|a| &a.value))
                ),
                "name an allowed archive (the site mirror is used either way)",
            ));
        }
    }
}

fn packages(d: &mut Diagnostics, spec: &Spec, st: &Stack) {
    let arch = spec.base.architecture.as_ref().map(|a| a.value.clone());
    let arch = arch.unwrap_or_else(|| Arch::new(super::defaults::ARCH).expect("valid literal"));
    let kernel: (PackageName, Option<&SrcPos>) = match &spec.kernel {
        Some(k) => (k.value.clone(), Some(&k.at)),
        None => (default_kernel(&arch), None),
    };
    let mut seen: BTreeMap<&str, &SrcPos> = BTreeMap::new();
    for p in &spec.packages {
        if let Some(prev) = seen.insert(p.value.name.as_str(), &p.at) {
            d.push(
                Diagnostic::new(
                    p.at.clone(),
                    format!("package `{}` is listed twice", p.value.name),
                )
                .note("first", prev, "listed here")
                .hint("list each package once, with one constraint"),
            );
        }
    }
    let requested = spec
        .packages
        .iter()
        .map(|p| {
            (
                &p.value.name,
                p.value.constraint.as_ref(),
                &p.at,
                "packages",
            )
        })
        .chain(kernel.1.map(|at| (&kernel.0, None, at, "kernel")));
    for (name, constraint, at, field) in requested {
        for f in &st.forbidden_packages {
            if !f.value.matches_name(name) {
                continue;
            }
            // A versioned pattern is decided by the resolver once the version is known,
            // unless the user pinned an exact version it covers.
            let certain = match (&f.value.constraint, constraint) {
                (None, _) => true,
                (Some(fc), Some(c)) => c.op == VersionOp::Eq && fc.matches(&c.version),
                (Some(_), None) => false,
            };
            if certain {
                d.push(violation(
                    at,
                    format!("{field}: `{name}` is forbidden"),
                    &f.at,
                    format!("packages.forbidden: `{}`", f.value),
                    "remove it; the site does not allow this package in any image",
                ));
            }
        }
    }
    if spec.kernel.is_none() {
        for f in &st.forbidden_packages {
            if f.value.constraint.is_none() && f.value.matches_name(&kernel.0) {
                d.push(violation(
                    &spec.base.distribution.at,
                    format!("the default kernel `{}` is forbidden", kernel.0),
                    &f.at,
                    format!("packages.forbidden: `{}`", f.value),
                    "name an allowed kernel with `kernel:`",
                ));
            }
        }
    }
}

fn files(d: &mut Diagnostics, spec: &Spec, st: &Stack) {
    let mut seen: BTreeMap<&str, &SrcPos> = BTreeMap::new();
    for f in &spec.files {
        let path = &f.value.path;
        if let Some(prev) = seen.insert(path.as_str(), &f.at) {
            d.push(
                Diagnostic::new(f.at.clone(), format!("files: {path} is listed twice"))
                    .note("first", prev, "listed here")
                    .hint("each path may be added once"),
            );
        }
        if let Some(req) = st.required_files.iter().find(|r| &r.value.path == path) {
            d.push(violation(
                &f.at,
                format!("files: {path} is provided by the policy and cannot be overridden"),
                &req.at,
                format!("files.required: {path}"),
                "choose another path",
            ));
        }
        if let Some(p) = st.protected_paths.iter().find(|p| path.is_within(&p.value)) {
            d.push(violation(
                &f.at,
                format!("files: {path} is inside the protected path {}", p.value),
                &p.at,
                format!("files.protected: {}", p.value),
                format!("put the file outside {}", p.value),
            ));
        }
    }
}

fn range_check(
    d: &mut Diagnostics,
    what: &str,
    id: u32,
    name: &str,
    at: &SrcPos,
    range: &Option<Loc<crate::policy::IdRange>>,
    key: &str,
) {
    if let Some(r) = range
        && !r.value.contains(id)
    {
        d.push(violation(
            at,
            format!("{what} `{name}`: id {id} is outside the allowed range"),
            &r.at,
            format!("{key} = {}", r.value),
            format!("pick an id from {} to {}", r.value.min, r.value.max),
        ));
    }
}

fn accounts(d: &mut Diagnostics, spec: &Spec, st: &Stack) {
    let mut names: BTreeMap<&str, &SrcPos> = BTreeMap::new();
    let mut gids: BTreeMap<u32, &SrcPos> = BTreeMap::new();
    for g in &spec.groups {
        let dup = names
            .insert(g.value.name.as_str(), &g.at)
            .map(|p| (p, "name"))
            .or_else(|| gids.insert(g.value.gid, &g.at).map(|p| (p, "gid")));
        if let Some((prev, what)) = dup {
            d.push(
                Diagnostic::new(
                    g.at.clone(),
                    format!("groups: `{}` repeats a group {what}", g.value.name),
                )
                .note("first", prev, "defined here")
                .hint("group names and gids must be unique"),
            );
        }
        range_check(
            d,
            "group",
            g.value.gid,
            g.value.name.as_str(),
            &g.at,
            &st.gid_range,
            "users.gid_range",
        );
    }
    let mut unames: BTreeMap<&str, &SrcPos> = BTreeMap::new();
    let mut uids: BTreeMap<u32, &SrcPos> = BTreeMap::new();
    for u in &spec.users {
        let dup = unames
            .insert(u.value.name.as_str(), &u.at)
            .map(|p| (p, "name"))
            .or_else(|| uids.insert(u.value.uid, &u.at).map(|p| (p, "uid")));
        if let Some((prev, what)) = dup {
            d.push(
                Diagnostic::new(
                    u.at.clone(),
                    format!("users: `{}` repeats a user {what}", u.value.name),
                )
                .note("first", prev, "defined here")
                .hint("user names and uids must be unique"),
            );
        }
        range_check(
            d,
            "user",
            u.value.uid,
            u.value.name.as_str(),
            &u.at,
            &st.uid_range,
            "users.uid_range",
        );
        // A user who lists no group gets one of its own name, whose gid is its uid (unless
        // the spec defines that group).
        let own = spec.groups.iter().any(|g| g.value.name == u.value.name);
        if u.value.groups.is_empty() && !own {
            range_check(
                d,
                "user's own group",
                u.value.uid,
                u.value.name.as_str(),
                &u.at,
                &st.gid_range,
                "users.gid_range",
            );
        }
    }
}

fn resources(d: &mut Diagnostics, spec: &Spec, st: &Stack) {
    if let (Some(v), Some(l)) = (&spec.vcpus, &st.max_vcpus)
        && v.value > l.value
    {
        d.push(violation(
            &v.at,
            format!("resources.vcpus = {} exceeds the policy limit", v.value),
            &l.at,
            format!("limits.max_vcpus = {}", l.value),
            format!(
                "ask for at most {} vCPUs, or use a partition whose policy allows more",
                l.value
            ),
        ));
    }
    if let (Some(m), Some(l)) = (&spec.memory, &st.max_memory)
        && m.value > l.value
    {
        d.push(violation(
            &m.at,
            format!("resources.memory = {} exceeds the policy limit", m.value),
            &l.at,
            format!("limits.max_memory = {}", l.value),
            format!(
                "ask for at most {}, or use a partition whose policy allows more",
                l.value
            ),
        ));
    }
}

fn checkpoint(d: &mut Diagnostics, spec: &Spec, st: &Stack) {
    let Some(c) = &spec.checkpoint else { return };
    if let (Some(i), Some(min)) = (&c.interval, &st.checkpoint_min_interval)
        && i.value < min.value
    {
        d.push(violation(
            &i.at,
            format!(
                "checkpoint.interval = {} is shorter than the policy allows",
                i.value
            ),
            &min.at,
            format!("checkpoint.min_interval = {}", min.value),
            format!("checkpoint at most every {}", min.value),
        ));
    }
}

fn hypervisor(d: &mut Diagnostics, spec: &Spec, st: &Stack) {
    if let (Some(h), Some(allowed)) = (&spec.hypervisor, &st.hypervisors)
        && !allowed.value.iter().any(|a| a.value == h.value)
    {
        let list = join(allowed.value.iter().map(|a| a.value));
        d.push(violation(
            &h.at,
            format!("hypervisor `{}` is not allowed", h.value),
            &allowed.at,
            format!("hypervisors.allowed = [{list}]"),
            format!("use one of: {list}, or leave `hypervisor:` out"),
        ));
    }
}
