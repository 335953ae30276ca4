//! Raw spec → validated [`Spec`], collecting every problem.

use super::model::{BaseSpec, CheckpointSpec, SPEC_VERSION, Spec};
use super::raw::{RawFile, RawGroup, RawSpec, RawUser};
use crate::env::{CheckpointMode, FileContent, FileEntry, Group, SourceFile, User, Variant};
use crate::units::{
    AbsPath, ByteSize, FileMode, Hypervisor, MirrorUrl, Seconds, UnixName, ValueError, Word,
};
use crate::yaml::conv::{arch, one_of, package_name, relation};
use crate::yaml::{At, Ctx, Diagnostics, Loc, Source};
use std::path::{Path, PathBuf};

pub fn convert(src: &Source, raw: RawSpec) -> Result<Spec, Diagnostics> {
    let mut cx = Ctx::new(&src.name);
    if raw.version.value != SPEC_VERSION {
        let at = cx.pos(&raw.version);
        cx.error(
            at,
            "version",
            ValueError::new(format!(
                "spec format {} is not supported",
                raw.version.value
            ))
            .hint(format!("this vse reads `version: {SPEC_VERSION}`")),
        );
    }
    let name = cx.parse(&raw.name, "name", Word::parse);
    let b = &raw.base;
    let distribution = cx.parse(&b.distribution, "base.distribution", Word::parse);
    let suite = cx.parse(&b.suite, "base.suite", Word::parse);
    let architecture = cx.parse_opt(&b.architecture, "base.architecture", arch);
    let components = b.components.as_ref().map(|c| Loc {
        at: cx.pos(c),
        value: c
            .value
            .iter()
            .filter_map(|w| cx.parse(w, "base.components", Word::parse))
            .collect(),
    });
    let mirror = cx.parse_opt(&b.mirror, "base.mirror", MirrorUrl::parse);
    let snapshot = cx.parse_opt(&b.snapshot, "base.snapshot", snapshot);
    let variant = cx.parse_opt(&b.variant, "base.variant", |s| {
        one_of(s, &Variant::NAMES, Variant::parse)
    });
    let recommends = b.recommends.as_ref().map(|r| cx.loc(r));
    let kernel = cx.parse_opt(&raw.kernel, "kernel", package_name);
    let packages = raw
        .packages
        .iter()
        .filter_map(|p| cx.parse(p, "packages", relation))
        .collect();
    let files = raw
        .files
        .iter()
        .filter_map(|f| file_entry(&mut cx, f, &src.dir, "files", Sources::SpecDir))
        .collect();
    let groups = raw
        .groups
        .iter()
        .filter_map(|g| group(&mut cx, g))
        .collect();
    let users = raw.users.iter().filter_map(|u| user(&mut cx, u)).collect();
    let environment = raw
        .environment
        .iter()
        .filter_map(|(k, v)| {
            if env_name_ok(k) && !v.value.contains(['\n', '\0']) {
                Some((k.clone(), cx.loc(v)))
            } else if env_name_ok(k) {
                let at = cx.pos(v);
                cx.error(
                    at,
                    "environment",
                    ValueError::new(format!("`{k}`'s value spans lines or holds a NUL byte"))
                        .hint("a variable's value is one line of text"),
                );
                None
            } else {
                let at = cx.pos(v);
                cx.error(
                    at,
                    "environment",
                    ValueError::new(format!("`{k}` is not a valid variable name"))
                        .hint("use letters, digits and `_`, not starting with a digit"),
                );
                None
            }
        })
        .collect();
    let post_install = raw.post_install.iter().map(|c| cx.loc(c)).collect();
    let (mut vcpus, mut memory) = (None, None);
    if let Some(r) = &raw.resources {
        vcpus = r
            .vcpus
            .as_ref()
            .and_then(|v| cx.range(v, "resources.vcpus", 1, 1024));
        memory = cx.parse_opt(&r.memory, "resources.memory", vm_memory);
    }
    let checkpoint = raw.checkpoint.as_ref().and_then(|c| {
        let mode = cx.parse(&c.mode, "checkpoint.mode", |s| {
            one_of(s, &CheckpointMode::NAMES, CheckpointMode::parse)
        })?;
        let interval = cx.parse_opt(&c.interval, "checkpoint.interval", Seconds::parse);
        match (mode.value, &interval) {
            (CheckpointMode::Periodic, None) => {
                cx.error(
                    mode.at.clone(),
                    "checkpoint",
                    ValueError::new("periodic checkpoints need an interval")
                        .hint("add e.g. `interval: 2h`"),
                );
                None
            }
            (CheckpointMode::Never | CheckpointMode::WalltimeEnd, Some(i)) => {
                cx.error(
                    i.at.clone(),
                    "checkpoint.interval",
                    ValueError::new(format!(
                        "an interval only applies to `mode: periodic`, not `{}`",
                        mode.value.as_str()
                    ))
                    .hint("remove `interval`, or set `mode: periodic`"),
                );
                None
            }
            _ => Some(CheckpointSpec { mode, interval }),
        }
    });
    let hypervisor = cx.parse_opt(&raw.hypervisor, "hypervisor", Hypervisor::parse);
    let shares = super::shares::convert(&mut cx, &raw.shares);

    let (Some(name), Some(distribution), Some(suite)) = (name, distribution, suite) else {
        return Err(cx.diags);
    };
    let spec = Spec {
        file: src.name.clone(),
        name,
        description: raw.description,
        base: BaseSpec {
            distribution,
            suite,
            architecture,
            components,
            mirror,
            snapshot,
            variant,
            recommends,
        },
        kernel,
        packages,
        files,
        groups,
        users,
        environment,
        post_install,
        vcpus,
        memory,
        checkpoint,
        hypervisor,
        shares,
    };
    cx.diags.into_result(spec)
}

fn vm_memory(s: &str) -> Result<ByteSize, ValueError> {
    let m = ByteSize::parse(s)?;
    if m < ByteSize::from_mib(64) {
        return Err(
            ValueError::new(format!("{m} is too little memory for a VM"))
                .hint("ask for at least 64MiB"),
        );
    }
    Ok(m)
}

pub(crate) fn env_name_ok(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// snapshot.debian.org timestamp from `2024-06-01`, `2024-06-01T12:00:00Z` or
/// `20240601T120000Z`.
fn snapshot(s: &str) -> Result<String, ValueError> {
    let digits: String = s.chars().filter(|c| c.is_ascii_digit()).collect();
    let shape_ok = s.chars().all(|c| c.is_ascii_digit() || "-:TZ".contains(c));
    let full = match digits.len() {
        8 if !s.contains('T') => format!("{digits}000000"),
        14 if s.ends_with('Z') => digits,
        _ => String::new(),
    };
    let num = |a: usize, b: usize| {
        full.get(a..b)
            .and_then(|x| x.parse::<u32>().ok())
            .unwrap_or(0)
    };
    let valid = shape_ok
        && full.len() == 14
        && num(0, 4) >= 2005
        && (1..=12).contains(&num(4, 6))
        && (1..=31).contains(&num(6, 8))
        && num(8, 10) < 24
        && num(10, 12) < 60
        && num(12, 14) < 60;
    if !valid {
        return Err(ValueError::new(format!("`{s}` is not a snapshot date"))
            .hint("write a UTC date `2024-06-01` or time `2024-06-01T12:00:00Z` (snapshot.debian.org starts in 2005)"));
    }
    Ok(format!("{}T{}Z", &full[..8], &full[8..]))
}

/// The file a `source:` names, checked against where it may come from. The spec-directory
/// rule is checked on the resolved path, so a symlink that leads out is refused too.
fn source_path(dir: &Path, value: &str, sources: Sources) -> Result<PathBuf, ValueError> {
    use std::path::Component;
    // A spec named without a directory (`vse build job.vse.yaml`) lives in the current one.
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let p = dir.join(value);
    let readable = || {
        ValueError::new(format!("`{}` is not a readable file", p.display()))
            .hint("relative sources are resolved from the directory of the file that names them")
    };
    if value.is_empty() || !p.is_file() {
        return Err(readable());
    }
    if sources == Sources::Host {
        return Ok(p);
    }
    let outside = || {
        ValueError::new(format!("`{value}` is outside the spec's directory"))
        .hint("a spec copies files only from its own directory (no absolute path, no `..`, no symlink leading out): put the file next to the spec, or ask an admin to add it with a policy's files.required")
    };
    let path = Path::new(value);
    if path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(outside());
    }
    let (Ok(real), Ok(root)) = (p.canonicalize(), dir.canonicalize()) else {
        return Err(readable());
    };
    if !real.starts_with(&root) {
        return Err(outside());
    }
    Ok(p)
}

/// Where a file entry's `source:` may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sources {
    /// A spec's: only from the spec's own directory (the builder may run as root: a spec must
    /// not make it copy `/etc/shadow` into an image).
    SpecDir,
    /// A policy's (written by an admin): any host file.
    Host,
}

/// A file entry (also used for policy-required files). `field` names the list for messages.
pub(crate) fn file_entry(
    cx: &mut Ctx,
    raw: &At<RawFile>,
    dir: &Path,
    field: &str,
    sources: Sources,
) -> Option<Loc<FileEntry>> {
    let f = &raw.value;
    let at = cx.pos(raw);
    let path = cx.parse(&f.path, &format!("{field}.path"), AbsPath::parse);
    let content = match (&f.content, &f.source) {
        (Some(c), None) => Some(FileContent::Inline(c.value.clone())),
        (None, Some(s)) => match source_path(dir, &s.value, sources) {
            Ok(p) => Some(FileContent::Source(SourceFile {
                path: p,
                written: s.value.clone(),
                beneath: (sources == Sources::SpecDir).then(|| dir.to_path_buf()),
            })),
            Err(e) => {
                let sat = cx.pos(s);
                cx.error(sat, &format!("{field}.source"), e);
                None
            }
        },
        (Some(_), Some(_)) | (None, None) => {
            cx.error(
                at.clone(),
                field,
                ValueError::new("a file needs exactly one of `content` and `source`")
                    .hint("`content: |` for inline text, or `source: path/on/host`"),
            );
            None
        }
    };
    let mode = cx.parse_opt(&f.mode, &format!("{field}.mode"), FileMode::parse);
    let owner = cx.parse_opt(&f.owner, &format!("{field}.owner"), UnixName::parse);
    let group = cx.parse_opt(&f.group, &format!("{field}.group"), UnixName::parse);
    let bad = (f.mode.is_some() && mode.is_none())
        || (f.owner.is_some() && owner.is_none())
        || (f.group.is_some() && group.is_none());
    if bad {
        return None;
    }
    let root = || UnixName::parse("root").ok();
    Some(Loc {
        value: FileEntry {
            path: path?.value,
            content: content?,
            mode: mode.map_or(FileMode::DEFAULT, |m| m.value),
            owner: owner.map(|o| o.value).or_else(root)?,
            group: group.map(|g| g.value).or_else(root)?,
        },
        at,
    })
}

fn group(cx: &mut Ctx, raw: &At<RawGroup>) -> Option<Loc<Group>> {
    let name = cx.parse(&raw.value.name, "groups.name", UnixName::parse)?;
    Some(Loc {
        value: Group {
            name: name.value,
            gid: raw.value.gid.value,
        },
        at: cx.pos(raw),
    })
}

fn user(cx: &mut Ctx, raw: &At<RawUser>) -> Option<Loc<User>> {
    let u = &raw.value;
    let name = cx.parse(&u.name, "users.name", UnixName::parse);
    let groups: Vec<_> = u
        .groups
        .iter()
        .map(|g| cx.parse(g, "users.groups", UnixName::parse))
        .collect();
    let shell = cx.parse_opt(&u.shell, "users.shell", AbsPath::parse);
    let home = cx.parse_opt(&u.home, "users.home", AbsPath::parse);
    let name = name?;
    let home = match home {
        Some(h) => h.value,
        None => AbsPath::parse(&format!("/home/{}", name.value)).ok()?,
    };
    let shell = match shell {
        Some(s) => s.value,
        None => AbsPath::parse("/bin/sh").ok()?,
    };
    Some(Loc {
        value: User {
            name: name.value,
            uid: u.uid.value,
            groups: groups
                .into_iter()
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .map(|g| g.value)
                .collect(),
            shell,
            home,
        },
        at: cx.pos(raw),
    })
}

#[cfg(test)]
mod tests {
    use super::snapshot;

    #[test]
    fn snapshot_dates() {
        assert_eq!(snapshot("2024-06-01").unwrap(), "20240601T000000Z");
        assert_eq!(
            snapshot("2024-06-01T12:30:00Z").unwrap(),
            "20240601T123000Z"
        );
        assert_eq!(snapshot("20240601T123000Z").unwrap(), "20240601T123000Z");
        for bad in [
            "2024-13-01",
            "yesterday",
            "2024-06-01T12:30:00",
            "1999-01-01",
        ] {
            assert!(snapshot(bad).is_err(), "{bad}");
        }
    }
}
