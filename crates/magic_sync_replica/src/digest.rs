//! What a replica holds, in a few numbers per table, for the server to compare
//! with what it records the replica holds.
//!
//! For each table that goes down, in the order the engine lists them:
//!
//! - `rows`: how many rows the replica holds, leaving out rows it retired and
//!   rows whose latest version it refused;
//! - `fingerprint`: FNV-1a (64 bits, [`magic_sync_core::digest`]) over the canonical key
//!   texts of those rows ([`canonical_key`](super::canonical_key): the compact
//!   JSON array of the key's values, in declared key order, as
//!   [`Value::to_json`](crate::Value::to_json) writes them), sorted bytewise
//!   ascending, each followed by one `0` byte. An empty table's fingerprint is
//!   FNV-1a of nothing, `0xcbf29ce484222325`.
//!
//! The server computes the same over the rows it records the replica holding,
//! leaving out the ones the replica refused; [`fingerprint`] is that
//! computation given the keys.

use super::key;
use super::state;
use super::tables::{TableSql, Tables};
use crate::envelope::{Digest, TableDigest};
use crate::error::Result;
use magic_sync_core::digest::{extend, fnv1a};
use rusqlite::Connection;

/// FNV-1a over `keys` (canonical key texts) sorted bytewise, each followed by
/// a 0 byte. Sorts `keys` in place.
pub fn fingerprint(keys: &mut [String]) -> u64 {
    keys.sort_unstable();
    keys.iter()
        .fold(fnv1a(b""), |h, k| extend(extend(h, k.as_bytes()), &[0]))
}

/// The digest of every table that goes down.
pub(crate) fn digest(conn: &Connection, tables: &Tables) -> Result<Digest> {
    let tables = tables
        .iter()
        .map(|sql| table_digest(conn, sql))
        .collect::<Result<_>>()?;
    Ok(Digest { tables })
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
        fingerprint: fingerprint(&mut keys),
    })
}

#[cfg(test)]
mod tests {
    use super::fingerprint;
    use magic_sync_core::digest::fnv1a;

    #[test]
    fn the_fingerprint_is_over_sorted_keys_each_ended_by_a_zero() {
        let mut keys = vec!["[2]".to_string(), "[10]".to_string(), "[1]".to_string()];
        // Bytewise: "[10]" < "[1]" < "[2]" ('0' < ']').
        assert_eq!(fingerprint(&mut keys), fnv1a(b"[10]\0[1]\0[2]\0"));
        assert_eq!(fingerprint(&mut []), fnv1a(b""));
    }
}
