//! The replica type: its connection and what it holds in memory of its
//! file, its identity and the server key it trusts, and the write
//! transaction every step that changes the file begins. Its other methods
//! live with what they do: opening (`open`), messages down (`down`),
//! uploads (`upload`), where it stands (`standing`).

use crate::chain::Chain;
use crate::engine::Engine;
use crate::envelope;
use crate::error::Result;
use crate::shape::Shapes;
use crate::tables::Tables;
use crate::{trust, up, uplink, Schema, ServerKey};
use rusqlite::{Connection, Transaction, TransactionBehavior};

/// A replica's database and what it knows of the chain.
#[derive(Debug)]
pub struct Replica {
    pub(crate) conn: Connection,
    pub(crate) id: String,
    /// The host's declarations; `None` for a replica that follows the
    /// server's description ([`Replica::open_described`]).
    pub(crate) declared: Option<Engine>,
    /// Its tables, owned, with their codecs.
    pub(crate) shapes: Shapes,
    /// Its tables as it holds them, with the foreign keys among them.
    pub(crate) schema: Schema,
    /// What the server last said its tables are made of.
    pub(crate) described: Option<envelope::ReplicaSchema>,
    pub(crate) tables: Tables,
    /// Tables an earlier build made to go down that this build does not
    /// declare, still in the file (see the `former` module).
    pub(crate) former: std::collections::BTreeSet<String>,
    pub(crate) chain: Chain,
    /// The server key it follows now, once one is pinned.
    pub(crate) trusted: Option<ServerKey>,
    /// Messages and answers refused as not the server's, counted and not
    /// yet written to the file.
    pub(crate) forgeries: trust::Forgeries,
    /// Rows an uplink refused for good, set aside until the replica is
    /// opened again, as (table, key as noted).
    pub(crate) set_aside: std::collections::HashSet<(String, String)>,
    /// Answers to uploads not recorded as sent yet (or never sent by this
    /// replica), kept a while in case their send is recorded after them.
    pub(crate) early: std::collections::HashSet<Vec<u8>>,
    pub(crate) patience: uplink::Patience,
    /// Why the replica's loop last ended on what only its host can end
    /// ([`Handling::Stop`](crate::Handling::Stop)); `None` while it runs,
    /// and after it ended cleanly.
    pub(crate) stopped: Option<String>,
}

impl Replica {
    /// Pins `key`, the server's public key as it was handed over with the
    /// replica's secret when the replica was enrolled: from then on the
    /// replica applies only what that key (or a newer key it endorsed)
    /// signed. A replica that pins a key already takes that key again, or
    /// the newer one it follows, and refuses any other
    /// ([`Error::OtherServer`](crate::Error::OtherServer)), so a host may
    /// give the enrolment key on every start. Until a key is pinned,
    /// [`apply`](Self::apply) is
    /// [`Error::NoServerKey`](crate::Error::NoServerKey).
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

    /// Follows the server from `trusted` to the newer key `signer` it just
    /// verified something of: an older key's messages are refused from now on.
    pub(crate) fn follow(&mut self, trusted: ServerKey, signer: ServerKey) -> Result<()> {
        if signer != trusted {
            trust::advance(&self.conn, &signer)?;
            self.trusted = Some(signer);
        }
        Ok(())
    }

    /// Wakes the hosts in this process waiting on this file
    /// ([`wait_written`](crate::wait_written)): what they wait for may have moved.
    pub(crate) fn ring(&self) {
        if let Some(path) = self.conn.path().filter(|p| !p.is_empty()) {
            up::bell(path).ring();
        }
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
