//! The body of one message, applied inside the transaction the replica opened
//! for it: rows overwritten, rows let go of, a snapshot begun or ended, and
//! every row it could not take recorded as refused.
//!
//! Each table's statements are prepared once per message and kept
//! ([`Prepared`]), and a row goes from the message's bytes to SQLite without
//! an intermediate struct ([`row`]). A row is first taken the short way: read
//! by its codec, its key's canonical text written from what was read and
//! found equal to the key it travels under. Anything else (a row that does
//! not decode, a key that is not in its canonical text or does not match) is
//! taken the careful way, which reads the key on its own and says which of
//! the two is wrong.

use super::key::{self, KeyProblem};
use super::row::{self, Param};
use super::snapshot::{self, Snapshot};
use super::state::{self, Refusal};
use super::tables::{TableSql, Tables};
use crate::codec::CodecError;
use crate::envelope::{to_replica::Body, RowData, TableRows, ToReplica};
use crate::error::Result;
use crate::shape::{Codec, Shapes};
use crate::sql::ident;
use crate::value::Value;
use rusqlite::types::Value as Lite;
use rusqlite::{params_from_iter, CachedStatement, Connection, ErrorCode};
use std::collections::{HashMap, HashSet};

/// Why a row was not taken. Its text is the reason the server is told.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Reason {
    #[error("the replica has no table `{0}`")]
    UnknownTable(String),
    #[error("table `{0}` does not travel down: its rows are the replica's own")]
    NotDown(String),
    #[error("{0}")]
    Key(#[source] KeyProblem),
    #[error("the row does not decode: {0}")]
    Row(#[source] CodecError),
    #[error("the row's own key is {row}, but it travels under the key {wire}")]
    KeyMismatch { row: String, wire: String },
    #[error("SQLite refused the row: {0}")]
    Refused(#[source] rusqlite::Error),
}

/// A row that clashed on a unique value, waiting for the table's other rows.
struct Waiting<'m> {
    row: &'m RowData,
    canonical: String,
    values: Vec<Lite>,
    clash: rusqlite::Error,
}

/// What became of writing a row.
enum Written {
    Done,
    /// It clashed with another row on a unique value: try again later.
    Clash(rusqlite::Error),
    /// SQLite refused it for another constraint.
    Refused(rusqlite::Error),
}

/// One message being applied.
pub(crate) struct Pass<'a> {
    conn: &'a Connection,
    tables: &'a Tables,
    shapes: &'a Shapes,
    number: u64,
    snapshot: Option<Snapshot>,
    refusals: Refusals,
    refused: usize,
    /// Each table's statements, in the order of `tables`.
    prepared: Vec<Prepared<'a>>,
}

impl<'a> Pass<'a> {
    /// Applies the body of `message`; returns how many rows were refused.
    pub fn run(
        conn: &'a Connection,
        tables: &'a Tables,
        shapes: &'a Shapes,
        message: &ToReplica,
    ) -> Result<usize> {
        if message.begins_snapshot {
            snapshot::begin(conn, tables, message.number)?;
        }
        let mut pass = Pass {
            conn,
            tables,
            shapes,
            number: message.number,
            snapshot: Snapshot::load(conn)?,
            refusals: Refusals::load(conn)?,
            refused: 0,
            prepared: (0..tables.len()).map(|_| Prepared::default()).collect(),
        };
        match &message.body {
            Some(Body::Down(down)) => {
                for rows in &down.tables {
                    pass.table_rows(rows)?;
                }
            }
            // Outside a snapshot nothing is stale, and nothing goes.
            Some(Body::EndSnapshot(end)) if pass.snapshot.is_some() => {
                snapshot::end(conn, tables, &end.tables, message.number)?;
                state::configured(conn, &end.schema)?;
            }
            Some(Body::EndSnapshot(_)) => {}
            Some(Body::Reached(reached)) => super::up::reached(conn, &reached.send_ids)?,
            Some(Body::Configured(configured)) => state::configured(conn, &configured.schema)?,
            // Taken before the message ran (`Replica::apply`).
            Some(Body::Described(_)) => {}
            // Refused when the message was decoded.
            None => {}
        }
        Ok(pass.refused)
    }

    fn table_rows(&mut self, rows: &TableRows) -> Result<()> {
        let target = self
            .tables
            .position(&rows.table)
            .zip(self.shapes.codec(&rows.table));
        let Some((t, codec)) = target else {
            // Nothing of a table the replica does not hold can be let go of;
            // its rows cannot be taken.
            for row in &rows.upserts {
                let reason = self.not_held(&rows.table);
                self.refuse(&rows.table, &row.key, None, reason)?;
            }
            return Ok(());
        };
        for key in &rows.deletes {
            self.delete(t, key)?;
        }
        self.upserts(t, codec, &rows.upserts)
    }

    fn not_held(&self, table: &str) -> Reason {
        match self.shapes.codec(table) {
            Some(_) => Reason::NotDown(table.to_string()),
            None => Reason::UnknownTable(table.to_string()),
        }
    }

    /// Whether the snapshot in progress fills table `t` from empty.
    fn fills(&self, t: usize) -> bool {
        let name = self.tables.at(t).table.name.as_str();
        self.snapshot.as_ref().is_some_and(|s| s.fills(name))
    }

    /// Whether the keys of table `t` are struck off its stale set as rows come.
    fn strikes(&self, t: usize) -> bool {
        self.snapshot.is_some() && !self.fills(t)
    }

    /// Writes the rows of table `t`. A row that clashes with another on a
    /// unique column waits until the table's other rows are written (the
    /// server sends a unique value moving between rows in one message, in no
    /// particular order), and is tried again as long as a round lets one of
    /// the waiting rows through.
    fn upserts<'m>(&mut self, t: usize, codec: &Codec, rows: &'m [RowData]) -> Result<()> {
        let fills = self.fills(t);
        let strikes = self.strikes(t);
        let mut values: Vec<Param<'m>> = Vec::with_capacity(codec.table().columns.len());
        let mut canonical = Vec::new();
        let mut waiting = Vec::new();
        for row in rows {
            if !self.take(t, codec, row, strikes, &mut values, &mut canonical)? {
                continue;
            }
            let written = if fills {
                self.prepared[t].insert_or_upsert(self.conn, self.tables.at(t), &values)?
            } else {
                self.prepared[t].upsert(self.conn, self.tables.at(t), &values)?
            };
            match written {
                Written::Done => self.forget_refusal(t, &row.key, &canonical)?,
                Written::Clash(clash) => waiting.push(Waiting {
                    row,
                    canonical: String::from_utf8_lossy(&canonical).into_owned(),
                    values: values.iter().map(Param::owned).collect(),
                    clash,
                }),
                Written::Refused(e) => {
                    let canonical = String::from_utf8_lossy(&canonical).into_owned();
                    let name = self.tables.at(t).table.name.as_str();
                    self.refuse(name, &row.key, Some(&canonical), Reason::Refused(e))?;
                }
            }
        }
        self.retry(t, waiting)
    }

    /// Tries the rows that clashed on a unique value again, round after
    /// round, while a round lets one through.
    fn retry(&mut self, t: usize, mut waiting: Vec<Waiting<'_>>) -> Result<()> {
        while !waiting.is_empty() {
            let before = waiting.len();
            let mut still = Vec::new();
            for mut w in waiting {
                match self.prepared[t].upsert(self.conn, self.tables.at(t), &w.values)? {
                    Written::Done => self.forget_refusal(t, &w.row.key, w.canonical.as_bytes())?,
                    Written::Clash(clash) => {
                        w.clash = clash;
                        still.push(w);
                    }
                    Written::Refused(e) => {
                        let name = self.tables.at(t).table.name.as_str();
                        self.refuse(name, &w.row.key, Some(&w.canonical), Reason::Refused(e))?;
                    }
                }
            }
            if still.len() == before
                && self.snapshot.is_some()
                && self.let_go_of_stale(t, &still)?
            {
                waiting = still;
                continue;
            }
            if still.len() == before {
                let name = self.tables.at(t).table.name.as_str();
                for w in still {
                    self.refuse(
                        name,
                        &w.row.key,
                        Some(&w.canonical),
                        Reason::Refused(w.clash),
                    )?;
                }
                break;
            }
            waiting = still;
        }
        Ok(())
    }

    /// During a snapshot, lets go of the rows the waiting rows clash with
    /// that the snapshot has not sent: what the replica held before the
    /// snapshot, which its end would let go of anyway, cannot hold back the
    /// server's current rows. Returns whether any row went.
    fn let_go_of_stale(&mut self, t: usize, waiting: &[Waiting<'_>]) -> Result<bool> {
        let sql = self.tables.at(t);
        let table = &sql.table;
        let mut stale: Vec<Vec<Value>> = Vec::new();
        for w in waiting {
            let columns = clash_columns(table, &w.clash);
            if columns.is_empty() {
                continue;
            }
            let mut filter: Vec<String> = columns
                .iter()
                .enumerate()
                .map(|(i, &c)| format!("{} = ?{}", ident(&table.columns[c].name), i + 1))
                .collect();
            // A row kept retired for the replica's own records stays: the
            // clash is then refused, and said.
            if let Some(retired) = table.retired.as_deref() {
                filter.push(format!("{} IS NULL", ident(retired)));
            }
            let keys: Vec<String> = table.key.iter().map(|k| ident(k)).collect();
            let query = format!(
                "SELECT {} FROM {} WHERE {}",
                keys.join(", "),
                ident(&table.name),
                filter.join(" AND ")
            );
            let params: Vec<&Lite> = columns.iter().map(|&c| &w.values[c]).collect();
            let mut stmt = self.conn.prepare(&query)?;
            let mut rows = stmt.query(params_from_iter(params))?;
            while let Some(row) = rows.next()? {
                let key = key::read(table, row)?;
                let is_stale = self.prepared[t]
                    .statement(Slot::IsStale, self.conn, &sql.stale.contains)?
                    .query_row(params_from_iter(key::params(&key)), |r| r.get::<_, bool>(0))?;
                if is_stale {
                    stale.push(key);
                }
            }
        }
        let any = !stale.is_empty();
        for key in stale {
            self.let_go(t, &key::params(&key))?;
        }
        Ok(any)
    }

    /// Reads a row into `values` and checks its key; strikes the key off the
    /// stale set when `strikes`. Leaves the key's canonical text in
    /// `canonical`. `false` when the row was refused.
    fn take<'m>(
        &mut self,
        t: usize,
        codec: &Codec,
        row: &'m RowData,
        strikes: bool,
        values: &mut Vec<Param<'m>>,
        canonical: &mut Vec<u8>,
    ) -> Result<bool> {
        let sql = self.tables.at(t);
        let read = row::read(codec, &row.data, values);
        let short = read.is_ok()
            && row::canonical_key(&sql.table, &sql.key_positions, values, canonical)
            && canonical.as_slice() == row.key.as_slice();
        if !short {
            return self.take_carefully(t, codec, row, strikes, read, values, canonical);
        }
        if strikes {
            let key = sql.key_positions.iter().map(|&k| &values[k]);
            self.prepared[t]
                .statement(Slot::Strike, self.conn, &sql.stale.strike)?
                .execute(params_from_iter(key))?;
        }
        Ok(true)
    }

    /// [`take`](Self::take) for a row whose key did not come out as its
    /// canonical text: the key is read on its own, struck off, and compared.
    #[allow(clippy::too_many_arguments)]
    fn take_carefully(
        &mut self,
        t: usize,
        codec: &Codec,
        row: &RowData,
        strikes: bool,
        read: std::result::Result<(), CodecError>,
        values: &[Param<'_>],
        canonical: &mut Vec<u8>,
    ) -> Result<bool> {
        let sql = self.tables.at(t);
        let table = &sql.table;
        let wire = match key::decode(table, &row.key) {
            Ok(wire) => wire,
            Err(problem) => {
                self.refuse(&table.name, &row.key, None, Reason::Key(problem))?;
                return Ok(false);
            }
        };
        let wire_key = key::canonical(&wire);
        // The snapshot sent this row, whether or not it can be taken.
        if strikes {
            self.prepared[t]
                .statement(Slot::Strike, self.conn, &sql.stale.strike)?
                .execute(params_from_iter(key::params(&wire)))?;
        }
        if let Err(e) = read {
            self.refuse(&table.name, &row.key, Some(&wire_key), Reason::Row(e))?;
            return Ok(false);
        }
        let row_key = if row::canonical_key(table, &sql.key_positions, values, canonical) {
            String::from_utf8_lossy(canonical).into_owned()
        } else {
            match codec.decode(&row.data) {
                Ok(decoded) => key::canonical(&key::of_row(table, &decoded)),
                Err(e) => {
                    self.refuse(&table.name, &row.key, Some(&wire_key), Reason::Row(e))?;
                    return Ok(false);
                }
            }
        };
        if row_key != wire_key {
            let reason = Reason::KeyMismatch {
                row: row_key,
                wire: wire_key.clone(),
            };
            self.refuse(&table.name, &row.key, Some(&wire_key), reason)?;
            return Ok(false);
        }
        canonical.clear();
        canonical.extend_from_slice(wire_key.as_bytes());
        Ok(true)
    }

    /// A row of table `t` was written or let go of: any refusal of it is over.
    fn forget_refusal(&mut self, t: usize, key: &[u8], canonical: &[u8]) -> Result<()> {
        let name = self.tables.at(t).table.name.as_str();
        if self.refusals.forget(name, key, canonical) {
            let canonical = String::from_utf8_lossy(canonical);
            state::forget_refused(self.conn, name, key, &canonical)?;
        }
        Ok(())
    }

    fn delete(&mut self, t: usize, key: &[u8]) -> Result<()> {
        let sql = self.tables.at(t);
        let values = match key::decode(&sql.table, key) {
            Ok(values) => values,
            Err(problem) => return self.refuse(&sql.table.name, key, None, Reason::Key(problem)),
        };
        let params = key::params(&values);
        self.let_go(t, &params)?;
        self.forget_refusal(t, key, key::canonical(&values).as_bytes())?;
        // Let go of since the snapshot sent it: its end lets go of it again.
        if self.strikes(t) {
            self.prepared[t]
                .statement(Slot::PutBack, self.conn, &sql.stale.put_back)?
                .execute(params_from_iter(&params))?;
        }
        Ok(())
    }

    /// Deletes the row, or retires it while a row of the replica still points
    /// at it (a sale keeps its customer). A table without a retired column
    /// deletes regardless.
    fn let_go(&mut self, t: usize, key: &[Lite]) -> Result<()> {
        let sql = self.tables.at(t);
        let prepared = &mut self.prepared[t];
        if let (Some(pointed_at), Some(retire)) = (&sql.pointed_at, &sql.retire) {
            let held: bool = prepared
                .statement(Slot::PointedAt, self.conn, pointed_at)?
                .query_row(params_from_iter(key), |r| r.get(0))?;
            if held {
                let number = Lite::Integer(state::to_sql(self.number)?);
                prepared
                    .statement(Slot::Retire, self.conn, retire)?
                    .execute(params_from_iter(key.iter().chain([&number])))?;
                return Ok(());
            }
        }
        prepared
            .statement(Slot::Delete, self.conn, &sql.delete)?
            .execute(params_from_iter(key))?;
        Ok(())
    }

    fn refuse(
        &mut self,
        table: &str,
        key: &[u8],
        canonical: Option<&str>,
        reason: Reason,
    ) -> Result<()> {
        self.refused += 1;
        self.refusals.add(table, key, canonical);
        state::refuse(
            self.conn,
            &Refusal {
                table,
                key,
                canonical,
                number: self.number,
                reason: reason.to_string(),
            },
        )
    }
}

/// The statements of one table a message has used, taken from the
/// connection's cache on first use (parsing them anew for every message cost
/// a busy replica more than applying it).
#[derive(Default)]
struct Prepared<'c> {
    statements: [Option<CachedStatement<'c>>; SLOTS],
}

/// Which of a table's statements.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Insert,
    Upsert,
    Delete,
    Retire,
    PointedAt,
    Strike,
    PutBack,
    IsStale,
}

const SLOTS: usize = 8;

impl<'c> Prepared<'c> {
    /// The statement in `slot`, prepared from `text` on first use.
    fn statement(
        &mut self,
        slot: Slot,
        conn: &'c Connection,
        text: &str,
    ) -> Result<&mut CachedStatement<'c>> {
        let entry = &mut self.statements[slot as usize];
        if entry.is_none() {
            *entry = Some(conn.prepare_cached(text)?);
        }
        Ok(entry.as_mut().expect("prepared just now"))
    }

    /// Writes a row, overwriting the row of its key if there is one.
    fn upsert<P: rusqlite::ToSql>(
        &mut self,
        conn: &'c Connection,
        sql: &TableSql,
        values: &[P],
    ) -> Result<Written> {
        let written = self
            .statement(Slot::Upsert, conn, &sql.upsert)?
            .execute(params_from_iter(values));
        outcome(written)
    }

    /// Inserts a row into a table being filled from empty; a row of the same
    /// key already there (sent twice) is overwritten instead.
    fn insert_or_upsert(
        &mut self,
        conn: &'c Connection,
        sql: &TableSql,
        values: &[Param<'_>],
    ) -> Result<Written> {
        let inserted = self
            .statement(Slot::Insert, conn, &sql.insert)?
            .execute(params_from_iter(values));
        match inserted {
            Err(e) if is_key_clash(&e) => self.upsert(conn, sql, values),
            other => outcome(other),
        }
    }
}

fn outcome(written: rusqlite::Result<usize>) -> Result<Written> {
    match written {
        Ok(_) => Ok(Written::Done),
        Err(e) if is_unique_clash(&e) => Ok(Written::Clash(e)),
        Err(e) if is_constraint(&e) => Ok(Written::Refused(e)),
        Err(e) => Err(e.into()),
    }
}

/// The rows on record as refused, by table, by key as it came and by
/// canonical key: taking a row asks here, not the database, whether it
/// must forget a refusal.
#[derive(Debug, Default)]
struct Refusals {
    tables: HashMap<String, RefusedKeys>,
}

#[derive(Debug, Default)]
struct RefusedKeys {
    keys: HashSet<Vec<u8>>,
    canonical: HashSet<Vec<u8>>,
}

impl Refusals {
    fn load(conn: &Connection) -> Result<Self> {
        let mut refusals = Refusals::default();
        if state::any_refused(conn)? {
            for (table, key, canonical) in state::refused_rows(conn)? {
                refusals.add(&table, &key, canonical.as_deref());
            }
        }
        Ok(refusals)
    }

    fn add(&mut self, table: &str, key: &[u8], canonical: Option<&str>) {
        let keys = self.tables.entry(table.to_string()).or_default();
        keys.keys.insert(key.to_vec());
        if let Some(c) = canonical {
            keys.canonical.insert(c.as_bytes().to_vec());
        }
    }

    /// Whether a refusal of the row is on record; forgets it here.
    fn forget(&mut self, table: &str, key: &[u8], canonical: &[u8]) -> bool {
        let Some(keys) = self.tables.get_mut(table) else {
            return false;
        };
        let by_key = keys.keys.remove(key);
        let by_canonical = keys.canonical.remove(canonical);
        by_key || by_canonical
    }
}

/// Purges the retired rows nothing points at any more, a round at a time
/// until a round purges none: a retired row a retired child pointed at goes
/// in the round after its child. Returns how many rows went.
pub(crate) fn purge(conn: &Connection, tables: &Tables) -> Result<usize> {
    let mut total = 0;
    loop {
        let mut round = 0;
        for sql in tables.iter() {
            if let Some(purge) = &sql.purge {
                round += conn.prepare_cached(purge)?.execute([])?;
            }
        }
        if round == 0 {
            return Ok(total);
        }
        total += round;
    }
}

fn is_constraint(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation)
}

fn extended_code(e: &rusqlite::Error) -> Option<i32> {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.extended_code),
        _ => None,
    }
}

fn is_unique_clash(e: &rusqlite::Error) -> bool {
    extended_code(e) == Some(rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE)
}

fn is_key_clash(e: &rusqlite::Error) -> bool {
    extended_code(e) == Some(rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
}

/// The positions of the columns a unique clash names (SQLite says
/// "UNIQUE constraint failed: products.barcode, products.shelf").
fn clash_columns(table: &crate::shape::Table, clash: &rusqlite::Error) -> Vec<usize> {
    let text = clash.to_string();
    let Some((_, list)) = text.split_once("UNIQUE constraint failed: ") else {
        return Vec::new();
    };
    list.split(", ")
        .filter_map(|qualified| qualified.rsplit_once('.').map(|(_, c)| c.trim()))
        .map(|c| table.columns.iter().position(|col| col.name == c))
        .collect::<Option<Vec<usize>>>()
        .unwrap_or_default()
}
