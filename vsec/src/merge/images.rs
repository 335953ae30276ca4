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
    package_rules(&mut d, st, &facts.source, &facts.installed);
    d
}

/// The forbidden packages `installed` holds and the required ones it lacks.
pub fn package_rules(
    d: &mut Diagnostics,
    st: &Stack,
    source: &str,
    installed: &[InstalledPackage],
) {
    let parsed: Vec<(PackageName, Option<DebVersion>)> = installed
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
                            source, f.value
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
                    format!("{} lacks required package `{rel}`", source),
                )
                .hint("rebuild (or re-import) the image with it, or ask your admin"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::Source;
    use std::path::Path;

    fn stack_of(policies: &[(&str, &str)]) -> (Stack, Diagnostics) {
        let loaded: Vec<_> = policies
            .iter()
            .map(|(name, text)| {
                let src = Source::from_bytes(name, Path::new(name), text.as_bytes().to_vec());
                crate::policy::parse_source(&src).unwrap()
            })
            .collect();
        super::super::stack(&loaded)
    }

    fn pkg(name: &str, version: &str) -> InstalledPackage {
        InstalledPackage {
            name: name.into(),
            version: version.into(),
            architecture: "amd64".into(),
        }
    }

    #[test]
    fn rules_parse_stack_and_check() {
        let (st, d) = stack_of(&[(
            "site.yaml",
            "version: 1\nname: site\npackages:\n  required: [libnuma1]\n  forbidden: [\"telnetd\"]\nimages:\n  require_dpkg_database: true\n",
        )]);
        assert!(d.is_empty(), "{d}");
        let mut facts = ImageFacts {
            dpkg_database: false,
            installed: vec![],
            source: "tar:x.tar".into(),
        };
        let d = check_imported(&st, &facts);
        assert_eq!(d.len(), 1, "{d}");
        assert!(d.to_string().contains("site.yaml:7:"), "{d}");
        facts.dpkg_database = true;
        facts.installed = vec![pkg("telnetd", "0.17-44"), pkg("dpkg", "1.21.22")];
        let d = check_imported(&st, &facts).to_string();
        assert!(
            d.contains("`telnetd` 0.17-44") && d.contains("lacks required package `libnuma1`"),
            "{d}"
        );
        facts.installed = vec![pkg("libnuma1", "2.0.16-1")];
        assert!(check_imported(&st, &facts).is_empty());
        assert!(check_import_allowed(&st, "x").is_empty());
    }

    #[test]
    fn a_later_policy_may_only_narrow() {
        let (st, d) = stack_of(&[
            (
                "site.yaml",
                "version: 1\nname: site\nimages:\n  allow_imported: false\n",
            ),
            (
                "part.yaml",
                "version: 1\nname: part\nimages:\n  allow_imported: true\n",
            ),
        ]);
        assert_eq!(d.len(), 1);
        assert!(
            d.to_string().contains("part.yaml:4:") && d.to_string().contains("widens"),
            "{d}"
        );
        assert!(!check_import_allowed(&st, "oci:x").is_empty());
        let (st, d) = stack_of(&[
            (
                "site.yaml",
                "version: 1\nname: site\nimages:\n  require_dpkg_database: true\n",
            ),
            (
                "part.yaml",
                "version: 1\nname: part\nimages:\n  require_dpkg_database: false\n",
            ),
        ]);
        assert_eq!(d.len(), 1, "{d}");
        assert_eq!(st.images.require_dpkg_database.map(|l| l.value), Some(true));
    }

    /// Boot templates: a policy may turn them off, a later one never on again.
    #[test]
    fn boot_templates_can_only_be_turned_off() {
        let off = "version: 1\nname: site\nimages:\n  boot_templates: false\n";
        let on = "version: 1\nname: part\nimages:\n  boot_templates: true\n";
        let (st, d) = stack_of(&[("site.yaml", off), ("part.yaml", on)]);
        assert_eq!(d.len(), 1, "{d}");
        assert!(
            d.to_string().contains("part.yaml:4:") && d.to_string().contains("widens"),
            "{d}"
        );
        let p = crate::merge::image_policy(&st);
        assert!(!p.boot_templates.value);
        assert!(
            p.boot_templates.from.to_string().contains("site.yaml:4"),
            "{}",
            p.boot_templates.from
        );
        let (st, d) = stack_of(&[("part.yaml", on), ("site.yaml", off)]);
        assert!(d.is_empty(), "{d}");
        assert!(!crate::merge::image_policy(&st).boot_templates.value);
        let (st, _) = stack_of(&[]);
        let p = crate::merge::image_policy(&st);
        assert!(p.boot_templates.value && p.is_default(), "on by default");
    }
}
