//! One agent's life: bootstrap along the tree, the BMG overlay, then the running loop with the
//! failure detectors. Agent 0 (the front-end) runs the same code plus the user's policy.

use super::{
    AgentConfig, AgentError, OnFailure,
    links::{Blob, Input, Links, dial, serve},
    role::front_end_only,
    spawn::{ChildSpec, SpawnedChild},
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

/// Something the front-end's user (the CLI, a test, a benchmark) should know.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event<A> {
    /// An agent started its child agents.
    Spawned {
        by: NodeId,
        children: Vec<NodeId>,
    },
    /// A connection without valid credentials was dropped.
    Rejected {
        peer: SocketAddr,
        reason: String,
    },
    /// The whole tree reported: `up` agents (front-end included) are running.
    Bootstrapped {
        up: usize,
        failed: Vec<NodeId>,
        depth: u32,
        elapsed: Duration,
    },
    /// Every live agent has its overlay links.
    Ready {
        agents: usize,
        elapsed: Duration,
    },
    NodeFailed {
        node: NodeId,
        by: NodeId,
        reason: String,
    },
    /// An application message routed to this agent.
    Message {
        from: NodeId,
        msg: A,
    },
    /// The answer to a [`Control::Ping`]: `from` is alive and reachable over the overlay.
    Pong {
        from: NodeId,
        seq: u64,
    },
    ShuttingDown {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Failure {
    pub node: NodeId,
    pub by: NodeId,
    pub reason: String,
}

/// How an agent ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Exit {
    pub reason: String,
    pub failures: Vec<Failure>,
    /// False when the job ended because of failures.
    pub clean: bool,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.reason)?;
        for x in &self.failures {
            write!(f, "; {} failed ({}, seen by {})", x.node, x.reason, x.by)?;
        }
        Ok(())
    }
}

/// Orders from the front-end's user.
#[derive(Debug, Clone)]
pub enum Control<A> {
    Shutdown {
        reason: String,
    },
    Send {
        dst: NodeId,
        msg: A,
    },
    /// An end-to-end probe over the overlay: answered by [`Event::Pong`].
    Ping {
        dst: NodeId,
        seq: u64,
    },
}

/// A running job seen from the front-end.
pub struct Job<A> {
    ctl: mpsc::UnboundedSender<Control<A>>,
    pub events: mpsc::UnboundedReceiver<Event<A>>,
    task: JoinHandle<Result<Exit, AgentError>>,
}

impl<A: Payload> Job<A> {
    /// Starts the front-end (agent 0), which starts everything else.
    pub fn start(cfg: AgentConfig) -> Self {
        let (ctl, ctl_rx) = mpsc::unbounded_channel();
        let (ev, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(
            AgentConfig {
                id: NodeId(0),
                ..cfg
            },
            None,
            Some(ctl_rx),
            ev,
        ));
        Self { ctl, events, task }
    }

    pub fn control(&self, c: Control<A>) {
        let _ = self.ctl.send(c);
    }

    /// A cloneable handle that can give orders from another thread or task.
    pub fn handle(&self) -> JobHandle<A> {
        JobHandle(self.ctl.clone())
    }

    /// Next event, or None once the front-end has ended.
    pub async fn next_event(&mut self) -> Option<Event<A>> {
        self.events.recv().await
    }

    pub async fn wait(self) -> Result<Exit, AgentError> {
        self.task
            .await
            .map_err(|e| AgentError::Lost(e.to_string()))?
    }
}

#[derive(Debug)]
pub struct JobHandle<A>(mpsc::UnboundedSender<Control<A>>);

impl<A> Clone for JobHandle<A> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<A> JobHandle<A> {
    pub(crate) fn new(ctl: mpsc::UnboundedSender<Control<A>>) -> Self {
        Self(ctl)
    }

    /// Sends `msg` to agent `dst` over the overlay.
    pub fn send(&self, dst: NodeId, msg: A) {
        self.control(Control::Send { dst, msg });
    }

    pub fn control(&self, c: Control<A>) {
        let _ = self.0.send(c);
    }
}

struct AbortOnDrop(JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Node<A> {
    cfg: AgentConfig,
    me: NodeId,
    listen: SocketAddr,
    inbox_tx: mpsc::UnboundedSender<Input<A>>,
    inbox: mpsc::UnboundedReceiver<Input<A>>,
    links: Links<A>,
    children: HashMap<NodeId, SpawnedChild>,
    dead: HashSet<NodeId>,
    routes: Option<RoutingTable>,
    events: mpsc::UnboundedSender<Event<A>>,
    failures: Vec<Failure>,
    ping: u64,
    /// Inputs that arrived before the phase that handles them.
    deferred: Vec<Input<A>>,
    _server: AbortOnDrop,
}

enum Step {
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
    let listener = TcpListener::bind((cfg.bind, 0))
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
    let mut n = Node {
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
        _server: AbortOnDrop(server),
    };
    let result = n.life(parent, ctl, start).await;
    // Whatever happened, nothing this agent started may outlive it.
    n.links.close_all(Duration::from_secs(1)).await;
    let grace = n.cfg.timing.timeout;
    let kids: Vec<SpawnedChild> = n.children.drain().map(|(_, c)| c).collect();
    futures_join(kids.into_iter().map(|c| c.finish(grace))).await;
    result
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
    fn emit(&self, e: Event<A>) {
        let _ = self.events.send(e);
    }

    fn is_front_end(&self) -> bool {
        self.me.0 == 0
    }

    async fn life(
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
        }
        let (up, failed) = self.bootstrap_children().await?;
        let directory = if let Some(pid) = parent_id {
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
            all
        };
        let live: HashSet<NodeId> = directory.iter().map(|(id, _)| *id).collect();
        for id in tree.children(self.me) {
            if live.contains(&id) {
                self.send_to(
                    id,
                    Msg::Directory {
                        addrs: directory.clone(),
                    },
                );
            }
        }
        self.dead = (0..tree.size())
            .map(NodeId)
            .filter(|id| !live.contains(id))
            .collect();
        self.recompute_routes();
        self.build_overlay(&directory).await;
        if self.is_front_end() {
            if let Step::Stop(reason, clean) = self.await_overlay_ready(&live, start).await {
                return Ok(self.shutdown(reason, clean).await);
            }
        } else {
            self.route(NodeId(0), Msg::OverlayReady { id: self.me });
        }
        self.running(&mut ctl).await
    }

    /// Starts the children and waits for each one's subtree report or failure.
    async fn bootstrap_children(
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

    async fn await_directory(
        &mut self,
        pid: NodeId,
    ) -> Result<Option<Vec<(NodeId, SocketAddr)>>, AgentError> {
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
                    msg: Msg::Directory { addrs },
                    ..
                }) if from == pid => return Ok(Some(addrs)),
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

    /// Dials the BMG neighbours with higher ids (unless a tree link already joins them) and
    /// waits for the lower ones to dial in.
    async fn build_overlay(&mut self, directory: &[(NodeId, SocketAddr)]) {
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
                let addr = addrs[&nb];
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

    async fn await_overlay_ready(&mut self, live: &HashSet<NodeId>, start: Instant) -> Step {
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
        self.emit(Event::Ready {
            agents,
            elapsed: start.elapsed(),
        });
        Step::Continue
    }

    async fn running(
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
                c = recv_ctl(ctl) => match c {
                    Some(Control::Shutdown { reason }) => Step::Stop(reason, self.failures.is_empty()),
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

    fn handle(&mut self, input: Input<A>) -> Step {
        match input {
            Input::Link { id, listen, tx, rx } => {
                if !self.dead.contains(&id) {
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

    fn on_message(&mut self, from: NodeId, msg: Msg<A>, _blob: Vec<u8>) -> Step {
        match msg {
            Msg::Ping { seq } => self.send_to(from, Msg::Pong { seq }),
            Msg::Pong { .. } | Msg::Hello { .. } | Msg::Welcome { .. } => {}
            Msg::Failed { node, by, reason } => self.fail(node, by, reason),
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
    fn heartbeat(&mut self) -> Step {
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
    fn fail(&mut self, node: NodeId, by: NodeId, reason: String) {
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

    fn after_failures(&mut self) -> Step {
        if self.failures.is_empty() {
            return Step::Continue;
        }
        if self.is_front_end() {
            if self.cfg.on_failure == OnFailure::Abort {
                return Step::Stop(format!("{} agent(s) failed", self.failures.len()), false);
            }
        } else if self.dead.contains(&NodeId(0)) {
            return Step::Stop("front-end lost".into(), false);
        } else if self
            .routes
            .as_ref()
            .is_some_and(|r| r.next_hop(NodeId(0)).is_none())
        {
            return Step::Stop("cut off from the front-end".into(), false);
        }
        Step::Continue
    }

    fn recompute_routes(&mut self) {
        self.routes = Some(Bmg::new(self.cfg.tree.size()).routes(self.me, &self.dead));
    }

    fn send_to(&self, id: NodeId, msg: Msg<A>) {
        if let Some(l) = self.links.get(id) {
            l.send(msg, Blob::default());
        }
    }

    fn route(&self, dst: NodeId, msg: Msg<A>) {
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
    fn forward(&self, dst: NodeId, routed: Msg<A>) {
        if let Some(l) = self.links.get(dst) {
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

    async fn shutdown(&mut self, reason: String, clean: bool) -> Exit {
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

    fn exit(&mut self, reason: String, clean: bool) -> Exit {
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
