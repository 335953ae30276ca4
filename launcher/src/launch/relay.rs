//! The front-end's end of the barrier relay: guest ranks' barrier lines arrive from node
//! agents over the authenticated overlay ([`Wire::Barrier(BarrierMsg::Up)`]) and are replayed to the
//! controller's [`BarrierServer`](control::migrate::BarrierServer) on a private Unix socket, one
//! connection per guest rank connection, so the server sees ordinary ranks. Its answers go
//! back to whichever node holds the VM *now* — after a migration that is the destination,
//! and the guest connection id is unchanged, so a blocked rank gets its ACK there. The hub
//! knows each connection's rank (its `HELLO`), so a checkpoint can record the connections and
//! a restore can introduce them to its own server again.

use crate::sync::lock;
use crate::wire::{BarrierConn, BarrierMsg, Wire};
use agents::agent::{Control, JobHandle};
use agents::proto::NodeId;
use control::migrate::{hello_line, parse_hello};
use monitor::{JobId, VmId};
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
    job: JobId,
    conns: HashMap<(String, u64), UnixStream>,
    ranks: HashMap<(String, u64), u32>,
}

impl BarrierHub {
    pub fn new(server: PathBuf, owners: Owners, h: JobHandle<Wire>, job: JobId) -> Self {
        Self {
            server,
            owners,
            h,
            job,
            conns: HashMap::new(),
            ranks: HashMap::new(),
        }
    }

    /// The connections open from `vm`'s ranks.
    pub fn conns(&self, vm: &str) -> Vec<BarrierConn> {
        let mut out: Vec<BarrierConn> = (self.ranks.iter())
            .filter(|((v, c), _)| v == vm && self.conns.contains_key(&(v.clone(), *c)))
            .map(|((_, conn), rank)| BarrierConn {
                conn: *conn,
                rank: *rank,
            })
            .collect();
        out.sort_by_key(|c| c.conn);
        out
    }

    /// Connections of a restored VM's ranks, made before the VM was saved: the server of
    /// this launch hears their `HELLO` again, so later notices reach them.
    pub fn adopt(&mut self, vm: &str, conns: &[BarrierConn]) {
        let Ok(id) = VmId::new(vm) else { return };
        for c in conns {
            let hello = hello_line(&self.job, &id, c.rank);
            self.ranks.insert((vm.to_string(), c.conn), c.rank);
            self.relay(vm, c.conn, &hello);
        }
    }

    /// A line from a guest rank; `from` must hold `vm` (others are ignored: a node speaks
    /// only for its own VMs).
    pub fn up(&mut self, from: NodeId, vm: &str, conn: u64, line: &str) {
        if self.owner(vm) != Some(from) {
            return;
        }
        if let Some((_, _, rank)) = parse_hello(line) {
            self.ranks.insert((vm.to_string(), conn), rank);
        }
        self.relay(vm, conn, line);
    }

    fn relay(&mut self, vm: &str, conn: u64, line: &str) {
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
            self.ranks.remove(&key);
        }
    }

    pub fn closed(&mut self, from: NodeId, vm: &str, conn: u64) {
        if self.owner(vm) != Some(from) {
            return;
        }
        self.ranks.remove(&(vm.to_string(), conn));
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
