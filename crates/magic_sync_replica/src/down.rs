//! Messages down: a message's bytes checked as the server's, decoded,
//! decided on by the chain, and applied in one transaction with its record
//! (or a gap opened); then retired rows purged. Also what the replica
//! tells the server of it: its acknowledgement, its gap, the rows it refused.

use crate::chain::{Applied, Break, Decision};
use crate::envelope::{self, ToReplica};
use crate::open::{drop_former, statements, take_description};
use crate::{apply, sign, state, up, write_transaction};
use crate::{Error, Forgery, Replica, Result};
use magic_sync_core::ids::BeyondAnyMessage;
use prost::Message;

/// What became of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied and recorded; [`Replica::ack`] now names it.
    Applied {
        /// The message's number.
        number: u64,
        /// Rows it carried that the replica could not take.
        refused: usize,
        /// Retired rows purged after it, because nothing points at them any more.
        purged: usize,
    },
    /// Applied before: nothing changed.
    Duplicate {
        /// The message's number.
        number: u64,
    },
    /// The message does not follow the last one applied: nothing applies
    /// until a snapshot begins. [`Replica::gap`] says what to tell the server.
    Gap {
        /// The newest message the replica could not follow.
        newest: u64,
        /// Why this one could not be followed.
        why: Break,
    },
    /// The message is of an epoch older than the one the replica follows:
    /// one the server sent before it began a new epoch, replayed. Nothing
    /// changed, whether or not it begins a snapshot, and no gap opened; the
    /// replica says again where it stands.
    Superseded {
        /// The message's number.
        number: u64,
    },
    /// The message is addressed to another replica: nothing changed.
    WrongReplica {
        /// The replica it names.
        replica: String,
    },
    /// The message is not the server's: unsigned, altered on the way, or
    /// signed by a key the replica does not trust. Nothing changed, and it
    /// is counted ([`Status::forged`](crate::Status::forged)). Judged
    /// before anything in it is believed, its number included.
    Forged {
        /// Why it was refused.
        why: Forgery,
    },
}

impl Replica {
    /// Applies one message from the server, as the transport delivered it.
    ///
    /// Bytes that are not a `ToReplica`, or one that cannot be applied as it
    /// is (no body, no epoch, ...), are an error naming what is wrong, and
    /// change nothing. A message applied but whose purge failed afterwards is
    /// [`Error::Purge`]: it is applied all the same.
    pub fn apply(&mut self, bytes: &[u8]) -> Result<Outcome> {
        let trusted = self.trusted.ok_or(Error::NoServerKey)?;
        let signer = match sign::verify_message(&trusted, bytes) {
            Ok(signer) => signer,
            Err(why) => {
                self.forgeries
                    .count(&self.conn, &self.id, &why.to_string())?;
                return Ok(Outcome::Forged { why });
            }
        };
        self.forgeries.write_if_due(&self.conn, &self.id)?;
        let message = decode(bytes)?;
        let outcome = match self.chain.decide(&self.id, &message) {
            Decision::Apply => self.apply_message(&message),
            Decision::Duplicate => Ok(Outcome::Duplicate {
                number: message.number,
            }),
            Decision::Superseded => Ok(Outcome::Superseded {
                number: message.number,
            }),
            Decision::Gap(why) => self.open_gap(&message, why),
            Decision::WrongReplica => Ok(Outcome::WrongReplica {
                replica: message.replica,
            }),
        };
        self.follow(trusted, signer)?;
        outcome
    }

    fn apply_message(&mut self, message: &ToReplica) -> Result<Outcome> {
        let head = Applied::of(message).map_err(beyond(message))?;
        let description = match &message.body {
            Some(envelope::to_replica::Body::Described(d)) => Some(d),
            Some(envelope::to_replica::Body::EndSnapshot(end)) => end.described.as_ref(),
            _ => None,
        };
        // A snapshot of another epoch: that server answered nothing yet.
        let new_epoch = message.begins_snapshot
            && self
                .chain
                .applied
                .as_ref()
                .is_some_and(|a| a.epoch != message.epoch);
        let tx = write_transaction(&mut self.conn)?;
        if new_epoch {
            up::new_epoch(&tx)?;
        }
        // The server provisions a replica again when what it records of it
        // cannot be trusted: a gap, a lost message, a digest that differed,
        // or its own database restored from an older copy, which forgot
        // the uploads it filed after the copy was taken (and the replica
        // let go of once answered). So at a snapshot's end, what the
        // replica wrote goes up again: filing is idempotent, and nothing
        // the server answered is lost however old its database is.
        let ends_snapshot = matches!(
            message.body,
            Some(envelope::to_replica::Body::EndSnapshot(_))
        ) && (message.begins_snapshot || state::snapshot_began(&tx)?.is_some());
        // A description is taken before anything of its message: a
        // snapshot's end lets go of rows, which the new foreign keys decide.
        let mut retold = match description {
            Some(d) => Some(take_description(
                &tx,
                self.declared.as_ref(),
                &self.shapes,
                d,
            )?),
            None => None,
        };
        let tables = retold.as_ref().map_or(&self.tables, |r| &r.tables);
        let shapes = retold
            .as_ref()
            .and_then(|r| r.shapes.as_ref())
            .unwrap_or(&self.shapes);
        let refused = apply::Pass::run(&tx, tables, shapes, message)?;
        if refused > 0 {
            state::trim_refused(&tx)?;
        }
        if ends_snapshot {
            let noted = up::note_everything(&tx, shapes)?;
            if noted > 0 {
                tracing::info!(
                    replica = %self.id,
                    rows = noted,
                    "provisioned: everything this replica wrote goes up again"
                );
            }
        }
        // The tables a description no longer names, made former by it.
        let newly_former = retold.as_mut().and_then(|r| r.former.take());
        let former = newly_former.as_ref().unwrap_or(&self.former);
        let schema = retold.as_ref().map_or(&self.schema, |r| &r.schema);
        let dropped = !former.is_empty() && drop_former(&tx, schema, former)?;
        state::save_applied(&tx, &head)?;
        tx.commit()?;
        if let Some(newly) = newly_former {
            self.former = newly;
        }
        if dropped {
            self.former.clear();
        }
        if let Some(retold) = retold {
            self.schema = retold.schema;
            self.tables = retold.tables;
            if let Some(shapes) = retold.shapes {
                self.conn
                    .set_prepared_statement_cache_capacity(statements(&shapes));
                self.shapes = shapes;
            }
            self.described = description.cloned();
        }
        self.ring();
        self.chain = self.chain.applied(head);
        let purged = self.purge().map_err(|e| Error::Purge {
            number: message.number,
            source: Box::new(e),
        })?;
        Ok(Outcome::Applied {
            number: message.number,
            refused,
            purged,
        })
    }

    fn open_gap(&mut self, message: &ToReplica, why: Break) -> Result<Outcome> {
        let gap = self.chain.newest_gap(message).map_err(beyond(message))?;
        state::save_gap(&self.conn, &gap)?;
        let newest = gap.number.wire();
        self.chain = self.chain.gapped(gap);
        Ok(Outcome::Gap { newest, why })
    }

    /// Purges retired rows nothing of the replica points at any more, in a
    /// transaction of its own. [`apply`](Self::apply) runs it after every
    /// message it applies; returns how many rows went.
    pub fn purge(&mut self) -> Result<usize> {
        let tx = write_transaction(&mut self.conn)?;
        let purged = apply::purge(&tx, &self.tables)?;
        tx.commit()?;
        Ok(purged)
    }

    /// The last message applied, with its seal as it came: what the replica
    /// tells the server it applied, with the newest upload that server
    /// answered as filed (`Ack::answered`) and the server's receipt for it
    /// (`Ack::receipt`), which the server checks. `None` before the first.
    pub fn ack(&self) -> Option<envelope::Ack> {
        self.chain.applied.as_ref().map(|a| envelope::Ack {
            // Unread is no claim: the server then checks nothing.
            answered: up::answered(&self.conn).unwrap_or(0),
            receipt: up::receipt(&self.conn).unwrap_or(None),
            ..a.ack()
        })
    }

    /// The gap the replica is in, if any: the newest message it could not follow.
    pub fn gap(&self) -> Option<envelope::Gap> {
        self.chain.gap.as_ref().map(|g| g.envelope())
    }

    /// Every row on record as refused, oldest message first.
    pub fn refused(&self) -> Result<Vec<envelope::Refused>> {
        state::refused(&self.conn)
    }
}

/// The message in `bytes`, refused when it cannot be applied as it is.
fn decode(bytes: &[u8]) -> Result<ToReplica> {
    let message = ToReplica::decode(bytes).map_err(Error::Envelope)?;
    match malformation(&message) {
        None => Ok(message),
        Some(problem) => Err(Error::Malformed {
            replica: message.replica,
            number: message.number,
            problem: problem.to_string(),
        }),
    }
}

/// `message` refused for a number no message of the server's has (which
/// [`decode`] refuses before the chain is asked).
fn beyond(message: &ToReplica) -> impl FnOnce(BeyondAnyMessage) -> Error + '_ {
    |e| Error::Malformed {
        replica: message.replica.clone(),
        number: message.number,
        problem: e.to_string(),
    }
}

fn malformation(message: &ToReplica) -> Option<&'static str> {
    if message.body.is_none() {
        Some("it carries no body: neither rows nor the end of a snapshot")
    } else if message.number == 0 {
        Some("its number is 0; numbers start at 1")
    } else if i64::try_from(message.number).is_err() {
        Some("its number is beyond what a PostgreSQL sequence gives")
    } else if message.epoch.is_empty() {
        Some("it names no epoch")
    } else if message.nonce.is_empty() {
        Some("it has no nonce")
    } else {
        None
    }
}
