//! A spec's `files: source:` as a root build reads it, while the spec's owner (the ordinary
//! account) swaps the named file for a symlink to `/etc/shadow` in a loop: the builder reads
//! the file it opened beneath the spec's directory, or refuses; it never copies the link's
//! target. A source reached through a symlink (a link itself, or a symlinked directory on the
//! way) is refused outright.

use imgbuild::pipeline::{PipelineError, to_customization};
use std::path::Path;
use std::process::Stdio;

const CONTENT: &[u8] = b"the spec's own file\n";

fn spec(dir: &Path, source: &str) -> std::path::PathBuf {
    let p = dir.join("job.vse.yaml");
    std::fs::write(
        &p,
        format!(
            "version: 1\nname: sources\nbase:\n  distribution: debian\n  suite: bookworm\n  \
             architecture: amd64\n  components: [main]\nkernel: linux-image-cloud-amd64\n\
             files:\n  - path: /etc/stolen\n    source: {source}\n"
        ),
    )
    .unwrap();
    p
}

/// Ends the account's loop however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The content of the customization's one file, or the read error.
fn read(env: &vsec::env::EffectiveEnv) -> Result<Vec<u8>, PipelineError> {
    to_customization(env, Path::new("")).map(|c| c.files[0].content.clone())
}

fn env_of(spec: &Path) -> vsec::env::EffectiveEnv {
    let s = vsec::spec::load(spec).expect("the spec parses");
    vsec::merge::merge(&s, &[]).expect("the spec merges")
}

#[test]
fn a_spec_source_swapped_for_a_symlink_is_never_followed() {
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let shadow = std::fs::read("/etc/shadow").expect("root reads /etc/shadow");
    let scratch = t.scratch("sources");
    let dir = scratch.path();
    t.write(&dir.join("data.txt"), CONTENT);
    let env = env_of(&spec(dir, "data.txt"));
    assert_eq!(read(&env).unwrap(), CONTENT);

    // The account swaps data.txt between a symlink to /etc/shadow and a regular file, as
    // fast as it can, while the builder reads it.
    let swapper = t
        .command("sh")
        .arg("-c")
        .arg(
            "cd \"$1\" && while :; do ln -sfn /etc/shadow l && mv -T l data.txt; \
             printf 'the spec'\"'\"'s own file\\n' > f && mv -T f data.txt; done",
        )
        .arg("sh")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _swapper = KillOnDrop(swapper);
    let (mut copied, mut refused) = (0, 0);
    // Until both states were seen many times (the account's loop needs a moment to start).
    for _ in 0..1_000_000 {
        if copied >= 1000 && refused >= 1000 {
            break;
        }
        match read(&env) {
            Ok(bytes) => {
                assert!(
                    bytes != shadow,
                    "the builder copied /etc/shadow through the swapped symlink"
                );
                assert_eq!(bytes, CONTENT);
                copied += 1;
            }
            Err(e @ PipelineError::FileSource { .. }) => {
                if refused == 0 {
                    eprintln!("refused: {e}");
                }
                refused += 1;
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    eprintln!("{copied} reads of the file, {refused} refusals of the symlink");
    // Both states were seen: the race was run.
    assert!(refused > 0, "the swap never raced the read");
}

#[test]
fn a_spec_source_through_a_symlink_is_refused_named() {
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let scratch = t.scratch("sources-link");
    let dir = scratch.path();
    t.write(&dir.join("data.txt"), CONTENT);
    let env = env_of(&spec(dir, "data.txt"));
    // Once the spec is checked, the account replaces the file by a link inside its own
    // directory, then a directory on the way by a link to /etc: both refused at the read.
    let link = |target: &str, at: &Path| {
        let s = t
            .command("ln")
            .args(["-sfn", target])
            .arg(at)
            .status()
            .unwrap();
        assert!(s.success());
    };
    t.write(&dir.join("other.txt"), CONTENT);
    std::fs::remove_file(dir.join("data.txt")).unwrap();
    link("other.txt", &dir.join("data.txt"));
    let e = read(&env).expect_err("a symlink is refused");
    let text = e.to_string();
    assert!(
        text.contains("/etc/stolen") && text.contains("symlink") && text.contains("hint:"),
        "{text}"
    );
    assert_eq!(
        vse_exit::Classify::kind(&e),
        vse_exit::ErrorKind::InvalidInput
    );

    std::fs::create_dir(dir.join("sub")).unwrap();
    t.chown(&dir.join("sub"));
    t.write(&dir.join("sub/shadow"), CONTENT);
    let env = env_of(&spec(dir, "sub/shadow"));
    std::fs::remove_dir_all(dir.join("sub")).unwrap();
    link("/etc", &dir.join("sub"));
    let e = read(&env).expect_err("a symlinked directory on the way is refused");
    assert!(matches!(e, PipelineError::FileSource { .. }), "{e}");
}
