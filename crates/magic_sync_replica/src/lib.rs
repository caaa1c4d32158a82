//! A replica: a SQLite database that holds what the server sends it, applies
//! each message in one transaction, and says what it applied.
//!
//! [`Replica::apply`] takes the bytes of one `ToReplica` as the transport
//! delivered them. The chain ([`crate::chain`]) decides whether the message is
//! the next one; if it is, its rows are written in one transaction together
//! with the record of the message, so a message applies whole or not at all,
//! and a message delivered twice changes nothing the second time.
//!
//! How a message applies:
//!
//! - Tables in the order the message lists them; in each, its deletes, then
//!   its upserts.
//! - An upsert overwrites the replica's copy except the columns the replica
//!   owns, and brings a retired row back to life.
//! - A row that cannot be taken (a table the replica does not have, a row
//!   that does not decode, a value SQLite refuses) is recorded as refused with
//!   the reason and the message's number, and the rest of the message applies.
//! - A delete deletes the row, unless one of the replica's own records (a row
//!   of an up table) still points at it through one of the foreign keys the
//!   server described (see below): then the row is retired (its retired column set to
//!   the message number), if its table has a retired column. Rows the server
//!   sent that point at it are the server's to let go of or re-point, which
//!   it does in the same message or an earlier one.
//! - After the message commits, retired rows nothing points at any more are
//!   purged, children first, in a transaction of their own.
//! - A snapshot fills a table that holds no row when it begins with plain
//!   inserts, and sets aside the table's indexes that are not unique (the
//!   replica's and the host's own) until `EndSnapshot`, or until the replica
//!   is next opened: one build over every row is cheaper than keeping them
//!   up row by row. See the `snapshot` module.
//!
//! The foreign keys among the replica's tables come from the server, which
//! reads them from its catalogue: it describes the tables (`ReplicaSchema`)
//! with every snapshot's end, and to every replica kept up when it starts
//! with other declarations, before the rows they send. The replica keeps
//! the last description in its file. Its columns and keys are its own
//! build's declarations, which its codecs read rows by;
//! [`Replica::configuration`] says where the server's description differs.
//!
//! The replica's tables have no foreign keys of their own in SQLite
//! (`foreign_keys=OFF`): the server sends parents before their children and
//! lets go of children before their parents, and within a message a unique
//! value may move between rows in any order.

// A library speaks through its return values and `tracing`, never by
// printing behind its host's back.
#![warn(clippy::print_stdout, clippy::print_stderr)]

mod apply;
mod described;
mod digest;
pub mod error;
mod former;
mod key;
pub mod lite;
mod row;
pub mod run;
mod shape;
mod snapshot;
mod state;
mod tables;
mod trust;
mod up;
mod uplink;

// The derive names the runtime crate as `::magic_sync`; in this crate's own
// tests that is the protocol core.
#[cfg(test)]
extern crate magic_sync_core as magic_sync;

use magic_sync_core::{chain, codec, engine, envelope, sign, sql, value};

pub use digest::fingerprint;
pub use error::{Error, Handling, Result};
pub use key::{canonical as canonical_key, KeyProblem};
pub use magic_sync_core::schema::{ForeignKey, Schema};
pub use magic_sync_core::sign::{Forgery, ServerKey};
pub use state::{Status, MAX_REFUSED};
pub use up::{backlog, mark, wait_written, written, Mark, Pending, Written};
pub use uplink::{LinkError, LinkErrorKind, SentUp, Uplink, UplinkError};

use crate::chain::{Applied, Break, Chain, Decision};
use crate::engine::Engine;
use crate::envelope::ToReplica;
use crate::error::Mismatch;
use crate::shape::Shapes;
use prost::Message;
use rusqlite::{Connection, Transaction, TransactionBehavior};
use std::path::Path;
use tables::Tables;

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
    /// is counted ([`Status::forged`]). Judged before anything in it is
    /// believed, its number included.
    Forged {
        /// Why it was refused.
        why: Forgery,
    },
}

/// A replica's database and what it knows of the chain.
#[derive(Debug)]
pub struct Replica {
    conn: Connection,
    id: String,
    /// The host's declarations; `None` for a replica that follows the
    /// server's description ([`Replica::open_described`]).
    declared: Option<Engine>,
    /// Its tables, owned, with their codecs.
    shapes: Shapes,
    /// Its tables as it holds them, with the foreign keys among them.
    schema: Schema,
    /// What the server last said its tables are made of.
    described: Option<envelope::ReplicaSchema>,
    tables: Tables,
    /// Tables an earlier build made to go down that this build does not
    /// declare, still in the file (see the `former` module).
    former: std::collections::BTreeSet<String>,
    chain: Chain,
    /// The server key it follows now, once one is pinned.
    trusted: Option<ServerKey>,
    /// Messages and answers refused as not the server's, counted and not
    /// yet written to the file.
    forgeries: trust::Forgeries,
    /// Rows an uplink refused for good, set aside until the replica is
    /// opened again, as (table, key as noted).
    set_aside: std::collections::HashSet<(String, String)>,
    /// Answers to uploads not recorded as sent yet (or never sent by this
    /// replica), kept a while in case their send is recorded after them.
    early: std::collections::HashSet<Vec<u8>>,
    patience: uplink::Patience,
    /// Why the replica's loop last ended on what only its host can end
    /// ([`Handling::Stop`]); `None` while it runs, and after it ended
    /// cleanly.
    stopped: Option<String>,
}

/// How long the replica waits for a host's write transaction to end
/// before its own statement fails as busy (a transient error).
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Answers to unknown sends kept at most.
const EARLY_ANSWERS: usize = 256;

impl Replica {
    /// Opens (or creates) the replica database at `path` for the replica
    /// called `replica_id`: WAL mode, SQLite's own foreign keys off, every
    /// table `engine` declares (up tables too: the replica writes them), and
    /// the replica's bookkeeping. The foreign keys among the tables are the
    /// ones the server last described (none before it first did: it does
    /// with the first snapshot's end).
    pub fn open(path: impl AsRef<Path>, replica_id: &str, engine: &Engine) -> Result<Self> {
        Self::open_with_foreign_keys(path, replica_id, engine, Vec::new())
    }

    /// [`open`](Self::open), following `foreign_keys` among the declared
    /// tables until the server describes them: for a replica fed messages
    /// by hand, with no server to say (tests, tools). Once the server
    /// described the tables, its foreign keys stand and these are ignored.
    pub fn open_with_foreign_keys(
        path: impl AsRef<Path>,
        replica_id: &str,
        engine: &Engine,
        foreign_keys: Vec<ForeignKey>,
    ) -> Result<Self> {
        let shapes = Shapes::of(engine);
        check_foreign_keys(&shapes, &foreign_keys)?;
        up::check(&shapes)?;
        let conn = open_file(path)?;
        let told = described::load(&conn)?;
        let foreign_keys = match &told {
            Some(d) => described::foreign_keys(&shapes, d),
            None => foreign_keys,
        };
        let schema = Schema::new(engine, &foreign_keys);
        Self::assemble(conn, replica_id, Some(engine), shapes, schema, told)
    }

    /// Opens (or creates) the replica database at `path` for the replica
    /// called `replica_id`, with no declarations of its own: its tables,
    /// their columns, keys, directions and the foreign keys among them are
    /// what the server describes, and its rows travel as JSON. Until the
    /// server first describes them (a snapshot begins with it), it holds
    /// no table; opened again, it follows the last description it took.
    ///
    /// The host writes its own records (up tables, and the owned columns
    /// of two-way tables) with any SQLite driver once the tables are
    /// there; the replica notes each write, as for a Rust host. A table
    /// the server describes in a codec other than JSON, or otherwise
    /// beyond what the replica can hold, stops it with
    /// [`Error::Undescribable`], naming the table.
    pub fn open_described(path: impl AsRef<Path>, replica_id: &str) -> Result<Self> {
        let conn = open_file(path)?;
        let told = described::load(&conn)?;
        let (schema, shapes) = match &told {
            Some(d) => following(d)?,
            None => Default::default(),
        };
        Self::assemble(conn, replica_id, None, shapes, schema, told)
    }

    /// The replica on `conn`, its tables made where missing.
    fn assemble(
        mut conn: Connection,
        replica_id: &str,
        declared: Option<&Engine>,
        shapes: Shapes,
        schema: Schema,
        told: Option<envelope::ReplicaSchema>,
    ) -> Result<Self> {
        let foreign_keys = schema.foreign_keys();
        let tables = Tables::new(shapes.tables(), &foreign_keys);
        conn.set_prepared_statement_cache_capacity(statements(&shapes));
        let former = create_tables(&mut conn, &shapes, &tables, &foreign_keys, told.as_ref())?;
        let chain = state::load_chain(&conn)?;
        let trusted = trust::load(&conn)?.current;
        let mut replica = Replica {
            conn,
            id: replica_id.to_string(),
            declared: declared.cloned(),
            shapes,
            schema,
            described: told,
            tables,
            former,
            chain,
            trusted,
            forgeries: Default::default(),
            set_aside: Default::default(),
            early: Default::default(),
            patience: Default::default(),
            stopped: None,
        };
        // The server may have said this build's configuration is whole
        // while an older build ran here: what it took back then went.
        if !replica.former.is_empty() {
            let tx = write_transaction(&mut replica.conn)?;
            let dropped = drop_former(&tx, &replica.schema, &replica.former)?;
            tx.commit()?;
            if dropped {
                replica.former.clear();
            }
        }
        Ok(replica)
    }

    /// Pins `key`, the server's public key as it was handed over with the
    /// replica's secret when the replica was enrolled: from then on the
    /// replica applies only what that key (or a newer key it endorsed)
    /// signed. A replica that pins a key already takes that key again, or
    /// the newer one it follows, and refuses any other
    /// ([`Error::OtherServer`]), so a host may give the enrolment key on
    /// every start. Until a key is pinned, [`apply`](Self::apply) is
    /// [`Error::NoServerKey`].
    pub fn trust(&mut self, key: &ServerKey) -> Result<()> {
        self.trusted = Some(trust::pin(&self.conn, key)?);
        Ok(())
    }

    /// The server key the replica follows now, if one is pinned.
    pub fn server_key(&self) -> Option<ServerKey> {
        self.trusted
    }

    /// The replica's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// What its database is made of: the declared tables, with the foreign
    /// keys among them the server described.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The tables as the server last described them, whole from a server
    /// of this build (`magic_sync_core::schema::Schema::from_described`
    /// reads it back: every table's columns, key, direction, rule, owned,
    /// version, origin and retired columns, codec and foreign keys); `None`
    /// before the server first did.
    pub fn described(&self) -> Option<&envelope::ReplicaSchema> {
        self.described.as_ref()
    }

    /// The database, for the host to read what the replica holds and write
    /// its own records. Writing tables that go down is the server's business.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

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

    /// Follows the server from `trusted` to the newer key `signer` it just
    /// verified something of: an older key's messages are refused from now on.
    fn follow(&mut self, trusted: ServerKey, signer: ServerKey) -> Result<()> {
        if signer != trusted {
            trust::advance(&self.conn, &signer)?;
            self.trusted = Some(signer);
        }
        Ok(())
    }

    fn apply_message(&mut self, message: &ToReplica) -> Result<Outcome> {
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
        state::save_applied(&tx, &Applied::of(message))?;
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
        self.chain = self.chain.applied(message);
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
        let gap = self.chain.newest_gap(message);
        state::save_gap(&self.conn, &gap)?;
        self.chain = self.chain.gapped(message);
        Ok(Outcome::Gap {
            newest: gap.number,
            why,
        })
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

    /// What the host wrote that is due to go up, as one upload of at most
    /// about `max_bytes` of rows, for the host's uplink; `None` when nothing
    /// is. Rows go as they are now, each once however often written; a row
    /// sent and not answered for `resend_after` goes again, under a new
    /// send id. See the `up` module.
    /// The upload is recorded as sent: hand it over only once this returns.
    pub fn upload(
        &mut self,
        max_bytes: usize,
        resend_after: std::time::Duration,
    ) -> Result<Option<envelope::Up>> {
        let Some(pending) = self.prepare_upload(max_bytes, resend_after)? else {
            return Ok(None);
        };
        self.sent(&pending)?;
        Ok(Some(pending.up))
    }

    /// The same upload as [`upload`](Self::upload), not yet recorded as
    /// sent: for a host that hands it over first and calls
    /// [`sent`](Self::sent) once its uplink took it. Rows set aside are
    /// left out, and so are rows that cannot be read as their table
    /// declares them, which are set aside.
    pub fn prepare_upload(
        &mut self,
        max_bytes: usize,
        resend_after: std::time::Duration,
    ) -> Result<Option<Pending>> {
        let due = up::due(&self.conn, resend_after, &self.set_aside)?;
        let mut unreadable = Vec::new();
        let made = up::make(
            &mut self.conn,
            &self.shapes,
            &due,
            max_bytes,
            &mut unreadable,
        );
        for (table, key, _) in unreadable {
            self.set_aside.insert((table, key));
        }
        made
    }

    /// Records `pending` as sent. An answer to it that came first lets go of
    /// its rows now; returns how many.
    pub fn sent(&mut self, pending: &Pending) -> Result<usize> {
        self.sender().sent(pending)
    }

    /// Sends what is due through `uplink`, at most `most` uploads; finds
    /// and sets aside a row the uplink refuses for good (see the `uplink`
    /// module). Stops early, with why, when the uplink cannot reach the
    /// server or refuses everything.
    pub fn send_up(
        &mut self,
        uplink: &impl Uplink,
        resend_after: std::time::Duration,
        most: usize,
    ) -> Result<SentUp> {
        self.sender().send_up(uplink, resend_after, most)
    }

    fn sender(&mut self) -> uplink::Sender<'_> {
        uplink::Sender {
            conn: &mut self.conn,
            shapes: &self.shapes,
            set_aside: &mut self.set_aside,
            early: &mut self.early,
            patience: &mut self.patience,
        }
    }

    /// Wakes the hosts in this process waiting on this file
    /// ([`wait_written`]): what they wait for may have moved.
    fn ring(&self) {
        if let Some(path) = self.conn.path().filter(|p| !p.is_empty()) {
            up::bell(path).ring();
        }
    }

    /// The server filed an upload: lets go of what that send carried and
    /// was not written since. Returns how many rows were let go of; none for
    /// a send this replica does not know (one not recorded as sent yet is
    /// remembered a while, and counts once it is).
    ///
    /// An answer that is not the server's (see [`Outcome::Forged`]) is
    /// [`Error::Forged`], counted, and lets go of nothing. The receipt an
    /// answer carries, signed with it, is kept when it is the newest: the
    /// replica's acknowledgements give it back (see [`ack`](Self::ack)).
    pub fn filed(&mut self, filed: &envelope::Filed) -> Result<usize> {
        let trusted = self.trusted.ok_or(Error::NoServerKey)?;
        let signer = match sign::verify_filed(&trusted, &self.id, filed) {
            Ok(signer) => signer,
            Err(why) => {
                self.forgeries
                    .count(&self.conn, &self.id, &why.to_string())?;
                return Err(Error::Forged {
                    what: "an answer to an upload".into(),
                    why,
                });
            }
        };
        self.forgeries.write_if_due(&self.conn, &self.id)?;
        self.follow(trusted, signer)?;
        self.patience.answered(&filed.send_id);
        // One transaction: one commit, and the host's writes wait for it
        // rather than interleave.
        let tx = write_transaction(&mut self.conn)?;
        let released = up::filed(&tx, &filed.send_id)?;
        if let Some(receipt) = &filed.receipt {
            up::keep_receipt(&tx, receipt)?;
        }
        tx.commit()?;
        self.ring();
        if released == 0 && !up::knows(&self.conn, &filed.send_id)? {
            if self.early.len() >= EARLY_ANSWERS {
                self.early.clear();
            }
            self.early.insert(filed.send_id.clone());
        }
        Ok(released)
    }

    /// How long to let an upload go unanswered before sending its rows
    /// again: `floor`, or four times the smoothed time answers took to
    /// come when that is longer. Each resend draws a new id, and only the
    /// newest send's answer lets go of a row: a replica resending faster
    /// than a loaded server answers would keep every row in flight, and
    /// add to the load. The runner's loop waits this long.
    pub fn patience(&self, floor: std::time::Duration) -> std::time::Duration {
        self.patience.after(floor)
    }

    /// Where the replica stands: ready (a snapshot ended, none under way),
    /// the last message applied (its number, epoch and nonce), a gap it
    /// waits in, the rows it refused, the rows its host wrote that are not
    /// filed yet. A host on a connection of its own asks
    /// [`status`](fn@status), which counts refused forgeries as written.
    pub fn status(&self) -> Result<Status> {
        let mut status = state::status(&self.conn)?;
        (status.forged, status.last_forgery) = self
            .forgeries
            .on_top_of(status.forged, status.last_forgery.take());
        status.stopped.clone_from(&self.stopped);
        Ok(status)
    }

    /// Whether this replica holds whole the configuration it runs: the
    /// server said its declarations with this build's fingerprint (
    /// [`schema`](Self::schema)) have all been sent and applied, by a
    /// snapshot's end or once a deployment of them was done. While a
    /// snapshot or a deployment is arriving, what it holds is consistent
    /// (no row without its parents) but may be part old, part new: a host
    /// that must show a new configuration whole waits for this.
    /// A host reading on a connection of its own asks
    /// [`configuration`](fn@configuration).
    pub fn configuration(&self) -> Result<Configuration> {
        Configuration::read(
            &self.conn,
            &self.schema,
            self.described.as_ref(),
            self.former.iter().cloned().collect(),
        )
    }

    /// The mark of everything the host has written here so far: ask
    /// [`written`](Self::written) how far it went. A host writing on a
    /// connection of its own asks [`mark`] and [`written`](fn@written) there.
    pub fn mark(&self) -> Result<Mark> {
        up::mark(&self.conn)
    }

    /// How far the host's writes up to `mark` went: still here, filed by
    /// the server, or reached (this replica reads its own writes).
    pub fn written(&self, mark: Mark) -> Result<Written> {
        up::written(&self.conn, mark)
    }

    /// Per table, rows the host wrote that have not gone up, and rows gone
    /// up that the server has not filed yet.
    pub fn progress(&self) -> Result<envelope::Backlog> {
        up::backlog(&self.conn)
    }

    /// What the replica holds of each table that goes down (see the
    /// definition in the `digest` module: rows held live and not refused, and
    /// an FNV-1a fingerprint of their sorted canonical keys).
    pub fn digest(&self) -> Result<envelope::Digest> {
        digest::digest(&self.conn, &self.tables)
    }
}

impl Drop for Replica {
    /// Writes the refusals counted and not written yet.
    fn drop(&mut self) {
        if let Err(e) = self.forgeries.write(&self.conn, &self.id) {
            tracing::warn!(replica = %self.id, error = %e, "could not write the refusals counted");
        }
    }
}

/// A transaction that takes the write lock as it begins, waiting up to the
/// busy timeout for a host's write to end. A deferred one that read first
/// and then writes after a host committed is refused at once ("database is
/// locked": SQLite cannot wait there without risking a deadlock), which
/// under a busy host failed one message in a few hundred.
pub(crate) fn write_transaction(conn: &mut Connection) -> rusqlite::Result<Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
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

/// Drops the tables of `former` when the server said the declarations
/// `schema` runs are whole here; returns whether it did.
fn drop_former(
    tx: &Transaction<'_>,
    schema: &Schema,
    former: &std::collections::BTreeSet<String>,
) -> Result<bool> {
    let whole = state::configuration(tx)?.as_deref() == Some(&schema.fingerprint().0[..]);
    if whole {
        former::drop_all(tx, former)?;
    }
    Ok(whole)
}

/// The declared tables, the bookkeeping and their indexes, in one
/// transaction; and the indexes a snapshot in progress set aside, built again.
/// Returns the tables an earlier build made to go down that `shapes` does
/// not hold (`told`: the server's last description).
fn create_tables(
    conn: &mut Connection,
    shapes: &Shapes,
    tables: &Tables,
    foreign_keys: &[ForeignKey],
    told: Option<&envelope::ReplicaSchema>,
) -> Result<std::collections::BTreeSet<String>> {
    let tx = write_transaction(conn)?;
    let former = make_tables(&tx, shapes, tables, foreign_keys, told)?;
    tx.commit()?;
    Ok(former)
}

/// [`create_tables`], in `tx`.
fn make_tables(
    tx: &Transaction<'_>,
    shapes: &Shapes,
    tables: &Tables,
    foreign_keys: &[ForeignKey],
    told: Option<&envelope::ReplicaSchema>,
) -> Result<std::collections::BTreeSet<String>> {
    for table in shapes.tables() {
        tx.execute_batch(&lite::create(table))?;
        add_columns(tx, table)?;
        if let Some(index) = tables::retired_index(table) {
            tx.execute_batch(&index)?;
        }
    }
    for sql in tables.iter() {
        tx.execute_batch(&sql.stale.create)?;
    }
    state::create(tx)?;
    up::create(tx, shapes)?;
    snapshot::carry_over(tx, tables)?;
    snapshot::build_set_aside(tx)?;
    for fk in foreign_keys {
        tx.execute_batch(&tables::foreign_key_index(fk))?;
    }
    former::open(tx, shapes, told)
}

/// Adds the columns a new build declares that `table`, made by an older
/// one, lacks: its rows stay, the new columns NULL in them until the server
/// sends the rows again (a deployment that changes a table's columns sends
/// it again). SQLite cannot add a NOT NULL column without a default, so
/// the new columns take NULL; the rows sent fill them.
fn add_columns(tx: &Transaction<'_>, table: &crate::shape::Table) -> Result<()> {
    let mut have = std::collections::HashSet::new();
    {
        let mut stmt = tx.prepare(&format!("PRAGMA table_info({})", sql::ident(&table.name)))?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            have.insert(row.get::<_, String>(1)?);
        }
    }
    let mut wanted: Vec<(&str, &str)> = table
        .columns
        .iter()
        .map(|c| (c.name.as_str(), lite::storage(c.kind)))
        .collect();
    if let Some(retired) = table.retired.as_deref() {
        wanted.push((retired, "INTEGER"));
    }
    for (name, storage) in wanted {
        if !have.contains(name) {
            tx.execute_batch(&format!(
                "ALTER TABLE {} ADD COLUMN {} {storage}",
                sql::ident(&table.name),
                sql::ident(name)
            ))?;
        }
    }
    Ok(())
}

/// What a description made of the replica's tables.
struct Retold {
    /// The tables as the replica holds them now, with the foreign keys
    /// among them.
    schema: Schema,
    /// Their statements.
    tables: Tables,
    /// For a replica that follows the description: its tables, and the
    /// tables it made to go down before that the description no longer
    /// names.
    shapes: Option<Shapes>,
    former: Option<std::collections::BTreeSet<String>>,
}

/// Keeps the server's description of the tables, and builds what it
/// decides: for a replica with declarations of its own, the foreign keys'
/// indexes and the statements that retire and purge; for one that follows
/// the description, its tables too, made or widened where they differ.
fn take_description(
    tx: &Transaction<'_>,
    declared: Option<&Engine>,
    shapes: &Shapes,
    described: &envelope::ReplicaSchema,
) -> Result<Retold> {
    let Some(engine) = declared else {
        let (schema, shapes) = following(described)?;
        described::save(tx, described)?;
        let foreign_keys = schema.foreign_keys();
        let tables = Tables::new(shapes.tables(), &foreign_keys);
        let former = make_tables(tx, &shapes, &tables, &foreign_keys, Some(described))?;
        return Ok(Retold {
            schema,
            tables,
            shapes: Some(shapes),
            former: Some(former),
        });
    };
    described::save(tx, described)?;
    let foreign_keys = described::foreign_keys(shapes, described);
    for fk in &foreign_keys {
        tx.execute_batch(&tables::foreign_key_index(fk))?;
    }
    Ok(Retold {
        schema: Schema::new(engine, &foreign_keys),
        tables: Tables::new(shapes.tables(), &foreign_keys),
        shapes: None,
        former: None,
    })
}

/// The schema and tables of a description, for a replica that follows it;
/// refused in words when it cannot.
fn following(described: &envelope::ReplicaSchema) -> Result<(Schema, Shapes)> {
    let schema = Schema::from_described(described).map_err(Error::Undescribable)?;
    let shapes = Shapes::described(&schema).map_err(Error::Undescribable)?;
    Ok((schema, shapes))
}

/// The oldest SQLite a replica runs on: its tables are `STRICT` (3.37).
/// The library links the system's SQLite (decision 169), so this is the
/// machine's to meet.
const OLDEST_SQLITE: (i32, &str) = (3_037_000, "3.37.0");

/// The file at `path`, opened as a replica's: WAL, SQLite's own foreign
/// keys off, waiting for the host's writes rather than failing.
fn open_file(path: impl AsRef<Path>) -> Result<Connection> {
    if rusqlite::version_number() < OLDEST_SQLITE.0 {
        return Err(Error::OldSqlite {
            found: rusqlite::version(),
            needed: OLDEST_SQLITE.1,
        });
    }
    let conn = Connection::open(path)?;
    // The host writes its records on connections of its own: wait for
    // them rather than fail.
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0))?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    described::create(&conn)?;
    Ok(conn)
}

/// Statements kept prepared: the replica's own (a few dozen) and a
/// handful per table. rusqlite keeps 16, fewer than a message and an
/// upload go through, so each was parsed again.
fn statements(shapes: &Shapes) -> usize {
    64 + 8 * shapes.tables().count()
}

/// Refuses foreign keys naming a table or a column that is not declared.
fn check_foreign_keys(shapes: &Shapes, foreign_keys: &[ForeignKey]) -> Result<()> {
    let mut problems = Vec::new();
    for fk in foreign_keys {
        let child = side(shapes, &fk.child, &fk.child_columns, &mut problems);
        let parent = side(shapes, &fk.parent, &fk.parent_columns, &mut problems);
        let arity = fk.child_columns.len() == fk.parent_columns.len();
        if child && parent && (!arity || fk.child_columns.is_empty()) {
            problems.push(Mismatch {
                table: fk.child.clone(),
                column: None,
                problem: format!(
                    "a foreign key to `{}` pairs {} columns with {}",
                    fk.parent,
                    fk.child_columns.len(),
                    fk.parent_columns.len()
                ),
            });
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Declarations(problems))
    }
}

/// Whether one side of a foreign key names a declared table and its columns;
/// records what it does not.
fn side(shapes: &Shapes, table: &str, columns: &[String], problems: &mut Vec<Mismatch>) -> bool {
    let Some(declared) = shapes.codec(table).map(|c| c.table()) else {
        problems.push(Mismatch {
            table: table.to_string(),
            column: None,
            problem: "a foreign key given to the replica names it, but no table is declared so"
                .into(),
        });
        return false;
    };
    let missing: Vec<&String> = columns
        .iter()
        .filter(|c| declared.column(c).is_none())
        .collect();
    for c in &missing {
        problems.push(Mismatch {
            table: table.to_string(),
            column: Some(c.to_string()),
            problem: "a foreign key given to the replica names it, but the declaration has no such column"
                .into(),
        });
    }
    missing.is_empty()
}

/// Whether a replica holds its configuration whole (see
/// [`Replica::configuration`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configuration {
    /// The server said everything of the declarations this build runs
    /// ([`Configuration::own`]) has been sent, and it was applied.
    pub complete: bool,
    /// The fingerprint of this build's declarations.
    pub own: magic_sync_core::schema::Fingerprint,
    /// The fingerprint the server last said the replica holds whole; `None`
    /// while a snapshot is arriving, or before the server said. Another
    /// than [`own`](Self::own): the server runs other declarations than
    /// this build, or a deployment of them is still arriving.
    pub server: Option<Vec<u8>>,
    /// Where the tables the server last described differ from this build's
    /// declarations, in words: a table or column one side has and the
    /// other lacks, or declares otherwise. A replica that disagrees takes
    /// what its build can read; the host's build wants updating.
    pub disagreements: Vec<String>,
    /// Tables an earlier build made here that this build no longer
    /// declares, still in the file: the server has not yet said this
    /// build's configuration is whole. Once it does, the replica drops
    /// them; until then the configuration is not complete.
    pub former_tables: Vec<String>,
}

impl Configuration {
    fn read(
        conn: &Connection,
        schema: &Schema,
        described: Option<&envelope::ReplicaSchema>,
        former_tables: Vec<String>,
    ) -> Result<Configuration> {
        let own = schema.fingerprint();
        let server = state::configuration(conn)?;
        Ok(Configuration {
            complete: server.as_deref() == Some(&own.0[..]) && former_tables.is_empty(),
            own,
            server,
            disagreements: described
                .map(|d| schema.disagreements(d))
                .unwrap_or_default(),
            former_tables,
        })
    }
}

/// Whether the replica whose file `conn` opens, run by a build declaring
/// `engine`, holds its configuration whole (see
/// [`Replica::configuration`]); for a host reading on a connection of its
/// own while the replica runs. The file must have been opened as a
/// replica once. Reads only: a replica whose server has not described its
/// tables yet is read with no foreign keys among them, and is not
/// complete anyway.
pub fn configuration(conn: &Connection, engine: &Engine) -> Result<Configuration> {
    let shapes = Shapes::of(engine);
    let described = described::load(conn)?;
    let foreign_keys = described
        .as_ref()
        .map(|d| described::foreign_keys(&shapes, d))
        .unwrap_or_default();
    let schema = Schema::new(engine, &foreign_keys);
    let former_tables = former::read(conn, &shapes)?;
    Configuration::read(conn, &schema, described.as_ref(), former_tables)
}

/// Where the replica whose file `conn` opens stands (see
/// [`Replica::status`]); for a host reading on a connection of its own.
/// The file must have been opened as a replica once.
pub fn status(conn: &Connection) -> Result<Status> {
    state::status(conn)
}

/// [`status`] of the replica in the file at `path`, opened read-only for
/// the question alone: for a tool beside a running replica. A file that is
/// missing, or was never opened as a replica, is an error.
pub fn status_at(path: impl AsRef<Path>) -> Result<Status> {
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    state::status(&conn)
}
