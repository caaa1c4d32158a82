//! What a replica holds, in a few numbers per table, for the server to compare
//! with what it records the replica holds.
//!
//! For each table that goes down, in the order the engine lists them:
//!
//! - `rows`: how many rows the replica holds, leaving out rows it retired and
//!   rows whose latest version it refused;
//! - `fingerprint`: the [`DigestForm::Summed`] fingerprint
//!   ([`magic_sync_core::digest`]) of the canonical key texts of those rows
//!   ([`canonical_key`](super::canonical_key): the compact JSON array of the
//!   key's values, in declared key order, as
//!   [`Value::to_json`](crate::Value::to_json) writes them): the wrapping
//!   sum of each key's hash, 0 for an empty table. The digest says its form.
//!
//! The server computes the same over the rows it records the replica holding,
//! leaving out the ones the replica refused; [`fingerprint`] is that
//! computation given the keys. A replica of another build or language may
//! send the first form ([`DigestForm::Sorted`]), which the server reads too.

use super::key;
use super::state;
use super::tables::{TableSql, Tables};
use crate::envelope::{Digest, TableDigest};
use crate::error::Result;
use magic_sync_core::digest::{key_hash, summed, DigestForm};
use rusqlite::Connection;

/// The fingerprint a replica's digest gives `keys` (canonical key texts):
/// the [`DigestForm::Summed`] one.
pub fn fingerprint(keys: &[String]) -> u64 {
    summed(keys)
}

/// The digest of every table that goes down.
pub(crate) fn digest(conn: &Connection, tables: &Tables) -> Result<Digest> {
    let tables = tables
        .iter()
        .map(|sql| table_digest(conn, sql))
        .collect::<Result<_>>()?;
    Ok(Digest {
        tables,
        form: DigestForm::Summed.into(),
    })
}

fn table_digest(conn: &Connection, sql: &TableSql) -> Result<TableDigest> {
    let name = sql.table.name.as_str();
    let refused = state::refused_keys(conn, name)?;
    let mut stmt = conn.prepare(&sql.live_keys)?;
    let mut rows = stmt.query([])?;
    let (mut held, mut sum) = (0, 0u64);
    while let Some(row) = rows.next()? {
        let text = key::canonical(&key::read(&sql.table, row)?);
        if !refused.contains(&text) {
            held += 1;
            sum = sum.wrapping_add(key_hash(text.as_bytes()));
        }
    }
    Ok(TableDigest {
        table: name.to_string(),
        rows: held,
        fingerprint: sum,
    })
}
