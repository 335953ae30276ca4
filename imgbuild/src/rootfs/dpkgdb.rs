//! dpkg's database for packages we unpacked ourselves: `/var/lib/dpkg/status` with every
//! package `install ok unpacked`, and `info/<pkg>.{list,md5sums,conffiles,postinst,...}`.
//! The image's own `dpkg --configure -a` then takes them to `installed`, exactly as after a
//! `dpkg --unpack`, so the result is a real dpkg-managed system.

use super::inroot::InRoot;
use crate::deb::ControlFiles;
use std::fmt::Write as _;
use std::io;

/// Control files dpkg keeps in `info/` (the rest of control.tar is not stored).
const INFO_FILES: &[&str] = &[
    "preinst",
    "postinst",
    "prerm",
    "postrm",
    "config",
    "templates",
    "triggers",
    "shlibs",
    "symbols",
    "md5sums",
    "conffiles",
];
const SCRIPTS: &[&str] = &["preinst", "postinst", "prerm", "postrm", "config"];

/// One unpacked package, as dpkg will see it.
#[derive(Debug, Clone)]
pub struct Unpacked {
    pub control: ControlFiles,
    /// Image paths the package owns, in archive order.
    pub paths: Vec<String>,
}

impl Unpacked {
    pub fn name(&self) -> &str {
        self.control.field("Package").unwrap_or("")
    }

    /// dpkg's file name stem: `libc6:amd64` for `Multi-Arch: same`, else the name.
    pub fn info_stem(&self) -> String {
        let same = self
            .control
            .field("Multi-Arch")
            .is_some_and(|m| m.eq_ignore_ascii_case("same"));
        match (same, self.control.field("Architecture")) {
            (true, Some(arch)) => format!("{}:{arch}", self.name()),
            _ => self.name().to_string(),
        }
    }
}

const DB: &str = "var/lib/dpkg";

/// Writes the database for `pkgs` into `var/lib/dpkg` of the image (status sorted by name).
/// Every path is resolved inside the root: the unpacked packages may have planted links.
pub fn write_db(root: &InRoot, pkgs: &[Unpacked]) -> io::Result<()> {
    for d in ["info", "updates", "triggers", "alternatives", "parts"] {
        root.create_dir_all(&format!("{DB}/{d}"), 0o755)?;
    }
    for f in ["available", "diversions", "statoverride"] {
        let rel = format!("{DB}/{f}");
        if root.lstat(&rel).is_err() {
            root.write_new(&rel, b"", 0o644)?;
        }
    }
    let mut sorted: Vec<&Unpacked> = pkgs.iter().collect();
    sorted.sort_by_key(|p| p.info_stem());
    let mut status = String::new();
    for p in sorted {
        write_info(root, p)?;
        status.push_str(&status_stanza(p));
        status.push('\n');
    }
    root.write_new(&format!("{DB}/status"), status.as_bytes(), 0o644)
}

/// A dpkg file name stem the package's own control data chose: a Debian package name
/// (`[a-z0-9][a-z0-9+.-]+`), with `:arch` (`[a-z0-9-]+`) for `Multi-Arch: same`. Anything
/// else (a `/`, `..`) would name a file outside `info/`.
fn checked_stem(stem: &str) -> io::Result<&str> {
    let (name, arch) = stem
        .split_once(':')
        .map_or((stem, None), |(n, a)| (n, Some(a)));
    let name_ok = name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+.-".contains(&b));
    let arch_ok = arch.is_none_or(|a| {
        !a.is_empty()
            && a.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    });
    if name_ok && arch_ok {
        Ok(stem)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{stem:?} is not a Debian package name (expected [a-z0-9][a-z0-9+.-]+, optionally :arch)"
            ),
        ))
    }
}

/// `info/<stem>.list` and the control files dpkg keeps.
fn write_info(root: &InRoot, p: &Unpacked) -> io::Result<()> {
    let stem = p.info_stem();
    let stem = checked_stem(&stem)?;
    let mut list = String::new();
    for path in &p.paths {
        // dpkg lists the root as `/.`.
        list.push_str(if path == "/" { "/." } else { path });
        list.push('\n');
    }
    root.write_new(&format!("{DB}/info/{stem}.list"), list.as_bytes(), 0o644)?;
    for name in INFO_FILES {
        if let Some(data) = p.control.files.get(*name) {
            let mode = if SCRIPTS.contains(name) { 0o755 } else { 0o644 };
            root.write_new(&format!("{DB}/info/{stem}.{name}"), data, mode)?;
        }
    }
    Ok(())
}

/// Adds one unpacked package to the database of a configured image (its `.list`, control
/// files and an `install ok unpacked` stanza), for the image's dpkg to configure.
pub fn add_one(root: &InRoot, p: &Unpacked) -> io::Result<()> {
    write_info(root, p)?;
    let rel = format!("{DB}/status");
    let mut status = root.read_to_string(&rel)?;
    status.push_str(&status_stanza(p));
    status.push('\n');
    root.write_new(&rel, status.as_bytes(), 0o644)
}

/// Removes a package from the database of a configured image: its info files and its
/// status stanza (the rest of dpkg's own text is kept as it is).
pub fn remove_one(root: &InRoot, stem: &str) -> io::Result<()> {
    let stem = checked_stem(stem)?;
    for name in INFO_FILES.iter().chain(&["list"]) {
        match root.remove_file(&format!("{DB}/info/{stem}.{name}")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    let (name, arch) = stem
        .split_once(':')
        .map_or((stem, None), |(n, a)| (n, Some(a)));
    let rel = format!("{DB}/status");
    let status = root.read_to_string(&rel)?;
    let kept: Vec<&str> = status
        .split_inclusive("\n\n")
        .filter(|stanza| {
            let field = |f: &str| {
                stanza
                    .lines()
                    .find_map(|l| l.strip_prefix(f).map(str::trim))
            };
            !(field("Package:") == Some(name)
                && arch.is_none_or(|a| field("Architecture:") == Some(a)))
        })
        .collect();
    root.write_new(&rel, kept.concat().as_bytes(), 0o644)
}

/// The control stanza with `Status:` after `Package:` and the conffiles dpkg must track.
fn status_stanza(p: &Unpacked) -> String {
    let mut out = String::new();
    for line in p.control.control_text().lines() {
        if line.trim().is_empty() {
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if line.starts_with("Package:") {
            out.push_str("Status: install ok unpacked\n");
        }
    }
    if let Some(conf) = p.control.files.get("conffiles") {
        let conf = String::from_utf8_lossy(conf);
        let names: Vec<&str> = conf
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with('/'))
            .collect();
        if !names.is_empty() {
            out.push_str("Conffiles:\n");
            for n in names {
                // dpkg's marker for a conffile unpacked but not yet configured.
                let _ = writeln!(out, " {n} newconffile");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pkg(control: &str) -> Unpacked {
        let mut files = BTreeMap::new();
        files.insert("control".to_string(), control.as_bytes().to_vec());
        files.insert("postinst".to_string(), b"#!/bin/sh\n".to_vec());
        Unpacked {
            control: ControlFiles { files },
            paths: vec!["/".into(), "/usr/bin/x".into()],
        }
    }

    #[test]
    fn a_planted_database_link_is_followed_inside_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("var/lib")).unwrap();
        // A package shipped `/var/lib/dpkg` as a link to a host directory.
        std::os::unix::fs::symlink(outside.path(), root.path().join("var/lib/dpkg")).unwrap();
        let image = InRoot::open(root.path()).unwrap();
        let p = pkg("Package: hello\nVersion: 1\nArchitecture: amd64\n");
        // Dangling inside the root: refused, nothing written anywhere.
        assert!(write_db(&image, std::slice::from_ref(&p)).is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        let inside = root.path().join(outside.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        write_db(&image, std::slice::from_ref(&p)).unwrap();
        add_one(&image, &pkg("Package: two\nVersion: 1\n")).unwrap();
        remove_one(&image, "hello").unwrap();
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // The link's target, taken inside the root, holds the database.
        let status = std::fs::read_to_string(inside.join("status")).unwrap();
        assert!(
            status.contains("Package: two\nStatus: install ok unpacked\n"),
            "{status}"
        );
        assert!(!status.contains("hello"), "{status}");
        assert!(inside.join("info/two.postinst").is_file());
        assert!(!inside.join("info/hello.postinst").exists());
    }

    #[test]
    fn a_package_name_that_names_a_path_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let image = InRoot::open(root.path()).unwrap();
        for control in [
            "Package: ../../../../etc/cron.d/x\n",
            "Package: a/b\n",
            "Package: ok\nMulti-Arch: same\nArchitecture: ../x\n",
            "Package: \n",
        ] {
            let e = write_db(&image, &[pkg(control)]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{control}");
        }
        assert_eq!(
            remove_one(&image, "../status").unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert!(checked_stem("libc6:amd64").is_ok());
        assert!(checked_stem("g++-12").is_ok());
    }
}
