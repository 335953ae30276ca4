//! A job that outlives its front-end. A node agent that loses the front-end (agent 0) does
//! not end at once when the job allows a grace period: it keeps running, holds what it would
//! have sent to the front-end, and waits for a new front-end to attach. The new one dials the
//! agents the old one was linked to (its tree children and overlay neighbours); each of them
//! floods `Attached`, so every agent routes to agent 0 again, sends the messages it held and
//! reports its overlay ready, as at bootstrap. After the grace period the agent ends, and its
//! node's work with it.

use super::{
    AgentError,
    job::{Control, Event, Exit},
    links::{Input, dial},
    node::{Node, Step},
};
use crate::proto::{Held, Msg, NodeId, Payload};
use crate::topo::Bmg;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

/// Output messages held at most while there is no front-end; statuses are always held.
const BOUNDED: usize = 16_384;

/// Messages for the front-end, in the order they were sent, while there is none.
pub(super) struct HeldMessages<A> {
    msgs: Vec<A>,
    bounded: usize,
    dropped: u64,
}

impl<A> Default for HeldMessages<A> {
    fn default() -> Self {
        Self {
            msgs: Vec::new(),
            bounded: 0,
            dropped: 0,
        }
    }
}

impl<A: Payload> HeldMessages<A> {
    pub(super) fn push(&mut self, msg: A) {
        match msg.held() {
            Held::Keep => self.msgs.push(msg),
            Held::Bounded if self.bounded < BOUNDED => {
                self.bounded += 1;
                self.msgs.push(msg);
            }
            Held::Bounded => self.dropped += 1,
            Held::Drop => {}
        }
    }

    fn take(&mut self) -> (Vec<A>, u64) {
        self.bounded = 0;
        (
            std::mem::take(&mut self.msgs),
            std::mem::take(&mut self.dropped),
        )
    }
}

impl<A: Payload> Node<A> {
    /// The front-end is gone: wait for another one, or end now when the job allows none.
    pub(super) fn orphan(&mut self, why: &str) -> Step {
        let grace = self.cfg.orphan_grace;
        if grace.is_zero() {
            return Step::Stop(why.into(), false);
        }
        self.orphaned = Some(Instant::now() + grace);
        self.front_via = None;
        self.emit(Event::Orphaned { grace });
        Step::Continue
    }

    /// A new front-end is reachable through `via` (itself, linked to this agent, or the
    /// neighbour that announced it): route to it again, tell the neighbours, and hand it
    /// what was held.
    pub(super) fn adopted(&mut self, via: NodeId) {
        self.orphaned = None;
        self.front_via = Some(via);
        self.dead.remove(&NodeId(0));
        self.recompute_routes();
        self.links.broadcast(&Msg::Attached, None);
        self.route(NodeId(0), Msg::OverlayReady { id: self.me });
        let (held, dropped) = self.held.take();
        for msg in held {
            self.route(NodeId(0), Msg::App(msg));
        }
        self.emit(Event::Adopted { dropped });
    }

    /// The new front-end's life: links to the agents the old one was linked to, waits until
    /// every live agent in `directory` routes to it, then runs as any front-end.
    pub(super) async fn attach(
        &mut self,
        directory: Vec<(NodeId, SocketAddr)>,
        ctl: mpsc::UnboundedReceiver<Control<A>>,
        start: Instant,
    ) -> Result<Exit, AgentError> {
        let size = self.cfg.tree.size();
        if let Some((bad, _)) = directory.iter().find(|(id, _)| id.0 == 0 || id.0 >= size) {
            return Err(AgentError::BadId { id: bad.0, size });
        }
        let addrs: HashMap<NodeId, SocketAddr> = directory.iter().copied().collect();
        self.dead
            .extend((1..size).map(NodeId).filter(|id| !addrs.contains_key(id)));
        self.recompute_routes();
        let mut peers: HashSet<NodeId> = Bmg::new(size).neighbours(self.me).into_iter().collect();
        peers.extend(self.cfg.tree.children(self.me));
        peers.retain(|p| addrs.contains_key(p));
        // Dial results come apart from the inbox: what the agents send once linked (what they
        // held) must stay in order behind nothing.
        let (dialed, mut results) = mpsc::unbounded_channel::<Input<A>>();
        for &p in &peers {
            let (key, listen, hs, inbox) = (
                self.cfg.secret.clone(),
                self.listen,
                self.cfg.timing.handshake,
                dialed.clone(),
            );
            let addr = addrs[&p];
            tokio::spawn(async move {
                let input = match dial::<A>(addr, &key, NodeId(0), listen, p, hs).await {
                    Ok((tx, rx)) => Input::Link {
                        id: p,
                        listen: addr,
                        tx,
                        rx,
                    },
                    Err(e) => Input::DialFailed {
                        to: p,
                        reason: e.to_string(),
                    },
                };
                let _ = inbox.send(input);
            });
        }
        drop(dialed);
        let deadline = Instant::now() + self.cfg.timing.handshake;
        let mut pending = peers.clone();
        let mut refused = Vec::new();
        while !pending.is_empty() {
            let input = tokio::select! {
                i = results.recv() => i,
                _ = sleep_until(deadline) => break,
            };
            match input {
                Some(Input::Link { id, listen, tx, rx }) => {
                    pending.remove(&id);
                    self.links.add(id, listen, tx, rx, &self.inbox_tx)
                }
                Some(Input::DialFailed { to, reason }) => {
                    pending.remove(&to);
                    refused.push((to, reason));
                }
                Some(_) | None => break,
            }
        }
        if !peers.iter().any(|p| self.links.contains(*p)) {
            // Nothing to fail over to: the job is gone (or never ran with these agents).
            let why = "no agent of the job answered";
            return Ok(self.exit(why.into(), false));
        }
        for (to, reason) in refused {
            self.fail(to, self.me, reason);
        }
        for p in pending {
            self.fail(p, self.me, "no answer to the new front-end in time".into());
        }
        if let Step::Stop(reason, clean) = self.await_overlay_ready(&directory, start).await {
            return Ok(self.shutdown(reason, clean).await);
        }
        self.running(&mut Some(ctl)).await
    }
}
