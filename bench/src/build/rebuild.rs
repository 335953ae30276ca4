//! Rebuilds against the full build (one package added, one spec file changed), the
//! mmdebstrap peer, and `vse launch SPEC`'s image-store hit.

use super::{Bench, BuildBench, Env, Row};
use crate::BenchError;
use imgbuild::pipeline::ImageStore;
use imgbuild::progress::Silent;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use vsec::lock::Lockfile;

impl Bench<'_> {
    /// The built image rebuilt with one more package, then with one spec file changed (specs
    /// that have no `files:` of their own), against the full build.
    pub(super) fn rebuild_figures(&self, spec: &Path, row: &mut Row) -> Result<(), BenchError> {
        let added = self.dir.join("added.lock");
        let add = &self.a.add_package;
        self.timed("vse lock", self.lock_cmd(spec, &added, Some(add)))?;
        let (t, report) = self.timed_build(
            &format!("vse build (the image plus {add})"),
            &added,
            "warm.img",
        )?;
        row.add_one_package_s = Some(t.as_secs_f64());
        row.add_one_package_vs_full = Some(t.as_secs_f64() / row.full_build_s);
        row.add_one_package_root = root_of(&report);
        row.add_one_package_phases = super::phases_of(&report);
        let text = std::fs::read_to_string(spec)?;
        if text.lines().any(|l| l.starts_with("files:")) {
            return Ok(());
        }
        // The spec with one file: built once, then rebuilt with the file's content changed.
        let mut changed = None;
        for (i, content) in ["one", "two"].iter().enumerate() {
            let s = self.dir.join("with-file.vse.yaml");
            std::fs::write(
                &s,
                format!(
                    "{text}\nfiles:\n  - path: /etc/vse-bench\n    content: \"{content}\\n\"\n"
                ),
            )?;
            let l = self.dir.join("with-file.lock");
            self.timed("vse lock", self.lock_cmd(&s, &l, None))?;
            changed = Some(self.timed_build(
                &format!("vse build (spec file, version {})", i + 1),
                &l,
                "warm.img",
            )?);
        }
        let (t, report) = changed.expect("two builds");
        row.change_one_file_s = Some(t.as_secs_f64());
        row.change_one_file_vs_full = Some(t.as_secs_f64() / row.full_build_s);
        row.change_one_file_root = root_of(&report);
        row.change_one_file_phases = super::phases_of(&report);
        Ok(())
    }

    /// mmdebstrap installing exactly the locked package names from the lock's repositories
    /// into a tarball, with its own apt archive cache kept between a warm-up run and the
    /// timed run (the documented `sync-in`/`sync-out` recipe). It resolves the names itself:
    /// `apt-get update` from the repositories, then apt's solver (so vse's side of the
    /// comparison includes its `vse lock`).
    pub(super) fn mmdebstrap(&self, l: &Lockfile) -> Result<Duration, BenchError> {
        let cache = self.dir.join("mm-cache");
        std::fs::create_dir_all(&cache)?;
        let suite = l
            .repositories
            .first()
            .map(|r| r.suite.clone())
            .ok_or_else(|| BenchError::Failed("the lock names no repository".into()))?;
        let include: Vec<String> = l.packages.iter().map(|p| p.name.to_string()).collect();
        let cmd = |out: &Path| {
            let mut c = Command::new("mmdebstrap");
            c.arg("--variant=custom")
                .arg(format!("--include={}", include.join(",")))
                .arg("--skip=essential/unlink")
                .arg("--quiet")
                .arg(format!(
                    "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/ && cp -a {}/. \"$1\"/var/cache/apt/archives/",
                    cache.display()
                ))
                .arg(format!(
                    "--customize-hook=sync-out /var/cache/apt/archives {}",
                    cache.display()
                ))
                .arg(&suite)
                .arg(out);
            for r in &l.repositories {
                c.arg(format!(
                    "deb {} {} {}",
                    r.url,
                    r.suite,
                    r.components.join(" ")
                ));
            }
            c
        };
        self.timed(
            "mmdebstrap (fills its cache)",
            cmd(&self.dir.join("mm-first.tar")),
        )?;
        let _ = std::fs::remove_file(self.dir.join("mm-first.tar"));
        let t = self.timed("mmdebstrap (warm cache)", cmd(&self.dir.join("mm.tar")))?;
        let _ = std::fs::remove_file(self.dir.join("mm.tar"));
        Ok(t)
    }
}

/// How a build's root was made, from its `--json` report (the image does not say).
fn root_of(report: &[u8]) -> Option<String> {
    use imgbuild::layers::base::RootSource;
    let v: serde_json::Value = serde_json::from_slice(report).ok()?;
    Some(match serde_json::from_value(v.get("root")?.clone()).ok()? {
        RootSource::Clean { why } => format!("clean: {why}"),
        RootSource::Layer { .. } => "layer".into(),
        RootSource::Delta { added, removed, .. } => {
            format!("delta +[{}] -[{}]", added.join(" "), removed.join(" "))
        }
    })
}

/// `vse launch SPEC`'s work before the launch, on its second run: the image store
/// (`$VSE_CACHE/images`) then has the image, so this is check + lock + a cache hit.
pub(super) fn launch_spec_hit(
    a: &BuildBench,
    env: &Env,
    spec: &Path,
) -> Result<Duration, BenchError> {
    let prepare = || -> Result<PathBuf, BenchError> {
        let merged = imgbuild::pipeline::load_env(spec, &a.policies)
            .map_err(imgbuild::pipeline::PipelineError::from)?;
        let built = ImageStore::default().image_for_spec(
            spec,
            &a.policies,
            &merged,
            env.agent.clone(),
            &Silent,
        )?;
        Ok(built.dir)
    };
    (env.step)("vse launch SPEC's image (fills the image store)");
    prepare()?;
    let t = Instant::now();
    prepare()?;
    Ok(t.elapsed())
}
