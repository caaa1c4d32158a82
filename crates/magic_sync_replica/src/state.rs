//! The replica's own bookkeeping, in tables of its database named
//! `_magic_sync_*`: the last message applied, the gap it is in, the rows it
//! refused, and the snapshot in progress: the tables that were empty when it
//! began, and the indexes set aside until it ends. (The keys it has not sent
//! yet are kept per table, beside each table: see `tables::Stale`.) Each is
//! written in the transaction of the message it is about.

use crate::chain::{Applied, Chain, GapAt};
use crate::envelope;
use crate::error::{Error, Result};
use magic_sync_core::MessageNo;
use rusqlite::{params, Connection, OptionalExtension};

/// Creates the bookkeeping tables when they are missing.
const CREATE: &str = "
CREATE TABLE IF NOT EXISTS _magic_sync_applied (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch BLOB NOT NULL,
    number INTEGER NOT NULL,
    nonce BLOB NOT NULL,
    seal BLOB NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS _magic_sync_gap (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch BLOB NOT NULL,
    number INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS _magic_sync_refused (
    table_name TEXT NOT NULL,
    key BLOB NOT NULL,
    canonical TEXT,
    number INTEGER NOT NULL,
    reason TEXT NOT NULL,
    superseded INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (table_name, key)
) STRICT;
CREATE INDEX IF NOT EXISTS _magic_sync_refused_canonical
    ON _magic_sync_refused (table_name, canonical);
CREATE TABLE IF NOT EXISTS _magic_sync_refused_dropped (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    n INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS _magic_sync_snapshot (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    began INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS _magic_sync_snapshot_empty (
    table_name TEXT PRIMARY KEY
) STRICT;
CREATE TABLE IF NOT EXISTS _magic_sync_configured (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    schema BLOB NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS _magic_sync_snapshot_indexes (
    name TEXT PRIMARY KEY,
    table_name TEXT NOT NULL,
    sql TEXT NOT NULL
) STRICT;
";

const LOAD_APPLIED: &str = "SELECT epoch, number, nonce, seal FROM _magic_sync_applied";
const SAVE_APPLIED: &str = "
INSERT INTO _magic_sync_applied (id, epoch, number, nonce, seal) VALUES (1, ?1, ?2, ?3, ?4)
ON CONFLICT (id) DO UPDATE SET
    epoch = excluded.epoch, number = excluded.number, nonce = excluded.nonce, seal = excluded.seal";

const LOAD_GAP: &str = "SELECT epoch, number FROM _magic_sync_gap";
const SAVE_GAP: &str = "
INSERT INTO _magic_sync_gap (id, epoch, number) VALUES (1, ?1, ?2)
ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, number = excluded.number";
const CLEAR_GAP: &str = "DELETE FROM _magic_sync_gap";

const CONFIGURED: &str = "SELECT schema FROM _magic_sync_configured";
const SAVE_CONFIGURED: &str = "
INSERT INTO _magic_sync_configured (id, schema) VALUES (1, ?1)
ON CONFLICT (id) DO UPDATE SET schema = excluded.schema";
const FORGET_CONFIGURED: &str = "DELETE FROM _magic_sync_configured";

const SNAPSHOT_BEGAN: &str = "SELECT began FROM _magic_sync_snapshot";
const BEGIN_SNAPSHOT: &str = "
INSERT INTO _magic_sync_snapshot (id, began) VALUES (1, ?1)
ON CONFLICT (id) DO UPDATE SET began = excluded.began";
const END_SNAPSHOT: &str = "DELETE FROM _magic_sync_snapshot";
const FORGET_EMPTY: &str = "DELETE FROM _magic_sync_snapshot_empty";
const NOTE_EMPTY: &str = "INSERT INTO _magic_sync_snapshot_empty (table_name) VALUES (?1)";
const EMPTY: &str = "SELECT table_name FROM _magic_sync_snapshot_empty";
const ANY_REFUSED: &str = "SELECT EXISTS (SELECT 1 FROM _magic_sync_refused)";
const REFUSED_ROWS: &str = "SELECT table_name, key, canonical FROM _magic_sync_refused";

const SET_ASIDE: &str =
    "INSERT OR REPLACE INTO _magic_sync_snapshot_indexes (name, table_name, sql) VALUES (?1, ?2, ?3)";
const SET_ASIDE_ALL: &str = "SELECT name, sql FROM _magic_sync_snapshot_indexes ORDER BY name";
const FORGET_SET_ASIDE: &str = "DELETE FROM _magic_sync_snapshot_indexes";
/// The indexes of a table that can be dropped and built again: made by
/// `CREATE INDEX` (not a key or a `UNIQUE` constraint) and not unique, so no
/// row is refused or let through differently without them.
const DROPPABLE_INDEXES: &str = "
SELECT m.name, m.sql FROM sqlite_master AS m JOIN pragma_index_list(?1) AS l ON l.name = m.name
WHERE m.type = 'index' AND m.sql IS NOT NULL AND l.origin = 'c' AND NOT l.\"unique\"
ORDER BY m.name";
const TABLE_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)";
/// Where earlier versions kept the keys a snapshot had sent.
const OLD_NAMED: &str = "_magic_sync_snapshot_keys";
const WAS_NAMED: &str =
    "SELECT EXISTS (SELECT 1 FROM _magic_sync_snapshot_keys WHERE table_name = ?1 AND key = ?2)";
const INDEX_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?1)";

const REFUSE: &str = "
INSERT INTO _magic_sync_refused (table_name, key, canonical, number, reason, superseded)
VALUES (?1, ?2, ?3, ?4, ?5, 0)
ON CONFLICT (table_name, key) DO UPDATE SET
    canonical = excluded.canonical, number = excluded.number,
    reason = excluded.reason, superseded = 0";
const FORGET_REFUSED: &str =
    "DELETE FROM _magic_sync_refused WHERE table_name = ?1 AND (key = ?2 OR canonical = ?3)";
const SUPERSEDE_REFUSED: &str = "UPDATE _magic_sync_refused SET superseded = 1";
const FORGET_SUPERSEDED: &str =
    "DELETE FROM _magic_sync_refused WHERE table_name = ?1 AND superseded = 1";
const REFUSED: &str = "
SELECT table_name, key, number, reason FROM _magic_sync_refused
ORDER BY number, table_name, key";
const REFUSED_KEYS: &str =
    "SELECT canonical FROM _magic_sync_refused WHERE table_name = ?1 AND canonical IS NOT NULL";

/// Creates the bookkeeping tables.
pub(crate) fn create(conn: &Connection) -> Result<()> {
    conn.execute_batch(CREATE)?;
    conn.execute_batch(crate::trust::CREATE)?;
    Ok(())
}

/// A message number as SQLite stores it. Numbers come from a PostgreSQL
/// sequence, so they fit; the envelope's check refuses any that does not.
pub(crate) fn to_sql(number: u64) -> Result<i64> {
    i64::try_from(number)
        .map_err(|_| Error::Bookkeeping(format!("message number {number} does not fit SQLite")))
}

/// A message number as the replica's database keeps it, refused below zero
/// (which no server gives).
fn stored(number: i64) -> Result<MessageNo> {
    if number < 0 {
        return Err(Error::Bookkeeping(format!(
            "it holds message number {number}, below zero"
        )));
    }
    Ok(MessageNo::from_store(number))
}

fn from_sql(number: i64) -> Result<u64> {
    u64::try_from(number)
        .map_err(|_| Error::Bookkeeping(format!("it holds message number {number}, below zero")))
}

/// The chain as the database records it.
pub(crate) fn load_chain(conn: &Connection) -> Result<Chain> {
    let applied = conn
        .query_row(LOAD_APPLIED, [], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, i64>(1)?,
                r.get(2)?,
                r.get(3)?,
            ))
        })
        .optional()?
        .map(|(epoch, number, nonce, seal)| -> Result<Applied> {
            Ok(Applied {
                epoch: epoch.into(),
                number: stored(number)?,
                nonce,
                seal,
            })
        })
        .transpose()?;
    let gap = conn
        .query_row(LOAD_GAP, [], |r| {
            Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?))
        })
        .optional()?
        .map(|(epoch, number)| -> Result<GapAt> {
            Ok(GapAt {
                epoch: epoch.into(),
                number: stored(number)?,
            })
        })
        .transpose()?;
    Ok(Chain { applied, gap })
}

/// Records `applied` as the last message applied, and closes any gap.
pub(crate) fn save_applied(conn: &Connection, applied: &Applied) -> Result<()> {
    conn.prepare_cached(SAVE_APPLIED)?.execute(params![
        applied.epoch.as_bytes(),
        applied.number.store(),
        applied.nonce,
        applied.seal
    ])?;
    conn.prepare_cached(CLEAR_GAP)?.execute([])?;
    Ok(())
}

/// Records the gap the replica is in.
pub(crate) fn save_gap(conn: &Connection, gap: &GapAt) -> Result<()> {
    conn.prepare_cached(SAVE_GAP)?
        .execute(params![gap.epoch.as_bytes(), gap.number.store()])?;
    Ok(())
}

/// The number of the message that began the snapshot in progress, if any.
pub(crate) fn snapshot_began(conn: &Connection) -> Result<Option<u64>> {
    conn.query_row(SNAPSHOT_BEGAN, [], |r| r.get::<_, i64>(0))
        .optional()?
        .map(from_sql)
        .transpose()
}

/// Starts a snapshot at message `number`: every refusal so far is superseded
/// by what the snapshot will send. Returns the tables of `tables` that hold
/// no row, which are noted as such until the snapshot ends.
pub(crate) fn begin_snapshot<'t>(
    conn: &Connection,
    number: u64,
    tables: &[&'t str],
) -> Result<Vec<&'t str>> {
    conn.prepare_cached(FORGET_EMPTY)?.execute([])?;
    let mut empty = Vec::new();
    for &table in tables {
        let none: bool = conn.query_row(
            &format!(
                "SELECT NOT EXISTS (SELECT 1 FROM {})",
                crate::sql::ident(table)
            ),
            [],
            |r| r.get(0),
        )?;
        if none {
            conn.prepare_cached(NOTE_EMPTY)?.execute([table])?;
            empty.push(table);
        }
    }
    conn.prepare_cached(SUPERSEDE_REFUSED)?.execute([])?;
    // What it holds is a configuration arriving until the snapshot ends.
    conn.prepare_cached(FORGET_CONFIGURED)?.execute([])?;
    conn.prepare_cached(BEGIN_SNAPSHOT)?
        .execute([to_sql(number)?])?;
    Ok(empty)
}

/// Records that the replica holds whole the server's declarations whose
/// fingerprint is `schema` (empty: a server that does not say).
pub(crate) fn configured(conn: &Connection, schema: &[u8]) -> Result<()> {
    if schema.is_empty() {
        conn.prepare_cached(FORGET_CONFIGURED)?.execute([])?;
    } else {
        conn.prepare_cached(SAVE_CONFIGURED)?.execute([schema])?;
    }
    Ok(())
}

/// The fingerprint of the server's declarations the replica holds whole,
/// if the server said so since the last snapshot began.
pub(crate) fn configuration(conn: &Connection) -> Result<Option<Vec<u8>>> {
    Ok(conn
        .prepare_cached(CONFIGURED)?
        .query_row([], |r| r.get(0))
        .optional()?)
}

/// Ends the snapshot in progress.
pub(crate) fn end_snapshot(conn: &Connection) -> Result<()> {
    conn.prepare_cached(FORGET_EMPTY)?.execute([])?;
    conn.prepare_cached(END_SNAPSHOT)?.execute([])?;
    Ok(())
}

/// The indexes of `table` a snapshot may drop while it fills the table, by
/// name, with the statement that makes each.
pub(crate) fn droppable_indexes(conn: &Connection, table: &str) -> Result<Vec<(String, String)>> {
    let mut stmt = conn.prepare_cached(DROPPABLE_INDEXES)?;
    let rows = stmt.query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Records that the index `name` of `table`, made by `sql`, is dropped until
/// the snapshot ends.
pub(crate) fn set_aside(conn: &Connection, name: &str, table: &str, sql: &str) -> Result<()> {
    conn.prepare_cached(SET_ASIDE)?
        .execute([name, table, sql])?;
    Ok(())
}

/// The indexes set aside, by name, with the statement that makes each; and
/// forgets them.
pub(crate) fn take_set_aside(conn: &Connection) -> Result<Vec<(String, String)>> {
    let indexes = {
        let mut stmt = conn.prepare_cached(SET_ASIDE_ALL)?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<rusqlite::Result<Vec<(String, String)>>>()?
    };
    conn.prepare_cached(FORGET_SET_ASIDE)?.execute([])?;
    Ok(indexes)
}

/// Whether the database holds the keys a snapshot had sent as earlier
/// versions kept them (one table for all, by canonical text).
pub(crate) fn has_old_named_keys(conn: &Connection) -> Result<bool> {
    Ok(conn
        .prepare_cached(TABLE_EXISTS)?
        .query_row([OLD_NAMED], |r| r.get(0))?)
}

/// Whether the snapshot in progress had sent the row `canonical` of `table`,
/// by the keys earlier versions kept.
pub(crate) fn was_named(conn: &Connection, table: &str, canonical: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached(WAS_NAMED)?
        .query_row([table, canonical], |r| r.get(0))?)
}

/// Drops the keys earlier versions kept, once carried over.
pub(crate) fn drop_old_named_keys(conn: &Connection) -> Result<()> {
    conn.execute_batch(&format!("DROP TABLE IF EXISTS {OLD_NAMED}"))?;
    Ok(())
}

/// Whether the database has an index called `name`.
pub(crate) fn index_exists(conn: &Connection, name: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached(INDEX_EXISTS)?
        .query_row([name], |r| r.get(0))?)
}

/// A row the replica could not take.
#[derive(Debug)]
pub(crate) struct Refusal<'a> {
    pub table: &'a str,
    /// The key as it came.
    pub key: &'a [u8],
    /// Its canonical text, when it could be read.
    pub canonical: Option<&'a str>,
    pub number: u64,
    pub reason: String,
}

/// Refusals kept on record at most: past it the oldest are dropped, and
/// counted ([`Status::refused_dropped`]). Every message the replica applies
/// reads them, so their number is bounded; the server's comparison of
/// digests still finds what a dropped refusal was about.
/// The server's bound on what one report may carry is the same number.
pub const MAX_REFUSED: i64 = magic_sync_core::bounds::MAX_REFUSED as i64;

const DROP_OLDEST_REFUSED: &str = "
DELETE FROM _magic_sync_refused WHERE rowid IN (
    SELECT rowid FROM _magic_sync_refused ORDER BY number, rowid
    LIMIT max(0, (SELECT count(*) FROM _magic_sync_refused) - ?1))";
const COUNT_DROPPED: &str = "
INSERT INTO _magic_sync_refused_dropped (id, n) VALUES (1, ?1)
ON CONFLICT (id) DO UPDATE SET n = n + excluded.n";

/// Records a refusal, replacing an earlier one of the same row.
pub(crate) fn refuse(conn: &Connection, refusal: &Refusal<'_>) -> Result<()> {
    conn.prepare_cached(REFUSE)?.execute(params![
        refusal.table,
        refusal.key,
        refusal.canonical,
        to_sql(refusal.number)?,
        refusal.reason
    ])?;
    Ok(())
}

/// Past [`MAX_REFUSED`] refusals on record, drops the oldest and counts
/// them: once a message that refused rows is applied, in its transaction.
pub(crate) fn trim_refused(conn: &Connection) -> Result<()> {
    let dropped = conn
        .prepare_cached(DROP_OLDEST_REFUSED)?
        .execute([MAX_REFUSED])?;
    if dropped > 0 {
        conn.prepare_cached(COUNT_DROPPED)?
            .execute([i64::try_from(dropped).unwrap_or(i64::MAX)])?;
    }
    Ok(())
}

/// Forgets any refusal of the row (it applied, or was let go of).
pub(crate) fn forget_refused(
    conn: &Connection,
    table: &str,
    key: &[u8],
    canonical: &str,
) -> Result<()> {
    conn.prepare_cached(FORGET_REFUSED)?
        .execute(params![table, key, canonical])?;
    Ok(())
}

/// Forgets the refusals of `table` from before the snapshot that ends now.
pub(crate) fn forget_superseded(conn: &Connection, table: &str) -> Result<()> {
    conn.prepare_cached(FORGET_SUPERSEDED)?.execute([table])?;
    Ok(())
}

/// Every refusal on record, oldest message first.
pub(crate) fn refused(conn: &Connection) -> Result<Vec<envelope::Refused>> {
    let mut stmt = conn.prepare_cached(REFUSED)?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?, r.get(3)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (table, key, number, reason) = row?;
        out.push(envelope::Refused {
            table,
            key,
            number: from_sql(number)?,
            reason,
        });
    }
    Ok(out)
}

/// The canonical keys of the refused rows of `table`.
pub(crate) fn refused_keys(
    conn: &Connection,
    table: &str,
) -> Result<std::collections::HashSet<String>> {
    let mut stmt = conn.prepare_cached(REFUSED_KEYS)?;
    let keys = stmt
        .query_map([table], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(keys)
}

/// The tables that were empty when the snapshot in progress began.
pub(crate) fn empty_at_snapshot(conn: &Connection) -> Result<std::collections::HashSet<String>> {
    let mut stmt = conn.prepare_cached(EMPTY)?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Whether any row is on record as refused.
pub(crate) fn any_refused(conn: &Connection) -> Result<bool> {
    Ok(conn
        .prepare_cached(ANY_REFUSED)?
        .query_row([], |r| r.get(0))?)
}

/// A refused row on record: its table, its key as it came, and the key's
/// canonical text when it could be read.
pub(crate) type RefusedRow = (String, Vec<u8>, Option<String>);

/// Every refused row on record.
pub(crate) fn refused_rows(conn: &Connection) -> Result<Vec<RefusedRow>> {
    let mut stmt = conn.prepare_cached(REFUSED_ROWS)?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Where a replica stands, for its host: read from its file alone, so any
/// connection to the file may ask (see [`super::status`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    /// It holds a whole, consistent set: a snapshot ended, and none is
    /// under way. A replica that never finished its first snapshot is not
    /// ready.
    pub ready: bool,
    /// The last message it applied.
    pub applied: Option<u64>,
    /// The epoch its chain ends at: that of the last message it applied.
    pub epoch: Option<magic_sync_core::EpochId>,
    /// The nonce of the last message it applied: with its number and
    /// epoch, what the next message must name as the one it follows.
    pub nonce: Option<Vec<u8>>,
    /// The message that began the snapshot under way, if one is.
    pub snapshot_began: Option<u64>,
    /// The newest message it could not follow, if it is in a gap: it
    /// applies nothing more until the server begins a snapshot.
    pub gap: Option<u64>,
    /// Rows it could not take, on record until the server sends them again
    /// (see [`super::Replica::refused`] for which and why).
    pub refused: u64,
    /// Messages and answers refused as not its server's (unsigned, or
    /// signed by a key it does not trust): none applied anything. Written
    /// to the file at most every ten seconds: read on a connection of the
    /// host's own, it may be that far behind.
    pub forged: u64,
    /// Why the last of those was refused.
    pub last_forgery: Option<String>,
    /// Refusals dropped from the record, oldest first, to keep it within
    /// [`MAX_REFUSED`].
    pub refused_dropped: u64,
    /// The fingerprint of the server's declarations it holds whole (a
    /// snapshot of them ended, or a deployment of them was done), as the
    /// server last said; `None` while a snapshot is under way or before the
    /// server said (see [`super::Replica::configuration`]).
    pub configuration: Option<Vec<u8>>,
    /// Rows the host wrote that the server has not filed yet: not sent,
    /// sent and not answered, or written again since they were sent. One
    /// per row however often written; per table, see
    /// [`super::Replica::progress`].
    pub unfiled: u64,
    /// Why the replica's loop ([`crate::run::replica_with`]) last ended on
    /// what only its host can end ([`crate::Handling::Stop`]: a key not
    /// pinned, its database failing, a transport that refuses it): the
    /// error it returned. `None` while the loop runs or after it ended
    /// cleanly, and always when read on a connection of the host's own
    /// (the [`Replica`](super::Replica) that ran the loop knows it).
    pub stopped: Option<String>,
}

impl Status {
    /// The status as one JSON object, as a replica outside Rust reads it
    /// (`magic-sync-replica --status --json`, the C ABI): the fields by
    /// their names, the epoch and configuration in hex, `null` for what is
    /// not known. The nonce is left out: it is the chain's, not the host's.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "ready": self.ready,
            "applied": self.applied,
            "epoch": self.epoch.as_ref().map(|e| hex::encode(e.as_bytes())),
            "snapshot_began": self.snapshot_began,
            "gap": self.gap,
            "refused": self.refused,
            "refused_dropped": self.refused_dropped,
            "forged": self.forged,
            "last_forgery": self.last_forgery,
            "configuration": self.configuration.as_ref().map(hex::encode),
            "unfiled": self.unfiled,
            "stopped": self.stopped,
        })
    }
}

/// Where the replica whose file `conn` opens stands.
pub(crate) fn status(conn: &Connection) -> Result<Status> {
    let chain = load_chain(conn)?;
    let snapshot_began = snapshot_began(conn)?;
    let refused: i64 = conn
        .prepare_cached("SELECT count(*) FROM _magic_sync_refused WHERE superseded = 0")?
        .query_row([], |r| r.get(0))?;
    let applied = chain.applied.as_ref().map(|a| a.number.wire());
    let (epoch, nonce) = chain.applied.map(|a| (a.epoch, a.nonce)).unzip();
    let trust = crate::trust::load(conn)?;
    let dropped: i64 = conn
        .prepare_cached("SELECT coalesce((SELECT n FROM _magic_sync_refused_dropped), 0)")?
        .query_row([], |r| r.get(0))?;
    Ok(Status {
        ready: applied.is_some() && snapshot_began.is_none(),
        applied,
        snapshot_began,
        gap: chain.gap.as_ref().map(|g| g.number.wire()),
        refused: u64::try_from(refused).unwrap_or(0),
        forged: trust.forged,
        last_forgery: trust.last_forgery,
        refused_dropped: u64::try_from(dropped).unwrap_or(0),
        configuration: configuration(conn)?,
        epoch,
        nonce,
        unfiled: crate::up::unfiled(conn)?,
        stopped: None,
    })
}
