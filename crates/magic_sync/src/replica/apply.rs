//! The body of one message, applied inside the transaction the replica opened
//! for it: rows overwritten, rows let go of, a snapshot begun or ended, and
//! every row it could not take recorded as refused.

use super::key::{self, KeyProblem};
use super::state::{self, Refusal};
use super::tables::{TableSql, Tables};
use crate::codec::CodecError;
use crate::engine::Engine;
use crate::envelope::{to_replica::Body, RowData, TableRows, ToReplica};
use crate::error::Result;
use crate::sql::ident;
use crate::value::Value;
use crate::wire;
use rusqlite::types::Value as Lite;
use rusqlite::{params_from_iter, Connection, ErrorCode};

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

/// A row decoded and ready to write.
struct Ready<'m> {
    row: &'m RowData,
    canonical: String,
    values: Vec<Lite>,
}

/// One message being applied.
pub(crate) struct Pass<'a> {
    conn: &'a Connection,
    tables: &'a Tables,
    engine: &'a Engine,
    number: u64,
    /// Whether a snapshot is in progress, so the keys of its rows are noted.
    naming: bool,
    /// Tables empty when the snapshot in progress began: not named.
    empty: std::collections::HashSet<String>,
    /// Whether any refusal is on record, so taking a row must forget one.
    refusals: bool,
    refused: usize,
}

impl<'a> Pass<'a> {
    /// Applies the body of `message`; returns how many rows were refused.
    pub fn run(
        conn: &'a Connection,
        tables: &'a Tables,
        engine: &'a Engine,
        message: &ToReplica,
    ) -> Result<usize> {
        if message.begins_snapshot {
            let names: Vec<&str> = tables.iter().map(|t| t.table.name).collect();
            state::begin_snapshot(conn, message.number, &names)?;
        }
        let mut pass = Pass {
            conn,
            tables,
            engine,
            number: message.number,
            naming: state::snapshot_began(conn)?.is_some(),
            empty: state::empty_at_snapshot(conn)?,
            refusals: state::any_refused(conn)?,
            refused: 0,
        };
        if message.begins_snapshot {
            pass.set_indexes_for_snapshot()?;
        }
        match &message.body {
            Some(Body::Down(down)) => {
                for rows in &down.tables {
                    pass.table_rows(rows)?;
                }
            }
            Some(Body::EndSnapshot(end)) => pass.end_snapshot(&end.tables)?,
            // Refused when the message was decoded.
            None => {}
        }
        Ok(pass.refused)
    }

    fn table_rows(&mut self, rows: &TableRows) -> Result<()> {
        let target = self
            .tables
            .get(&rows.table)
            .zip(self.engine.codec(&rows.table));
        let Some((sql, codec)) = target else {
            // Nothing of a table the replica does not hold can be let go of;
            // its rows cannot be taken.
            for row in &rows.upserts {
                let reason = self.not_held(&rows.table);
                self.refuse(&rows.table, &row.key, None, reason)?;
            }
            return Ok(());
        };
        for key in &rows.deletes {
            self.delete(sql, key)?;
        }
        self.upserts(sql, codec, &rows.upserts)
    }

    fn not_held(&self, table: &str) -> Reason {
        match self.engine.codec(table) {
            Some(_) => Reason::NotDown(table.to_string()),
            None => Reason::UnknownTable(table.to_string()),
        }
    }

    /// Writes the rows of one table. A row that clashes with another on a
    /// unique column waits until the table's other rows are written (the
    /// server sends a unique value moving between rows in one message, in no
    /// particular order), and is tried again as long as a round lets one of
    /// the waiting rows through.
    fn upserts(&mut self, sql: &TableSql, codec: &wire::Codec, rows: &[RowData]) -> Result<()> {
        let mut waiting = Vec::new();
        for row in rows {
            if let Some(ready) = self.prepare(sql, codec, row)? {
                if let Some(clash) = self.write(sql, &ready)? {
                    waiting.push((ready, clash));
                }
            }
        }
        while !waiting.is_empty() {
            let before = waiting.len();
            let mut still = Vec::new();
            for (ready, _) in waiting {
                if let Some(clash) = self.write(sql, &ready)? {
                    still.push((ready, clash));
                }
            }
            if still.len() == before && self.naming && self.let_go_of_stale(sql, &still)? {
                waiting = still;
                continue;
            }
            if still.len() == before {
                for (ready, clash) in still {
                    let canonical = Some(ready.canonical.as_str());
                    self.refuse(
                        sql.table.name,
                        &ready.row.key,
                        canonical,
                        Reason::Refused(clash),
                    )?;
                }
                break;
            }
            waiting = still;
        }
        Ok(())
    }

    /// During a snapshot, lets go of the rows the waiting rows clash with
    /// that the snapshot has not named: what the replica held before the
    /// snapshot, which its end would let go of anyway, cannot hold back the
    /// server's current rows. Returns whether any row went.
    fn let_go_of_stale(
        &mut self,
        sql: &TableSql,
        waiting: &[(Ready<'_>, rusqlite::Error)],
    ) -> Result<bool> {
        let table = sql.table;
        let mut stale: Vec<Vec<Value>> = Vec::new();
        for (ready, clash) in waiting {
            let columns = clash_columns(table, clash);
            if columns.is_empty() {
                continue;
            }
            let mut filter: Vec<String> = columns
                .iter()
                .enumerate()
                .map(|(i, &c)| format!("{} = ?{}", ident(table.columns[c].name), i + 1))
                .collect();
            // A row kept retired for the replica's own records stays: the
            // clash is then refused, and said.
            if let Some(retired) = table.retired {
                filter.push(format!("{} IS NULL", ident(retired)));
            }
            let keys: Vec<String> = table.key.iter().map(|k| ident(k)).collect();
            let query = format!(
                "SELECT {} FROM {} WHERE {}",
                keys.join(", "),
                ident(table.name),
                filter.join(" AND ")
            );
            let params: Vec<&Lite> = columns.iter().map(|&c| &ready.values[c]).collect();
            let mut stmt = self.conn.prepare(&query)?;
            let mut rows = stmt.query(params_from_iter(params))?;
            while let Some(row) = rows.next()? {
                let key = key::read(table, row)?;
                if !self.is_named(table.name, &key::canonical(&key))? {
                    stale.push(key);
                }
            }
        }
        let any = !stale.is_empty();
        for key in stale {
            self.let_go(sql, &key)?;
        }
        Ok(any)
    }

    /// Decodes a row and checks its key; `None` when it was refused.
    fn prepare<'m>(
        &mut self,
        sql: &TableSql,
        codec: &wire::Codec,
        row: &'m RowData,
    ) -> Result<Option<Ready<'m>>> {
        let table = sql.table;
        let wire_key = match key::decode(table, &row.key) {
            Ok(values) => key::canonical(&values),
            Err(problem) => {
                self.refuse(table.name, &row.key, None, Reason::Key(problem))?;
                return Ok(None);
            }
        };
        // The snapshot named this row, whether or not it can be taken.
        self.name(table.name, &wire_key)?;
        let values = match codec.decode(&row.data) {
            Ok(values) => values,
            Err(e) => {
                self.refuse(table.name, &row.key, Some(&wire_key), Reason::Row(e))?;
                return Ok(None);
            }
        };
        let row_key = key::canonical(&key::of_row(table, &values));
        if row_key != wire_key {
            let reason = Reason::KeyMismatch {
                row: row_key,
                wire: wire_key.clone(),
            };
            self.refuse(table.name, &row.key, Some(&wire_key), reason)?;
            return Ok(None);
        }
        Ok(Some(Ready {
            row,
            canonical: wire_key,
            values: key::params(&values),
        }))
    }

    /// Writes a decoded row. Returns the error of a clash on a unique column
    /// (to try again later); refuses it for any other constraint.
    fn write(&mut self, sql: &TableSql, ready: &Ready<'_>) -> Result<Option<rusqlite::Error>> {
        let name = sql.table.name;
        let written = self
            .conn
            .prepare_cached(&sql.upsert)?
            .execute(params_from_iter(&ready.values));
        match written {
            Ok(_) => {
                if self.refusals {
                    state::forget_refused(self.conn, name, &ready.row.key, &ready.canonical)?;
                }
                Ok(None)
            }
            Err(e) if is_unique_clash(&e) => Ok(Some(e)),
            Err(e) if is_constraint(&e) => {
                let canonical = Some(ready.canonical.as_str());
                self.refuse(name, &ready.row.key, canonical, Reason::Refused(e))?;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn delete(&mut self, sql: &TableSql, key: &[u8]) -> Result<()> {
        let name = sql.table.name;
        let values = match key::decode(sql.table, key) {
            Ok(values) => values,
            Err(problem) => return self.refuse(name, key, None, Reason::Key(problem)),
        };
        let canonical = key::canonical(&values);
        self.let_go(sql, &values)?;
        if self.refusals {
            state::forget_refused(self.conn, name, key, &canonical)?;
        }
        if self.naming && !self.empty.contains(name) {
            state::unname_key(self.conn, name, &canonical)?;
        }
        Ok(())
    }

    /// Deletes the row, or retires it while a row of the replica still points
    /// at it (a sale keeps its customer). A table without a retired column
    /// deletes regardless.
    fn let_go(&mut self, sql: &TableSql, key: &[Value]) -> Result<()> {
        let mut params = key::params(key);
        if let (Some(pointed_at), Some(retire)) = (&sql.pointed_at, &sql.retire) {
            let held: bool = self
                .conn
                .prepare_cached(pointed_at)?
                .query_row(params_from_iter(&params), |r| r.get(0))?;
            if held {
                params.push(Lite::Integer(state::to_sql(self.number)?));
                self.conn
                    .prepare_cached(retire)?
                    .execute(params_from_iter(&params))?;
                return Ok(());
            }
        }
        self.conn
            .prepare_cached(&sql.delete)?
            .execute(params_from_iter(&params))?;
        Ok(())
    }

    /// Lets go of every row of `tables` the snapshot did not name, and of the
    /// refusals it superseded; then the snapshot is over. Outside a snapshot
    /// nothing was named, and nothing is let go of.
    fn end_snapshot(&mut self, tables: &[String]) -> Result<()> {
        if !self.naming {
            return Ok(());
        }
        // Letting go of a row asks whether anything points at it: every
        // index is back first.
        for sql in self.tables.iter() {
            for (_, create) in &sql.indexes {
                self.conn.execute_batch(create)?;
            }
        }
        for name in tables {
            if let Some(sql) = self.tables.get(name) {
                if !self.empty.contains(name.as_str()) {
                    for key in self.unnamed(sql)? {
                        self.let_go(sql, &key)?;
                    }
                }
                state::forget_superseded(self.conn, name)?;
            }
        }
        state::end_snapshot(self.conn)
    }

    /// A table empty when a snapshot begins is filled by it in bulk: the
    /// indexes on its foreign keys are dropped until the snapshot ends, and
    /// built then in one go, which is cheaper than keeping them up a row at a
    /// time. (A table holding rows keeps them: its rows may be let go of, and
    /// that asks what points at them.)
    fn set_indexes_for_snapshot(&self) -> Result<()> {
        for sql in self.tables.iter() {
            let empty = self.empty.contains(sql.table.name);
            for (name, create) in &sql.indexes {
                if empty {
                    self.conn
                        .execute_batch(&format!("DROP INDEX IF EXISTS {}", ident(name)))?;
                } else {
                    self.conn.execute_batch(create)?;
                }
            }
        }
        Ok(())
    }

    /// The keys of the rows of a table the snapshot in progress did not name.
    fn unnamed(&self, sql: &TableSql) -> Result<Vec<Vec<Value>>> {
        let mut stmt = self.conn.prepare(&sql.keys)?;
        let mut rows = stmt.query([])?;
        let mut unnamed = Vec::new();
        while let Some(row) = rows.next()? {
            let values = key::read(sql.table, row)?;
            if !self.is_named(sql.table.name, &key::canonical(&values))? {
                unnamed.push(values);
            }
        }
        Ok(unnamed)
    }

    /// Whether the snapshot in progress named the row: every row of a table
    /// empty when it began came from it.
    fn is_named(&self, table: &str, canonical: &str) -> Result<bool> {
        Ok(self.empty.contains(table) || state::is_named(self.conn, table, canonical)?)
    }

    fn name(&self, table: &str, canonical: &str) -> Result<()> {
        if self.naming && !self.empty.contains(table) {
            state::name_key(self.conn, table, canonical)?;
        }
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
        self.refusals = true;
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

fn is_unique_clash(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
    )
}

/// The positions of the columns a unique clash names (SQLite says
/// "UNIQUE constraint failed: products.barcode, products.shelf").
fn clash_columns(table: &crate::row::Table, clash: &rusqlite::Error) -> Vec<usize> {
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
