//! What the server said the replica's tables are made of (a
//! `ReplicaSchema`), kept in `_magic_sync_described`: the foreign keys
//! among them come from there, so a host does not restate what the server
//! reads from its catalogue. The columns and keys a replica writes are its
//! own build's (its codecs read the rows); where the server's description
//! differs from them, [`crate::Configuration::disagreements`] says how.

use crate::envelope::ReplicaSchema;
use crate::error::Result;
use crate::shape::Shapes;
use magic_sync_core::schema::{described_foreign_keys, ForeignKey};
use prost::Message;
use rusqlite::{Connection, OptionalExtension};

const CREATE: &str = "
CREATE TABLE IF NOT EXISTS _magic_sync_described (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    described BLOB NOT NULL
) STRICT";
const LOAD: &str = "SELECT described FROM _magic_sync_described";
const SAVE: &str = "
INSERT INTO _magic_sync_described (id, described) VALUES (1, ?1)
ON CONFLICT (id) DO UPDATE SET described = excluded.described";

pub(crate) fn create(conn: &Connection) -> Result<()> {
    conn.execute_batch(CREATE)?;
    Ok(())
}

/// The description the server last gave, if it gave one. One that does
/// not decode (a file written by a newer build) counts as none: the
/// server describes the tables again with the next snapshot or start.
pub(crate) fn load(conn: &Connection) -> Result<Option<ReplicaSchema>> {
    let bytes: Option<Vec<u8>> = conn
        .prepare_cached(LOAD)?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(bytes.and_then(|b| ReplicaSchema::decode(b.as_slice()).ok()))
}

pub(crate) fn save(conn: &Connection, described: &ReplicaSchema) -> Result<()> {
    conn.prepare_cached(SAVE)?
        .execute([described.encode_to_vec()])?;
    Ok(())
}

/// The foreign keys of `described` this build can follow: those whose
/// tables and columns `engine` declares, with as many columns on each side.
/// The rest are the server's business (a table this build does not hold
/// has no rows to keep), and show as disagreements.
pub(crate) fn foreign_keys(shapes: &Shapes, described: &ReplicaSchema) -> Vec<ForeignKey> {
    let has = |table: &str, columns: &[String]| {
        shapes.codec(table).is_some_and(|c| {
            columns
                .iter()
                .all(|column| c.table().column(column).is_some())
        })
    };
    let mut fks: Vec<ForeignKey> = described_foreign_keys(described)
        .into_iter()
        .filter(|fk| {
            !fk.child_columns.is_empty()
                && fk.child_columns.len() == fk.parent_columns.len()
                && has(&fk.child, &fk.child_columns)
                && has(&fk.parent, &fk.parent_columns)
        })
        .collect();
    fks.sort();
    fks
}
