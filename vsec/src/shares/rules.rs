//! The stacked `shares.*` rules, and the one judgement of a host path against them that both
//! `vse check` (on the path as written) and [`super::resolve`] (on the canonical path) make.

use crate::env::{
    AllowedShare, DefaultShare, EffectiveEnv, Origin, SharePolicy, ShareSpec, Sourced,
};
use crate::policy::Policy;
use crate::units::AbsPath;
use crate::yaml::{Diagnostic, Diagnostics};
use std::path::{Path, PathBuf};

/// What the policies say about shares, each entry with its policy line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareRules {
    /// `None`: any directory the user can read may be shared read-write.
    pub allowed: Option<Sourced<Vec<Sourced<AllowedShare>>>>,
    pub forbidden: Vec<Sourced<AbsPath>>,
    /// What every job gets unasked; the built-in default is the launch directory, as
    /// Apptainer shares the working directory.
    pub default: Sourced<Vec<Sourced<DefaultShare>>>,
}

impl Default for ShareRules {
    fn default() -> Self {
        ShareRules::from_policy(&SharePolicy::default())
    }
}

impl ShareRules {
    /// The rules an effective environment carries (`vse launch SPEC`).
    pub fn from_env(env: &EffectiveEnv) -> ShareRules {
        ShareRules::from_policy(&env.share_policy)
    }

    pub fn from_policy(p: &SharePolicy) -> ShareRules {
        ShareRules {
            allowed: p.allowed.clone(),
            forbidden: p.forbidden.clone(),
            default: p
                .default
                .clone()
                .unwrap_or_else(|| Sourced::default(vec![Sourced::default(DefaultShare::CWD)])),
        }
    }

    /// The rules of a policy stack (`vse launch IMAGE --policy ...`), refused as `vse check`
    /// refuses the stack.
    pub fn from_policies(policies: &[Policy]) -> Result<ShareRules, Diagnostics> {
        let (st, d) = crate::merge::stack(policies);
        d.into_result(ShareRules::from_policy(&crate::merge::share_policy(&st)))
    }

    /// The allowed list as a message shows it.
    pub(super) fn allowed_list(&self) -> String {
        let Some(a) = &self.allowed else {
            return String::new();
        };
        (a.value.iter())
            .map(|e| format!("{}{}", e.value.path, if e.value.ro { ":ro" } else { "" }))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How the rules judge a path.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict<'a> {
    /// Shared; read-only when asked, or when its allowed entry says so.
    Ok {
        ro: bool,
    },
    Forbidden(&'a Sourced<AbsPath>),
    NotAllowed,
    /// Asked read-write under a read-only allowed entry.
    ReadOnly(&'a Sourced<AllowedShare>),
}

/// Judges `path`. `forms` gives each form of a rule's prefix to compare with (the written
/// one, and on the host its canonical one, since a prefix may itself be a symlink).
/// Forbidden wins over allowed; the most specific allowed entry decides the mode.
pub(super) fn judge<'a>(
    path: &Path,
    ro: bool,
    rules: &'a ShareRules,
    forms: &dyn Fn(&AbsPath) -> Vec<PathBuf>,
) -> Verdict<'a> {
    let under = |prefix: &AbsPath| {
        (forms(prefix).iter())
            .filter(|f| path.starts_with(f))
            .map(|f| f.components().count())
            .max()
    };
    if let Some(f) = rules.forbidden.iter().find(|f| under(&f.value).is_some()) {
        return Verdict::Forbidden(f);
    }
    let Some(allowed) = &rules.allowed else {
        return Verdict::Ok { ro };
    };
    let best = (allowed.value.iter())
        .filter_map(|a| under(&a.value.path).map(|depth| (depth, a)))
        .max_by_key(|(depth, a)| (*depth, a.value.ro));
    match best {
        None => Verdict::NotAllowed,
        Some((_, a)) if a.value.ro && !ro => Verdict::ReadOnly(a),
        Some(_) => Verdict::Ok { ro },
    }
}

/// The spec's shares against the rules, for `vse check`: the file system is not read, so
/// only absolute host paths are judged, as written (`vse launch` judges every one again on
/// its canonical path).
pub fn check_spec(env: &EffectiveEnv, rules: &ShareRules) -> Diagnostics {
    check_shares(&env.shares, rules)
}

pub(crate) fn check_shares(shares: &[Sourced<ShareSpec>], rules: &ShareRules) -> Diagnostics {
    let mut d = Diagnostics::default();
    for s in shares {
        let (Origin::User { at } | Origin::Policy { at }) = &s.from else {
            continue;
        };
        if !s.value.host.starts_with('/') {
            continue;
        }
        let path = super::syntax::lexical(Path::new(&s.value.host));
        let shown = path.display();
        let lexical = |p: &AbsPath| vec![PathBuf::from(p.as_str())];
        let diag = match judge(&path, s.value.ro, rules, &lexical) {
            Verdict::Ok { .. } => continue,
            Verdict::Forbidden(f) => Diagnostic::new(
                at.clone(),
                format!(
                    "shares: {shown} is under {}, which the policy forbids",
                    f.value
                ),
            )
            .hint("share another directory; this one is never shared")
            .with_rule(&f.from, format!("shares.forbidden: {}", f.value)),
            Verdict::NotAllowed => {
                let allowed = rules.allowed.as_ref().expect("judged against a list");
                Diagnostic::new(
                    at.clone(),
                    format!("shares: {shown} is under no allowed directory"),
                )
                .hint("share a directory under one of those shares.allowed lists")
                .with_rule(
                    &allowed.from,
                    format!("shares.allowed = [{}]", rules.allowed_list()),
                )
            }
            Verdict::ReadOnly(a) => Diagnostic::new(
                at.clone(),
                format!(
                    "shares: {shown} is asked read-write, but the policy allows {} read-only",
                    a.value.path
                ),
            )
            .hint("ask for it read-only: `:ro`, or `mode: ro`")
            .with_rule(&a.from, format!("shares.allowed: {}:ro", a.value.path)),
        };
        d.push(diag);
    }
    d
}

trait WithRule {
    fn with_rule(self, from: &Origin, what: String) -> Self;
}

impl WithRule for Diagnostic {
    fn with_rule(self, from: &Origin, what: String) -> Self {
        match from {
            Origin::Policy { at } | Origin::User { at } => self.note("policy", at, what),
            Origin::Default => self,
        }
    }
}
