//! How the server treats its connections: the bounds on how many it holds,
//! on what each may send and be owed, and how long each step may take.

use std::time::Duration;

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
