//! Throwaway OpenPGP keys for the `images.signed_by` tests: a good signing key, one that
//! expired, one that was revoked, and one whose signature comes from a subkey bound without
//! the signing flag.

use chrono::SubsecRound as _;
use pgp::composed::{
    ArmorOptions, KeyType, SecretKeyParamsBuilder, SignedPublicKey, SignedSecretKey,
    StandaloneSignature, SubkeyParamsBuilder,
};
use pgp::packet::{SignatureConfig, SignatureType, Subpacket, SubpacketData};
use pgp::types::{KeyDetails, Password};
use rand::SeedableRng;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Good,
    Expired,
    Revoked,
    /// Signs with a subkey whose binding lacks the signing flag.
    NonSigningSubkey,
}

pub struct Key {
    pub kind: Kind,
    secret: SignedSecretKey,
    /// The armored public key: what a policy's `signed_by` names.
    pub public: PathBuf,
    /// The armored secret key: what `vse sign --key` takes.
    pub secret_file: PathBuf,
}

pub fn key(dir: &Path, name: &str, kind: Kind, seed: u64) -> Key {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut b = SecretKeyParamsBuilder::default();
    b.key_type(KeyType::Ed25519Legacy)
        .can_sign(true)
        .can_certify(true)
        .primary_user_id(format!("{name} <{name}@example.org>"));
    let now = chrono::Utc::now().trunc_subsecs(0);
    if kind == Kind::Expired {
        b.created_at(now - chrono::Duration::days(10));
    }
    if kind == Kind::NonSigningSubkey {
        b.subkey(
            SubkeyParamsBuilder::default()
                .key_type(KeyType::Ed25519Legacy)
                .can_sign(false)
                .can_authenticate(true)
                .build()
                .unwrap(),
        );
    }
    let secret = b
        .build()
        .unwrap()
        .generate(&mut rng)
        .unwrap()
        .sign(&mut rng, &Password::empty())
        .unwrap();
    let mut public: SignedPublicKey = secret.signed_public_key();
    if kind == Kind::Expired {
        // rPGP's builder does not write a key expiration subpacket: a new self-signature
        // says the key expired a day after it was made.
        let pk = &secret.primary_key;
        let mut cfg = SignatureConfig::from_key(&mut rng, pk, SignatureType::CertPositive).unwrap();
        let mut flags = pgp::packet::KeyFlags::default();
        flags.set_sign(true);
        flags.set_certify(true);
        cfg.hashed_subpackets = vec![
            Subpacket::regular(SubpacketData::IssuerFingerprint(pk.fingerprint())).unwrap(),
            Subpacket::regular(SubpacketData::SignatureCreationTime(
                now - chrono::Duration::days(9),
            ))
            .unwrap(),
            Subpacket::regular(SubpacketData::KeyExpirationTime(chrono::Duration::days(1)))
                .unwrap(),
            Subpacket::regular(SubpacketData::KeyFlags(flags)).unwrap(),
        ];
        let user = &mut public.details.users[0];
        let sig = cfg
            .sign_certification(
                pk,
                &public.primary_key,
                &Password::empty(),
                pgp::types::Tag::UserId,
                &user.id,
            )
            .unwrap();
        user.signatures = vec![sig];
    }
    if kind == Kind::Revoked {
        let pk = &secret.primary_key;
        let mut cfg =
            SignatureConfig::from_key(&mut rng, pk, SignatureType::KeyRevocation).unwrap();
        cfg.hashed_subpackets = vec![
            Subpacket::regular(SubpacketData::IssuerFingerprint(pk.fingerprint())).unwrap(),
            Subpacket::regular(SubpacketData::SignatureCreationTime(
                chrono::Utc::now().trunc_subsecs(0),
            ))
            .unwrap(),
        ];
        let rev = cfg
            .sign_key(pk, &Password::empty(), &public.primary_key)
            .unwrap();
        public.details.revocation_signatures.push(rev);
    }
    let public_file = dir.join(format!("{name}.pub.asc"));
    let secret_file = dir.join(format!("{name}.key.asc"));
    std::fs::write(
        &public_file,
        public.to_armored_string(ArmorOptions::default()).unwrap(),
    )
    .unwrap();
    std::fs::write(
        &secret_file,
        secret.to_armored_string(ArmorOptions::default()).unwrap(),
    )
    .unwrap();
    Key {
        kind,
        secret,
        public: public_file,
        secret_file,
    }
}

impl Key {
    /// Writes `manifest.json.asc` of `image` as this key signs: `vse sign` (the primary key),
    /// or, for [`Kind::NonSigningSubkey`], a signature made with the subkey.
    pub fn sign(&self, vse: &str, image: &Path) {
        if self.kind != Kind::NonSigningSubkey {
            let o = std::process::Command::new(vse)
                .arg("sign")
                .arg(image)
                .arg("--key")
                .arg(&self.secret_file)
                .output()
                .unwrap();
            assert!(o.status.success(), "vse sign: {o:?}");
            return;
        }
        self.sign_manifest(image);
    }

    /// Signs `image`'s manifest.json as it is, parts unchecked (the test's own shortcut:
    /// `vse sign` hashes every part first).
    pub fn sign_manifest(&self, image: &Path) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(99);
        let sub = match self.kind {
            Kind::NonSigningSubkey => &self.secret.secret_subkeys[0].key,
            _ => {
                let pk = &self.secret.primary_key;
                let mut cfg =
                    SignatureConfig::from_key(&mut rng, pk, SignatureType::Binary).unwrap();
                cfg.hashed_subpackets = vec![
                    Subpacket::regular(SubpacketData::IssuerFingerprint(pk.fingerprint())).unwrap(),
                    Subpacket::regular(SubpacketData::SignatureCreationTime(
                        chrono::Utc::now().trunc_subsecs(0),
                    ))
                    .unwrap(),
                ];
                let manifest = std::fs::read(image.join("manifest.json")).unwrap();
                let sig = cfg.sign(pk, &Password::empty(), &manifest[..]).unwrap();
                let armored = StandaloneSignature::new(sig)
                    .to_armored_string(ArmorOptions::default())
                    .unwrap();
                std::fs::write(image.join("manifest.json.asc"), armored).unwrap();
                return;
            }
        };
        let mut cfg = SignatureConfig::from_key(&mut rng, sub, SignatureType::Binary).unwrap();
        cfg.hashed_subpackets = vec![
            Subpacket::regular(SubpacketData::IssuerFingerprint(sub.fingerprint())).unwrap(),
            Subpacket::regular(SubpacketData::SignatureCreationTime(
                chrono::Utc::now().trunc_subsecs(0),
            ))
            .unwrap(),
        ];
        let manifest = std::fs::read(image.join("manifest.json")).unwrap();
        let sig = cfg.sign(sub, &Password::empty(), &manifest[..]).unwrap();
        let armored = StandaloneSignature::new(sig)
            .to_armored_string(ArmorOptions::default())
            .unwrap();
        std::fs::write(image.join("manifest.json.asc"), armored).unwrap();
    }
}

/// A site key the job user may read: a 0755 directory under `/tmp` (kept while the returned
/// directory lives) holding the `Good` key `site`, its public half 0644.
pub fn readable_site_key() -> (tempfile::TempDir, Key) {
    let keys = tempfile::Builder::new()
        .prefix("vse-swap-keys")
        .tempdir_in("/tmp")
        .unwrap();
    chmod(keys.path(), 0o755);
    let k = key(keys.path(), "site", Kind::Good, 1);
    chmod(&k.public, 0o644);
    (keys, k)
}

/// Sets `p`'s mode (root's test files the job user must read).
pub fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap()
}

/// An image the job user owns and can swap parts of: `img/` (a copy of `base`, its manifest
/// renamed per try so every try makes a fresh copy), `evil.ext4` (the root disk with
/// `/vse-swap-marker` saying SWAPPED, same size), and manifests to swap in.
pub struct SwapKit {
    pub img: PathBuf,
    dir: PathBuf,
    base_manifest: serde_json::Value,
    evil_sha: String,
}

/// What a guest prints: `clean`, or the marker of the swapped root disk; then who the command
/// runs as and where ([`who`]).
pub const PROBE: &str = "cat /vse-swap-marker 2>/dev/null || echo clean; \
    echo \"who=$(id -u):$(id -g):$(id -G):$(id -un):$HOME\"; echo \"cwd=$(pwd)\"";

/// The `who=` line of [`PROBE`] for a command run as `t`: its uid, gid, groups (its own only),
/// name and home, as the host has them.
pub fn who(t: &testkit::unpriv::Tester) -> String {
    format!(
        "who={}:{}:{}:{}:{}",
        t.uid,
        t.gid,
        t.gid,
        t.name,
        t.home.display()
    )
}

impl SwapKit {
    pub fn new(tester: &testkit::unpriv::Tester, base: &Path, dir: &Path) -> SwapKit {
        let img = dir.join("img");
        std::fs::create_dir(&img).unwrap();
        for f in ["vmlinuz", "initrd.img", "root.ext4", "manifest.json"] {
            let st = std::process::Command::new("cp")
                .arg("--sparse=always")
                .arg(base.join(f))
                .arg(img.join(f))
                .status()
                .unwrap();
            assert!(st.success());
        }
        std::fs::hard_link(img.join("root.ext4"), dir.join("good.ext4")).unwrap();
        let evil = dir.join("evil.ext4");
        let st = std::process::Command::new("cp")
            .arg("--sparse=always")
            .arg(img.join("root.ext4"))
            .arg(&evil)
            .status()
            .unwrap();
        assert!(st.success());
        let marker = dir.join("marker");
        std::fs::write(&marker, "SWAPPED\n").unwrap();
        let o = std::process::Command::new("debugfs")
            .arg("-w")
            .arg("-R")
            .arg(format!("write {} vse-swap-marker", marker.display()))
            .arg(&evil)
            .output()
            .unwrap();
        assert!(o.status.success(), "debugfs: {o:?}");
        let o = std::process::Command::new("sha256sum")
            .arg(&evil)
            .output()
            .unwrap();
        let evil_sha = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        let base_manifest =
            serde_json::from_slice(&std::fs::read(img.join("manifest.json")).unwrap()).unwrap();
        for p in [dir.to_path_buf(), img.clone(), evil, marker] {
            walk_chown(tester, &p);
        }
        SwapKit {
            img,
            dir: dir.to_path_buf(),
            base_manifest,
            evil_sha,
        }
    }

    /// Try `n`'s manifest (signed by `key`) in place, the good root disk under `root.ext4`,
    /// and the files the racer swaps in: `good.ext4`/`bad.ext4` (hard links),
    /// `good.json`/`bad.json` (the bad one names the swapped disk's digest).
    pub fn arm(&self, tester: &testkit::unpriv::Tester, n: u32, key: &Key) {
        let mut m = self.base_manifest.clone();
        m["builder"] = format!("{} (swap try {n})", m["builder"].as_str().unwrap_or("")).into();
        let good = serde_json::to_string_pretty(&m).unwrap();
        m["parts"]["root"]["sha256"] = self.evil_sha.clone().into();
        let bad = serde_json::to_string_pretty(&m).unwrap();
        std::fs::write(self.img.join("manifest.json"), &good).unwrap();
        key.sign_manifest(&self.img);
        std::fs::write(self.img.join("good.json"), &good).unwrap();
        std::fs::write(self.img.join("bad.json"), &bad).unwrap();
        // Link names let the racer swap by rename; each try starts from the good disk.
        for (from, to) in [
            ("good.ext4", "good.ext4"),
            ("good.ext4", "root.ext4"),
            ("evil.ext4", "bad.ext4"),
        ] {
            let _ = std::fs::remove_file(self.img.join(to));
            std::fs::hard_link(self.dir.join(from), self.img.join(to)).unwrap();
        }
        walk_chown(tester, &self.img);
    }

    /// Puts the good root disk and manifest back (the racer stopped).
    pub fn settle(&self) {
        std::fs::copy(self.img.join("good.json"), self.img.join("manifest.json")).unwrap();
        let _ = std::fs::remove_file(self.img.join("root.ext4"));
        std::fs::hard_link(self.img.join("good.ext4"), self.img.join("root.ext4")).unwrap();
    }

    /// SHA256 of the manifest of try `n` and its signature (the name of its copy in an
    /// admitted store).
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(std::fs::read(self.img.join("good.json")).unwrap());
        if let Ok(sig) = std::fs::read(self.img.join("manifest.json.asc")) {
            h.update(sig);
        }
        h.finalize().iter().map(|x| format!("{x:02x}")).collect()
    }
}

/// The racer, as the job user: swaps `root.ext4` and `manifest.json` of `$1` by rename in
/// a loop until `$1/stop` exists, then prints how many rounds it made.
pub const RACER: &str = r#"cd "$1"; n=0
while [ ! -e stop ]; do
  ln -f bad.ext4 r.tmp && mv -f r.tmp root.ext4
  cp bad.json m.tmp && mv -f m.tmp manifest.json
  ln -f good.ext4 r.tmp && mv -f r.tmp root.ext4
  cp good.json m.tmp && mv -f m.tmp manifest.json
  n=$((n+1))
done
rm -f stop
echo "$n rounds""#;

/// The timed racer, as the job user: waits until process `$2` has opened `$1/root.ext4` and
/// closed it again (admission done, as far as a check-then-use would go), then swaps in the
/// other disk and says `swapped`.
pub const TIMED: &str = r#"cd "$1"; seen=0
while kill -0 "$2" 2>/dev/null; do
  if ls -l /proc/$2/fd 2>/dev/null | grep -q root.ext4; then seen=1
  elif [ $seen = 1 ]; then ln -f bad.ext4 r.tmp && mv -f r.tmp root.ext4; echo swapped; exit 0; fi
done
echo "never saw root.ext4 open""#;

fn walk_chown(t: &testkit::unpriv::Tester, p: &Path) {
    t.chown(p);
    if p.is_dir() && !p.is_symlink() {
        for e in std::fs::read_dir(p).unwrap().flatten() {
            walk_chown(t, &e.path());
        }
    }
}

/// A small image (not bootable: admission comes first) with a manifest of its parts.
pub fn tiny_image(dir: &Path) {
    use sha2::Digest;
    let mut parts = std::collections::BTreeMap::new();
    for (name, file, byte) in [
        ("kernel", "vmlinuz", b'k'),
        ("initrd", "initrd.img", b'i'),
        ("root", "root.ext4", b'r'),
    ] {
        let body = vec![byte; 4096];
        std::fs::write(dir.join(file), &body).unwrap();
        let sha256 = sha2::Sha256::digest(&body)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect();
        let part = vse_image::Part {
            file: file.into(),
            size: body.len() as u64,
            sha256,
        };
        parts.insert(name.to_string(), part);
    }
    let m = vse_image::Manifest::assembled("signing test", "console=ttyS0", parts);
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(&m).unwrap(),
    )
    .unwrap();
}
