//! The destination side of a live migration: prepare an incoming VM from the source's
//! profile (`-incoming`) on this node's own copy of the image (found by digest in its own
//! cache; the source's paths are not trusted), on the source's disk overlay when this node
//! sees the source's probe next to it (shared storage) or else on a fresh overlay of its own
//! that the source mirrors the disk into; take over the guest agent link with a new one — the rank's command
//! keeps running in the guest, its reply now comes here under the same request id — and
//! report to the front-end; the rank is reported from here when it ends.

use super::report::{NodeRelay, await_rank, rank_output, report_rank};
use super::service::Node;
use super::state::Rank;
use super::{NodeError, settings};
use crate::net::Relay;
use crate::wire::{MigrateMsg, Wire};
use agents::proto::NodeId;
use control::state::Transfer;
use monitor::VmId;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, mpsc};
use std::time::Duration;
use v2m::{DiskMigration, NetMode, PluginKind, Profile, registry};
use vmhost::{DestDisks, Incoming, OverlayDir};
use vse_guest_agent::{Barriers, LinkOptions, PendingExec};
use vse_image::ImageDir;

/// How long the destination waits for the state once the source said it was sent, and then
/// for the guest agent.
const TAKE_OVER: Duration = Duration::from_secs(120);

/// A `MigrateMsg::In` from node `from`.
pub(crate) struct MoveIn {
    pub from: NodeId,
    pub vm: String,
    pub rank: u32,
    pub profile: Profile,
    pub exec_id: u64,
    pub first_id: u64,
    pub switch: Option<SocketAddr>,
    pub digest: Option<String>,
    pub probe: Option<vmhost::StorageProbe>,
    pub shares: Vec<vse_guest_agent::share::server::Shared>,
}

pub(crate) fn migrate_in(node: Node, m: MoveIn) {
    let rx = node.state.wait_for(&m.vm);
    let mut sent = false;
    let r = take_in(&node, &m, &rx, &mut sent);
    node.state.end_wait(&m.vm);
    let done = |error, transfer| {
        let (vm, rank) = (m.vm.clone(), m.rank);
        Wire::Migrate(MigrateMsg::Done {
            vm,
            rank,
            error,
            transfer,
        })
    };
    match r {
        Ok(None) => {}
        Ok(Some((pending, rank, nic_relay, transfer))) => {
            node.send(NodeId(0), done(None, transfer));
            // After `Done`: the front-end takes the rank's relay from its new owner only.
            if let Some(r) = &nic_relay {
                super::rank::announce_relay(&node, m.rank, r);
            }
            let mut output = rank_output(&node.h, m.rank, &rank.last_output);
            let out = await_rank(&pending, rank.pid, &rank.handed_off, &mut output);
            if let Some(out) = out.transpose() {
                // The rank ended here: stop the VM (its overlay goes with it) and forget it.
                drop(node.state.remove(&m.vm));
                report_rank(&node, m.rank, out, None);
            }
        }
        Err(e) => {
            // Before the state was sent the source keeps the VM and reports; after, the VM
            // is lost with this node's failure and only the front-end can be told.
            drop(node.state.remove(&m.vm));
            let to = if sent { NodeId(0) } else { m.from };
            node.send(to, done(Some(e.describe()), None));
        }
    }
}

fn take_in(
    node: &Node,
    m: &MoveIn,
    rx: &mpsc::Receiver<Wire>,
    sent: &mut bool,
) -> Result<Option<Taken>, NodeError> {
    // Node agents sharing one machine share its run directory, where the source's VM still
    // runs under the same name: a VM migrated in lives under this agent's own directory.
    let mut settings = settings();
    settings.qemu.run_root = settings.qemu.run_root.join(format!("in-{}", node.me));
    let plugin = registry::select(&settings, Some(PluginKind::Qemu))?;
    let id = VmId::new(m.vm.clone()).map_err(NodeError::VmId)?;
    // Opened before the guest's state comes: a share this node cannot serve refuses the move.
    let shares =
        vse_guest_agent::share::server::ShareSet::open(&m.shares).map_err(NodeError::Shares)?;
    let shares = Arc::new(shares);
    // Killed on drop by any early return: no half-made VM outlives a failure.
    let cgroup = node.cgroup.as_deref();
    // The VM's NIC gets this node's own relay (QEMU's network backend is not part of the
    // migrated state: the device moves, its socket is new).
    let (mut profile, disks) = local_profile(m, &super::cache_dir())?;
    let nic_relay = match m.switch {
        Some(sw) if profile.network.mode == NetMode::Udp => {
            let r = super::rank::open_relay(node, sw, m.rank)?;
            profile.network.local = Some(r.vm);
            profile.network.remote = Some(r.relay);
            Some(r)
        }
        _ => None,
    };
    // The listener is on the allocation network: only the source holding the key gets in.
    let key = super::migration_key(&node.secret, &m.vm);
    let incoming =
        Incoming::prepare_with(&*plugin, &profile, node.bind, cgroup, Some(&key), disks)?;
    let (vm, addr, disks) = (m.vm.clone(), incoming.addr(), incoming.disks());
    node.send(
        m.from,
        Wire::Migrate(MigrateMsg::Listening { vm, addr, disks }),
    );
    let (report, cut) = match node.wait(rx, "state from the source")? {
        Wire::Migrate(MigrateMsg::Sent {
            ok: true,
            report,
            cut,
            ..
        }) => {
            *sent = true;
            (report, hex::decode(cut).unwrap_or_default())
        }
        // The source reports the failure; the prepared VM goes with `incoming`.
        Wire::Migrate(MigrateMsg::Sent { ok: false, .. }) => return Ok(None),
        other => {
            return Err(NodeError::Unexpected {
                from: "message from the source",
                msg: format!("{other:?}"),
            });
        }
    };
    let relay = Arc::new(NodeRelay {
        vm: m.vm.clone(),
        h: node.h.clone(),
    });
    let link = LinkOptions::new(TAKE_OVER)
        .barriers(Barriers::Relay(relay))
        .first_id(m.first_id)
        .carried(cut)
        .cancel(node.state.stopping().clone())
        .shares(Some(shares));
    let mut vm = incoming.finish(TAKE_OVER)?.connect(&link)?;
    if disks == DiskMigration::Shared {
        // The source left its disk overlay to this node, which removes it when the VM ends
        // here (a copied disk is this node's own overlay, already in `vm`).
        let overlay = m
            .profile
            .disks
            .first()
            .and_then(|d| OverlayDir::adopt(&d.path));
        vm.set_overlay(overlay);
    }
    let (link, pid) = (vm.link().clone(), vm.pid());
    let pending = link.adopt_exec(m.exec_id);
    node.state.register(vm)?;
    let rank = Rank {
        rank: m.rank,
        exec_id: m.exec_id,
        id,
        pid,
        link,
        handed_off: Arc::new(AtomicBool::new(false)),
        last_output: Arc::new(std::sync::Mutex::new(std::time::Instant::now())),
    };
    node.state.start_rank(&m.vm, rank.clone());
    let transfer = report.as_ref().map(crate::fleet::transfer);
    Ok(Some((pending, rank, nic_relay, transfer)))
}

/// A VM taken in: its adopted command, its rank, its NIC's relay, what the move carried.
type Taken = (PendingExec, Rank, Option<Relay>, Option<Transfer>);

/// The source's profile on this node's own copy of the image, and where its disk comes
/// from: the source's overlay in place when this node sees the source's probe next to it,
/// else a fresh overlay here for the source to mirror into.
fn local_profile(
    m: &MoveIn,
    cache: &std::path::Path,
) -> Result<(Profile, DestDisks<'static>), NodeError> {
    let digest = m.digest.as_deref().unwrap_or("");
    let valid = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
    if !valid {
        return Err(NodeError::Refused(format!(
            "the source named no valid image digest ({digest:?}) for this node to boot its own copy of"
        )));
    }
    let dir = cache.join(digest);
    let image = ImageDir::open(&dir).map_err(|e| {
        NodeError::Refused(format!(
            "image {digest} is not in this node's image cache ({}): {e}",
            dir.display()
        ))
    })?;
    let profile = vmhost::on_local_image(&m.profile, &image);
    let shared = match (&m.probe, m.profile.disks.first()) {
        (Some(p), Some(d)) => p.visible_with(&d.path),
        _ => false,
    };
    let disks = if shared {
        DestDisks::Shared
    } else {
        DestDisks::Copy {
            scratch_prefix: "launch-in",
        }
    };
    Ok((profile, disks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;
    use v2m::{Disk, DiskFormat, ImageRef};
    use vse_image::{MANIFEST, Manifest, Part};

    const DIGEST: &str = "ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12";

    /// A `MigrateMsg::In` as a source with its image under `/src/cache` would send it.
    fn move_in(digest: Option<&str>, probe: Option<vmhost::StorageProbe>, disk: &Path) -> MoveIn {
        let src = Path::new("/src/cache").join(DIGEST);
        let mut profile = Profile::new(
            "vm-r0".parse().unwrap(),
            1,
            128,
            ImageRef {
                kernel: src.join("vmlinuz"),
                initrd: Some(src.join("initrd.img")),
                root_disk: Some(src.join("root.raw")),
                cmdline: String::new(),
            },
        );
        profile.disks.push(Disk {
            path: disk.to_path_buf(),
            format: DiskFormat::Qcow2,
            readonly: false,
        });
        MoveIn {
            from: NodeId(1),
            vm: "vm-r0".into(),
            rank: 0,
            profile,
            exec_id: 1,
            first_id: 2,
            switch: None,
            digest: digest.map(str::to_owned),
            probe,
            shares: Vec::new(),
        }
    }

    fn stage(cache: &Path) -> std::path::PathBuf {
        let dir = cache.join(DIGEST);
        std::fs::create_dir_all(&dir).unwrap();
        let mut parts = BTreeMap::new();
        for (name, file) in [
            ("kernel", "vmlinuz"),
            ("initrd", "initrd.img"),
            ("root", "root.raw"),
        ] {
            std::fs::write(dir.join(file), b"x").unwrap();
            let part = Part {
                file: file.into(),
                size: 1,
                sha256: String::new(),
            };
            parts.insert(name.to_string(), part);
        }
        let m = Manifest::assembled("test", "", parts);
        std::fs::write(dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        dir
    }

    #[test]
    fn the_destination_boots_on_its_own_image_copy_and_copies_an_unseen_disk() {
        let t = tempfile::tempdir().unwrap();
        let dir = stage(t.path());
        let m = move_in(Some(DIGEST), None, Path::new("/src/tmp/vse-x/root.qcow2"));
        let (p, disks) = local_profile(&m, t.path()).unwrap();
        assert_eq!(p.image.kernel, dir.join("vmlinuz"));
        assert_eq!(p.image.initrd, Some(dir.join("initrd.img")));
        assert_eq!(p.image.root_disk, Some(dir.join("root.raw")));
        assert!(matches!(disks, DestDisks::Copy { .. }), "{disks:?}");
    }

    #[test]
    fn a_visible_probe_means_shared_storage_and_a_forged_one_does_not() {
        let t = tempfile::tempdir().unwrap();
        stage(t.path());
        let overlay = t.path().join("vse-ov");
        std::fs::create_dir(&overlay).unwrap();
        let disk = overlay.join("root.qcow2");
        std::fs::write(&disk, b"qcow2").unwrap();
        let file = vmhost::leave_probe(&disk).unwrap();
        let m = move_in(Some(DIGEST), Some(file.probe().clone()), &disk);
        let (_, disks) = local_profile(&m, t.path()).unwrap();
        assert_eq!(disks, DestDisks::Shared);
        let mut forged = file.probe().clone();
        forged.token = "f".repeat(32);
        let m = move_in(Some(DIGEST), Some(forged), &disk);
        let (_, disks) = local_profile(&m, t.path()).unwrap();
        assert!(matches!(disks, DestDisks::Copy { .. }), "{disks:?}");
    }

    #[test]
    fn an_image_missing_here_or_a_bad_digest_is_refused_clearly() {
        let t = tempfile::tempdir().unwrap();
        let disk = Path::new("/src/tmp/vse-x/root.qcow2");
        let e = local_profile(&move_in(Some(DIGEST), None, disk), t.path()).unwrap_err();
        let text = e.describe();
        assert!(
            text.contains(DIGEST) && text.contains(&t.path().display().to_string()),
            "{text}"
        );
        for bad in [None, Some("../../etc"), Some("ab12")] {
            let e = local_profile(&move_in(bad, None, disk), t.path()).unwrap_err();
            assert!(e.describe().contains("no valid image digest"), "{e}");
        }
    }
}
