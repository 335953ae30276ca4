//! Policy checks for images made outside vse (`vse import`): whether imported images may run
//! at all, whether they must carry a dpkg database, and the package rules (forbidden and
//! required packages) applied to what that database lists, as they apply to built images.
//! Pure functions over a policy stack and what the image holds, so the importer and the
//! launcher can ask the same question.

use super::Stack;
use crate::deb::{DebVersion, PackageName};
use crate::yaml::{Diagnostic, Diagnostics};

/// One package an image's dpkg database lists as installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
    pub architecture: String,
}

/// What a policy needs to know about an imported image.
#[derive(Debug, Clone, Default)]
pub struct ImageFacts {
    /// The image has `/var/lib/dpkg/status`.
    pub dpkg_database: bool,
    pub installed: Vec<InstalledPackage>,
    /// Where the image came from, for messages (`oci-archive:debian.tar`).
    pub source: String,
}

/// Problems with importing at all (before anything is unpacked).
pub fn check_import_allowed(st: &Stack, source: &str) -> Diagnostics {
    let mut d = Diagnostics::default();
    if let Some(a) = &st.images.allow_imported
        && !a.value
    {
        d.push(
            Diagnostic::new(
                a.at.clone(),
                format!(
                    "imported images are not allowed (images.allow_imported = false): {source}"
                ),
            )
            .hint("build the environment from a spec with `vse build` instead, or ask your admin"),
        );
    }
    d
}

/// Every policy problem of an imported image: [`check_import_allowed`], the dpkg database
/// rule, forbidden packages it has, required packages it lacks (when it has a database).
pub fn check_imported(st: &Stack, facts: &ImageFacts) -> Diagnostics {
    let mut d = check_import_allowed(st, &facts.source);
    if !facts.dpkg_database {
        if let Some(r) = &st.images.require_dpkg_database
            && r.value
        {
            d.push(
                Diagnostic::new(
                    r.at.clone(),
                    format!(
                        "{} has no dpkg database (/var/lib/dpkg/status), which images.require_dpkg_database demands",
                        facts.source
                    ),
                )
                .hint("import a Debian-based image, or ask your admin"),
            );
        }
        return d;
    }
    let parsed: Vec<(PackageName, Option<DebVersion>)> = facts
        .installed
        .iter()
        .filter_map(|p| {
            let name = PackageName::new(&p.name).ok()?;
            Some((name, DebVersion::parse(&p.version).ok()))
        })
        .collect();
    for f in &st.forbidden_packages {
        for (name, version) in &parsed {
            let hit = match version {
                Some(v) => f.value.matches(name, v),
                None => f.value.constraint.is_none() && f.value.matches_name(name),
            };
            if hit {
                let v = version.as_ref().map(|v| v.to_string()).unwrap_or_default();
                d.push(
                    Diagnostic::new(
                        f.at.clone(),
                        format!(
                            "{} holds package `{name}` {v}, forbidden by `{}`",
                            facts.source, f.value
                        ),
                    )
                    .hint("remove the package from the image (or use another image)"),
                );
            }
        }
    }
    for r in &st.required_packages {
        let rel = &r.value;
        let ok = parsed.iter().any(|(name, version)| {
            *name == rel.name
                && match (&rel.constraint, version) {
                    (None, _) => true,
                    (Some(c), Some(v)) => c.matches(v),
                    (Some(_), None) => false,
                }
        });
        if !ok {
            d.push(
                Diagnostic::new(
                    r.at.clone(),
                    format!("{} lacks required package `{rel}`", facts.source),
                )
                .hint("install it in the image before importing it, or ask your admin"),
            );
        }
    }
    d
}
