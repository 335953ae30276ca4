//! dpkg's database for packages we unpacked ourselves: `/var/lib/dpkg/status` with every
//! package `install ok unpacked`, and `info/<pkg>.{list,md5sums,conffiles,postinst,...}`.
//! The image's own `dpkg --configure -a` then takes them to `installed`, exactly as after a
//! `dpkg --unpack`, so the result is a real dpkg-managed system.

use crate::deb::ControlFiles;
use std::fmt::Write as _;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

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

/// Writes the database for `pkgs` into `root/var/lib/dpkg` (status sorted by name).
pub fn write_db(root: &Path, pkgs: &[Unpacked]) -> io::Result<()> {
    let db = root.join("var/lib/dpkg");
    let info = db.join("info");
    for d in ["info", "updates", "triggers", "alternatives", "parts"] {
        std::fs::create_dir_all(db.join(d))?;
    }
    for f in ["available", "diversions", "statoverride"] {
        if !db.join(f).exists() {
            std::fs::write(db.join(f), "")?;
        }
    }
    let mut sorted: Vec<&Unpacked> = pkgs.iter().collect();
    sorted.sort_by_key(|p| p.info_stem());
    let mut status = String::new();
    for p in sorted {
        write_info(&info, p)?;
        status.push_str(&status_stanza(p));
        status.push('\n');
    }
    std::fs::write(db.join("status"), status)
}

/// `info/<stem>.list` and the control files dpkg keeps.
fn write_info(info: &Path, p: &Unpacked) -> io::Result<()> {
    let stem = p.info_stem();
    let mut list = String::new();
    for path in &p.paths {
        // dpkg lists the root as `/.`.
        list.push_str(if path == "/" { "/." } else { path });
        list.push('\n');
    }
    std::fs::write(info.join(format!("{stem}.list")), list)?;
    for name in INFO_FILES {
        if let Some(data) = p.control.files.get(*name) {
            let dest = info.join(format!("{stem}.{name}"));
            std::fs::write(&dest, data)?;
            let mode = if SCRIPTS.contains(name) { 0o755 } else { 0o644 };
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

/// Adds one unpacked package to the database of a configured image (its `.list`, control
/// files and an `install ok unpacked` stanza), for the image's dpkg to configure.
pub fn add_one(root: &Path, p: &Unpacked) -> io::Result<()> {
    let db = root.join("var/lib/dpkg");
    write_info(&db.join("info"), p)?;
    let path = db.join("status");
    let mut status = std::fs::read_to_string(&path)?;
    status.push_str(&status_stanza(p));
    status.push('\n');
    std::fs::write(path, status)
}

/// Removes a package from the database of a configured image: its info files and its
/// status stanza (the rest of dpkg's own text is kept as it is).
pub fn remove_one(root: &Path, stem: &str) -> io::Result<()> {
    let db = root.join("var/lib/dpkg");
    for name in INFO_FILES.iter().chain(&["list"]) {
        let f = db.join("info").join(format!("{stem}.{name}"));
        if f.exists() {
            std::fs::remove_file(f)?;
        }
    }
    let (name, arch) = stem
        .split_once(':')
        .map_or((stem, None), |(n, a)| (n, Some(a)));
    let path = db.join("status");
    let status = std::fs::read_to_string(&path)?;
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
    std::fs::write(path, kept.concat())
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
