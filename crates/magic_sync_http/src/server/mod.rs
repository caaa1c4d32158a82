//! The server's side: a [`Hub`] that the relay publishes through and hears
//! replicas from, and [`serve`], which accepts their connections.
//!
//! A replica's messages go down its one connection in order. Those it has
//! not acknowledged yet stay with the hub (up to
//! [`Settings::max_unacked_bytes`]) and go again, first, when it connects
//! next: a connection lost mid-stream loses nothing, and the replica's
//! chain skips what it had applied. Beyond that bound, or while the replica
//! is not connected, a send fails and the rest waits in the outbox.
//!
//! Its parts, in the order a replica meets them:
//!
//! - `settings`: the bounds and timeouts the server holds connections to;
//! - `listener`: [`serve`] accepts a connection (TLS optional), counts it
//!   against the bounds, and serves its HTTP until it upgrades;
//! - `upgrade`: the upgrade checks the replica's HTTP Basic credentials and
//!   hands the socket over under the replica they proved;
//! - `session`: the replica's connection, read at its pace and written with
//!   pings, until it ends;
//! - `hub`: what the [`Hub`] keeps per replica, and what it heard;
//! - `relay`: the hub as the relay sees it, its transport and its reports.

mod hub;
mod listener;
mod relay;
mod session;
mod settings;
mod upgrade;

pub use hub::Hub;
pub use listener::{serve, Security};
#[cfg(feature = "tls")]
pub use listener::{tls_acceptor, TlsAcceptor};
pub use settings::Settings;
