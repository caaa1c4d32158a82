//! Tables an earlier build declared and this one does not: the rows the
//! server stopped sending leave the replica with them.
//!
//! The replica makes a SQLite table for every table its build declares, and
//! records in `_magic_sync_tables` each one that goes down. A new build
//! that no longer declares one of those (the host removed it, or renamed
//! it) can no longer read its rows, nor let go of them one by one: its
//! codecs do not know the table. Its rows stay until the server says this
//! build's configuration is whole here, by a snapshot's end or the
//! `Configured` a deployment ends with, under this build's fingerprint:
//! the server then records none of the table held by the replica, and the
//! replica drops it (the table, its stale keys, its refusals and any write
//! of it still due to go up). Until then the replica holds a consistent
//! superset, as during any deployment, and does not say its configuration
//! is complete.
//!
//! The record is the replica's own, so a file opened by a build that
//! forgot a table still knows it made it. A file made before the record
//! existed has the server's last description instead, which names every
//! table the server sent it.
//!
//! A table the replica writes (`up`) is its own records, never dropped.

use crate::envelope::ReplicaSchema;
use crate::error::Result;
use crate::shape::Shapes;
use crate::sql::ident;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeSet;

const CREATE: &str = "
CREATE TABLE IF NOT EXISTS _magic_sync_tables (
    name   TEXT PRIMARY KEY,
    mirror TEXT NOT NULL
) STRICT";
const RECORD: &str = "
INSERT INTO _magic_sync_tables (name, mirror) VALUES (?1, ?2)
ON CONFLICT (name) DO UPDATE SET mirror = excluded.mirror";
const RECORDED: &str = "SELECT name FROM _magic_sync_tables WHERE mirror IN ('down', 'both')";
const FORGET: &str = "DELETE FROM _magic_sync_tables WHERE name = ?1";
const EXISTS: &str = "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1";

/// Records the tables `engine` declares that go down, and returns the
/// tables an earlier build made to go down that `engine` does not declare
/// (`told`: the server's last description, for a file older than the
/// record) and that are still in the file.
pub(crate) fn open(
    conn: &Connection,
    shapes: &Shapes,
    told: Option<&ReplicaSchema>,
) -> Result<BTreeSet<String>> {
    conn.execute_batch(CREATE)?;
    let mut earlier: BTreeSet<String> = conn
        .prepare_cached(RECORDED)?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if let Some(told) = told {
        earlier.extend(
            told.tables
                .iter()
                .filter(|t| matches!(t.mirror.as_str(), "down" | "both"))
                .map(|t| t.name.clone()),
        );
    }
    for table in shapes.tables() {
        earlier.remove(&table.name);
        if table.mirror.goes_down() {
            conn.prepare_cached(RECORD)?
                .execute(params![table.name, table.mirror.as_str()])?;
        }
    }
    let mut former = BTreeSet::new();
    for name in earlier {
        if exists(conn, &name)? {
            conn.prepare_cached(RECORD)?
                .execute(params![name, "down"])?;
            former.insert(name);
        } else {
            conn.prepare_cached(FORGET)?.execute([&name])?;
        }
    }
    Ok(former)
}

/// Drops every table of `former`, with everything the replica kept about
/// it: for when the server said this build's configuration is whole here.
pub(crate) fn drop_all(conn: &Connection, former: &BTreeSet<String>) -> Result<()> {
    for name in former {
        let stale = format!("_magic_sync_stale_{name}");
        conn.execute_batch(&format!(
            "DROP TABLE IF EXISTS {};\nDROP TABLE IF EXISTS {};",
            ident(name),
            ident(&stale)
        ))?;
        for sql in [
            "DELETE FROM _magic_sync_refused WHERE table_name = ?1",
            "DELETE FROM _magic_sync_up WHERE table_name = ?1",
            "DELETE FROM _magic_sync_snapshot_indexes WHERE table_name = ?1",
            "DELETE FROM _magic_sync_snapshot_empty WHERE table_name = ?1",
            FORGET,
        ] {
            conn.prepare_cached(sql)?.execute([name])?;
        }
        tracing::info!(
            table = %name,
            "dropped a table this build no longer declares: the server sends it no more"
        );
    }
    Ok(())
}

fn exists(conn: &Connection, name: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached(EXISTS)?
        .query_row([name], |_| Ok(()))
        .optional()?
        .is_some())
}

/// The tables an earlier build made to go down that `engine` does not
/// declare and that are still in the file, read without writing anything:
/// for a host reading beside the replica's own connection.
pub(crate) fn read(conn: &Connection, shapes: &Shapes) -> Result<Vec<String>> {
    if !exists(conn, "_magic_sync_tables")? {
        return Ok(Vec::new());
    }
    let recorded: Vec<String> = conn
        .prepare_cached(RECORDED)?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut left = Vec::new();
    for name in recorded {
        if shapes.codec(&name).is_none() && exists(conn, &name)? {
            left.push(name);
        }
    }
    Ok(left)
}
