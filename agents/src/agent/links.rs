//! Authenticated links of one agent: a writer task and a reader task per link; everything the
//! readers get, and every link that goes down, arrives in the agent's single inbox.

use crate::{
    proto::{self, LinkRx, LinkTx, Msg, NodeId, Payload, ProtoError},
    secret::JobSecret,
};
use std::{collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
    task::{AbortHandle, JoinHandle},
    time::Instant,
};

pub(crate) type Blob = Arc<Vec<u8>>;

pub(crate) enum Input<A> {
    Link {
        id: NodeId,
        listen: SocketAddr,
        tx: LinkTx,
        rx: LinkRx,
    },
    Msg {
        from: NodeId,
        epoch: u64,
        msg: Msg<A>,
        blob: Vec<u8>,
    },
    Down {
        from: NodeId,
        epoch: u64,
        reason: String,
    },
    DialFailed {
        to: NodeId,
        reason: String,
    },
    Rejected {
        peer: SocketAddr,
        reason: String,
    },
    ChildExit {
        id: NodeId,
        how: String,
    },
}

pub(crate) struct Link<A> {
    pub epoch: u64,
    pub listen: SocketAddr,
    pub last_seen: Instant,
    out: mpsc::UnboundedSender<(Msg<A>, Blob)>,
    writer: JoinHandle<()>,
    reader: AbortHandle,
}

impl<A> Link<A> {
    pub fn send(&self, msg: Msg<A>, blob: Blob) {
        // A send to a dying link is lost on purpose: the reader reports the link down.
        let _ = self.out.send((msg, blob));
    }
}

pub(crate) struct Links<A> {
    map: HashMap<NodeId, Link<A>>,
    epoch: u64,
}

impl<A> Default for Links<A> {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            epoch: 0,
        }
    }
}

impl<A: Payload> Links<A> {
    pub fn add(
        &mut self,
        id: NodeId,
        listen: SocketAddr,
        mut tx: LinkTx,
        mut rx: LinkRx,
        inbox: &mpsc::UnboundedSender<Input<A>>,
    ) {
        self.epoch += 1;
        let epoch = self.epoch;
        let (out, mut queue) = mpsc::unbounded_channel::<(Msg<A>, Blob)>();
        let writer = tokio::spawn(async move {
            while let Some((msg, blob)) = queue.recv().await {
                if tx.send_blob(&msg, &blob).await.is_err() {
                    break;
                }
            }
        });
        let inbox = inbox.clone();
        let reader = tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok((msg, blob)) => {
                        if inbox
                            .send(Input::Msg {
                                from: id,
                                epoch,
                                msg,
                                blob,
                            })
                            .is_err()
                        {
                            break;
                        }
                    }
                    Err(e) => {
                        // A peer killed with frames still unread in its socket resets the
                        // connection instead of closing it: the same end of the peer.
                        let reason = match e {
                            ProtoError::Closed => "connection closed".to_string(),
                            ProtoError::Io(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::ConnectionReset
                                        | std::io::ErrorKind::ConnectionAborted
                                ) =>
                            {
                                "connection closed (reset by the peer)".to_string()
                            }
                            e => e.to_string(),
                        };
                        let _ = inbox.send(Input::Down {
                            from: id,
                            epoch,
                            reason,
                        });
                        break;
                    }
                }
            }
        })
        .abort_handle();
        if let Some(old) = self.map.insert(
            id,
            Link {
                epoch,
                listen,
                last_seen: Instant::now(),
                out,
                writer,
                reader,
            },
        ) {
            old.reader.abort();
        }
    }

    pub fn get(&self, id: NodeId) -> Option<&Link<A>> {
        self.map.get(&id)
    }

    pub fn get_mut(&mut self, id: NodeId) -> Option<&mut Link<A>> {
        self.map.get_mut(&id)
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.map.contains_key(&id)
    }

    pub fn ids(&self) -> Vec<NodeId> {
        self.map.keys().copied().collect()
    }

    /// Counts every link as just heard from (heartbeats start after the bootstrap phases).
    pub fn refresh(&mut self) {
        let now = Instant::now();
        for l in self.map.values_mut() {
            l.last_seen = now;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Removes a link if `epoch` is current (stale reports of replaced links are ignored).
    pub fn remove_if(&mut self, id: NodeId, epoch: Option<u64>) -> bool {
        match self.map.get(&id) {
            Some(l) if epoch.is_none_or(|g| g == l.epoch) => {
                let l = self.map.remove(&id).expect("present");
                l.reader.abort();
                true
            }
            _ => false,
        }
    }

    pub fn broadcast(&self, msg: &Msg<A>, except: Option<NodeId>) {
        let empty: Blob = Arc::new(Vec::new());
        for (id, l) in &self.map {
            if Some(*id) != except {
                l.send(msg.clone(), empty.clone());
            }
        }
    }

    /// Lets queued frames go out (bounded by `grace`), then closes every link.
    pub async fn close_all(&mut self, grace: Duration) {
        let links: Vec<Link<A>> = self.map.drain().map(|(_, l)| l).collect();
        let mut writers = Vec::new();
        for l in links {
            drop(l.out);
            writers.push((l.writer, l.reader));
        }
        let deadline = Instant::now() + grace;
        for (w, r) in writers {
            let _ = tokio::time::timeout_at(deadline, w).await;
            r.abort();
        }
    }
}

impl<A> Drop for Links<A> {
    fn drop(&mut self) {
        for l in self.map.values() {
            l.reader.abort();
            l.writer.abort();
        }
    }
}

/// Accepts connections forever; each one that authenticates with a Hello becomes an `Input::Link`.
pub(crate) fn serve<A: Payload>(
    listener: TcpListener,
    key: JobSecret,
    me: NodeId,
    deadline: Duration,
    inbox: mpsc::UnboundedSender<Input<A>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let gate = proto::Gate::default();
        loop {
            let (stream, peer, slot) = gate.accept(&listener).await;
            let key = key.clone();
            let inbox = inbox.clone();
            tokio::spawn(async move {
                let handshake = proto::accept::<Msg<A>>(stream, &key, deadline).await;
                drop(slot);
                let input = match handshake {
                    Ok((mut tx, rx, Msg::Hello { id, listen })) => {
                        match tx.send(&Msg::<A>::Welcome { id: me }).await {
                            Ok(()) => Input::Link { id, listen, tx, rx },
                            Err(e) => Input::Rejected {
                                peer,
                                reason: e.to_string(),
                            },
                        }
                    }
                    Ok((_, _, other)) => Input::Rejected {
                        peer,
                        reason: format!("expected Hello, got {other:?}"),
                    },
                    Err(e) => Input::Rejected {
                        peer,
                        reason: e.to_string(),
                    },
                };
                let _ = inbox.send(input);
            });
        }
    })
}

/// Why an agent could not link up with another.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("connect to {0} timed out")]
    Timeout(SocketAddr),
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        source: crate::proto::ProtoError,
    },
    #[error("{addr} answered {answer}, expected Welcome from {expect}")]
    Unexpected {
        addr: SocketAddr,
        answer: String,
        expect: NodeId,
    },
}

/// Dials `addr`, introduces itself, and checks the callee is the agent it expected.
pub(crate) async fn dial<A: Payload>(
    addr: SocketAddr,
    key: &JobSecret,
    me: NodeId,
    my_listen: SocketAddr,
    expect: NodeId,
    deadline: Duration,
) -> Result<(LinkTx, LinkRx), DialError> {
    let stream = tokio::time::timeout(deadline, TcpStream::connect(addr))
        .await
        .map_err(|_| DialError::Timeout(addr))?
        .map_err(|source| DialError::Connect { addr, source })?;
    let (tx, rx, answer) = proto::connect(
        stream,
        key,
        &Msg::<A>::Hello {
            id: me,
            listen: my_listen,
        },
        deadline,
    )
    .await
    .map_err(|source| DialError::Handshake { addr, source })?;
    match answer {
        Msg::Welcome { id } if id == expect => Ok((tx, rx)),
        other => Err(DialError::Unexpected {
            addr,
            answer: format!("{other:?}"),
            expect,
        }),
    }
}
