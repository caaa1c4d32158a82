//! Reading declared columns out of PostgreSQL as [`Value`]s.
//!
//! Every column is selected cast to one of a few wire types chosen by its
//! [`Kind`], so reading never depends on the exact type the database has
//! (`integer` or `bigint`, `varchar` or `text`, an enum, a domain or the
//! type it is over, ...): the driver takes a value only as the type it
//! expects, and the statement says which, whatever the column is.

use crate::row::{Column, Table};
use crate::sql::ident;
use crate::value::{Kind, Value, ValueError};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use tokio_postgres::Row as PgRow;

/// The select expression for one declared column, read from `alias`.
pub fn select_expr(alias: &str, column: &Column) -> String {
    let c = format!("{alias}.{}", ident(column.name));
    match column.kind {
        Kind::Int16 | Kind::Int32 | Kind::Int64 => format!("{c}::int8"),
        Kind::Float32 | Kind::Float64 => format!("{c}::float8"),
        Kind::Text | Kind::Numeric => format!("{c}::text"),
        Kind::Json | Kind::Array(_) => format!("to_jsonb({c})"),
        Kind::Bool => format!("{c}::bool"),
        Kind::Bytes => format!("{c}::bytea"),
        Kind::Timestamptz => format!("{c}::timestamptz"),
        Kind::Timestamp => format!("{c}::timestamp"),
        Kind::Date => format!("{c}::date"),
    }
}

/// The select list of every declared column of `table`, read from `alias`.
pub fn select_list(alias: &str, table: &Table) -> String {
    table
        .columns
        .iter()
        .map(|c| select_expr(alias, c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads column `index` of `row`, selected by [`select_expr`], as a value of `kind`.
pub fn read(row: &PgRow, index: usize, kind: Kind) -> Result<Value, ValueError> {
    fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
        row: &'a PgRow,
        index: usize,
        kind: Kind,
    ) -> Result<Option<T>, ValueError> {
        row.try_get::<_, Option<T>>(index).map_err(|e| ValueError {
            column: None,
            expected: kind.to_string(),
            found: format!("a value PostgreSQL could not give as such ({e})"),
        })
    }
    let value = match kind {
        Kind::Bool => get::<bool>(row, index, kind)?.map(Value::Bool),
        Kind::Int16 | Kind::Int32 | Kind::Int64 => get::<i64>(row, index, kind)?.map(Value::Int),
        Kind::Float32 | Kind::Float64 => get::<f64>(row, index, kind)?.map(Value::Float),
        Kind::Text => get::<String>(row, index, kind)?.map(Value::Text),
        Kind::Numeric => get::<String>(row, index, kind)?.map(Value::Numeric),
        Kind::Bytes => get::<Vec<u8>>(row, index, kind)?.map(Value::Bytes),
        Kind::Timestamptz => get::<DateTime<Utc>>(row, index, kind)?.map(Value::Timestamptz),
        Kind::Timestamp => get::<NaiveDateTime>(row, index, kind)?.map(Value::Timestamp),
        Kind::Date => get::<NaiveDate>(row, index, kind)?.map(Value::Date),
        Kind::Json => get::<serde_json::Value>(row, index, kind)?.map(Value::Json),
        Kind::Array(_) => match get::<serde_json::Value>(row, index, kind)? {
            None => None,
            Some(json) => Some(Value::from_json(kind, json)?),
        },
    };
    Ok(value.unwrap_or(Value::Null))
}

/// Reads the declared columns of `table` from `row`, starting at column `first`.
pub fn read_row(row: &PgRow, first: usize, table: &Table) -> Result<Vec<Value>, ValueError> {
    table
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| read(row, first + i, c.kind).map_err(|e| e.in_column(c.name)))
        .collect()
}
