//! One agent's life: bootstrap along the tree (`bootstrap`), the BMG overlay, then the
//! running loop with the failure detectors. Agent 0 (the front-end) runs the same code plus
//! the user's policy.

use super::{
    AgentConfig, AgentError, OnFailure,
    job::{Control, Event, Exit, Failure},
    links::{Blob, Input, Links, dial, serve},
    role::front_end_only,
    spawn::SpawnedChild,
};
use crate::{
    proto::{Msg, NodeId, Payload},
    topo::{Bmg, RoutingTable},
};
use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    time::Duration,
};
use tokio::{
    net::TcpListener,
    sync::mpsc,
    task::JoinHandle,
    time::{Instant, sleep_until},
};

struct AbortOnDrop(JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) struct Node<A> {
    pub(super) cfg: AgentConfig,
    pub(super) me: NodeId,
    pub(super) listen: SocketAddr,
    pub(super) inbox_tx: mpsc::UnboundedSender<Input<A>>,
    pub(super) inbox: mpsc::UnboundedReceiver<Input<A>>,
    pub(super) links: Links<A>,
    pub(super) children: HashMap<NodeId, SpawnedChild>,
    pub(super) dead: HashSet<NodeId>,
    pub(super) routes: Option<RoutingTable>,
    pub(super) events: mpsc::UnboundedSender<Event<A>>,
    pub(super) failures: Vec<Failure>,
    pub(super) ping: u64,
    /// Inputs that arrived before the phase that handles them.
    pub(super) deferred: Vec<Input<A>>,
    /// A node agent without its front-end: when it gives up waiting for a new one.
    pub(super) orphaned: Option<Instant>,
    /// The neighbour this agent learned of a new front-end from: the way to it until this
    /// agent's own route is linked (agent 0 itself once it dialed this agent).
    pub(super) front_via: Option<NodeId>,
    /// Messages for the front-end kept while there is none.
    pub(super) held: super::orphan::HeldMessages<A>,
    _server: AbortOnDrop,
}

pub(super) enum Step {
    Continue,
    Stop(String, bool),
}

pub(crate) async fn run<A: Payload>(
    cfg: AgentConfig,
    parent: Option<SocketAddr>,
    ctl: Option<mpsc::UnboundedReceiver<Control<A>>>,
    events: mpsc::UnboundedSender<Event<A>>,
) -> Result<Exit, AgentError> {
    let start = Instant::now();
    let mut n = Node::listen(cfg, events).await?;
    let result = n.life(parent, ctl, start).await;
    n.end(result).await
}

/// The front-end of a running job that lost its own (see [`super::Job::attach`]).
pub(crate) async fn run_attached<A: Payload>(
    cfg: AgentConfig,
    directory: Vec<(NodeId, SocketAddr)>,
    ctl: mpsc::UnboundedReceiver<Control<A>>,
    events: mpsc::UnboundedSender<Event<A>>,
) -> Result<Exit, AgentError> {
    let start = Instant::now();
    let mut n = Node::listen(cfg, events).await?;
    let result = n.attach(directory, ctl, start).await;
    n.end(result).await
}

impl<A: Payload> Node<A> {
    async fn listen(
        cfg: AgentConfig,
        events: mpsc::UnboundedSender<Event<A>>,
    ) -> Result<Self, AgentError> {
        let listener =
            TcpListener::bind((cfg.bind, 0))
                .await
                .map_err(|source| AgentError::Listen {
                    addr: cfg.bind,
                    source,
                })?;
        let listen = listener.local_addr().map_err(|source| AgentError::Listen {
            addr: cfg.bind,
            source,
        })?;
        let (inbox_tx, inbox) = mpsc::unbounded_channel();
        let server = serve(
            listener,
            cfg.secret.clone(),
            cfg.id,
            cfg.timing.handshake,
            inbox_tx.clone(),
        );
        Ok(Node {
            me: cfg.id,
            cfg,
            listen,
            inbox_tx,
            inbox,
            links: Links::default(),
            children: HashMap::new(),
            dead: HashSet::new(),
            routes: None,
            events,
            failures: Vec::new(),
            ping: 0,
            deferred: Vec::new(),
            orphaned: None,
            front_via: None,
            held: Default::default(),
            _server: AbortOnDrop(server),
        })
    }

    async fn end(mut self, result: Result<Exit, AgentError>) -> Result<Exit, AgentError> {
        // Whatever happened, nothing this agent started may outlive it.
        self.links.close_all(Duration::from_secs(1)).await;
        let grace = self.cfg.timing.timeout;
        let kids: Vec<SpawnedChild> = self.children.drain().map(|(_, c)| c).collect();
        futures_join(kids.into_iter().map(|c| c.finish(grace))).await;
        result
    }
}

async fn futures_join<F: std::future::Future<Output = ()> + Send + 'static>(
    fs: impl Iterator<Item = F>,
) {
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    for h in handles {
        let _ = h.await;
    }
}

impl<A: Payload> Node<A> {
    pub(super) fn emit(&self, e: Event<A>) {
        let _ = self.events.send(e);
    }

    pub(super) fn is_front_end(&self) -> bool {
        self.me.0 == 0
    }

    pub(super) async fn life(
        &mut self,
        parent: Option<SocketAddr>,
        mut ctl: Option<mpsc::UnboundedReceiver<Control<A>>>,
        start: Instant,
    ) -> Result<Exit, AgentError> {
        let tree = self.cfg.tree;
        let parent_id = tree.parent(self.me);
        if let (Some(addr), Some(pid)) = (parent, parent_id) {
            // Handshake with the parent first: an agent that cannot do it terminates itself.
            let (tx, rx) = dial::<A>(
                addr,
                &self.cfg.secret,
                self.me,
                self.listen,
                pid,
                self.cfg.timing.handshake,
            )
            .await
            .map_err(AgentError::Dial)?;
            self.links.add(pid, addr, tx, rx, &self.inbox_tx);
            self.emit(Event::Linked { parent: pid });
        }
        let (up, failed) = self.bootstrap_children().await?;
        let (directory, dead) = if let Some(pid) = parent_id {
            let report = Msg::SubtreeReady {
                up: up.clone(),
                failed: failed.clone(),
            };
            self.send_to(pid, report);
            match self.await_directory(pid).await? {
                Some(d) => d,
                None => return Ok(self.exit("shut down during bootstrap".into(), true)),
            }
        } else {
            let mut all = up.clone();
            all.push((self.me, self.listen));
            self.emit(Event::Bootstrapped {
                up: all.len(),
                failed: failed.clone(),
                depth: tree.depth(),
                elapsed: start.elapsed(),
            });
            for f in &failed {
                self.failures.push(Failure {
                    node: *f,
                    by: self.me,
                    reason: "did not bootstrap".into(),
                });
            }
            if !failed.is_empty() && self.cfg.on_failure == OnFailure::Abort {
                return Ok(self
                    .shutdown(
                        format!("{} agent(s) failed to bootstrap", failed.len()),
                        false,
                    )
                    .await);
            }
            if !self.cfg.overlay {
                return Ok(self.shutdown("bootstrap complete".into(), true).await);
            }
            let live: HashSet<NodeId> = all.iter().map(|(id, _)| *id).collect();
            let dead = (0..tree.size())
                .map(NodeId)
                .filter(|id| !live.contains(id))
                .collect();
            (all, dead)
        };
        self.dead.extend(dead.iter().copied());
        self.pass_directory(&directory, &dead);
        self.recompute_routes();
        self.build_overlay(&directory).await;
        if self.is_front_end() {
            if let Step::Stop(reason, clean) = self.await_overlay_ready(&directory, start).await {
                return Ok(self.shutdown(reason, clean).await);
            }
        } else {
            self.emit(Event::OverlayLinked);
            self.route(NodeId(0), Msg::OverlayReady { id: self.me });
        }
        self.running(&mut ctl).await
    }
}

impl<A: Payload> Node<A> {
    pub(super) async fn running(
        &mut self,
        ctl: &mut Option<mpsc::UnboundedReceiver<Control<A>>>,
    ) -> Result<Exit, AgentError> {
        self.links.refresh();
        let mut tick = tokio::time::interval(self.cfg.timing.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let step = tokio::select! {
                i = self.inbox.recv() => match i {
                    Some(i) => self.handle(i),
                    None => Step::Stop("inbox closed".into(), false),
                },
                _ = tick.tick() => self.heartbeat(),
                _ = sleep_until(self.orphaned.unwrap_or_else(Instant::now)), if self.orphaned.is_some() => {
                    Step::Stop(format!(
                        "front-end lost, and none attached within {} s",
                        self.cfg.orphan_grace.as_secs()
                    ), false)
                }
                c = recv_ctl(ctl) => match c {
                    Some(Control::Shutdown { reason }) => Step::Stop(reason, self.failures.is_empty()),
                    Some(Control::Send { dst, msg }) if dst.0 == 0 && self.orphaned.is_some() => {
                        self.held.push(msg);
                        Step::Continue
                    }
                    Some(Control::Send { dst, msg }) => {
                        self.route(dst, Msg::App(msg));
                        Step::Continue
                    }
                    Some(Control::Ping { dst, seq }) => {
                        self.route(dst, Msg::Ping { seq });
                        Step::Continue
                    }
                    None => {
                        *ctl = None;
                        Step::Continue
                    }
                },
            };
            if let Step::Stop(reason, clean) = step {
                return Ok(self.shutdown(reason, clean).await);
            }
        }
    }

    pub(super) fn handle(&mut self, input: Input<A>) -> Step {
        match input {
            Input::Link { id, listen, tx, rx } => {
                if id.0 == 0 && self.orphaned.is_some() {
                    self.links.add(id, listen, tx, rx, &self.inbox_tx);
                    self.adopted(id);
                } else if !self.dead.contains(&id) {
                    self.links.add(id, listen, tx, rx, &self.inbox_tx);
                }
            }
            Input::Msg {
                from,
                epoch,
                msg,
                blob,
            } => {
                match self.links.get_mut(from) {
                    Some(l) if l.epoch == epoch => l.last_seen = Instant::now(),
                    _ => return Step::Continue,
                }
                return self.on_message(from, msg, blob);
            }
            Input::Down {
                from,
                epoch,
                reason,
            } => {
                if self.links.remove_if(from, Some(epoch)) {
                    self.fail(from, self.me, reason);
                }
            }
            Input::DialFailed { to, reason } => self.fail(to, self.me, reason),
            Input::Rejected { peer, reason } => self.emit(Event::Rejected { peer, reason }),
            Input::ChildExit { id, how } => {
                self.children.remove(&id);
                self.fail(id, self.me, how);
            }
        }
        self.after_failures()
    }

    pub(super) fn on_message(&mut self, from: NodeId, msg: Msg<A>, _blob: Vec<u8>) -> Step {
        match msg {
            Msg::Ping { seq } => self.send_to(from, Msg::Pong { seq }),
            Msg::Pong { .. } | Msg::Hello { .. } | Msg::Welcome { .. } => {}
            // Another agent's word that the front-end died cannot outweigh the live link to it.
            Msg::Failed { node, .. } if node.0 == 0 && self.links.contains(node) => {}
            Msg::Failed { node, by, reason } => self.fail(node, by, reason),
            Msg::Attached if self.orphaned.is_some() => self.adopted(from),
            Msg::Shutdown { reason } => {
                self.links.broadcast(
                    &Msg::Shutdown {
                        reason: reason.clone(),
                    },
                    Some(from),
                );
                return Step::Stop(reason, true);
            }
            Msg::Routed {
                src,
                dst,
                hops,
                inner,
            } => {
                if dst != self.me {
                    if hops < 64 {
                        self.forward(
                            dst,
                            Msg::Routed {
                                src,
                                dst,
                                hops: hops + 1,
                                inner,
                            },
                        );
                    }
                } else if front_end_only(&inner) && src.0 != 0 {
                    self.emit(Event::Rejected {
                        peer: self.links.get(from).map_or(self.listen, |l| l.listen),
                        reason: format!("{src} may not send {inner:?}"),
                    });
                } else if let Msg::Ping { seq } = *inner {
                    // Routed ping: the end-to-end probe that an agent is still controllable.
                    self.route(src, Msg::Pong { seq });
                } else {
                    match *inner {
                        Msg::App(msg) => self.emit(Event::Message { from: src, msg }),
                        Msg::Pong { seq } => self.emit(Event::Pong { from: src, seq }),
                        _ => {}
                    }
                }
            }
            Msg::App(msg) => self.emit(Event::Message { from, msg }),
            // Late bootstrap traffic (e.g. a directory resent after a failure) needs no action.
            _ => {}
        }
        self.after_failures()
    }

    /// The heartbeat detector: ping every link, declare those silent for too long dead.
    pub(super) fn heartbeat(&mut self) -> Step {
        self.ping += 1;
        let timeout = self.cfg.timing.timeout;
        let now = Instant::now();
        for id in self.links.ids() {
            let silent = self
                .links
                .get(id)
                .map_or(Duration::ZERO, |l| now - l.last_seen);
            if silent > timeout {
                self.links.remove_if(id, None);
                self.fail(
                    id,
                    self.me,
                    format!("no heartbeat for {} ms", silent.as_millis()),
                );
            } else {
                self.send_to(id, Msg::Ping { seq: self.ping });
            }
        }
        self.after_failures()
    }

    /// Records a failure once, floods it, and reroutes.
    pub(super) fn fail(&mut self, node: NodeId, by: NodeId, reason: String) {
        if node == self.me || !self.dead.insert(node) {
            return;
        }
        self.links.remove_if(node, None);
        if let Some(child) = self.children.remove(&node) {
            tokio::spawn(child.finish(Duration::ZERO));
        }
        self.recompute_routes();
        self.links.broadcast(
            &Msg::Failed {
                node,
                by,
                reason: reason.clone(),
            },
            None,
        );
        self.failures.push(Failure {
            node,
            by,
            reason: reason.clone(),
        });
        self.emit(Event::NodeFailed { node, by, reason });
    }

    pub(super) fn after_failures(&mut self) -> Step {
        if self.failures.is_empty() {
            return Step::Continue;
        }
        if self.is_front_end() {
            if self.cfg.on_failure == OnFailure::Abort {
                return Step::Stop(format!("{} agent(s) failed", self.failures.len()), false);
            }
        } else if self.orphaned.is_some() {
            return Step::Continue;
        } else if self.dead.contains(&NodeId(0)) {
            return self.orphan("front-end lost");
        } else if self
            .routes
            .as_ref()
            .is_some_and(|r| r.next_hop(NodeId(0)).is_none())
        {
            return self.orphan("cut off from the front-end");
        }
        Step::Continue
    }

    pub(super) fn recompute_routes(&mut self) {
        self.routes = Some(Bmg::new(self.cfg.tree.size()).routes(self.me, &self.dead));
    }

    pub(super) fn send_to(&self, id: NodeId, msg: Msg<A>) {
        if let Some(l) = self.links.get(id) {
            l.send(msg, Blob::default());
        }
    }

    pub(super) fn route(&self, dst: NodeId, msg: Msg<A>) {
        self.forward(
            dst,
            Msg::Routed {
                src: self.me,
                dst,
                hops: 0,
                inner: Box::new(msg),
            },
        );
    }

    /// Next hop by the routing table; while overlay links are still missing, fall back to the
    /// nearest live tree ancestor (every agent has a path up).
    pub(super) fn forward(&self, dst: NodeId, routed: Msg<A>) {
        if let Some(l) = self.links.get(dst) {
            return l.send(routed, Blob::default());
        }
        // Towards a front-end that just attached: only through an agent known to reach it.
        if dst.0 == 0
            && let Some(l) = self.front_via.and_then(|v| self.links.get(v))
        {
            return l.send(routed, Blob::default());
        }
        let hop = self
            .routes
            .as_ref()
            .and_then(|r| r.next_hop(dst))
            .filter(|h| self.links.contains(*h));
        let hop = hop
            .or_else(|| self.cfg.tree.live_parent(self.me, &self.dead))
            .or_else(|| {
                // Downwards: the child whose subtree holds dst.
                self.cfg
                    .tree
                    .children(self.me)
                    .into_iter()
                    .find(|c| self.cfg.tree.subtree(*c).contains(&dst))
            });
        if let Some(l) = hop.and_then(|h| self.links.get(h)) {
            l.send(routed, Blob::default());
        }
    }

    pub(super) async fn shutdown(&mut self, reason: String, clean: bool) -> Exit {
        self.emit(Event::ShuttingDown {
            reason: reason.clone(),
        });
        self.links.broadcast(
            &Msg::Shutdown {
                reason: reason.clone(),
            },
            None,
        );
        if self.is_front_end() {
            // Wait for the agents we are linked to to hang up: they got the order and left.
            let deadline = Instant::now() + self.cfg.timing.timeout;
            while !self.links.is_empty() {
                let input = tokio::select! {
                    i = self.inbox.recv() => i,
                    _ = sleep_until(deadline) => break,
                };
                match input {
                    Some(Input::Down { from, epoch, .. }) => {
                        self.links.remove_if(from, Some(epoch));
                    }
                    None => break,
                    Some(_) => {}
                }
            }
        }
        self.exit(reason, clean)
    }

    pub(super) fn exit(&mut self, reason: String, clean: bool) -> Exit {
        Exit {
            reason,
            failures: std::mem::take(&mut self.failures),
            clean,
        }
    }
}

async fn recv_ctl<A>(ctl: &mut Option<mpsc::UnboundedReceiver<Control<A>>>) -> Option<Control<A>> {
    match ctl {
        Some(c) => c.recv().await,
        None => std::future::pending().await,
    }
}
