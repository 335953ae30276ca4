//! The front-end's end of the barrier relay: guest ranks' barrier lines arrive from node
//! agents over the authenticated overlay ([`Wire::Barrier(BarrierMsg::Up)`]) and are replayed to the
//! controller's [`BarrierServer`](control::migrate::BarrierServer) on a private Unix socket, one
//! connection per guest rank connection, so the server sees ordinary ranks. Its answers go
//! back to whichever node holds the VM *now* — after a migration that is the destination,
//! and the guest connection id is unchanged, so a blocked rank gets its ACK there.

use crate::sync::lock;
use crate::wire::{BarrierMsg, Wire};
use agents::agent::{Control, JobHandle};
use agents::proto::NodeId;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Which node holds each VM (updated when a migration completes).
pub type Owners = Arc<Mutex<HashMap<String, NodeId>>>;

pub struct BarrierHub {
    server: PathBuf,
    owners: Owners,
    h: JobHandle<Wire>,
    conns: HashMap<(String, u64), UnixStream>,
}

impl BarrierHub {
    pub fn new(server: PathBuf, owners: Owners, h: JobHandle<Wire>) -> Self {
        Self {
            server,
            owners,
            h,
            conns: HashMap::new(),
        }
    }

    /// A line from a guest rank; `from` must hold `vm` (others are ignored: a node speaks
    /// only for its own VMs).
    pub fn up(&mut self, from: NodeId, vm: &str, conn: u64, line: &str) {
        if self.owner(vm) != Some(from) {
            return;
        }
        let key = (vm.to_string(), conn);
        if !self.conns.contains_key(&key) {
            let Some(s) = self.open(vm, conn) else {
                self.down_closed(vm, conn);
                return;
            };
            self.conns.insert(key.clone(), s);
        }
        if let Some(s) = self.conns.get_mut(&key)
            && s.write_all(format!("{}\n", line.trim_end()).as_bytes())
                .is_err()
        {
            self.conns.remove(&key);
        }
    }

    pub fn closed(&mut self, from: NodeId, vm: &str, conn: u64) {
        if self.owner(vm) != Some(from) {
            return;
        }
        if let Some(s) = self.conns.remove(&(vm.to_string(), conn)) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn owner(&self, vm: &str) -> Option<NodeId> {
        lock(&self.owners).get(vm).copied()
    }

    fn down_closed(&self, vm: &str, conn: u64) {
        if let Some(dst) = self.owner(vm) {
            self.h.control(Control::Send {
                dst,
                msg: Wire::Barrier(BarrierMsg::DownClosed {
                    vm: vm.to_string(),
                    conn,
                }),
            });
        }
    }

    /// Connects to the server and relays its lines down to the VM's current node.
    fn open(&self, vm: &str, conn: u64) -> Option<UnixStream> {
        let s = UnixStream::connect(&self.server).ok()?;
        let reader = s.try_clone().ok()?;
        let (owners, h, vm) = (self.owners.clone(), self.h.clone(), vm.to_string());
        std::thread::spawn(move || {
            let owner = || lock(&owners).get(&vm).copied();
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                if let Some(dst) = owner() {
                    h.control(Control::Send {
                        dst,
                        msg: Wire::Barrier(BarrierMsg::Down {
                            vm: vm.clone(),
                            conn,
                            line,
                        }),
                    });
                }
            }
            if let Some(dst) = owner() {
                h.control(Control::Send {
                    dst,
                    msg: Wire::Barrier(BarrierMsg::DownClosed { vm, conn }),
                });
            }
        });
        Some(s)
    }
}

impl Drop for BarrierHub {
    fn drop(&mut self) {
        for s in self.conns.values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}
