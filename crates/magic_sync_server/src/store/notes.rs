//! How a write to a declared table is noted (`sync.notes`): the statement
//! each table's trigger function runs per row, which `crate::trigger`
//! builds the functions around. The relay reads and clears the notes in
//! its passes (`crate::store::plan`).

use crate::sql::literal;

/// The PL/pgSQL statements noting one change of `table`: what happened to
/// the row (`op`, as `sync.notes.op` says it), its key (`key`, an
/// expression over `NEW` or `OLD`) and, for a row that was there before,
/// the columns it had (`parents`). After the note, a dozing relay is
/// woken when the transaction commits; one at work is kept from dozing
/// until the transaction has ended (`crate::store::wake`). Taken again in
/// the same transaction, the lock is found in the backend's own table.
pub(crate) fn note(table: &str, op: Op, key: &str, parents: &str) -> String {
    format!(
        "INSERT INTO sync.notes (table_name, source, key, parents, op)\n            \
         VALUES ({}, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, {key}, {parents}, {});\n        \
         IF NOT pg_try_advisory_xact_lock_shared({dozing}) THEN\n            \
         PERFORM pg_notify({channel}, '');\n        \
         END IF",
        literal(table),
        op.literal(),
        dozing = super::wake::DOZING,
        channel = literal(super::wake::CHANNEL),
    )
}

/// What a note says happened to its row (`sync.notes.op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Op {
    Insert = b'i',
    Update = b'u',
    Delete = b'd',
    /// Noted again by a relay starting: the row as it is now.
    Again = b'a',
}

impl Op {
    /// As an SQL literal.
    pub(crate) fn literal(self) -> String {
        format!("'{}'", self as u8 as char)
    }
}
