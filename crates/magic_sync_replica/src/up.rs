//! What the replica writes, on its way up: noted by triggers in the writing
//! transaction, gathered as the rows are now into an `Up`, and let go of
//! when the server says it filed the send that carried them.
//!
//! - **Noting.** Every row of an up table the host inserts, updates or
//!   deletes, and every change of a column the replica owns in a two-way
//!   table, bumps one note per row (`_magic_sync_up`: table, key, writes) in
//!   the host's own transaction. No write path can forget one, and a row
//!   written a thousand times is one note. The replica's own applying never
//!   notes anything: messages from the server do not write up tables, and
//!   leave owned columns as they are.
//! - **Gathering** ([`due`], [`make`]). The notes not yet sent, sent and written
//!   since, or sent and unanswered for longer than the caller's patience,
//!   are read with their rows as they are now: a row written twice goes once,
//!   as its last version. A row gone by then goes as its key when its table
//!   is keyed by the replica that wrote it (its origin column is part of the
//!   key): the key space, and the deletion, are the replica's. Gone from any
//!   other table (history a replica pruned, say), it is not the server's to
//!   delete: it goes nowhere, and its note is let go of. Each upload draws
//!   a random id, stamped on its notes with their write counts once the
//!   uplink took it ([`stamp`]); an answer that comes before that is
//!   remembered by the replica, and lets go of them when the stamp is
//!   written.
//! - **Filed** ([`filed`]). The server's answer names a send: the notes that
//!   send carried, and not written since, are let go of. A note sent again
//!   since waits for the later send's answer; a row written since goes up
//!   again; an id the replica never stamped (another replica's answer, or
//!   one to this replica before it was restored) lets go of nothing.
//!
//! Every upload carries the replica's backlog as it stands when the upload
//! is made, so the server knows what the replica has that it has not
//! filed; the runner says it again, alone, when an answer changed it.
//!
//! Keys are noted as SQLite's `json_array` of the key columns. A key column
//! holding bytes cannot be, and is refused when the replica opens.

use crate::envelope::{Backlog, Receipt, RowData, TableBacklog, Up, UpRows};
use crate::error::{Error, Mismatch, Result};
use crate::lite;
use crate::shape::Shapes;
use crate::shape::Table;
use crate::sql::{ident, literal};
use crate::value::{canonical_key, Kind};
use magic_sync_core::row::Mirror;
use magic_sync_core::EpochId;
use rand::RngCore;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const CREATE: &str = "
CREATE TABLE IF NOT EXISTS _magic_sync_up (
    table_name  TEXT NOT NULL,
    key         TEXT NOT NULL,
    writes      INTEGER NOT NULL,
    send_id     BLOB,
    sent_writes INTEGER,
    sent_at     INTEGER,
    -- On the write clock (`_magic_sync_up_clock`): the earliest write the
    -- server has not filed, the latest write, and the latest write the
    -- stamped send carried (when known).
    first_clock INTEGER NOT NULL,
    last_clock  INTEGER NOT NULL,
    sent_clock  INTEGER,
    PRIMARY KEY (table_name, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS _magic_sync_up_first ON _magic_sync_up (first_clock);
-- Looking for what is due reads only what is: notes not sent or written
-- since, and sent ones by when, not every note awaiting its answer.
CREATE INDEX IF NOT EXISTS _magic_sync_up_unsent ON _magic_sync_up (table_name, key)
    WHERE send_id IS NULL OR writes > sent_writes;
CREATE INDEX IF NOT EXISTS _magic_sync_up_sent_at ON _magic_sync_up (sent_at);
-- Counts every noted write: a mark of what the host has written so far.
CREATE TABLE IF NOT EXISTS _magic_sync_up_clock (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
) STRICT;
INSERT OR IGNORE INTO _magic_sync_up_clock (id, last) VALUES (1, 0);
-- Sends the server filed, until it says it did everything they caused
-- (a `Reached` message): the earliest write on the clock each carried.
CREATE TABLE IF NOT EXISTS _magic_sync_up_reaching (
    send_id BLOB PRIMARY KEY,
    clock   INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS _magic_sync_up_reaching_clock ON _magic_sync_up_reaching (clock);
-- Sends said reached before their answer came, newest kept.
CREATE TABLE IF NOT EXISTS _magic_sync_up_reached (
    send_id BLOB PRIMARY KEY,
    at      INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS _magic_sync_up_send ON _magic_sync_up (send_id)
    WHERE send_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS _magic_sync_up_sequence (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
) STRICT;
";
/// The next upload's sequence number, counted in the transaction that
/// makes it: one more than the last, but never behind the clock (`?1`,
/// microseconds since 1970). A replica restored from an older copy counts
/// on from where its copy left off; were it to count from there alone, its
/// next uploads would carry numbers the server already took edits under,
/// and be filed as older than those: acknowledged writes dropped. With the
/// clock, they are newer than anything it sent before the restore, unless
/// the clock was set back by more than the copy's age.
const NEXT_SEQUENCE: &str = "
INSERT INTO _magic_sync_up_sequence (id, last) VALUES (1, max(1, ?1))
ON CONFLICT (id) DO UPDATE SET last = max(last + 1, ?1)
RETURNING last";

/// Notes to send: never sent, written since they were, or sent at or before
/// `?1` (milliseconds since 1970) and not answered.
/// Through the two indexes, so a replica with many notes awaiting their
/// answers reads only those due.
const DUE: &str = "
SELECT * FROM (
    SELECT table_name, key, writes FROM _magic_sync_up INDEXED BY _magic_sync_up_unsent
    WHERE send_id IS NULL OR writes > sent_writes
    UNION ALL
    SELECT table_name, key, writes FROM _magic_sync_up INDEXED BY _magic_sync_up_sent_at
    WHERE sent_at <= ?1 AND NOT (send_id IS NULL OR writes > sent_writes))
ORDER BY table_name, key";
/// A row written since the send read it carried writes up to a clock not
/// known: it is taken to carry none of those not filed yet.
/// The uploads handed over, by send id, with their sequence: an answer
/// naming one says the server filed that sequence. One unanswered for an
/// hour of the sequence's clock (microseconds) is let go of: its rows were
/// sent again under another id long since.
const SENDS: &str = "
CREATE TABLE IF NOT EXISTS _magic_sync_up_sends (
    send_id  BLOB PRIMARY KEY,
    sequence INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS _magic_sync_up_sends_sequence ON _magic_sync_up_sends (sequence);
-- The newest sequence the server of this epoch answered as filed.
CREATE TABLE IF NOT EXISTS _magic_sync_up_answered (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    sequence INTEGER NOT NULL
) STRICT;
INSERT OR IGNORE INTO _magic_sync_up_answered (id, sequence) VALUES (1, 0);
-- The server's receipt for the newest upload it answered in this epoch,
-- as its answer carried it: given back with every acknowledgement.
CREATE TABLE IF NOT EXISTS _magic_sync_up_receipt (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    epoch    BLOB NOT NULL,
    sequence INTEGER NOT NULL,
    seal     BLOB NOT NULL
) STRICT;";
const SENT: &str =
    "INSERT OR REPLACE INTO _magic_sync_up_sends (send_id, sequence) VALUES (?1, ?2)";
const KEEP_SENDS: &str = "DELETE FROM _magic_sync_up_sends WHERE sequence < ?1 - 3600000000";
const ANSWERED: &str = "
UPDATE _magic_sync_up_answered
SET sequence = max(sequence, (SELECT sequence FROM _magic_sync_up_sends WHERE send_id = ?1))
WHERE id = 1 AND EXISTS (SELECT 1 FROM _magic_sync_up_sends WHERE send_id = ?1)";
const FORGET_SEND: &str = "DELETE FROM _magic_sync_up_sends WHERE send_id = ?1";

/// The newest sequence the server of this epoch answered as filed (0:
/// none), which the replica's acknowledgements carry (`Ack::answered`).
pub(crate) fn answered(conn: &Connection) -> Result<u64> {
    let sequence: i64 = conn
        .prepare_cached("SELECT sequence FROM _magic_sync_up_answered WHERE id = 1")?
        .query_row([], |r| r.get(0))?;
    Ok(u64::try_from(sequence).unwrap_or(0))
}

/// A server of a new epoch answered nothing yet.
pub(crate) fn new_epoch(conn: &Connection) -> Result<()> {
    conn.prepare_cached("UPDATE _magic_sync_up_answered SET sequence = 0 WHERE id = 1")?
        .execute([])?;
    conn.prepare_cached("DELETE FROM _magic_sync_up_receipt")?
        .execute([])?;
    Ok(())
}

/// The server's receipt for the newest upload it answered in this epoch,
/// which the replica's acknowledgements carry (`Ack::receipt`).
pub(crate) fn receipt(conn: &Connection) -> Result<Option<Receipt>> {
    let kept = conn
        .prepare_cached("SELECT epoch, sequence, seal FROM _magic_sync_up_receipt WHERE id = 1")?
        .query_row([], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Vec<u8>>(2)?,
            ))
        })
        .optional()?;
    Ok(kept.map(|(epoch, sequence, seal)| Receipt {
        epoch,
        sequence: sequence.unsigned_abs(),
        seal,
    }))
}

/// Keeps `receipt`, from an answer the server signed, if it is newer than
/// the one kept: of a later upload in the same epoch, or of an epoch that
/// does not precede the kept one's.
pub(crate) fn keep_receipt(conn: &Connection, receipt: &Receipt) -> Result<()> {
    // The server records sequences as `int8`: one past it is not its.
    let Ok(sequence) = i64::try_from(receipt.sequence) else {
        return Ok(());
    };
    let newer = match self::receipt(conn)? {
        None => true,
        Some(kept) if kept.epoch == receipt.epoch => receipt.sequence > kept.sequence,
        Some(kept) => !EpochId::from(receipt.epoch.as_slice()).precedes(&kept.epoch.into()),
    };
    if newer {
        conn.prepare_cached(
            "INSERT INTO _magic_sync_up_receipt (id, epoch, sequence, seal) VALUES (1, ?1, ?2, ?3)
             ON CONFLICT (id) DO UPDATE SET
                 epoch = excluded.epoch, sequence = excluded.sequence, seal = excluded.seal",
        )?
        .execute(params![receipt.epoch, sequence, receipt.seal])?;
    }
    Ok(())
}

/// Rows the host wrote that the server has not filed yet (not sent, sent
/// and unanswered, or written since they were sent): one per row, however
/// often written.
pub(crate) fn unfiled(conn: &Connection) -> Result<u64> {
    let n: i64 = conn
        .prepare_cached("SELECT count(*) FROM _magic_sync_up")?
        .query_row([], |r| r.get(0))?;
    Ok(n.unsigned_abs())
}

const STAMP: &str = "
UPDATE _magic_sync_up SET send_id = ?3, sent_writes = ?4, sent_at = ?5,
    sent_clock = CASE WHEN writes = ?4 THEN last_clock ELSE first_clock - 1 END
WHERE table_name = ?1 AND key = ?2";
const FORGET: &str =
    "DELETE FROM _magic_sync_up WHERE table_name = ?1 AND key = ?2 AND writes = ?3";
/// A filed send waits to be reached from the earliest write it carried.
const REACHING: &str = "
INSERT INTO _magic_sync_up_reaching (send_id, clock)
SELECT ?1, min(first_clock) FROM _magic_sync_up WHERE send_id = ?1 HAVING count(*) > 0
ON CONFLICT (send_id) DO NOTHING";
const FILED: &str = "DELETE FROM _magic_sync_up WHERE send_id = ?1 AND writes = sent_writes";
/// Written since it went: what it carried is filed, the rest is not.
const FILED_SINCE: &str = "
UPDATE _magic_sync_up SET first_clock = max(first_clock, sent_clock + 1)
WHERE send_id = ?1 AND writes > sent_writes AND sent_clock IS NOT NULL";
/// Sends said reached before their answer came, kept at most.
const REACHED_EARLY: i64 = 256;
const BACKLOG: &str = "
SELECT table_name,
       sum(send_id IS NULL OR writes > sent_writes),
       sum(send_id IS NOT NULL AND writes = sent_writes)
FROM _magic_sync_up GROUP BY table_name ORDER BY table_name";

/// Whether the replica notes the host's writes to `table`.
fn noted(table: &Table) -> bool {
    match table.mirror {
        Mirror::Up => true,
        Mirror::Both => !table.owned.is_empty(),
        Mirror::Down => false,
    }
}

/// Refuses tables whose writes cannot be noted: a key column of bytes.
pub(crate) fn check(shapes: &Shapes) -> Result<()> {
    let mut problems = Vec::new();
    for table in shapes.tables().filter(|t| noted(t)) {
        for k in &table.key {
            if table.column(k).is_some_and(|c| c.kind == Kind::Bytes) {
                problems.push(Mismatch {
                    table: table.name.to_string(),
                    column: Some(k.to_string()),
                    problem: "a key column of bytes: a replica notes the keys of the rows it writes as JSON, which holds no bytes".into(),
                });
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Declarations(problems))
    }
}

/// The notes' table and every table's triggers, made if missing.
pub(crate) fn create(conn: &Connection, shapes: &Shapes) -> Result<()> {
    conn.execute_batch(CREATE)?;
    conn.execute_batch(SENDS)?;
    for table in shapes.tables().filter(|t| noted(t)) {
        conn.execute_batch(&triggers(table))?;
    }
    Ok(())
}

/// Notes again everything the replica wrote that it still has: every row
/// of its up tables, and every row of a two-way table with an owned column
/// set (not retired), as if the host had just written each. For a replica
/// just provisioned, whose server may be a copy restored from before some
/// of them were filed: filing is idempotent, so sending what it has again
/// costs time and loses nothing. Returns how many rows were noted.
pub(crate) fn note_everything(conn: &Connection, shapes: &Shapes) -> Result<usize> {
    let mut noted_rows = 0;
    for table in shapes.tables().filter(|t| noted(t)) {
        let key: Vec<String> = table
            .key
            .iter()
            .map(|k| format!("t.{}", ident(k)))
            .collect();
        let mut only = Vec::new();
        if table.mirror == Mirror::Both {
            let owned: Vec<String> = table
                .owned
                .iter()
                .map(|c| format!("t.{} IS NOT NULL", ident(c)))
                .collect();
            only.push(format!("({})", owned.join(" OR ")));
        }
        if let Some(retired) = table.retired.as_deref() {
            only.push(format!("t.{} IS NULL", ident(retired)));
        }
        let only: String = only.iter().map(|w| format!(" AND {w}")).collect();
        conn.execute(
            "UPDATE _magic_sync_up_clock SET last = last + 1 WHERE id = 1",
            [],
        )?;
        noted_rows += conn.execute(
            &format!(
                "INSERT INTO _magic_sync_up (table_name, key, writes, first_clock, last_clock)
                 SELECT {name}, json_array({key}), 1, c.last, c.last
                 FROM {on} t, _magic_sync_up_clock c WHERE c.id = 1{only}
                 ON CONFLICT (table_name, key) DO UPDATE
                 SET writes = writes + 1, last_clock = excluded.last_clock",
                name = literal(&table.name),
                key = key.join(", "),
                on = ident(&table.name),
            ),
            [],
        )?;
    }
    Ok(noted_rows)
}

/// The triggers that note the host's writes to `table`.
fn triggers(table: &Table) -> String {
    let name = |what: &str| ident(&format!("_magic_sync_up_{}_{what}", table.name));
    let key = |row: &str| {
        let columns: Vec<String> = table
            .key
            .iter()
            .map(|k| format!("{row}.{}", ident(k)))
            .collect();
        format!("json_array({})", columns.join(", "))
    };
    let note = |row: &str| {
        format!(
            "UPDATE _magic_sync_up_clock SET last = last + 1 WHERE id = 1;
             INSERT INTO _magic_sync_up (table_name, key, writes, first_clock, last_clock)
             SELECT {}, {}, 1, last, last FROM _magic_sync_up_clock WHERE id = 1
             ON CONFLICT (table_name, key) DO UPDATE
             SET writes = writes + 1, last_clock = excluded.last_clock;",
            literal(&table.name),
            key(row)
        )
    };
    let on = ident(&table.name);
    if table.mirror == Mirror::Both {
        // Only the columns the replica owns are its to write.
        let owned: Vec<String> = table.owned.iter().map(|c| ident(c)).collect();
        let changed: Vec<String> = owned
            .iter()
            .map(|c| format!("OLD.{c} IS NOT NEW.{c}"))
            .collect();
        return format!(
            "CREATE TRIGGER IF NOT EXISTS {} AFTER UPDATE OF {} ON {on}
             WHEN {} BEGIN {} END;",
            name("owned"),
            owned.join(", "),
            changed.join(" OR "),
            note("NEW")
        );
    }
    let moved: Vec<String> = table
        .key
        .iter()
        .map(|k| format!("OLD.{k} IS NOT NEW.{k}", k = ident(k)))
        .collect();
    format!(
        "CREATE TRIGGER IF NOT EXISTS {insert} AFTER INSERT ON {on} BEGIN {new} END;
         CREATE TRIGGER IF NOT EXISTS {update} AFTER UPDATE ON {on} BEGIN {new} END;
         CREATE TRIGGER IF NOT EXISTS {rekey} AFTER UPDATE ON {on} WHEN {moved} BEGIN {old} END;
         CREATE TRIGGER IF NOT EXISTS {delete} AFTER DELETE ON {on} BEGIN {old} END;",
        insert = name("insert"),
        update = name("update"),
        rekey = name("rekey"),
        delete = name("delete"),
        new = note("NEW"),
        old = note("OLD"),
        moved = moved.join(" OR "),
    )
}

fn millis(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A noted row as gathered: its canonical key, and its bytes unless gone.
struct Gathered {
    key: Vec<u8>,
    data: Option<Vec<u8>>,
}

/// A note as gathered: its table, its key as noted, and its writes then.
pub(crate) type Note = (String, String, i64);

/// An upload made and not yet handed over: the `Up`, and the notes it
/// carries at the write counts it carries them.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The upload, for the uplink.
    pub up: Up,
    notes: Vec<Note>,
}

impl Pending {
    /// How many rows (or keys gone) it carries.
    pub fn rows(&self) -> usize {
        self.notes.len()
    }

    pub(crate) fn notes(&self) -> &[Note] {
        &self.notes
    }
}

/// The notes due to go up (see the module's comment), oldest table and key
/// first, but those in `skip`. Notes sent longer than `resend_after` ago
/// without an answer are due again.
pub(crate) fn due(
    conn: &Connection,
    resend_after: Duration,
    skip: &HashSet<(String, String)>,
) -> Result<Vec<Note>> {
    let now = SystemTime::now();
    let stale = millis(now.checked_sub(resend_after).unwrap_or(UNIX_EPOCH));
    let due: Vec<Note> = conn
        .prepare_cached(DUE)?
        .query_map([stale], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(due
        .into_iter()
        .filter(|(t, k, _)| !skip.contains(&(t.clone(), k.clone())))
        .collect())
}

/// The lane `table`'s writes go up on: its declared lane, or the first
/// lane ("").
pub(crate) fn lane_of<'e>(shapes: &'e Shapes, table: &str) -> &'e str {
    shapes
        .tables()
        .find(|t| t.name == table)
        .and_then(|t| t.lane.as_deref())
        .unwrap_or("")
}

/// `notes` by the lane their tables go up on, each in order, the first
/// lane first.
pub(crate) fn by_lane(shapes: &Shapes, notes: Vec<Note>) -> BTreeMap<String, Vec<Note>> {
    let mut lanes: BTreeMap<String, Vec<Note>> = BTreeMap::new();
    for note in notes {
        lanes
            .entry(lane_of(shapes, &note.0).to_string())
            .or_default()
            .push(note);
    }
    lanes
}

/// Makes one upload of `notes`, in order, of at most about `max_bytes` of
/// rows (at least one row), reading each row as it is now; `None` when
/// none of them goes (gone from a table that keeps history, or no longer
/// noted: such notes are let go of). An upload travels on one lane: that
/// of the first note's table; notes of other lanes are left for their
/// own. Nothing is stamped: see [`stamp`].
///
/// A row that cannot be read as its table declares it (a value the host
/// wrote in a form its column's kind does not take) is left out and
/// pushed to `unreadable` with why, for the caller to set aside: it holds
/// back no other row.
pub(crate) fn make(
    conn: &mut Connection,
    shapes: &Shapes,
    notes: &[Note],
    max_bytes: usize,
    unreadable: &mut Vec<(String, String, String)>,
) -> Result<Option<Pending>> {
    let tx = super::write_transaction(conn)?;
    let mut send_id = vec![0u8; 16];
    rand::thread_rng().fill_bytes(&mut send_id);
    let mut tables: BTreeMap<String, UpRows> = BTreeMap::new();
    let mut size = 0;
    let mut carried = Vec::new();
    let lane = notes.first().map_or("", |n| lane_of(shapes, &n.0));
    for (table_name, key, writes) in notes {
        if lane_of(shapes, table_name) != lane {
            continue;
        }
        let Some(table) = shapes.tables().find(|t| t.name == *table_name && noted(t)) else {
            // A table no longer declared, or no longer written here.
            tx.prepare_cached(FORGET)?
                .execute(params![table_name, key, writes])?;
            continue;
        };
        let gathered = match read(&tx, shapes, table, key) {
            Ok(gathered) => gathered,
            Err(e @ Error::Unreadable { .. }) => {
                unreadable.push((table_name.clone(), key.clone(), e.to_string()));
                continue;
            }
            Err(e) => return Err(e),
        };
        let Some(gathered) = gathered else {
            // Gone from a table whose rows are not the replica's to delete.
            tx.prepare_cached(FORGET)?
                .execute(params![table_name, key, writes])?;
            continue;
        };
        let bytes = gathered.key.len() + gathered.data.as_ref().map_or(0, Vec::len) + 8;
        if !carried.is_empty()
            && (size + bytes > max_bytes || carried.len() >= magic_sync_core::link::MAX_UPLOAD_ROWS)
        {
            break;
        }
        size += bytes;
        carried.push((table_name.clone(), key.clone(), *writes));
        let rows = tables.entry(table_name.clone()).or_insert_with(|| UpRows {
            table: table_name.clone(),
            ..UpRows::default()
        });
        match gathered.data {
            Some(data) => rows.rows.push(RowData {
                key: gathered.key,
                data,
            }),
            None => rows.gone.push(gathered.key),
        }
    }
    if carried.is_empty() {
        tx.commit()?;
        return Ok(None);
    }
    let backlog = Some(backlog(&tx)?);
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let sequence: i64 = tx
        .prepare_cached(NEXT_SEQUENCE)?
        .query_row([clock], |r| r.get(0))?;
    tx.commit()?;
    Ok(Some(Pending {
        up: Up {
            lane: lane.to_string(),
            send_id,
            tables: tables.into_values().collect(),
            backlog,
            sequence: u64::try_from(sequence).unwrap_or(0),
            // Answer with a receipt, which the replica's acknowledgements
            // give back.
            takes_receipts: true,
            ..Up::default()
        },
        notes: carried,
    }))
}

/// Records that `pending` was handed over: its notes carry its send id and
/// the write counts it carried, so its answer lets go of them.
pub(crate) fn stamp(conn: &mut Connection, pending: &Pending) -> Result<()> {
    let tx = super::write_transaction(conn)?;
    let now = millis(SystemTime::now());
    for (table_name, key, writes) in &pending.notes {
        tx.prepare_cached(STAMP)?.execute(params![
            table_name,
            key,
            pending.up.send_id,
            writes,
            now
        ])?;
    }
    tx.prepare_cached(SENT)?.execute(params![
        pending.up.send_id,
        i64::try_from(pending.up.sequence).unwrap_or(i64::MAX)
    ])?;
    tx.prepare_cached(KEEP_SENDS)?
        .execute([i64::try_from(pending.up.sequence).unwrap_or(i64::MAX)])?;
    tx.commit()?;
    Ok(())
}

/// The row of `table` noted under `key` as it is now; `Some` with no data
/// when it is gone and the replica's to delete, `None` when gone otherwise.
fn read(conn: &Connection, shapes: &Shapes, table: &Table, key: &str) -> Result<Option<Gathered>> {
    let codec = shapes.codec(&table.name).ok_or_else(|| Error::NoCodec {
        table: table.name.to_string(),
    })?;
    let columns: Vec<String> = table.columns.iter().map(|c| ident(&c.name)).collect();
    let matches: Vec<String> = table
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} IS json_extract(?1, '$[{i}]')", ident(k)))
        .collect();
    let sql = format!(
        "SELECT {} FROM {} WHERE {}",
        columns.join(", "),
        ident(&table.name),
        matches.join(" AND ")
    );
    let values = conn
        .prepare_cached(&sql)?
        .query_row([key], |row| Ok(lite::read(row, 0, table)))
        .optional()?
        .transpose()
        .map_err(|e| match e {
            Error::Unreadable { table, problem, .. } => Error::Unreadable {
                table,
                key: Some(key.to_string()),
                problem,
            },
            e => e,
        })?;
    match values {
        Some(values) => {
            let key_values: Vec<_> = table
                .key_positions()
                .into_iter()
                .map(|i| values[i].clone())
                .collect();
            let data = codec.encode(values).map_err(|e| Error::Unreadable {
                table: table.name.to_string(),
                key: Some(key.to_string()),
                problem: e.to_string(),
            })?;
            Ok(Some(Gathered {
                key: canonical_key(&key_values).into_bytes(),
                data: Some(data),
            }))
        }
        None if keyed_by_origin(table) => Ok(Some(Gathered {
            key: gone_key(conn, table, key)?.into_bytes(),
            data: None,
        })),
        None => Ok(None),
    }
}

/// Whether `table`'s key includes the column naming the replica that
/// wrote the row: its rows are the replica's to delete.
fn keyed_by_origin(table: &Table) -> bool {
    table.origin.as_ref().is_some_and(|o| table.key.contains(o))
}

/// The canonical key of a row gone, from the key SQLite noted: each
/// element read back as its column's kind.
fn gone_key(conn: &Connection, table: &Table, key: &str) -> Result<String> {
    let mut values = Vec::with_capacity(table.key.len());
    for (i, k) in table.key.iter().enumerate() {
        let kind = table
            .column(k)
            .map(|c| c.kind)
            .ok_or_else(|| Error::NoCodec {
                table: table.name.to_string(),
            })?;
        let value = conn.query_row(
            &format!("SELECT json_extract(?1, '$[{i}]')"),
            [key],
            |row| Ok(lite::from_sqlite(kind, row.get_ref(0)?)),
        )?;
        values.push(value.map_err(|e| Error::Unreadable {
            table: table.name.to_string(),
            key: Some(key.to_string()),
            problem: e.in_column(k).to_string(),
        })?);
    }
    Ok(canonical_key(&values))
}

/// Whether any note carries the send `send_id`.
pub(crate) fn knows(conn: &Connection, send_id: &[u8]) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM _magic_sync_up WHERE send_id = ?1)")?
        .query_row([send_id], |r| r.get(0))?)
}

/// Lets go of the notes the send `send_id` carried and that were not
/// written since; returns how many. The send then waits to be reached,
/// unless the server said so already.
pub(crate) fn filed(conn: &Connection, send_id: &[u8]) -> Result<usize> {
    conn.prepare_cached(ANSWERED)?.execute([send_id])?;
    conn.prepare_cached(FORGET_SEND)?.execute([send_id])?;
    let reached_early = conn
        .prepare_cached("DELETE FROM _magic_sync_up_reached WHERE send_id = ?1")?
        .execute([send_id])?
        > 0;
    if !reached_early {
        conn.prepare_cached(REACHING)?.execute([send_id])?;
    }
    conn.prepare_cached(FILED_SINCE)?.execute([send_id])?;
    Ok(conn.prepare_cached(FILED)?.execute([send_id])?)
}

/// The server did everything the sends `send_ids` caused (a `Reached`
/// message, applied in the same transaction as this): they no longer wait.
/// One whose answer has not come yet is remembered a while.
pub(crate) fn reached(conn: &Connection, send_ids: &[Vec<u8>]) -> Result<()> {
    for send_id in send_ids {
        let waited = conn
            .prepare_cached("DELETE FROM _magic_sync_up_reaching WHERE send_id = ?1")?
            .execute([send_id])?;
        if waited == 0 {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO _magic_sync_up_reached (send_id, at) VALUES (?1, ?2)",
            )?
            .execute(params![send_id, millis(SystemTime::now())])?;
        }
    }
    conn.prepare_cached(
        "DELETE FROM _magic_sync_up_reached WHERE send_id NOT IN
         (SELECT send_id FROM _magic_sync_up_reached ORDER BY at DESC LIMIT ?1)",
    )?
    .execute([REACHED_EARLY])?;
    Ok(())
}

/// A point in what the host wrote on a replica: every write noted before
/// it. See [`written`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mark(i64);

impl Mark {
    /// The mark as a number, for a host that keeps it outside Rust (the C
    /// ABI hands it over so): marks only grow as the host writes.
    pub fn get(self) -> i64 {
        self.0
    }

    /// The mark a number from [`get`](Self::get) stands for. A number the
    /// replica never gave is a mark like any other: writes before it.
    pub fn from_number(number: i64) -> Mark {
        Mark(number)
    }
}

/// How far the host's writes up to a [`Mark`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Written {
    /// Some are on this replica only: not sent yet, or sent and not
    /// filed (or set aside, or refused by the transport).
    Here,
    /// The server filed them all ("saved on the server"); what it did
    /// because of them has not all reached this replica yet.
    Filed,
    /// Filed, and this replica applied everything the server did because
    /// of them and everything it committed before it answered them: it
    /// reads its own writes.
    Reached,
}

/// The mark of everything the host has written on the replica so far.
/// Any connection to the replica's file may ask, the host's own included.
pub fn mark(conn: &Connection) -> Result<Mark> {
    Ok(Mark(
        conn.prepare_cached("SELECT last FROM _magic_sync_up_clock WHERE id = 1")?
            .query_row([], |r| r.get(0))?,
    ))
}

/// Waits up to `timeout` for the writes up to `mark` to go at least as far
/// as `until` ([`Written::Filed`]: "saved on the server";
/// [`Written::Reached`]: "everyone sees it", this replica included), and
/// returns how far they went: `until` or beyond, or less when the time ran
/// out.
///
/// A replica applying messages in this process wakes its waiters when an
/// answer or a message may have moved them; one in another process is
/// asked again every 100 ms.
pub fn wait_written(
    conn: &Connection,
    mark: Mark,
    until: Written,
    timeout: Duration,
) -> Result<Written> {
    let deadline = Instant::now() + timeout;
    let bell = conn.path().filter(|p| !p.is_empty()).map(bell);
    loop {
        let rung = bell.as_ref().map(|b| *b.rung.lock().expect("not poisoned"));
        let now = written(conn, mark)?;
        let left = deadline.saturating_duration_since(Instant::now());
        if now >= until || left.is_zero() {
            return Ok(now);
        }
        let wait = left.min(Duration::from_millis(100));
        match (&bell, rung) {
            (Some(bell), Some(seen)) => {
                let guard = bell.rung.lock().expect("not poisoned");
                let _ = bell
                    .ring
                    .wait_timeout_while(guard, wait, |rung| *rung == seen)
                    .expect("not poisoned");
            }
            _ => std::thread::sleep(wait),
        }
    }
}

/// What wakes the hosts waiting on one replica file in this process.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    rung: std::sync::Mutex<u64>,
    ring: std::sync::Condvar,
}

impl Bell {
    /// Wakes every waiter: what they wait for may have moved.
    pub(crate) fn ring(&self) {
        *self.rung.lock().expect("not poisoned") += 1;
        self.ring.notify_all();
    }
}

/// The bell of the replica file at `path`, shared in this process.
pub(crate) fn bell(path: &str) -> std::sync::Arc<Bell> {
    static BELLS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Bell>>>,
    > = std::sync::OnceLock::new();
    BELLS
        .get_or_init(Default::default)
        .lock()
        .expect("not poisoned")
        .entry(path.to_string())
        .or_default()
        .clone()
}

/// How far the writes up to `mark` went (see [`Written`]). A row the
/// server refused counts as filed: it is kept in the server's inbox.
pub fn written(conn: &Connection, mark: Mark) -> Result<Written> {
    // Cached: a host may ask every few milliseconds.
    let (here, reaching): (bool, bool) = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM _magic_sync_up WHERE first_clock <= ?1),
                    EXISTS (SELECT 1 FROM _magic_sync_up_reaching WHERE clock <= ?1)",
        )?
        .query_row([mark.0], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(match (here, reaching) {
        (true, _) => Written::Here,
        (false, true) => Written::Filed,
        (false, false) => Written::Reached,
    })
}

/// Per table, rows written and not sent, and rows sent and not filed.
pub fn backlog(conn: &Connection) -> Result<Backlog> {
    let tables = conn
        .prepare_cached(BACKLOG)?
        .query_map([], |r| {
            Ok(TableBacklog {
                table: r.get(0)?,
                unsent: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                unfiled: u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Backlog { tables })
}
