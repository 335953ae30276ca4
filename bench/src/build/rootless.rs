//! The rootless figures of `vse bench build`: the same lock built by an ordinary user (in a
//! user namespace of its subordinate ids) and by root, both without layers from a warm
//! download cache (a user's build keeps none, so root's is told not to use them either), and
//! whether the two images are the same bytes.

use super::{Bench, Row};
use crate::BenchError;
use crate::error::Context;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use vse_image::Manifest;

impl Bench<'_> {
    pub(super) fn rootless_figures(
        &self,
        user: &str,
        spec: &Path,
        row: &mut Row,
    ) -> Result<(), BenchError> {
        let (uid, gid) = (id_of(user, "-u")?, id_of(user, "-g")?);
        // Each side builds copies of the same inputs, under the same names, in its own
        // directory as deep as the other's (a lock names its inputs by relative paths): the
        // user's must be the user's, root's must not be writable by the user.
        let top = tempfile::Builder::new()
            .prefix("vse-bench-rootless-")
            .tempdir()
            .context("creating the user's directory")?;
        let mine = self.dir.join("rootless");
        let theirs = top.path().join("s0/rootless");
        std::fs::create_dir_all(&mine)?;
        std::fs::create_dir_all(&theirs)?;
        let mut inputs = vec![spec.to_path_buf()];
        inputs.extend(self.a.policies.iter().cloned());
        let name = |p: &Path| p.file_name().map(Path::new).unwrap_or(p).to_path_buf();
        for dir in [&theirs, &mine] {
            for p in &inputs {
                std::fs::copy(p, dir.join(name(p)))?;
            }
        }
        let lock = mine.join("env.lock");
        let mut c = self.vse();
        c.arg("lock")
            .arg(mine.join(name(spec)))
            .arg("-o")
            .arg(&lock);
        c.arg("--quiet").current_dir(&mine);
        for p in &self.a.policies {
            c.arg("--policy").arg(mine.join(name(p)));
        }
        if self.a.allow_expired {
            c.arg("--allow-expired");
        }
        self.timed("vse lock (the rootless pair's inputs)", c)?;
        std::fs::copy(&lock, theirs.join("env.lock"))?;
        for d in [top.path(), &top.path().join("s0"), &theirs] {
            chown_dir(d, uid, gid)?;
        }

        let mut root = self.build_cmd(&lock, "rootless/root.img");
        root.env("VSE_CACHE", mine.join("vse-cache"))
            .arg("--no-layers");
        let root_t = self.timed("vse build as root (warm download cache, no layer)", root)?;
        let as_user = |out: &str| {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .args(["--clear-groups", "--"])
                .arg(self.env.vse)
                .args(["build", "env.lock", "-o", out, "--quiet"])
                .env("HOME", top.path())
                .env("VSE_CACHE", top.path().join("cache"))
                .current_dir(&theirs);
            if let Some(agent) = &self.a.agent {
                c.arg("--agent").arg(agent);
            }
            c
        };
        self.timed(
            &format!("vse build as {user} (fills its download cache)"),
            as_user("first.img"),
        )?;
        let _ = std::fs::remove_dir_all(theirs.join("first.img"));
        let user_t = self.timed(
            &format!("vse build as {user} (rootless, warm download cache, no layer)"),
            as_user("user.img"),
        )?;
        let parts = |dir: &Path| {
            Manifest::read(dir).map(|m| {
                (m.parts.into_iter())
                    .map(|(k, p)| (k, p.sha256))
                    .collect::<Vec<_>>()
            })
        };
        let (a, b) = (
            parts(&mine.join("root.img")),
            parts(&theirs.join("user.img")),
        );
        if a.is_none() || b.is_none() {
            return Err(BenchError::Failed(
                "a rootless pair's build wrote no manifest".into(),
            ));
        }
        row.rootless_user = Some(user.to_string());
        row.root_no_layer_build_s = Some(root_t.as_secs_f64());
        row.rootless_build_s = Some(user_t.as_secs_f64());
        row.rootless_vs_root = Some(user_t.as_secs_f64() / root_t.as_secs_f64());
        row.rootless_identical = Some(a == b);
        let _ = std::fs::remove_dir_all(&mine);
        Ok(())
    }
}

fn id_of(user: &str, flag: &str) -> Result<u32, BenchError> {
    let o = Command::new("id")
        .arg(flag)
        .arg(user)
        .output()
        .context("running id")?;
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .map_err(|_| BenchError::Invalid(format!("--rootless-user {user}: no such account")))
}

/// Hands `dir` and what it holds to the user (0700: the build's inputs are the user's own).
fn chown_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), BenchError> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
    for e in std::fs::read_dir(dir)? {
        std::os::unix::fs::chown(e?.path(), Some(uid), Some(gid))?;
    }
    Ok(())
}
