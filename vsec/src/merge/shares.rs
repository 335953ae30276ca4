//! Stacking `shares:`: `allowed` only narrows (the stack allows what every policy allows),
//! `forbidden` accumulates, `default` is replaced by a later policy. The stacked defaults
//! must then obey the stacked `allowed` and `forbidden`.

use crate::env::{AllowedShare, DefaultDir, SharePolicy, Sourced};
use crate::policy::PolicyShares;
use crate::units::AbsPath;
use crate::yaml::{Diagnostic, Diagnostics, Loc};

pub(super) fn stack(d: &mut Diagnostics, cur: &mut PolicyShares, new: &PolicyShares) {
    cur.forbidden.extend(new.forbidden.iter().cloned());
    if new.default.is_some() {
        cur.default.clone_from(&new.default);
    }
    let Some(n) = &new.allowed else { return };
    let Some(c) = &cur.allowed else {
        cur.allowed = Some(n.clone());
        return;
    };
    let mut kept = Vec::new();
    for e in &n.value {
        match most_specific(&c.value, &e.value.path) {
            None => d.push(
                Diagnostic::new(
                    e.at.clone(),
                    format!(
                        "shares.allowed: {} is not allowed by an earlier policy",
                        e.value.path
                    ),
                )
                .note("earlier policy", &c.at, format!("shares.allowed = [{}]", list(&c.value)))
                .hint("a later policy may only narrow the ones before it: list directories under the earlier ones"),
            ),
            Some(o) if o.value.ro && !e.value.ro => d.push(
                Diagnostic::new(
                    e.at.clone(),
                    format!(
                        "shares.allowed: {} read-write widens an earlier policy",
                        e.value.path
                    ),
                )
                .note("earlier policy", &o.at, format!("shares.allowed: {}:ro", o.value.path))
                .hint("a later policy may only narrow the ones before it: add `mode: ro`"),
            ),
            Some(_) => kept.push(e.clone()),
        }
    }
    // An earlier read-only entry inside a later read-write one still holds.
    for o in c.value.iter().filter(|o| o.value.ro) {
        if most_specific(&kept, &o.value.path).is_some_and(|k| !k.value.ro) {
            kept.push(o.clone());
        }
    }
    cur.allowed = Some(Loc {
        value: kept,
        at: n.at.clone(),
    });
}

/// The entry that decides `path`: the deepest one holding it.
fn most_specific<'a>(
    list: &'a [Loc<AllowedShare>],
    path: &AbsPath,
) -> Option<&'a Loc<AllowedShare>> {
    (list.iter())
        .filter(|e| path.is_within(&e.value.path))
        .max_by_key(|e| (e.value.path.components().count(), e.value.ro))
}

fn list(v: &[Loc<AllowedShare>]) -> String {
    (v.iter())
        .map(|e| format!("{}{}", e.value.path, if e.value.ro { ":ro" } else { "" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A default path must be one the stack lets jobs share (`cwd` and `home` are judged at
/// launch, where they are known).
pub(super) fn self_consistency(d: &mut Diagnostics, s: &PolicyShares) {
    let Some(defaults) = &s.default else { return };
    for e in &defaults.value {
        let DefaultDir::Path(p) = &e.value.dir else {
            continue;
        };
        if let Some(f) = s.forbidden.iter().find(|f| p.is_within(&f.value)) {
            d.push(
                Diagnostic::new(e.at.clone(), format!("shares.default: {p} is forbidden"))
                    .note("policy", &f.at, format!("shares.forbidden: {}", f.value))
                    .hint("a default share must be one jobs may share; remove one of them"),
            );
        } else if let Some(a) = &s.allowed
            && most_specific(&a.value, p).is_none()
        {
            d.push(
                Diagnostic::new(
                    e.at.clone(),
                    format!("shares.default: {p} is under no allowed directory"),
                )
                .note(
                    "policy",
                    &a.at,
                    format!("shares.allowed = [{}]", list(&a.value)),
                )
                .hint("a default share must be one jobs may share: allow it, or remove it"),
            );
        }
    }
}

/// The stacked rules as the effective environment carries them.
pub fn share_policy(s: &PolicyShares) -> SharePolicy {
    SharePolicy {
        allowed: s.allowed.as_ref().map(sourced_list),
        default: s.default.as_ref().map(sourced_list),
        forbidden: s
            .forbidden
            .iter()
            .map(|f| Sourced::policy(f.value.clone(), f.at.clone()))
            .collect(),
    }
}

/// A located list of located entries, each as the policy line that set it.
fn sourced_list<T: Clone>(a: &Loc<Vec<Loc<T>>>) -> Sourced<Vec<Sourced<T>>> {
    let entries = (a.value.iter())
        .map(|e| Sourced::policy(e.value.clone(), e.at.clone()))
        .collect();
    Sourced::policy(entries, a.at.clone())
}
