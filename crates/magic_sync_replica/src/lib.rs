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

mod apply;
mod described;
mod digest;
mod down;
pub mod error;
mod former;
mod key;
pub mod lite;
mod open;
mod replica;
mod row;
pub mod run;
mod shape;
mod snapshot;
mod standing;
mod state;
mod tables;
mod trust;
mod up;
mod uplink;
mod upload;

// The derive names the runtime crate as `::magic_sync`; in this crate's own
// tests that is the protocol core.
#[cfg(test)]
extern crate magic_sync_core as magic_sync;

use magic_sync_core::{chain, codec, engine, envelope, sign, sql, value};

pub use digest::fingerprint;
pub use down::Outcome;
pub use error::{Error, Handling, Result};
pub use key::{canonical as canonical_key, KeyProblem};
pub use magic_sync_core::schema::{ForeignKey, Schema};
pub use magic_sync_core::sign::{Forgery, ServerKey};
pub use replica::Replica;
pub use standing::{configuration, status, status_at, Configuration};
pub use state::{Status, MAX_REFUSED};
pub use up::{backlog, mark, wait_written, written, Mark, Pending, Written};
pub use uplink::{LinkError, LinkErrorKind, SentUp, Uplink, UplinkError};

pub(crate) use replica::write_transaction;
