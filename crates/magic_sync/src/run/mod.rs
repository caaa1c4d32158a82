//! The runners: how a host drives the engine.
//!
//! - [`server`]: the relay's loop: the lock, passes and their backoff,
//!   publishing, and what replicas say back.
//! - [`replica`]: a replica's loop: apply each message as it arrives, and say
//!   what was applied.
//! - [`memory`]: an in-process network between them, for tests and examples.

use crate::envelope::{Ack, Filed, Gap, Up};

pub mod memory;
#[cfg(feature = "sqlite")]
pub mod replica;
#[cfg(feature = "postgres")]
pub mod server;

/// What a replica tells the server.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// The last message it applied, with its seal as it came.
    Applied(Ack),
    /// It could not follow a message and waits for a snapshot.
    Gap(Gap),
    /// What it wrote, to be filed ([`crate::replica::Replica::upload`]).
    Upload(Up),
}

/// What reached a replica through its link.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// A message from the server.
    Message(Vec<u8>),
    /// The answer to an upload.
    Filed(Filed),
    /// Nothing came for as long as it waited, or its host wrote
    /// something (a nudge).
    Quiet,
    /// The link is closed: the loop ends.
    Closed,
}
