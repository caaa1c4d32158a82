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

/// The path replicas connect to.
pub const PATH: &str = "/v1/replica";

/// What went wrong in the transport itself.
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
    /// Hashing a secret.
    #[error("hashing a secret: {0}")]
    Hash(String),
    /// TLS set-up: certificates, keys.
    #[error("TLS: {0}")]
    Tls(String),
    /// A setting that cannot work, named.
    #[error("{0}")]
    Settings(String),
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
