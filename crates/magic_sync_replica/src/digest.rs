//! What a replica holds, in a few numbers per table, for the server to compare
//! with what it records the replica holds.
//!
//! For each table that goes down, in the order the engine lists them:
//!
//! - `rows`: how many rows the replica holds, leaving out rows it retired and
//!   rows whose latest version it refused;
//! - `fingerprint` and `summed`: fingerprints ([`magic_sync_core::digest`])
//!   of the canonical key texts of those rows
//!   ([`canonical_key`](super::canonical_key): the compact JSON array of the
//!   key's values, in declared key order, as
//!   [`Value::to_json`](crate::Value::to_json) writes them), in both forms:
//!   `fingerprint` in the first ([`DigestForm::Sorted`]), which is what a
//!   server of any build reads, and `summed` in the summed one
//!   ([`DigestForm::Summed`]), which a server of this build compares instead.
//!
//! Sending both costs a sort of the keys, once a digest; it keeps a server
//! rolled back to a build that knows only the first form comparing digests
//! rightly, where a replica sending only the summed form would differ from
//! it every time and be provisioned again every hour.
//!
//! The server computes the same over the rows it records the replica holding,
//! leaving out the ones the replica refused; [`fingerprint`] is that
//! computation given the keys, in the form the server compares.

use super::key;
use super::state;
use super::tables::{TableSql, Tables};
use crate::envelope::{Digest, TableDigest};
use crate::error::Result;
use magic_sync_core::digest::{sorted, summed, DigestForm};
use rusqlite::Connection;

/// The fingerprint a server of this build compares for `keys` (canonical
/// key texts): the [`DigestForm::Summed`] one, `TableDigest.summed`.
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
        form: DigestForm::Sorted.into(),
    })
}

fn table_digest(conn: &Connection, sql: &TableSql) -> Result<TableDigest> {
    let name = sql.table.name.as_str();
    let refused = state::refused_keys(conn, name)?;
    let mut stmt = conn.prepare(&sql.live_keys)?;
    let mut rows = stmt.query([])?;
    let mut keys = Vec::new();
    while let Some(row) = rows.next()? {
        let text = key::canonical(&key::read(&sql.table, row)?);
        if !refused.contains(&text) {
            keys.push(text);
        }
    }
    Ok(TableDigest {
        table: name.to_string(),
        rows: keys.len() as u64,
        summed: Some(summed(&keys)),
        fingerprint: sorted(&mut keys),
    })
}
