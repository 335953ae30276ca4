//! Mounting the shares a host asks for. A guest mounts each share once; a host end that asks
//! again (every host end does, after a migration or a restore) finds it mounted already.

use super::fs::{Remote, ShareFs};
use super::proto::MountShare;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Mounts {
    live: Mutex<HashMap<u32, (String, fuser::BackgroundSession)>>,
}

/// Threads serving one mount: operations of several ranks wait for the host at once.
const THREADS: usize = 4;

impl Mounts {
    pub fn mount(&self, remote: Arc<dyn Remote>, shares: &[MountShare]) -> Result<(), String> {
        let mut live = lock(&self.live);
        for s in shares {
            if let Some((at, _)) = live.get(&s.id) {
                if *at == s.guest {
                    continue;
                }
                return Err(format!(
                    "share {} is mounted at {at}, not {}",
                    s.id, s.guest
                ));
            }
            if !s.guest.starts_with('/') || s.guest.split('/').any(|c| c == "..") {
                return Err(format!(
                    "share mount point {:?} is not an absolute path",
                    s.guest
                ));
            }
            if !std::path::Path::new("/dev/fuse").exists() {
                return Err(
                    "the guest kernel has no FUSE (/dev/fuse is missing); hint: rebuild the image with this vse, whose initramfs loads fuse.ko"
                        .into(),
                );
            }
            std::fs::create_dir_all(&s.guest).map_err(|e| format!("{}: {e}", s.guest))?;
            let mut options = vec![
                fuser::MountOption::FSName(format!("vse-share-{}", s.id)),
                fuser::MountOption::Subtype("vse".into()),
                fuser::MountOption::DefaultPermissions,
                fuser::MountOption::NoSuid,
                fuser::MountOption::NoDev,
            ];
            if s.ro {
                options.push(fuser::MountOption::RO);
            }
            let mut config = fuser::Config::default();
            config.mount_options = options;
            config.acl = fuser::SessionACL::All;
            config.n_threads = Some(THREADS);
            let fs = ShareFs::new(remote.clone(), s.id);
            let session = fuser::Session::new(fs, &s.guest, &config)
                .and_then(fuser::Session::spawn)
                .map_err(|e| format!("mounting share {} at {}: {e}", s.id, s.guest))?;
            live.insert(s.id, (s.guest.clone(), session));
        }
        Ok(())
    }
}
