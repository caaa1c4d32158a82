//! The runners: how a host drives the engine.
//!
//! - [`server`]: the relay's loop: the lock, passes and their backoff,
//!   publishing, and what replicas say back.
//! - [`replica`]: a replica's loop: apply each message as it arrives, and say
//!   what was applied.
//! - [`memory`]: an in-process network between them, for tests and examples.
//! - [`link`]: the shell a network link of a replica runs in: its thread,
//!   its queues, and whether it is connected.
//! - [`process`]: what a replica process does around its loop, whatever
//!   link it reads (the transports' `cli` modules are built on it).
//! - [`read_secret`]: a secret or seed from the file that keeps it.

pub use magic_sync_core::link::{
    filed_frame, host_of, is_loopback, message_frame, upload_rows, Delivery, LinkError,
    LinkErrorKind, Report, MAX_UPLOAD_ROWS,
};

pub mod memory;
mod secret;
pub use secret::read_secret;
#[cfg(all(feature = "postgres", feature = "sqlite"))]
pub mod link;
#[cfg(all(feature = "postgres", feature = "sqlite"))]
pub mod process;
#[cfg(feature = "sqlite")]
pub use magic_sync_replica::run as replica;
#[cfg(feature = "postgres")]
pub use magic_sync_server::run as server;
