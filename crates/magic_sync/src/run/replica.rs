//! A replica's loop: apply each message as it arrives, in one transaction
//! each, and say what was applied.

use super::memory::Network;
use super::Report;
use crate::error::Result;
use crate::replica::{Outcome, Replica};

/// Applies one message as the transport delivered it, and returns what to
/// tell the server: the last message applied (also after a duplicate, so a
/// lost acknowledgement is given again), or the gap it waits in. A message
/// for another replica changes nothing and says nothing.
pub fn deliver(replica: &mut Replica<'_>, message: &[u8]) -> Result<Option<Report>> {
    let outcome = match replica.apply(message) {
        Ok(outcome) => outcome,
        // The message applied; only the purge after it failed. The rows wait
        // for the next purge; the message is acknowledged.
        Err(crate::Error::Purge { .. }) => Outcome::Applied {
            number: 0,
            refused: 0,
            purged: 0,
        },
        Err(e) => return Err(e),
    };
    Ok(match outcome {
        Outcome::Applied { .. } | Outcome::Duplicate { .. } => replica.ack().map(Report::Applied),
        Outcome::Gap { .. } => replica.gap().map(Report::Gap),
        Outcome::WrongReplica { .. } => None,
    })
}

/// Applies every message the network brings `replica` until it closes, and
/// reports what it applied. A message that cannot be applied as it is
/// (malformed, not a message at all) is skipped: the server's next
/// comparison covers what it carried. Stops on an error of the replica's own
/// database, which the host decides about.
pub fn replica(replica: &mut Replica<'_>, network: &Network) -> Result<()> {
    let id = replica.id().to_string();
    while let Some(message) = network.next(&id) {
        match deliver(replica, &message) {
            Ok(Some(report)) => network.report(&id, report),
            Ok(None) => {}
            Err(crate::Error::Envelope(_) | crate::Error::Malformed { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
