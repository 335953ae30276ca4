//! The root filesystem: unpack every locked package, write dpkg's database, then let the
//! image's own dpkg configure it (maintainer scripts in dpkg's order).

pub mod chroot;
pub mod confine;
pub mod dpkgdb;
pub mod idbase;
pub mod inroot;
mod order;
pub mod sandbox;

use crate::deb::{self, DebError, DebFile, ExtractError, Kind, Meta, Records};
use crate::progress::{Event, Progress};
use chroot::{ChrootError, RunOptions, base_env, run_in_root};
pub use dpkgdb::Unpacked;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error(transparent)]
    Deb(#[from] DebError),
    #[error("{deb}: {source}")]
    Extract { deb: String, source: ExtractError },
    #[error("writing the rootfs at {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the image has no {what}, so its packages cannot be configured; hint: a VSE image is a Debian system, lock the `Priority: required` set (it brings dpkg and dash)"
    )]
    NotConfigurable { what: &'static str },
    #[error(transparent)]
    Chroot(#[from] ChrootError),
}

/// Unpacked data tarballs, by `.deb` (the error path of [`deb::read_deb`]).
enum UnpackFail {
    Deb(DebError),
    Extract(ExtractError),
}

impl From<DebError> for UnpackFail {
    fn from(e: DebError) -> Self {
        UnpackFail::Deb(e)
    }
}

/// Directories merged into `/usr` (Debian 12 default): made by the builder, not by packages,
/// so that `/bin/sh` from a package lands in `/usr/bin` through our own symlink.
const MERGED_USR: &[&str] = &["bin", "sbin", "lib", "lib64"];

/// Unpacks `debs` (name, path) into `root` in order. `limit` bounds each data tarball.
pub fn unpack_all(
    root: &Path,
    debs: &[(String, DebFile)],
    limit: u64,
    progress: &dyn Progress,
) -> Result<(Records, Vec<Unpacked>), RootfsError> {
    let (records, pkgs) = unpack_all_with_own(root, debs, limit, progress)?;
    Ok((records, pkgs.into_iter().map(|(u, _)| u).collect()))
}

/// [`unpack_all`], also returning what each package itself wrote (for the layer store).
pub fn unpack_all_with_own(
    root: &Path,
    debs: &[(String, DebFile)],
    limit: u64,
    progress: &dyn Progress,
) -> Result<(Records, Vec<(Unpacked, Records)>), RootfsError> {
    let mut records = Records::new();
    let dir_meta = Meta {
        kind: Kind::Dir,
        perm: 0o755,
        uid: 0,
        gid: 0,
    };
    records.insert("/".into(), dir_meta);
    for d in MERGED_USR {
        let target = root.join("usr").join(d);
        std::fs::create_dir_all(&target).map_err(|source| RootfsError::Io {
            path: target.clone(),
            source,
        })?;
        let link = root.join(d);
        // An earlier unpack into the same tree may have made it already.
        if !std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            std::os::unix::fs::symlink(format!("usr/{d}"), &link)
                .map_err(|source| RootfsError::Io { path: link, source })?;
        }
        records.insert(format!("/usr/{d}"), dir_meta);
        records.insert(
            format!("/{d}"),
            Meta {
                kind: Kind::Symlink,
                perm: 0o777,
                ..dir_meta
            },
        );
    }
    let mut pkgs = Vec::with_capacity(debs.len());
    let files: Vec<&DebFile> = debs.iter().map(|(_, d)| d).collect();
    deb::ahead::for_each_in_order(&files, limit, deb::ahead::threads(), |i, read| {
        let (name, deb) = &debs[i];
        let (u, own) = match read? {
            deb::ahead::Decoded::Buffered { control, data } => {
                unpack_decoded(root, name, deb, control, &data, limit)?
            }
            deb::ahead::Decoded::Large => unpack_one(root, name, deb, limit)?,
        };
        // Later packages win, as when unpacking into one map.
        records.extend(own.iter().map(|(k, m)| (k.clone(), *m)));
        progress.event(Event::Unpacked { name: name.clone() });
        pkgs.push((u, own));
        Ok::<(), RootfsError>(())
    })?;
    let unpacked: Vec<Unpacked> = pkgs.iter().map(|(u, _)| u.clone()).collect();
    let io = |source| RootfsError::Io {
        path: root.join("var/lib/dpkg"),
        source,
    };
    let image = inroot::InRoot::open(root).map_err(io)?;
    dpkgdb::write_db(&image, &unpacked).map_err(io)?;
    Ok((records, pkgs))
}

/// Unpacks one `.deb` into `root`; returns it as dpkg will see it and the metadata of the
/// paths it wrote (its own: merged by the caller, later packages winning).
pub fn unpack_one(
    root: &Path,
    name: &str,
    deb: &DebFile,
    limit: u64,
) -> Result<(Unpacked, Records), RootfsError> {
    let path = deb.path.as_path();
    let mut own = Records::new();
    let mut paths = Vec::new();
    let control = deb::read_deb(deb, limit, |data| {
        paths = deb::extract_data(data, root, &mut own).map_err(|e| match e {
            // Decompression and size-limit failures surface as read errors.
            ExtractError::Read(io) => {
                UnpackFail::Deb(deb::archive::member_error(path, "data.tar", limit, io))
            }
            other => UnpackFail::Extract(other),
        })?;
        Ok::<(), UnpackFail>(())
    })
    .map_err(|e| match e {
        UnpackFail::Deb(e) => RootfsError::Deb(e),
        UnpackFail::Extract(source) => RootfsError::Extract {
            deb: format!("{name} ({})", path.display()),
            source,
        },
    })?;
    Ok((Unpacked { control, paths }, own))
}

/// [`unpack_one`] of a package already read and verified whole ([`deb::ahead`]).
fn unpack_decoded(
    root: &Path,
    name: &str,
    deb: &DebFile,
    control: deb::ControlFiles,
    data: &[u8],
    limit: u64,
) -> Result<(Unpacked, Records), RootfsError> {
    let mut own = Records::new();
    let paths = deb::extract_data(&mut &data[..], root, &mut own).map_err(|e| match e {
        ExtractError::Read(io) => {
            RootfsError::Deb(deb::archive::member_error(&deb.path, "data.tar", limit, io))
        }
        source => RootfsError::Extract {
            deb: format!("{name} ({})", deb.path.display()),
            source,
        },
    })?;
    Ok((Unpacked { control, paths }, own))
}

/// Runs the maintainer scripts: every `preinst install` in Pre-Depends order, then the
/// image's `dpkg --configure -a`, with service starts denied by a temporary policy-rc.d.
pub fn configure(
    root: &Path,
    pkgs: &[Unpacked],
    epoch: u64,
    progress: &dyn Progress,
) -> Result<(), RootfsError> {
    for (what, p) in [("/bin/sh", "usr/bin/sh"), ("dpkg", "usr/bin/dpkg")] {
        if std::fs::symlink_metadata(root.join(p)).is_err() {
            return Err(RootfsError::NotConfigurable { what });
        }
    }
    let env = base_env(epoch);
    let out = |l: &str| progress.event(Event::ScriptOutput(l.to_string()));
    with_policy_rc(root, || {
        for p in order::pre_depends_order(pkgs) {
            if p.control.files.contains_key("preinst") {
                let script = format!("/var/lib/dpkg/info/{}.preinst", p.info_stem());
                // What dpkg itself exports to maintainer scripts (dpkg-maintscript-helper needs it).
                let mut env = env.clone();
                let arch = p.control.field("Architecture").unwrap_or("all").to_string();
                env.extend([
                    ("DPKG_MAINTSCRIPT_PACKAGE".into(), p.name().to_string()),
                    ("DPKG_MAINTSCRIPT_NAME".into(), "preinst".into()),
                    ("DPKG_MAINTSCRIPT_ARCH".into(), arch),
                    ("DPKG_ROOT".into(), String::new()),
                    ("DPKG_ADMINDIR".into(), "/var/lib/dpkg".into()),
                ]);
                run_in_root(
                    root,
                    &[&script, "install"],
                    &env,
                    &RunOptions::default(),
                    &out,
                )?;
            }
        }
        configure_pending(root, &env, &out)
    })?;
    scrub(root);
    Ok(())
}

/// The image's own `dpkg --configure -a`: every unpacked package to installed.
fn configure_pending(
    root: &Path,
    env: &[(String, String)],
    out: &dyn Fn(&str),
) -> Result<(), RootfsError> {
    run_in_root(
        root,
        &[
            "/usr/bin/dpkg",
            "--configure",
            "-a",
            "--force-confdef",
            "--force-confold",
        ],
        env,
        &RunOptions::default(),
        out,
    )?;
    Ok(())
}

/// Configures packages unpacked into an already configured image (no preinst: only
/// packages without maintainer scripts are added this way), then scrubs as [`configure`].
pub fn configure_added(
    root: &Path,
    epoch: u64,
    progress: &dyn Progress,
) -> Result<(), RootfsError> {
    let env = base_env(epoch);
    let out = |l: &str| progress.event(Event::ScriptOutput(l.to_string()));
    with_policy_rc(root, || configure_pending(root, &env, &out))?;
    scrub(root);
    Ok(())
}

/// Runs `f` with service starts denied by a temporary policy-rc.d (removed afterwards unless
/// the image has its own).
fn with_policy_rc(
    root: &Path,
    f: impl FnOnce() -> Result<(), RootfsError>,
) -> Result<(), RootfsError> {
    let rel = "usr/sbin/policy-rc.d";
    let io = |source| RootfsError::Io {
        path: root.join(rel),
        source,
    };
    // Scripts of an earlier step may have run in this root: no link is followed out of it.
    let image = inroot::InRoot::open(root).map_err(io)?;
    let had_policy = image.lstat(rel).is_ok();
    if !had_policy {
        let script = "#!/bin/sh\n# vse build: no services start in the builder\nexit 101\n";
        image.write_new(rel, script.as_bytes(), 0o755).map_err(io)?;
    }
    let result = f();
    if !had_policy {
        let _ = image.remove_file(rel);
    }
    result
}

/// Removes build-time leftovers that differ from build to build (logs, backups).
pub fn scrub(root: &Path) {
    let image = inroot::InRoot::open(root);
    for f in [
        "var/log/dpkg.log",
        "var/log/alternatives.log",
        "var/lib/dpkg/status-old",
        "var/lib/dpkg/diversions-old",
        "var/lib/dpkg/statoverride-old",
        "var/cache/debconf/config.dat-old",
        "var/cache/debconf/templates.dat-old",
        "var/cache/debconf/passwords.dat-old",
        "var/cache/ldconfig/aux-cache",
        "etc/passwd-",
        "etc/group-",
        "etc/shadow-",
        "etc/gshadow-",
    ] {
        // Resolved inside the root: a planted `var/log -> /var/log` must not reach the host.
        if let Ok(image) = &image {
            let _ = image.remove_file(f);
        }
    }
}
