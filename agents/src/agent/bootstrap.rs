//! Bootstrap: an agent starts its children along the k-ary tree, collects their subtrees'
//! addresses into the directory, and links up along the BMG overlay before the job runs.

use super::{
    AgentError, OnFailure,
    job::Event,
    links::{Input, dial},
    node::{Node, Step},
    spawn::ChildSpec,
};
use crate::{
    proto::{Msg, NodeId, Payload},
    topo::Bmg,
};
use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    time::Duration,
};
use tokio::time::{Instant, sleep_until};

/// What a parent passes down: overlay neighbours' addresses, and the agents that are dead.
type Directory = (Vec<(NodeId, SocketAddr)>, Vec<NodeId>);

impl<A: Payload> Node<A> {
    /// Starts the children and waits for each one's subtree report or failure.
    pub(super) async fn bootstrap_children(
        &mut self,
    ) -> Result<(Vec<(NodeId, SocketAddr)>, Vec<NodeId>), AgentError> {
        let tree = self.cfg.tree;
        let hs = self.cfg.timing.handshake;
        let mut up = Vec::new();
        let mut failed = Vec::new();
        // deadline to handshake, then deadline for the subtree report (one handshake per level)
        let mut pending: HashMap<NodeId, Instant> = HashMap::new();
        let mut reporting: HashMap<NodeId, Instant> = HashMap::new();
        let kids = tree.children(self.me);
        for &c in &kids {
            let spec = ChildSpec {
                id: c,
                parent: self.listen,
                config: self.cfg.for_child(c),
            };
            match self.cfg.spawner.spawn(spec) {
                Ok(mut child) => {
                    if let Some(exit) = child.take_exit() {
                        let inbox = self.inbox_tx.clone();
                        tokio::spawn(async move {
                            if let Ok(how) = exit.await {
                                let _ = inbox.send(Input::ChildExit { id: c, how });
                            }
                        });
                    }
                    self.children.insert(c, child);
                    pending.insert(c, Instant::now() + hs);
                }
                Err(_) => failed.extend(tree.subtree(c)),
            }
        }
        if !kids.is_empty() {
            self.emit(Event::Spawned {
                by: self.me,
                children: kids,
            });
        }
        while !(pending.is_empty() && reporting.is_empty()) {
            let next = pending
                .values()
                .chain(reporting.values())
                .min()
                .copied()
                .expect("non-empty");
            let input = tokio::select! {
                i = self.inbox.recv() => i,
                _ = sleep_until(next) => None,
            };
            let mut lost: Option<NodeId> = None;
            match input {
                Some(Input::Link { id, listen, tx, rx }) if pending.contains_key(&id) => {
                    pending.remove(&id);
                    self.links.add(id, listen, tx, rx, &self.inbox_tx);
                    let below = tree.depth().saturating_sub(tree.level(id)) + 1;
                    reporting.insert(id, Instant::now() + hs * below);
                }
                Some(Input::Msg {
                    from,
                    msg: Msg::SubtreeReady { up: u, failed: f },
                    ..
                }) if reporting.remove(&from).is_some() => {
                    up.extend(u);
                    failed.extend(f);
                }
                Some(Input::Down { from, .. }) if Some(from) == tree.parent(self.me) => {
                    return Err(AgentError::Bootstrap(format!(
                        "lost parent {from} during bootstrap"
                    )));
                }
                Some(Input::Msg {
                    msg: Msg::Shutdown { reason },
                    ..
                }) => {
                    return Err(AgentError::Bootstrap(format!(
                        "shut down during bootstrap: {reason}"
                    )));
                }
                Some(i @ (Input::Down { .. } | Input::ChildExit { .. })) => {
                    let (Input::Down { from, .. } | Input::ChildExit { id: from, .. }) = &i else {
                        unreachable!("matched above")
                    };
                    if pending.contains_key(from) || reporting.contains_key(from) {
                        lost = Some(*from);
                    } else {
                        // A child that already reported: the running loop handles it.
                        self.deferred.push(i);
                    }
                }
                Some(Input::Rejected { peer, reason }) => {
                    self.emit(Event::Rejected { peer, reason })
                }
                Some(other) => self.deferred.push(other),
                None => {
                    let now = Instant::now();
                    lost = pending
                        .iter()
                        .chain(reporting.iter())
                        .find(|(_, d)| **d <= now)
                        .map(|(id, _)| *id);
                }
            }
            if let Some(c) = lost.filter(|c| pending.contains_key(c) || reporting.contains_key(c)) {
                pending.remove(&c);
                reporting.remove(&c);
                self.links.remove_if(c, None);
                if let Some(child) = self.children.remove(&c) {
                    tokio::spawn(child.finish(Duration::ZERO));
                }
                failed.extend(tree.subtree(c));
            }
        }
        up.push((self.me, self.listen));
        if self.is_front_end() {
            up.pop();
        }
        Ok((up, failed))
    }

    /// The directory from the parent: addresses and the agents that did not come up.
    pub(super) async fn await_directory(
        &mut self,
        pid: NodeId,
    ) -> Result<Option<Directory>, AgentError> {
        let tree = self.cfg.tree;
        let deadline = Instant::now() + self.cfg.timing.handshake * (tree.depth() + 2);
        loop {
            let input = tokio::select! {
                i = self.inbox.recv() => i,
                _ = sleep_until(deadline) => {
                    return Err(AgentError::Bootstrap("no directory from the front-end in time".into()));
                }
            };
            match input {
                Some(Input::Msg {
                    from,
                    msg: Msg::Directory { addrs, dead },
                    ..
                }) if from == pid => return Ok(Some((addrs, dead))),
                Some(Input::Msg {
                    msg: Msg::Shutdown { reason },
                    from,
                    ..
                }) => {
                    self.links.broadcast(&Msg::Shutdown { reason }, Some(from));
                    return Ok(None);
                }
                Some(Input::Down { from, .. }) if from == pid => {
                    return Err(AgentError::Bootstrap(format!(
                        "lost parent {pid} before the directory"
                    )));
                }
                Some(Input::ChildExit { id, how }) => self.fail(id, self.me, how),
                Some(Input::Down {
                    from,
                    reason,
                    epoch,
                }) => {
                    if self.links.remove_if(from, Some(epoch)) {
                        self.fail(from, self.me, reason);
                    }
                }
                Some(Input::Rejected { peer, reason }) => {
                    self.emit(Event::Rejected { peer, reason })
                }
                // Overlay dials from agents that got the directory first: keep them for later.
                Some(other) => self.deferred.push(other),
                None => return Err(AgentError::Bootstrap("inbox closed".into())),
            }
        }
    }

    /// Sends each live child the part of `addrs` its subtree needs: the addresses of the
    /// overlay neighbours its agents dial (those with higher ids; the others dial them).
    pub(super) fn pass_directory(&self, addrs: &[(NodeId, SocketAddr)], dead: &[NodeId]) {
        let tree = self.cfg.tree;
        let bmg = Bmg::new(tree.size());
        let known: HashMap<NodeId, SocketAddr> = addrs.iter().copied().collect();
        for child in tree.children(self.me) {
            if self.dead.contains(&child) {
                continue;
            }
            let mut needed: HashSet<NodeId> = HashSet::new();
            for member in tree.subtree(child) {
                needed.extend(bmg.dials(member));
            }
            let mut part: Vec<(NodeId, SocketAddr)> = needed
                .into_iter()
                .filter_map(|id| known.get(&id).map(|a| (id, *a)))
                .collect();
            part.sort_unstable_by_key(|(id, _)| *id);
            self.send_to(
                child,
                Msg::Directory {
                    addrs: part,
                    dead: dead.to_vec(),
                },
            );
        }
    }

    /// Dials the BMG neighbours with higher ids (unless a tree link already joins them) and
    /// waits for the lower ones to dial in.
    pub(super) async fn build_overlay(&mut self, directory: &[(NodeId, SocketAddr)]) {
        for i in std::mem::take(&mut self.deferred) {
            let _ = self.inbox_tx.send(i);
        }
        let bmg = Bmg::new(self.cfg.tree.size());
        let addrs: HashMap<NodeId, SocketAddr> = directory.iter().copied().collect();
        let tree = self.cfg.tree;
        let tree_linked =
            |a: NodeId, b: NodeId| tree.parent(a) == Some(b) || tree.parent(b) == Some(a);
        let mut expect: HashSet<NodeId> = HashSet::new();
        for nb in bmg.neighbours(self.me) {
            if self.dead.contains(&nb) || tree_linked(self.me, nb) {
                continue;
            }
            expect.insert(nb);
            if nb.0 > self.me.0 {
                let (key, me, listen, hs, inbox) = (
                    self.cfg.secret.clone(),
                    self.me,
                    self.listen,
                    self.cfg.timing.handshake,
                    self.inbox_tx.clone(),
                );
                let Some(&addr) = addrs.get(&nb) else {
                    // A parent that left it out: no link, as if its dial had failed.
                    let reason = format!("{nb} missing from the directory");
                    let _ = self.inbox_tx.send(Input::DialFailed { to: nb, reason });
                    continue;
                };
                tokio::spawn(async move {
                    let input = match dial::<A>(addr, &key, me, listen, nb, hs).await {
                        Ok((tx, rx)) => Input::Link {
                            id: nb,
                            listen: addr,
                            tx,
                            rx,
                        },
                        Err(e) => Input::DialFailed {
                            to: nb,
                            reason: e.to_string(),
                        },
                    };
                    let _ = inbox.send(input);
                });
            }
        }
        let deadline = Instant::now() + self.cfg.timing.handshake;
        let mut early = Vec::new();
        while expect
            .iter()
            .any(|p| !self.links.contains(*p) && !self.dead.contains(p))
        {
            let input = tokio::select! {
                i = self.inbox.recv() => i,
                _ = sleep_until(deadline) => break,
            };
            match input {
                Some(Input::Link { id, listen, tx, rx }) => {
                    self.links.add(id, listen, tx, rx, &self.inbox_tx)
                }
                Some(Input::DialFailed { to, reason }) => self.fail(to, self.me, reason),
                None => break,
                Some(other) => early.push(other),
            }
        }
        let missing: Vec<NodeId> = expect
            .into_iter()
            .filter(|p| !self.links.contains(*p) && !self.dead.contains(p))
            .collect();
        for p in missing {
            self.fail(p, self.me, "no overlay link in time".into());
        }
        // Messages that arrived meanwhile are handled in order by the running loop.
        for i in early {
            let _ = self.inbox_tx.send(i);
        }
    }

    pub(super) async fn await_overlay_ready(
        &mut self,
        directory: &[(NodeId, SocketAddr)],
        start: Instant,
    ) -> Step {
        // An attached front-end's directory is the old one's: it lists every agent but this.
        let mut live: HashSet<NodeId> = directory.iter().map(|(id, _)| *id).collect();
        live.insert(self.me);
        let mut waiting: HashSet<NodeId> = live.iter().copied().filter(|id| id.0 != 0).collect();
        let deadline = Instant::now() + self.cfg.timing.handshake * 2;
        while !waiting.is_empty() {
            let input = tokio::select! {
                i = self.inbox.recv() => i,
                _ = sleep_until(deadline) => break,
            };
            match input {
                Some(Input::Msg {
                    msg: Msg::Routed { inner, src, .. },
                    ..
                }) if matches!(*inner, Msg::OverlayReady { .. }) => {
                    waiting.remove(&src);
                }
                Some(i) => {
                    if let Step::Stop(r, c) = self.handle(i) {
                        return Step::Stop(r, c);
                    }
                    waiting.retain(|id| !self.dead.contains(id));
                }
                None => break,
            }
        }
        for id in waiting {
            self.fail(id, self.me, "overlay not ready in time".into());
            if self.cfg.on_failure == OnFailure::Abort {
                return Step::Stop("agents failed while building the overlay".into(), false);
            }
        }
        let agents = live.len() - self.dead.iter().filter(|d| live.contains(d)).count();
        let directory = (directory.iter())
            .filter(|(id, _)| id.0 != 0 && !self.dead.contains(id))
            .copied()
            .collect();
        self.emit(Event::Ready {
            agents,
            elapsed: start.elapsed(),
            directory,
        });
        Step::Continue
    }
}
