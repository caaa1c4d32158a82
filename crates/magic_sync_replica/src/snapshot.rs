//! A snapshot on the replica, from the message that begins it to
//! `EndSnapshot`, which lets go of every row of the tables it names that the
//! snapshot did not send.
//!
//! - When it begins, each table that holds rows has its keys copied into its
//!   stale set (`_magic_sync_stale_<table>`, typed like its key), in one
//!   statement. Every row the snapshot sends strikes its key off, whether or
//!   not the row can be taken (a refused row keeps its previous copy); a row
//!   let go of during the snapshot is put back. What is left at the end is
//!   what the snapshot did not send, and goes in two statements per table:
//!   the rows one of the replica's own records points at are retired, the
//!   others deleted.
//! - A table that holds no row when it begins is filled by plain inserts (it
//!   has nothing to overwrite and nothing to let go of), and its indexes that
//!   can be built again without changing what is taken (made by
//!   `CREATE INDEX`, not unique: the foreign keys' and the host's own) are
//!   dropped, recorded in `_magic_sync_snapshot_indexes`, and built again
//!   when it ends: one bulk build is cheaper than keeping them up a row at a
//!   time. The partial index on the retired column stays: it holds no row
//!   of a table being filled, and the purge after every message reads it.
//! - Everything is written in the transaction of the message it belongs to,
//!   so a replica stopped in the middle of a snapshot carries on where it
//!   was. It builds the indexes set aside when it opens, so the host never
//!   finds them missing after a restart.

use super::key;
use super::state;
use super::tables::Tables;
use crate::error::Result;
use crate::sql::ident;
use rusqlite::{params_from_iter, Connection};
use std::collections::HashSet;

/// The snapshot in progress, as a message being applied sees it.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The tables that held no row when it began.
    empty: HashSet<String>,
}

impl Snapshot {
    /// The snapshot in progress, if any.
    pub fn load(conn: &Connection) -> Result<Option<Snapshot>> {
        if state::snapshot_began(conn)?.is_none() {
            return Ok(None);
        }
        Ok(Some(Snapshot {
            empty: state::empty_at_snapshot(conn)?,
        }))
    }

    /// Whether the snapshot fills `table` from empty.
    pub fn fills(&self, table: &str) -> bool {
        self.empty.contains(table)
    }
}

/// Begins a snapshot at message `number`: see the module's comment. An
/// earlier snapshot that never ended is over: its indexes are built again
/// and its stale keys forgotten.
pub(crate) fn begin(conn: &Connection, tables: &Tables, number: u64) -> Result<()> {
    build_set_aside(conn)?;
    let names: Vec<&str> = tables.iter().map(|t| t.table.name.as_str()).collect();
    let empty = state::begin_snapshot(conn, number, &names)?;
    for sql in tables.iter() {
        conn.prepare_cached(&sql.stale.clear)?.execute([])?;
        if !empty.contains(&sql.table.name.as_str()) {
            conn.prepare_cached(&sql.stale.fill)?.execute([])?;
            continue;
        }
        for (name, create) in state::droppable_indexes(conn, &sql.table.name)? {
            if sql.retired_index.as_deref() == Some(name.as_str()) {
                continue;
            }
            state::set_aside(conn, &name, &sql.table.name, &create)?;
            conn.execute_batch(&format!("DROP INDEX {}", ident(&name)))?;
        }
    }
    Ok(())
}

/// Ends the snapshot in progress at message `number`: the indexes set aside
/// are built again, then every row of `named` tables the snapshot did not
/// send is let go of, and the refusals it superseded are forgotten.
pub(crate) fn end(conn: &Connection, tables: &Tables, named: &[String], number: u64) -> Result<()> {
    // Letting go asks what points at a row: every index is back first.
    build_set_aside(conn)?;
    let number = state::to_sql(number)?;
    for name in named {
        let Some(sql) = tables.get(name) else {
            continue;
        };
        if let Some(retire) = &sql.stale.retire {
            conn.prepare_cached(retire)?.execute([number])?;
        }
        conn.prepare_cached(&sql.stale.delete)?.execute([])?;
        state::forget_superseded(conn, name)?;
    }
    for sql in tables.iter() {
        conn.prepare_cached(&sql.stale.clear)?.execute([])?;
    }
    state::end_snapshot(conn)
}

/// Builds every index a snapshot set aside (one the host made again in the
/// meantime stays as it is); returns how many were built.
pub(crate) fn build_set_aside(conn: &Connection) -> Result<usize> {
    let mut built = 0;
    for (name, create) in state::take_set_aside(conn)? {
        if !state::index_exists(conn, &name)? {
            conn.execute_batch(&create)?;
            built += 1;
        }
    }
    Ok(built)
}

/// Carries a snapshot in progress over from earlier versions, which kept the
/// keys it had sent (`_magic_sync_snapshot_keys`) where this one keeps those
/// it has not: each table that held rows when it began gets back the keys
/// not sent so far, so its end lets go of exactly what it would have. Then
/// the old table goes. Nothing to do on a database that never had it.
pub(crate) fn carry_over(conn: &Connection, tables: &Tables) -> Result<()> {
    if !state::has_old_named_keys(conn)? {
        return Ok(());
    }
    if state::snapshot_began(conn)?.is_some() {
        let empty = state::empty_at_snapshot(conn)?;
        for sql in tables.iter() {
            let table = &sql.table;
            conn.execute_batch(&sql.stale.clear)?;
            if empty.contains(table.name.as_str()) {
                continue;
            }
            let keys = {
                let mut stmt = conn.prepare(&sql.every_key)?;
                let mut rows = stmt.query([])?;
                let mut keys = Vec::new();
                while let Some(row) = rows.next()? {
                    keys.push(key::read(table, row)?);
                }
                keys
            };
            let mut put_back = conn.prepare(&sql.stale.put_back)?;
            for k in keys {
                if !state::was_named(conn, &table.name, &key::canonical(&k))? {
                    put_back.execute(params_from_iter(key::params(&k)))?;
                }
            }
        }
    }
    state::drop_old_named_keys(conn)
}
