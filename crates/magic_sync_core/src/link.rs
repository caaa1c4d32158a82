//! What travels between a replica's loop and the server's, as both runners
//! see it: what a replica reports, and what reaches it.

use crate::envelope::{Ack, Filed, Gap, Up};

/// Rows (and keys gone) one upload carries at most. A replica's uplink
/// keeps within it; the server refuses a larger upload unfiled, as it
/// refuses one larger than a message, so that no upload of many small rows
/// keeps filing (and the publishing beside it) from the rest of the fleet
/// for long.
pub const MAX_UPLOAD_ROWS: usize = 5_000;

/// The rows (and keys gone) `up` carries.
pub fn upload_rows(up: &Up) -> usize {
    up.tables.iter().map(|t| t.rows.len() + t.gone.len()).sum()
}

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

impl Report {
    /// An `Up` as it came over a transport that carries every report as
    /// one: one that only acknowledges, or only says a gap, is that;
    /// anything else is an upload, as the replica's loop sent it.
    pub fn from_up(mut up: Up) -> Report {
        let nothing_else = up.send_id.is_empty()
            && up.tables.is_empty()
            && up.refused.is_empty()
            && up.digest.is_none()
            && up.backlog.is_none();
        if nothing_else {
            match (up.applied.take(), up.gap.take()) {
                (Some(ack), None) => return Report::Applied(ack),
                (None, Some(gap)) => return Report::Gap(gap),
                (applied, gap) => {
                    up.applied = applied;
                    up.gap = gap;
                }
            }
        }
        Report::Upload(up)
    }
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
