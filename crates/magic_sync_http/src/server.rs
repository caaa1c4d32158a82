//! The server's side: a [`Hub`] that the relay publishes through and hears
//! replicas from, and [`serve`], which accepts their connections.
//!
//! A replica's messages go down its one connection in order. Those it has
//! not acknowledged yet stay with the hub (up to
//! [`Settings::max_unacked_bytes`]) and go again, first, when it connects
//! next: a connection lost mid-stream loses nothing, and the replica's
//! chain skips what it had applied. Beyond that bound, or while the replica
//! is not connected, a send fails and the rest waits in the outbox.

use crate::credentials::{self, Checked, Credentials};
use crate::guard::{self, Crowded, Guard};
use crate::logbook::{self, Kind, Logbook};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use axum::Router;
use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use magic_sync::core::bounds::{bounded_decode, Bounded, Refusal, UpBounds};
use magic_sync::envelope::{Filed, Up};
use magic_sync::relay::{SendError, Transport};
use magic_sync::run::server::Reports;
use magic_sync::run::Report;
use magic_sync::ReplicaId;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};

/// How the server treats its connections.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The most bytes one frame may have, either way. A replica that sends
    /// a larger one is disconnected.
    pub max_message_bytes: usize,
    /// Connections held at most; one more is closed as soon as accepted.
    pub max_connections: usize,
    /// Connections held at most from one address (a shop's tills behind
    /// one router share theirs); one more is closed as soon as accepted.
    pub max_connections_per_address: usize,
    /// Connections held at most from one network (an IPv4 /24, an IPv6
    /// /64: what one party usually holds whole), so that a few of its
    /// addresses cannot take every connection; one more is closed as soon
    /// as accepted.
    pub max_connections_per_network: usize,
    /// Bytes of messages a replica has not acknowledged yet held for it at
    /// most: past this, sends to it wait in the outbox until it catches up.
    pub max_unacked_bytes: usize,
    /// How long a connection may take to become a replica's: TLS, the
    /// request's headers, and checking its secret.
    pub handshake_timeout: Duration,
    /// How often the server pings each replica.
    pub ping_every: Duration,
    /// How long a replica may say nothing at all (not even a pong) before
    /// its connection is closed.
    pub idle_timeout: Duration,
    /// How long a frame may take to be taken by a replica before its
    /// connection is closed: a replica that stops reading holds nothing.
    /// Also how long a send waits for a replica to make room.
    pub write_timeout: Duration,
    /// How long after a replica's connection was lost its messages are
    /// still taken (within `max_unacked_bytes`), to go when it is back: a
    /// replica that reconnects at once misses nothing, even mid-snapshot.
    /// Later, its messages wait in the outbox.
    pub resume_window: Duration,
    /// How long after a replica's connection was lost the hub keeps what it
    /// sent it and did not hear acknowledged (at least `resume_window`).
    /// Past it that is let go of, so replicas that went away cost nothing
    /// here; one that comes back later misses those messages and is
    /// provisioned again.
    pub forget_after: Duration,
    /// Bytes of one replica's frames read and not yet taken by the relay, at
    /// most (one frame is always let in): past this the hub stops reading
    /// that replica's connection until the relay takes what it said. A
    /// replica that floods only slows itself.
    pub max_queued_bytes: usize,
    /// Bytes of every replica's frames read and not yet taken by the relay,
    /// at most: past this every connection waits before its next frame.
    pub max_queued_total: usize,
    /// Bytes a second read from one replica at most, after a first burst of
    /// `max_message_bytes`: the hub reads a replica that sends faster only
    /// at this pace, so what one replica sends costs the server a bounded
    /// share of its time, whatever it sends. Each frame counts as at least
    /// 4 KiB, and each row an upload carries as at least 1 KiB, so a flood
    /// of tiny frames, or of empty rows, is bounded by their number too.
    pub max_bytes_per_second: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_message_bytes: 16 << 20,
            max_connections: 10_000,
            max_connections_per_address: 1_000,
            max_connections_per_network: 1_000,
            max_unacked_bytes: 16 << 20,
            handshake_timeout: Duration::from_secs(10),
            ping_every: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(45),
            write_timeout: Duration::from_secs(30),
            resume_window: Duration::from_secs(30),
            forget_after: Duration::from_secs(600),
            max_queued_bytes: 16 << 20,
            max_queued_total: 256 << 20,
            max_bytes_per_second: 8 << 20,
        }
    }
}

/// What goes down a connection.
#[derive(Debug)]
enum Out {
    Frame(axum::body::Bytes),
    /// Close with this code and reason.
    Close(u16, String),
}

/// A replica's current connection.
#[derive(Debug)]
struct Conn {
    tx: mpsc::UnboundedSender<Out>,
    generation: u64,
}

/// What the hub keeps for one replica.
#[derive(Debug, Default)]
struct Peer {
    conn: Option<Conn>,
    /// Messages sent and not acknowledged, oldest first, by number.
    unacked: VecDeque<(u64, axum::body::Bytes)>,
    unacked_bytes: usize,
    /// Wakes sends waiting for room, or for the replica's connection to
    /// change.
    room: Arc<Notify>,
    /// When its last connection was lost, if it had one and has none now.
    lost_at: Option<std::time::Instant>,
    /// Until when what its connections read is paid for ([`Pace`]): kept
    /// across connections, so a replica that connects again does not
    /// start a fresh burst.
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
struct Queue {
    reports: VecDeque<(ReplicaId, Report)>,
    /// Per replica, the bytes of its frames queued.
    bytes: HashMap<String, usize>,
    total: usize,
}

#[derive(Debug)]
struct Inner {
    settings: Settings,
    credentials: Credentials,
    guard: Guard,
    /// What is logged of what others do wrong: a line a minute per kind.
    logbook: Logbook,
    peers: Mutex<HashMap<String, Peer>>,
    reports: Mutex<Queue>,
    reported: Notify,
    /// Wakes readers waiting for room in the queue once the relay took it.
    taken: Notify,
    generation: AtomicU64,
    connections: AtomicUsize,
}

/// The relay's transport to every replica connected, and where what they
/// say reaches it. Clones share it.
#[derive(Debug, Clone)]
pub struct Hub {
    inner: Arc<Inner>,
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

/// Close codes: going away, policy violation, data that is not an `Up`,
/// a frame too large.
const CLOSE_AWAY: u16 = 1001;
const CLOSE_POLICY: u16 = 1008;
const CLOSE_INVALID: u16 = 1007;
const CLOSE_TOO_BIG: u16 = 1009;

/// Bytes read from a replica's connection at a time.
const READ_BUFFER: usize = 8 << 10;
/// What a frame counts as, at least, against its replica's pace: hearing a
/// frame costs the relay by the frame as well as by the byte, and a flood
/// of acknowledgements of 50 bytes would otherwise be read at 170,000 a
/// second. At the default pace this is 2,048 frames a second, far above
/// what a replica says (an acknowledgement per message applied, an upload
/// per batch of writes).
const FRAME_FLOOR: usize = 4 << 10;
/// What a row of an upload counts as, at least, against its replica's
/// pace: filing costs by the row, and an upload of 5,000 empty rows is a
/// few KiB. At the default pace this is 8,192 rows a second, a day's
/// backlog of 100,000 sales in about 12 s.
const ROW_FLOOR: usize = 1 << 10;
/// The most bytes of an HTTP head the hub reads before it answers 431 and
/// closes. A replica's upgrade is a few hundred bytes: its Basic
/// credentials (an id of at most [`credentials::MAX_ID_BYTES`] and a
/// secret), the WebSocket headers, perhaps a proxy's. hyper's default is
/// about 400 KiB, and a stranger could make the hub parse that much per
/// connection from every new address it has.
const HEAD_BYTES: usize = 16 << 10;
/// The most header fields in a head (hyper's default is 100).
const HEAD_FIELDS: usize = 64;

impl Inner {
    /// Writes a line of `kind` with `write` (given what the line adds of
    /// those it did not write), if the logbook says one is due.
    fn log(&self, kind: Kind, write: impl FnOnce(&str)) {
        if let Some(unwritten) = self.logbook.note(kind) {
            write(&logbook::since(unwritten));
        }
    }

    fn peers(&self) -> MutexGuard<'_, HashMap<String, Peer>> {
        self.peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes `tx` `replica`'s connection: a connection it had before is
    /// closed, and what it has not acknowledged goes first.
    fn attach(&self, replica: &str, tx: mpsc::UnboundedSender<Out>) -> u64 {
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
    fn paid_at(&self, replica: &str) -> Option<tokio::time::Instant> {
        self.peers().get(replica).and_then(|p| p.paid_at)
    }

    /// Records that what `replica` read is paid for until `at`.
    fn paid(&self, replica: &str, at: tokio::time::Instant) {
        if let Some(peer) = self.peers().get_mut(replica) {
            peer.paid_at = Some(peer.paid_at.map_or(at, |p| p.max(at)));
        }
    }

    fn detach(self: &Arc<Self>, replica: &str, generation: u64) {
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
    async fn hear(&self, replica: &str, up: Up, size: usize) {
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

    /// Sends `frame` down `replica`'s connection if what it has not
    /// acknowledged leaves room; else returns what wakes a wait for room.
    fn offer(
        &self,
        replica: &str,
        number: u64,
        frame: &axum::body::Bytes,
    ) -> Result<Option<Arc<Notify>>, SendError> {
        let mut peers = self.peers();
        let peer = peers
            .get_mut(replica)
            .ok_or_else(|| Inner::not_connected(replica))?;
        let resumes = peer
            .lost_at
            .is_some_and(|at| at.elapsed() < self.settings.resume_window);
        if peer.conn.is_none() && !resumes {
            return Err(Inner::not_connected(replica));
        }
        let max = self.settings.max_unacked_bytes;
        if peer.unacked_bytes > 0 && peer.unacked_bytes + frame.len() > max {
            return Ok(Some(peer.room.clone()));
        }
        if let Some(conn) = &peer.conn {
            if conn.tx.send(Out::Frame(frame.clone())).is_err() {
                // The connection ended and is not detached yet: lost just
                // now, so the message waits for the replica to be back, as
                // it would a moment later (sending it as not connected
                // failed a snapshot whose replica was only reconnecting).
                peer.conn = None;
                peer.lost_at = Some(std::time::Instant::now());
            }
        }
        peer.unacked_bytes += frame.len();
        peer.unacked.push_back((number, frame.clone()));
        Ok(None)
    }

    fn not_connected(replica: &str) -> SendError {
        SendError::unreachable(format!("replica `{replica}` is not connected"))
    }
}

impl Transport for Hub {
    fn max_message_bytes(&self) -> usize {
        self.inner.settings.max_message_bytes
    }

    /// Connected, or lost within the window in which it may resume.
    fn reachable(&self, replica: &ReplicaId) -> Option<bool> {
        let peers = self.inner.peers();
        Some(peers.get(replica.as_str()).is_some_and(|peer| {
            peer.conn.is_some()
                || peer
                    .lost_at
                    .is_some_and(|at| at.elapsed() < self.inner.settings.resume_window)
        }))
    }

    async fn send(&self, replica: &ReplicaId, id: &str, message: Vec<u8>) -> Result<(), SendError> {
        // The id is `epoch-number-nonce`: the number is what the replica's
        // acknowledgements name.
        let number = id
            .split('-')
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let frame = axum::body::Bytes::from(magic_sync::run::message_frame(message));
        // A replica slower than the server waits to take more: the send
        // waits for room, as long as a frame may take to be taken.
        let deadline = tokio::time::Instant::now() + self.inner.settings.write_timeout;
        loop {
            let room = match self.inner.offer(replica, number, &frame)? {
                None => return Ok(()),
                Some(room) => room,
            };
            let notified = room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Room made before the wait was enabled counts.
            if self.inner.offer(replica, number, &frame)?.is_none() {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let unacked = self
                    .inner
                    .peers()
                    .get(replica.as_str())
                    .map_or(0, |p| p.unacked_bytes);
                // A replica slow to take: the rest waits for it.
                return Err(SendError::unreachable(format!(
                    "replica `{replica}` has {unacked} bytes of messages unacknowledged (at most \
                     {}) and took none for {:?}; the rest waits",
                    self.inner.settings.max_unacked_bytes, self.inner.settings.write_timeout
                )));
            }
        }
    }

    async fn answer(&self, replica: &ReplicaId, filed: Filed) -> Result<(), SendError> {
        let frame = axum::body::Bytes::from(magic_sync::run::filed_frame(filed));
        let peers = self.inner.peers();
        let conn = peers
            .get(replica.as_str())
            .and_then(|p| p.conn.as_ref())
            .ok_or_else(|| Inner::not_connected(replica))?;
        conn.tx
            .send(Out::Frame(frame))
            .map_err(|_| Inner::not_connected(replica))
    }

    fn misbehaved(&self, replica: &ReplicaId, why: &str) {
        self.inner.log(
            Kind::Misbehaved,
            |more| tracing::warn!(replica = %replica, "{why}; its connection is closed{more}"),
        );
        self.disconnect(replica, why);
    }
}

impl Reports for Hub {
    fn drain(&self) -> Vec<(ReplicaId, Report)> {
        let taken = {
            let mut queue = self
                .inner
                .reports
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            queue.bytes.clear();
            queue.total = 0;
            queue.reports.drain(..).collect()
        };
        self.inner.taken.notify_waiters();
        taken
    }

    async fn wait(&self) {
        let notified = self.inner.reported.notified();
        if !self
            .inner
            .reports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .reports
            .is_empty()
        {
            return;
        }
        notified.await;
    }
}

/// A TLS acceptor for [`serve`].
#[cfg(feature = "tls")]
pub type TlsAcceptor = tokio_rustls::TlsAcceptor;

/// A TLS acceptor from a PEM certificate chain and its PEM private key.
#[cfg(feature = "tls")]
pub fn tls_acceptor(
    certificates: &std::path::Path,
    key: &std::path::Path,
) -> crate::Result<TlsAcceptor> {
    use tokio_rustls::rustls;
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| crate::Error::Tls(format!("cannot read {}: {e}", p.display())))
    };
    let chain = rustls_pemfile::certs(&mut read(certificates)?.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| crate::Error::Tls(format!("{}: {e}", certificates.display())))?;
    let key = rustls_pemfile::private_key(&mut read(key)?.as_slice())
        .map_err(|e| crate::Error::Tls(format!("{}: {e}", key.display())))?
        .ok_or_else(|| crate::Error::Tls(format!("{}: no private key in it", key.display())))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| crate::Error::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| crate::Error::Tls(e.to_string()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// How [`serve`] secures its connections.
#[derive(Clone, Default)]
pub enum Security {
    /// Plain TCP: for loopback, or behind a proxy that ends TLS.
    #[default]
    Plain,
    /// TLS with this acceptor.
    #[cfg(feature = "tls")]
    Tls(TlsAcceptor),
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Security::Plain => f.write_str("Plain"),
            #[cfg(feature = "tls")]
            Security::Tls(_) => f.write_str("Tls"),
        }
    }
}

/// Accepts replicas' connections on `listener` for `hub` until `stop`
/// resolves; then closes every replica's connection, saying the server
/// stops.
pub async fn serve(
    hub: Hub,
    listener: TcpListener,
    security: Security,
    stop: impl Future<Output = ()>,
) -> crate::Result<()> {
    // Whether this `serve` stopped: a connection it accepted that asks to
    // become a replica's after is refused, and one that becomes a
    // replica's as it stops is closed.
    let (stopping, stopped) = watch::channel(false);
    let app = Router::new()
        .route(crate::PATH, get(upgrade))
        .layer(Extension(Stopped(stopped)))
        .with_state(hub.inner.clone());
    tokio::pin!(stop);
    loop {
        let (tcp, addr) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors, a connection reset before it was
                // taken: the next one may do.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let inner = &hub.inner;
        let open = inner.connections.fetch_add(1, Ordering::Relaxed);
        // Held by the connection until it ends, a replica's or not.
        let mut counted = Counted(inner.clone(), None);
        if open >= inner.settings.max_connections {
            inner.log(Kind::Crowded, |more| {
                tracing::warn!(
                    %addr,
                    "closed at once, {open} connections are open (at most {}){more}",
                    inner.settings.max_connections
                )
            });
            continue;
        }
        let from = match inner.guard.open(addr.ip()) {
            Ok(from) => from,
            Err(crowded) => {
                let (whose, most) = match crowded {
                    Crowded::Address => ("address", inner.settings.max_connections_per_address),
                    Crowded::Network => ("network", inner.settings.max_connections_per_network),
                };
                tracing::debug!(%addr, "closed at once, its {whose} has {most} connections open");
                continue;
            }
        };
        counted.1 = Some(from);
        let counted = Arc::new(counted);
        let _ = tcp.set_nodelay(true);
        let (app, security) = (app.clone(), security.clone());
        let handshake = inner.settings.handshake_timeout;
        // TLS, requests, and checking a secret: all within the timeout.
        let deadline = tokio::time::Instant::now() + handshake;
        tokio::spawn(async move {
            match security {
                Security::Plain => connection(tcp, addr, app, counted, handshake, deadline).await,
                #[cfg(feature = "tls")]
                Security::Tls(acceptor) => {
                    match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            connection(tls, addr, app, counted, handshake, deadline).await
                        }
                        Ok(Err(e)) => counted.0.log(
                            Kind::Handshake,
                            |more| tracing::warn!(%addr, error = %e, "TLS{more}"),
                        ),
                        Err(_) => counted.0.log(
                            Kind::Handshake,
                            |more| tracing::warn!(%addr, "no TLS handshake in {handshake:?}{more}"),
                        ),
                    }
                }
            }
        });
    }
    stopping.send_replace(true);
    let peers = hub.inner.peers();
    for conn in peers.values().filter_map(|p| p.conn.as_ref()) {
        let _ = conn
            .tx
            .send(Out::Close(CLOSE_AWAY, "the server stops".into()));
    }
    Ok(())
}

/// Counts a connection open while it lives, in all and against its address:
/// from its acceptance to the end of the replica's connection it became, if
/// it did.
struct Counted(Arc<Inner>, Option<crate::guard::Open>);

/// Whether the [`serve`] that accepted a connection stopped.
#[derive(Clone)]
struct Stopped(watch::Receiver<bool>);

impl Stopped {
    fn now(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves when the `serve` stops (never if it was dropped instead).
    async fn wait(&mut self) {
        if self.0.wait_for(|stopped| *stopped).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one connection's HTTP until it becomes a replica's (the
/// upgrade hands it over) or ends: by `deadline`, else it is closed, however
/// many requests it made meanwhile.
async fn connection<I>(
    io: I,
    addr: SocketAddr,
    app: Router,
    counted: Arc<Counted>,
    handshake: Duration,
    deadline: tokio::time::Instant,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let inner = counted.0.clone();
    let service = hyper_util::service::TowerToHyperService::new(
        app.layer(Extension(ConnectInfo(addr)))
            .layer(Extension(counted)),
    );
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(handshake)
        .max_buf_size(HEAD_BYTES)
        .max_headers(HEAD_FIELDS);
    let served = http
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .with_upgrades();
    match tokio::time::timeout_at(deadline, served).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => inner.log(
            Kind::Handshake,
            |more| tracing::warn!(%addr, error = %e, "serving a connection{more}"),
        ),
        Err(_) => inner.log(Kind::Handshake, |more| {
            tracing::warn!(
                %addr,
                "not a replica's connection after {handshake:?}; closed{more}"
            )
        }),
    }
}

/// The id and secret of HTTP Basic credentials.
fn basic(headers: &HeaderMap) -> Result<(String, String), &'static str> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or("no credentials: send the replica's id and secret as HTTP Basic credentials")?;
    let encoded = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .ok_or("credentials that are not HTTP Basic")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|d| String::from_utf8(d).ok())
        .ok_or("HTTP Basic credentials that do not decode")?;
    let (id, secret) = decoded
        .split_once(':')
        .ok_or("HTTP Basic credentials without a `:`")?;
    Ok((id.to_string(), secret.to_string()))
}

async fn upgrade(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    Extension(counted): Extension<Arc<Counted>>,
    Extension(stopped): Extension<Stopped>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if stopped.now() {
        return (StatusCode::SERVICE_UNAVAILABLE, "the server stops").into_response();
    }
    let (replica, secret) = match basic(&headers) {
        Ok(credentials) => credentials,
        Err(why) => {
            inner.log(
                Kind::NoCredentials,
                |more| tracing::warn!(%addr, "{why}{more}"),
            );
            return (StatusCode::UNAUTHORIZED, why).into_response();
        }
    };
    // Before anything is looked up, or kept, of it.
    if let Err(why) = credentials::check_id(&replica) {
        return inner.not_an_id(addr, &replica, &why.to_string());
    }
    let standing = inner.guard.standing(addr.ip(), &replica);
    let checked = tokio::time::timeout(
        inner.settings.handshake_timeout,
        inner.credentials.check_from(&replica, &secret, standing),
    )
    .await;
    if let Some(refused) = inner.refusal(addr, &replica, checked) {
        return refused;
    }
    let max = inner.settings.max_message_bytes;
    // A replica mostly acknowledges: a small read buffer (tungstenite
    // fills the whole buffer on its first read, 128 KiB by default, which
    // was most of an idle connection's cost).
    ws.max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(READ_BUFFER)
        .on_upgrade(move |socket| async move {
            let _counted = counted;
            replica_connection(inner, replica, addr, stopped, socket).await;
        })
}

/// What checking a secret came to, or that it took too long.
type CheckedInTime = Result<crate::Result<Checked>, tokio::time::error::Elapsed>;

impl Inner {
    /// The answer to `replica`'s upgrade from `addr` when its secret did
    /// not prove it, counting a failure where it is one; `None` when it
    /// did (what its party failed is then forgotten).
    fn refusal(&self, addr: SocketAddr, replica: &str, checked: CheckedInTime) -> Option<Response> {
        Some(match checked {
            Ok(Ok(Checked::Yes)) => {
                self.guard.proved(addr.ip(), replica);
                return None;
            }
            Ok(Ok(Checked::Barred(wait))) => {
                let seconds = wait.as_secs().max(1);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, seconds.to_string())],
                    format!("too many wrong secrets from this address: try again in {seconds} s"),
                )
                    .into_response()
            }
            Ok(Ok(Checked::No)) => {
                self.guard.failed(addr.ip(), Some(replica));
                self.log(Kind::WrongSecret, |more| {
                    tracing::warn!(
                        %addr,
                        replica = %guard::logged(replica),
                        "wrong credentials{more}"
                    )
                });
                (StatusCode::UNAUTHORIZED, "wrong credentials").into_response()
            }
            Ok(Ok(Checked::NotAnId)) => {
                self.not_an_id(addr, replica, "PostgreSQL cannot look it up")
            }
            Ok(Err(e)) => {
                self.log(
                    Kind::CannotCheck,
                    |more| tracing::warn!(%addr, error = %e, "cannot check credentials{more}"),
                );
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "cannot check credentials now",
                )
                    .into_response()
            }
            Err(_) => {
                self.log(
                    Kind::CannotCheck,
                    |more| tracing::warn!(%addr, "checking credentials took too long{more}"),
                );
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "checking credentials took too long",
                )
                    .into_response()
            }
        })
    }

    /// Refuses `replica`, which cannot be a replica's id (`why`), counting
    /// a failure against the party that sent it.
    fn not_an_id(&self, addr: SocketAddr, replica: &str, why: &str) -> Response {
        self.guard.failed(addr.ip(), None);
        self.log(Kind::NotAnId, |more| {
            tracing::warn!(
                %addr,
                replica = %guard::logged(replica),
                "an id that cannot be a replica's: {why}{more}"
            )
        });
        (
            StatusCode::UNAUTHORIZED,
            format!("an id that cannot be a replica's: {why}"),
        )
            .into_response()
    }
}

/// A failed read: the replica went away (code 0: nothing to say to it), or
/// it sent what is refused (too large, not WebSocket), and is told why.
fn lost_or_refused(e: axum::Error) -> Result<(), (u16, String)> {
    use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
    let why = e.to_string();
    match e.into_inner().downcast::<WsError>() {
        Ok(ws) => match *ws {
            WsError::ConnectionClosed
            | WsError::AlreadyClosed
            | WsError::Io(_)
            | WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => Err((0, why)),
            WsError::Capacity(_) => Err((CLOSE_TOO_BIG, why)),
            _ => Err((CLOSE_POLICY, why)),
        },
        Err(_) => Err((CLOSE_POLICY, why)),
    }
}

/// A close reason fits in a control frame: at most 123 bytes.
fn reason(why: &str) -> String {
    let mut end = why.len().min(123);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    why[..end].to_string()
}

/// Runs `replica`'s connection until it ends: what comes in is heard under
/// its name; what the hub sends it goes out, with pings.
async fn replica_connection(
    inner: Arc<Inner>,
    replica: String,
    addr: SocketAddr,
    mut stopped: Stopped,
    socket: WebSocket,
) {
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let generation = inner.attach(&replica, tx.clone());
    let settings = inner.settings.clone();
    let mut writer = tokio::spawn(async move {
        let mut ping = tokio::time::interval(settings.ping_every);
        ping.tick().await;
        loop {
            let (message, last) = tokio::select! {
                out = rx.recv() => match out {
                    Some(Out::Frame(bytes)) => (Message::Binary(bytes), false),
                    Some(Out::Close(code, why)) => (
                        Message::Close(Some(CloseFrame { code, reason: reason(&why).into() })),
                        true,
                    ),
                    None => return Ok(()),
                },
                _ = ping.tick() => (Message::Ping(axum::body::Bytes::new()), false),
                // Became a replica's as the server stopped.
                () = stopped.wait() => (
                    Message::Close(Some(CloseFrame {
                        code: CLOSE_AWAY,
                        reason: "the server stops".into(),
                    })),
                    true,
                ),
            };
            match tokio::time::timeout(settings.write_timeout, sink.send(message)).await {
                Ok(Ok(())) if !last => {}
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => {
                    return Err(format!(
                        "took no frame for {:?}: it does not read",
                        settings.write_timeout
                    ))
                }
            }
        }
    });
    let idle = inner.settings.idle_timeout;
    let mut pace = Pace::new(
        inner.settings.max_bytes_per_second,
        inner.settings.max_message_bytes,
    );
    if let Some(paid_at) = inner.paid_at(&replica) {
        pace.paid_at = pace.paid_at.max(paid_at);
    }
    let bounds = UpBounds::of_messages(inner.settings.max_message_bytes);
    let reader = async {
        loop {
            let frame = match tokio::time::timeout(idle, stream.next()).await {
                Err(_) => return Err((CLOSE_POLICY, format!("said nothing for {idle:?}"))),
                Ok(None) => return Ok(()),
                Ok(Some(Err(e))) => return lost_or_refused(e),
                Ok(Some(Ok(frame))) => frame,
            };
            match frame {
                // Counted on the wire before anything is decoded, and
                // queued by what it takes decoded (an empty entry is two
                // bytes sent and tens held).
                Message::Binary(bytes) => match bounded_decode(&bytes, &bounds) {
                    Ok(Bounded { up, decoded_bytes }) => {
                        let rows = magic_sync::core::link::upload_rows(&up);
                        inner.hear(&replica, up, decoded_bytes).await;
                        let charged = bytes.len().max(FRAME_FLOOR).max(rows * ROW_FLOOR);
                        inner.paid(&replica, pace.owe(charged));
                        pace.after(charged).await;
                    }
                    Err(Refusal::Malformed(e)) => {
                        return Err((CLOSE_INVALID, format!("a frame that is not an Up: {e}")))
                    }
                    Err(e) => return Err((CLOSE_POLICY, e.to_string())),
                },
                Message::Text(_) => {
                    return Err((
                        CLOSE_POLICY,
                        "a text frame: only binary frames are spoken".into(),
                    ))
                }
                Message::Close(_) => return Ok(()),
                Message::Ping(_) | Message::Pong(_) => {}
            }
        }
    };
    let ended = tokio::select! {
        read = reader => Some(read),
        _ = &mut writer => None,
    };
    match ended {
        Some(Err((0, why))) => {
            inner.log(
                Kind::Lost,
                |more| tracing::info!(replica = %replica, %addr, "connection lost: {why}{more}"),
            );
            writer.abort();
        }
        Some(Err((code, why))) => {
            inner.log(Kind::Refused, |more| {
                tracing::warn!(replica = %replica, %addr, "{why}; its connection is closed{more}")
            });
            let _ = tx.send(Out::Close(code, why));
            let _ = tokio::time::timeout(CLOSING, &mut writer).await;
            writer.abort();
            closing(&mut stream).await;
        }
        Some(Ok(())) => writer.abort(),
        // The writer said why it closed (or could not write at all).
        None => closing(&mut stream).await,
    }
    inner.detach(&replica, generation);
}

/// Reading at most so many bytes a second, after a first burst: a token
/// bucket kept as the moment its debt is paid.
struct Pace {
    /// When what was read so far is paid for.
    paid_at: tokio::time::Instant,
    /// Seconds a byte costs.
    per_byte: f64,
    /// How far ahead of its pace a replica may be.
    burst: Duration,
}

impl Pace {
    fn new(bytes_per_second: usize, burst_bytes: usize) -> Pace {
        let per_byte = 1.0 / bytes_per_second.max(1) as f64;
        Pace {
            paid_at: tokio::time::Instant::now(),
            per_byte,
            burst: Duration::from_secs_f64(burst_bytes as f64 * per_byte),
        }
    }

    /// Until when `bytes` more read are paid for.
    fn owe(&self, bytes: usize) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let floor = now.checked_sub(self.burst).unwrap_or(now);
        self.paid_at.max(floor) + Duration::from_secs_f64(bytes as f64 * self.per_byte)
    }

    /// Counts `bytes` read, and waits while the replica is ahead of its
    /// pace by more than the burst.
    async fn after(&mut self, bytes: usize) {
        self.paid_at = self.owe(bytes);
        if self.paid_at > tokio::time::Instant::now() {
            tokio::time::sleep_until(self.paid_at).await;
        }
    }
}

/// How long a closed connection is given to read its close frame.
const CLOSING: Duration = Duration::from_secs(1);

/// Keeps reading, briefly, after the server's close frame went: the
/// socket stays open until the replica answers it (or goes), so a replica
/// behind on reading still gets to read why.
async fn closing(stream: &mut futures_util::stream::SplitStream<WebSocket>) {
    let _ = tokio::time::timeout(CLOSING, async {
        while let Some(Ok(frame)) = stream.next().await {
            if matches!(frame, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}
