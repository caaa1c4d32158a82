//! What travels between a replica's loop and the server's, as both runners
//! see it: what a replica reports, and what reaches it.

use crate::envelope::{Ack, Filed, Gap, Up};

/// What a replica tells the server.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// The last message it applied, with its seal as it came.
    Applied(Ack),
    /// It could not follow a message and waits for a snapshot.
    Gap(Gap),
    /// What it wrote, to be filed.
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
