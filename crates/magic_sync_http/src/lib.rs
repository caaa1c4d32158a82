//! magic_sync's network transport: each replica holds one WebSocket to the
//! server, authenticated by a secret of its own.
//!
//! - [`server`]: the server's side. A [`server::Hub`] is the relay's
//!   [`magic_sync::relay::Transport`] and its
//!   [`magic_sync::run::server::Reports`]; [`server::serve`] accepts
//!   replicas' connections (TLS optional) and hands each to the hub under the
//!   replica its secret proved, never a name inside a frame. Connections
//!   are bounded per address and per network, an address that keeps
//!   presenting wrong secrets waits, longer each time, and what others do
//!   wrong is logged a line a minute per kind.
//! - [`client`]: the replica's side. A [`client::Socket`] is a
//!   [`magic_sync::run::replica::Link`]: the replica's loop runs over it as
//!   over the in-process network, and it reconnects by itself.
//! - [`credentials`]: each replica's secret, kept on the server as a
//!   password hash.
//! - [`cli`]: the arguments and loop of a replica process, for a host's
//!   binary.
//!
//! On the wire, every frame is binary: the server sends one `FromServer`
//! (a sealed and signed `ToReplica`, or the signed answer to an upload), the replica one `Up`
//! (see `proto/magic_sync.proto`). A replica authenticates its upgrade
//! request with HTTP Basic credentials: its id and its secret.

pub mod cli;
pub mod client;
pub mod credentials;
mod guard;
mod logbook;
pub mod server;

use magic_sync::Handling;

/// The path replicas connect to.
pub const PATH: &str = "/v1/replica";

/// What went wrong in the transport itself. Each variant is a kind, with
/// the operator's text beside it; [`Error::handling`] says what the kind
/// makes a caller do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server's database.
    #[error("database: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The engine.
    #[error(transparent)]
    Engine(#[from] magic_sync::Error),
    /// A socket, a file.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Checking or making a secret's hash could not be done now: too many
    /// checks wait already, or the task hashing it was cancelled.
    #[error("hashing a secret: {0}")]
    Hash(String),
    /// TLS set-up: certificates, keys.
    #[error("TLS: {0}")]
    Tls(String),
    /// A setting that cannot work, named.
    #[error("{0}")]
    Settings(String),
}

impl Error {
    /// What a caller does about this failure, by its kind: try again after
    /// a backoff ([`Handling::Retry`]), leave what it was about
    /// ([`Handling::SetAside`]), or stop until the operator acts
    /// ([`Handling::Stop`]).
    pub fn handling(&self) -> Handling {
        match self {
            Error::Postgres(e) => magic_sync::error::postgres_handling(e),
            Error::Engine(e) => e.handling(),
            // A connection reset, a listener out of descriptors: the
            // network and the machine are the infrastructure.
            Error::Io(_) => Handling::Retry,
            Error::Hash(_) => Handling::Retry,
            // Certificates and settings stay as they are until the
            // operator changes them.
            Error::Tls(_) | Error::Settings(_) => Handling::Stop,
        }
    }
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::Error;
    use magic_sync::Handling;

    #[test]
    fn what_only_the_operator_changes_stops_and_a_busy_hasher_is_tried_again() {
        assert_eq!(
            Error::Tls("no private key".into()).handling(),
            Handling::Stop
        );
        assert_eq!(
            Error::Settings("ws:// to another machine".into()).handling(),
            Handling::Stop
        );
        assert_eq!(
            Error::Hash("256 secrets wait to be checked already".into()).handling(),
            Handling::Retry
        );
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(Error::Io(reset).handling(), Handling::Retry);
    }
}
