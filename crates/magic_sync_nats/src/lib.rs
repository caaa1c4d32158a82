//! magic_sync's broker transport: replicas reached through NATS JetStream
//! rather than a socket each to the server.
//!
//! - [`broker`]: the server's side. A [`broker::Broker`] is the relay's
//!   [`magic_sync::relay::Transport`] and its
//!   [`magic_sync::run::server::Reports`]: it publishes each replica's
//!   messages to a stream of that replica's own, and consumes the one
//!   stream every replica's reports and uploads land in.
//! - [`mailbox`]: the replica's side. A [`mailbox::Mailbox`] is a
//!   [`magic_sync::run::replica::Link`]: it reads the replica's stream
//!   through the consumer the server made for it, in the order the stream
//!   keeps (`order`), and publishes what the replica says to its own
//!   upload subject.
//! - [`access`]: each replica's credentials on the broker (an nkey) and
//!   the broker's `authorization` block that confines each to its own
//!   subjects: it may fetch from its consumer and acknowledge, never make
//!   or remove a consumer or a stream.
//!
//! The broker is trusted with delivery, never with content: every message
//! and answer is signed by the server and verified by the replica, as over
//! the socket. Who spoke is the broker's to say: a replica may publish only
//! to `magic_sync.up.<its token>`, so the subject an upload came on names
//! its replica, never anything inside it.
//!
//! - [`cli`]: a replica process's arguments and body, for the host's
//!   binary.
//!
//! Nothing here needs a newer server than Debian's `nats-server` (2.9).

pub mod access;
pub mod broker;
pub mod cli;
pub mod mailbox;
mod order;

use magic_sync::run::{host_of, is_loopback, LinkError, LinkErrorKind};
use magic_sync::{Handling, ReplicaId};
use std::path::{Path, PathBuf};

/// The subject prefix of what the server sends a replica.
pub const DOWN: &str = "magic_sync.down";
/// The subject prefix of what replicas say.
pub const UP: &str = "magic_sync.up";
/// The stream every replica's reports and uploads land in.
pub const UP_STREAM: &str = "MAGIC_SYNC_UP";
/// The server's consumer of [`UP_STREAM`].
pub const UP_CONSUMER: &str = "server";
/// The name of each replica's consumer of its own stream.
pub const CONSUMER: &str = "replica";

/// A replica's id as one subject token: its bytes in hex, so that no id can
/// hold a `.`, `*`, `>` or space and reach another replica's subjects.
pub fn token(replica: &str) -> String {
    hex::encode(replica.as_bytes())
}

/// The replica a token names, if it names one.
pub fn replica_of(token: &str) -> Option<ReplicaId> {
    let bytes = hex::decode(token).ok()?;
    String::from_utf8(bytes).ok().map(ReplicaId::from)
}

/// The subject the server publishes `replica`'s messages to.
pub fn down_subject(replica: &str) -> String {
    format!("{DOWN}.{}", token(replica))
}

/// The stream that keeps `replica`'s messages until it takes them.
pub fn stream_of(replica: &str) -> String {
    format!("MAGIC_SYNC_R_{}", token(replica))
}

/// The subject `replica` publishes what it says to.
pub fn up_subject(replica: &str) -> String {
    format!("{UP}.{}", token(replica))
}

/// The inbox prefix of `replica`'s connection: the only subjects it may
/// subscribe to, so that no other replica's answers from the broker reach it.
pub fn inbox_of(replica: &str) -> String {
    format!("_INBOX_{}", token(replica))
}

/// How a side of the link reaches the broker: its address, and what it
/// trusts of the broker's TLS.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reach<'a> {
    pub url: &'a str,
    pub trust: Option<&'a Path>,
    pub allow_plain: bool,
}

impl Reach<'_> {
    /// Refuses an address that is not NATS, plain `nats://` to another
    /// machine unless allowed (what crosses would be readable on the way),
    /// and a trust file that holds no certificate.
    pub(crate) fn check(&self, who: &str) -> Result<()> {
        let url = self.url;
        if !url.starts_with("nats://") && !url.starts_with("tls://") {
            return Err(Error::Settings(format!(
                "the broker `{url}` is not a nats:// or tls:// address"
            )));
        }
        if let Some(host) = url.strip_prefix("nats://").map(host_of) {
            if !self.allow_plain && self.trust.is_none() && !is_loopback(host) {
                return Err(Error::Settings(format!(
                    "the broker `{url}` is nats:// to another machine: the rows {who} \
                     would cross the network in the clear; use tls://, or allow plain \
                     nats:// (`allow_plain`) where a proxy beside it ends TLS"
                )));
            }
        }
        if let Some(path) = self.trust {
            let pem = std::fs::read_to_string(path).map_err(|e| {
                Error::Settings(format!(
                    "the broker's certificates `{}` cannot be read: {e}",
                    path.display()
                ))
            })?;
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(Error::Settings(format!(
                    "the broker's certificates `{}` hold no PEM certificate",
                    path.display()
                )));
            }
        }
        Ok(())
    }

    /// Why connecting failed, as the operator reads it: a certificate not
    /// trusted points at `trust`, where the fix lies.
    pub(crate) fn not_connected(&self, e: &impl std::fmt::Display) -> String {
        let mut why = format!("connecting to {}: {e}", self.url);
        if why.contains("certificate") {
            why.push_str(
                " (is the broker's certificate, or its authority, the one `trust` names?)",
            );
        }
        why
    }

    /// `options` trusting what `trust` names, and requiring TLS if it names
    /// anything.
    pub(crate) fn apply(&self, options: async_nats::ConnectOptions) -> async_nats::ConnectOptions {
        match self.trust {
            Some(path) => options
                .add_root_certificates(PathBuf::from(path))
                .require_tls(true),
            None => options,
        }
    }
}

/// What went wrong in the broker transport itself. Each variant is a
/// kind, with the operator's text beside it; [`Error::handling`] says what
/// the kind makes a caller do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting to the broker, or a request it refused: out of reach
    /// now, a message larger than it carries, or credentials it refuses,
    /// by the [`LinkError`]'s kind.
    #[error("the broker: {0}")]
    Broker(LinkError),
    /// A setting that cannot work, named.
    #[error("{0}")]
    Settings(String),
    /// A file or a thread.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server's database, keeping the replicas' keys.
    #[error(transparent)]
    Store(#[from] magic_sync::Error),
}

impl Error {
    /// The broker failed doing `what`, for now: it is tried again.
    pub(crate) fn broker(what: &str, e: impl std::fmt::Display) -> Error {
        Error::Broker(LinkError::unreachable(format!("{what}: {e}")))
    }

    /// What a caller does about this failure, by its kind: try again after
    /// a backoff ([`Handling::Retry`]), leave what it was about
    /// ([`Handling::SetAside`]), or stop until the operator acts
    /// ([`Handling::Stop`]).
    pub fn handling(&self) -> Handling {
        match self {
            Error::Broker(e) => match e.kind {
                LinkErrorKind::Unreachable => Handling::Retry,
                LinkErrorKind::Refused => Handling::SetAside,
                LinkErrorKind::Misconfigured => Handling::Stop,
            },
            Error::Settings(_) => Handling::Stop,
            // A thread or a runtime not made: the machine's resources.
            Error::Io(_) => Handling::Retry,
            Error::Store(e) => e.handling(),
        }
    }

    /// This failure as the relay's [`magic_sync::relay::SendError`]: the
    /// broker's own kind, or the one its handling says, and its text.
    pub(crate) fn into_link(self) -> LinkError {
        let kind = match &self {
            Error::Broker(e) => e.kind,
            other => match other.handling() {
                Handling::Retry => LinkErrorKind::Unreachable,
                Handling::SetAside => LinkErrorKind::Refused,
                Handling::Stop => LinkErrorKind::Misconfigured,
            },
        };
        LinkError {
            kind,
            why: self.to_string(),
        }
    }
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_keep_ids_apart_and_come_back_whole() {
        for id in ["till-1", "a.b", "*", ">", "with space", "ü", ""] {
            let t = token(id);
            assert!(t.chars().all(|c| c.is_ascii_hexdigit()), "{id}: {t}");
            assert_eq!(replica_of(&t).as_deref(), Some(id));
        }
        assert_ne!(token("a.b"), token("a") + "." + &token("b"));
        assert_eq!(replica_of("zz"), None);
        assert_eq!(replica_of("ff"), None, "not UTF-8");
    }
}
