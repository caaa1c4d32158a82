//! The hub's state: per replica, its current connection, the messages it
//! has not acknowledged, and its pace; and the queue of what replicas said
//! that waits for the relay. A connection attaches to it and detaches from
//! it; a replica gone long enough is forgotten.

use super::session::CLOSE_POLICY;
use super::Settings;
use crate::credentials::Credentials;
use crate::guard::Guard;
use crate::logbook::{self, Kind, Logbook};
use magic_sync::envelope::Up;
use magic_sync::run::Report;
use magic_sync::ReplicaId;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, Notify};

/// What goes down a connection.
#[derive(Debug)]
pub(super) enum Out {
    Frame(axum::body::Bytes),
    /// Close with this code and reason.
    Close(u16, String),
}

/// A replica's current connection.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) tx: mpsc::UnboundedSender<Out>,
    generation: u64,
}

/// What the hub keeps for one replica.
#[derive(Debug, Default)]
pub(super) struct Peer {
    pub(super) conn: Option<Conn>,
    /// Messages sent and not acknowledged, oldest first, by number.
    pub(super) unacked: VecDeque<(u64, axum::body::Bytes)>,
    pub(super) unacked_bytes: usize,
    /// Wakes sends waiting for room, or for the replica's connection to
    /// change.
    pub(super) room: Arc<Notify>,
    /// When its last connection was lost, if it had one and has none now.
    pub(super) lost_at: Option<std::time::Instant>,
    /// Until when what its connections read is paid for ([`Pace`]): kept
    /// across connections, so a replica that connects again does not
    /// start a fresh burst.
    ///
    /// [`Pace`]: super::session::Pace
    paid_at: Option<tokio::time::Instant>,
}

impl Peer {
    /// Forgets what the replica no longer needs: everything up to `number`.
    fn release(&mut self, number: u64) {
        while let Some((n, frame)) = self.unacked.front() {
            if *n > number {
                break;
            }
            self.unacked_bytes -= frame.len();
            self.unacked.pop_front();
        }
        self.room.notify_waiters();
    }
}

/// What replicas said that the relay has not taken yet, and its bytes.
#[derive(Debug, Default)]
pub(super) struct Queue {
    pub(super) reports: VecDeque<(ReplicaId, Report)>,
    /// Per replica, the bytes of its frames queued.
    pub(super) bytes: HashMap<String, usize>,
    pub(super) total: usize,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) settings: Settings,
    pub(super) credentials: Credentials,
    pub(super) guard: Guard,
    /// What is logged of what others do wrong: a line a minute per kind.
    logbook: Logbook,
    peers: Mutex<HashMap<String, Peer>>,
    pub(super) reports: Mutex<Queue>,
    pub(super) reported: Notify,
    /// Wakes readers waiting for room in the queue once the relay took it.
    pub(super) taken: Notify,
    generation: AtomicU64,
    pub(super) connections: AtomicUsize,
}

/// The relay's transport to every replica connected, and where what they
/// say reaches it. Clones share it.
#[derive(Debug, Clone)]
pub struct Hub {
    pub(super) inner: Arc<Inner>,
}

impl Hub {
    /// A hub checking secrets with `credentials`.
    pub fn new(settings: Settings, credentials: Credentials) -> Self {
        Hub {
            inner: Arc::new(Inner {
                guard: Guard::new(
                    settings.max_connections_per_address,
                    settings.max_connections_per_network,
                ),
                logbook: Logbook::default(),
                settings,
                credentials,
                peers: Mutex::default(),
                reports: Mutex::default(),
                reported: Notify::new(),
                taken: Notify::new(),
                generation: AtomicU64::new(0),
                connections: AtomicUsize::new(0),
            }),
        }
    }

    /// Replicas connected now, sorted.
    pub fn connected(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .inner
            .peers()
            .iter()
            .filter(|(_, p)| p.conn.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// Until when what `replica`'s connections read is paid for at its
    /// pace (`max_bytes_per_second`): the hub reads it no further before
    /// then, whichever connection it comes on. `None` before it read any.
    pub fn paid_until(&self, replica: &str) -> Option<std::time::Instant> {
        self.inner
            .paid_at(replica)
            .map(tokio::time::Instant::into_std)
    }

    /// Bytes of what replicas said that the relay has not taken yet (as
    /// they take decoded): all of them, and `replica`'s.
    pub fn queued(&self, replica: &str) -> (usize, usize) {
        let queue = self
            .inner
            .reports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (queue.total, queue.bytes.get(replica).copied().unwrap_or(0))
    }

    /// Connections open now, replicas' or not yet.
    pub fn connections(&self) -> usize {
        self.inner.connections.load(Ordering::Relaxed)
    }

    /// Closes `replica`'s connection, saying `why`.
    pub fn disconnect(&self, replica: &str, why: &str) {
        if let Some(conn) = self
            .inner
            .peers()
            .get(replica)
            .and_then(|p| p.conn.as_ref())
        {
            let _ = conn.tx.send(Out::Close(CLOSE_POLICY, why.to_string()));
        }
    }
}

impl Inner {
    /// Writes a line of `kind` with `write` (given what the line adds of
    /// those it did not write), if the logbook says one is due.
    pub(super) fn log(&self, kind: Kind, write: impl FnOnce(&str)) {
        if let Some(unwritten) = self.logbook.note(kind) {
            write(&logbook::since(unwritten));
        }
    }

    pub(super) fn peers(&self) -> MutexGuard<'_, HashMap<String, Peer>> {
        self.peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes `tx` `replica`'s connection: a connection it had before is
    /// closed, and what it has not acknowledged goes first.
    pub(super) fn attach(&self, replica: &str, tx: mpsc::UnboundedSender<Out>) -> u64 {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let mut peers = self.peers();
        let peer = peers.entry(replica.to_string()).or_default();
        if let Some(old) = peer.conn.take() {
            let _ = old.tx.send(Out::Close(
                CLOSE_POLICY,
                "a newer connection of this replica took over".into(),
            ));
        }
        for (_, frame) in &peer.unacked {
            let _ = tx.send(Out::Frame(frame.clone()));
        }
        peer.conn = Some(Conn { tx, generation });
        peer.lost_at = None;
        peer.room.notify_waiters();
        drop(peers);
        // What waits for the replica goes now, not when the publisher would
        // next have tried it.
        self.reported.notify_waiters();
        generation
    }

    /// Until when what `replica`'s connections read is paid for, if it
    /// read anything since the hub last forgot it.
    pub(super) fn paid_at(&self, replica: &str) -> Option<tokio::time::Instant> {
        self.peers().get(replica).and_then(|p| p.paid_at)
    }

    /// Records that what `replica` read is paid for until `at`.
    pub(super) fn paid(&self, replica: &str, at: tokio::time::Instant) {
        if let Some(peer) = self.peers().get_mut(replica) {
            peer.paid_at = Some(peer.paid_at.map_or(at, |p| p.max(at)));
        }
    }

    pub(super) fn detach(self: &Arc<Self>, replica: &str, generation: u64) {
        if let Some(peer) = self.peers().get_mut(replica) {
            if peer
                .conn
                .as_ref()
                .is_some_and(|c| c.generation == generation)
            {
                peer.conn = None;
                peer.lost_at = Some(std::time::Instant::now());
                peer.room.notify_waiters();
                let (inner, replica) = (self.clone(), replica.to_string());
                let window = self.settings.forget_after.max(self.settings.resume_window);
                tokio::spawn(async move {
                    tokio::time::sleep(window).await;
                    inner.forget(&replica);
                });
            }
        }
    }

    /// What `replica` said, `size` bytes of it: the messages it
    /// acknowledged (or gave up on) are let go of, and the report waits for
    /// the relay, if the queue has room for it; if not, it is given back.
    fn heard(&self, replica: &str, up: Up, size: usize) -> Option<Up> {
        let done = up
            .applied
            .as_ref()
            .map(|a| a.number)
            .max(up.gap.as_ref().map(|g| g.number));
        if let Some(number) = done {
            if let Some(peer) = self.peers().get_mut(replica) {
                peer.release(number);
            }
        }
        let mut queue = self
            .reports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = queue.bytes.get(replica).copied().unwrap_or(0);
        let full = (mine > 0 && mine + size > self.settings.max_queued_bytes)
            || (queue.total > 0 && queue.total + size > self.settings.max_queued_total);
        if full {
            return Some(up);
        }
        *queue.bytes.entry(replica.to_string()).or_default() += size;
        queue.total += size;
        queue
            .reports
            .push_back((ReplicaId::from(replica), Report::from_up(up)));
        drop(queue);
        self.reported.notify_one();
        None
    }

    /// [`Inner::heard`], waiting while the queue has no room: the
    /// connection is not read meanwhile.
    pub(super) async fn hear(&self, replica: &str, up: Up, size: usize) {
        let mut up = up;
        loop {
            // Made before looking, so a take in between is not missed.
            let taken = self.taken.notified();
            match self.heard(replica, up, size) {
                None => return,
                Some(back) => up = back,
            }
            taken.await;
        }
    }

    /// Lets go of what `replica` was sent and did not acknowledge, if its
    /// connection is still lost `forget_after` on: it is provisioned again
    /// if it comes back.
    fn forget(&self, replica: &str) {
        let window = self.settings.forget_after.max(self.settings.resume_window);
        let mut peers = self.peers();
        let gone = peers.get(replica).is_some_and(|p| {
            p.conn.is_none() && p.lost_at.is_some_and(|at| at.elapsed() >= window)
        });
        if gone {
            if let Some(peer) = peers.remove(replica) {
                peer.room.notify_waiters();
            }
        }
    }
}
