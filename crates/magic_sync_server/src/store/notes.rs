//! How a write to a declared table is noted (`sync.notes`): the statement
//! each table's trigger function runs per row, which `crate::trigger`
//! builds the functions around. The relay reads and clears the notes in
//! its passes (`crate::store::plan`).

use crate::sql::literal;

/// The PL/pgSQL statements noting one change of `table`: its key (`key`,
/// an expression over `NEW` or `OLD`) and, for a row going away, the
/// parents it pointed at (`parents`). After the note, a dozing relay is
/// woken when the transaction commits; one at work is kept from dozing
/// until the transaction has ended (`crate::store::wake`). Taken again in
/// the same transaction, the lock is found in the backend's own table.
pub(crate) fn note(table: &str, key: &str, parents: &str) -> String {
    format!(
        "INSERT INTO sync.notes (table_name, source, key, parents)\n            \
         VALUES ({}, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, {key}, {parents});\n        \
         IF NOT pg_try_advisory_xact_lock_shared({dozing}) THEN\n            \
         PERFORM pg_notify({channel}, '');\n        \
         END IF",
        literal(table),
        dozing = super::wake::DOZING,
        channel = literal(super::wake::CHANNEL),
    )
}
