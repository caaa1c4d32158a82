//! [`Value`]s in and out of SQLite, and a replica's tables as the declarations say.
//!
//! Values keep their exact form: integers and booleans as INTEGER, floats as
//! REAL, bytes as BLOB, and everything else (numeric, timestamps, dates, JSON,
//! arrays) as the text [`Value::to_json`] gives them.

use crate::shape::Table;
use crate::sql::ident;
use crate::value::{Kind, Value, ValueError};
use rusqlite::types::{Value as Lite, ValueRef};

/// The SQLite storage type of a kind.
pub fn storage(kind: Kind) -> &'static str {
    match kind {
        Kind::Bool | Kind::Int16 | Kind::Int32 | Kind::Int64 => "INTEGER",
        Kind::Float32 | Kind::Float64 => "REAL",
        Kind::Bytes => "BLOB",
        _ => "TEXT",
    }
}

/// A value as SQLite stores it.
pub fn to_sqlite(value: &Value) -> Lite {
    match value {
        Value::Null => Lite::Null,
        Value::Bool(b) => Lite::Integer(i64::from(*b)),
        Value::Int(i) => Lite::Integer(*i),
        Value::Float(f) => Lite::Real(*f),
        Value::Text(s) | Value::Numeric(s) => Lite::Text(s.clone()),
        Value::Bytes(b) => Lite::Blob(b.clone()),
        other => match other.to_json() {
            serde_json::Value::String(s) => Lite::Text(s),
            json => Lite::Text(json.to_string()),
        },
    }
}

/// A value of `kind` read back from SQLite.
pub fn from_sqlite(kind: Kind, value: ValueRef<'_>) -> Result<Value, ValueError> {
    let wrong = |found: &str| ValueError {
        column: None,
        expected: kind.to_string(),
        found: found.to_string(),
    };
    Ok(match (kind, value) {
        (_, ValueRef::Null) => Value::Null,
        (Kind::Bool, ValueRef::Integer(i)) => Value::Bool(i != 0),
        (Kind::Int16 | Kind::Int32 | Kind::Int64, ValueRef::Integer(i)) => Value::Int(i),
        (Kind::Float32 | Kind::Float64, ValueRef::Real(f)) => Value::Float(f),
        (Kind::Float32 | Kind::Float64, ValueRef::Integer(i)) => Value::Float(i as f64),
        (Kind::Bytes, ValueRef::Blob(b)) => Value::Bytes(b.to_vec()),
        (Kind::Text, ValueRef::Text(t)) => {
            Value::Text(String::from_utf8(t.to_vec()).map_err(|_| wrong("text that is not UTF-8"))?)
        }
        (Kind::Numeric, ValueRef::Text(t)) => Value::Numeric(
            String::from_utf8(t.to_vec()).map_err(|_| wrong("text that is not UTF-8"))?,
        ),
        (Kind::Json | Kind::Array(_), ValueRef::Text(t)) => {
            let json = serde_json::from_slice(t).map_err(|_| wrong("text that is not JSON"))?;
            Value::from_json(kind, json)?
        }
        (_, ValueRef::Text(t)) => {
            let text = std::str::from_utf8(t).map_err(|_| wrong("text that is not UTF-8"))?;
            Value::from_json(kind, serde_json::Value::String(text.to_string()))?
        }
        (_, ValueRef::Integer(_)) => return Err(wrong("an integer")),
        (_, ValueRef::Real(_)) => return Err(wrong("a real")),
        (_, ValueRef::Blob(_)) => return Err(wrong("a blob")),
    })
}

/// `CREATE TABLE IF NOT EXISTS` for a declared table on a replica: its
/// columns, its key, and its retired column.
pub fn create_table(table: &magic_sync_core::row::Table) -> String {
    create(&Table::of(table))
}

/// Reads the declared columns of `table` from `row`, starting at column `first`.
pub fn read_row(
    row: &rusqlite::Row<'_>,
    first: usize,
    table: &magic_sync_core::row::Table,
) -> Result<Vec<Value>, crate::Error> {
    let columns = table.columns.iter().map(|c| (c.name, c.kind));
    read_columns(row, first, table.name, columns)
}

/// `CREATE TABLE IF NOT EXISTS` for `table` on a replica.
pub(crate) fn create(table: &Table) -> String {
    let mut columns: Vec<String> = table
        .columns
        .iter()
        .map(|c| {
            let not_null = if c.nullable { "" } else { " NOT NULL" };
            format!("{} {}{not_null}", ident(&c.name), storage(c.kind))
        })
        .collect();
    if let Some(retired) = table.retired.as_deref() {
        columns.push(format!("{} INTEGER", ident(retired)));
    }
    let key: Vec<String> = table.key.iter().map(|k| ident(k)).collect();
    columns.push(format!("PRIMARY KEY ({})", key.join(", ")));
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n    {}\n) STRICT",
        ident(&table.name),
        columns.join(",\n    ")
    )
}

/// Reads the columns of `table` from `row`, starting at column `first`.
pub(crate) fn read(
    row: &rusqlite::Row<'_>,
    first: usize,
    table: &Table,
) -> Result<Vec<Value>, crate::Error> {
    let columns = table.columns.iter().map(|c| (c.name.as_str(), c.kind));
    read_columns(row, first, &table.name, columns)
}

/// Reads `columns` (name and kind, in order) of table `table` from `row`,
/// starting at column `first`.
fn read_columns<'c>(
    row: &rusqlite::Row<'_>,
    first: usize,
    table: &str,
    columns: impl ExactSizeIterator<Item = (&'c str, Kind)>,
) -> Result<Vec<Value>, crate::Error> {
    let mut values = Vec::with_capacity(columns.len());
    for (i, (name, kind)) in columns.enumerate() {
        let v = row.get_ref(first + i)?;
        values.push(from_sqlite(kind, v).map_err(|e| crate::Error::Unreadable {
            table: table.to_string(),
            key: None,
            problem: e.in_column(name).to_string(),
        })?);
    }
    Ok(values)
}
