//! Keys on a replica.
//!
//! On the wire a key is the UTF-8 text of a JSON array of the key's columns,
//! in the order the table declares them (`[42]`, `["north",7]`). The replica
//! turns it into [`Value`]s of the key columns' kinds to find the row, and
//! writes keys back in one canonical text, [`canonical`], wherever it compares
//! them: the keys a snapshot named, the rows it refused, the digest.

use crate::lite;
use crate::shape::Table;
use crate::value::{Kind, Value, ValueError};
use rusqlite::types::Value as Lite;

/// The canonical text of a key: the JSON array of its values as
/// [`Value::to_json`] writes them, with no whitespace (`serde_json`'s compact
/// form).
pub fn canonical(values: &[Value]) -> String {
    crate::value::canonical_key(values)
}

/// Why a key from the wire cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyProblem {
    /// Not JSON at all.
    #[error("the key is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// JSON, but no array.
    #[error("the key is not a JSON array")]
    NotArray,
    /// An array of the wrong length.
    #[error("the key has {found} values, but the table has {expected} key columns")]
    Length {
        /// Values in the array.
        found: usize,
        /// Key columns declared.
        expected: usize,
    },
    /// A key column given as null.
    #[error("key column `{0}` is null")]
    Null(String),
    /// A value that does not fit its key column.
    #[error("key {0}")]
    Value(#[source] ValueError),
}

/// The key's values from its wire form.
pub(crate) fn decode(table: &Table, bytes: &[u8]) -> Result<Vec<Value>, KeyProblem> {
    let json = serde_json::from_slice(bytes).map_err(KeyProblem::NotJson)?;
    let serde_json::Value::Array(items) = json else {
        return Err(KeyProblem::NotArray);
    };
    if items.len() != table.key.len() {
        return Err(KeyProblem::Length {
            found: items.len(),
            expected: table.key.len(),
        });
    }
    table
        .key
        .iter()
        .zip(items)
        .map(|(name, json)| key_value(table, name, json))
        .collect()
}

fn key_value(table: &Table, name: &str, json: serde_json::Value) -> Result<Value, KeyProblem> {
    // The derive checks every key column is a field, so the kind is known.
    let kind = table.column(name).map_or(Kind::Text, |c| c.kind);
    match Value::from_json(kind, json) {
        Ok(Value::Null) => Err(KeyProblem::Null(name.to_string())),
        Ok(value) => Ok(value),
        Err(e) => Err(KeyProblem::Value(e.in_column(name))),
    }
}

/// The key's values out of a decoded row (values in declared column order).
pub(crate) fn of_row(table: &Table, row: &[Value]) -> Vec<Value> {
    table
        .key_positions()
        .into_iter()
        .filter_map(|i| row.get(i).cloned())
        .collect()
}

/// Values as SQLite parameters.
pub(crate) fn params(values: &[Value]) -> Vec<Lite> {
    values.iter().map(lite::to_sqlite).collect()
}

/// The key columns of a row selected as exactly the key columns, in key order.
pub(crate) fn read(table: &Table, row: &rusqlite::Row<'_>) -> crate::Result<Vec<Value>> {
    let mut values = Vec::with_capacity(table.key.len());
    for (i, name) in table.key.iter().enumerate() {
        let kind = table
            .column(name)
            .map(|c| c.kind)
            .ok_or_else(|| crate::Error::NoCodec {
                table: table.name.to_string(),
            })?;
        let value =
            lite::from_sqlite(kind, row.get_ref(i)?).map_err(|e| crate::Error::Unreadable {
                table: table.name.to_string(),
                key: None,
                problem: e.in_column(name).to_string(),
            })?;
        values.push(value);
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::canonical;
    use crate::value::Value;

    #[test]
    fn the_canonical_text_is_compact_json() {
        assert_eq!(canonical(&[Value::Int(42)]), "[42]");
        assert_eq!(
            canonical(&[Value::Text("north".into()), Value::Int(7)]),
            r#"["north",7]"#
        );
        assert_eq!(canonical(&[Value::Text("a\"b".into())]), r#"["a\"b"]"#);
    }
}
