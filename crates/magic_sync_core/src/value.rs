//! Column values as the engine moves them between PostgreSQL, codecs and SQLite.
//!
//! A field of a declared struct is any type implementing [`Field`]: it says
//! which [`Kind`] of column it maps to and converts to and from a [`Value`].

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use chrono::{DateTime, NaiveDate, NaiveDateTime, SecondsFormat, Utc};
use std::fmt;

/// The kind of a column, as a declared field sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `boolean`
    Bool,
    /// `smallint`
    Int16,
    /// `integer`
    Int32,
    /// `bigint`
    Int64,
    /// `real`
    Float32,
    /// `double precision`
    Float64,
    /// `text`, `varchar`, `char`, `uuid`, `citext`, `name`, and an enum
    /// (read as its label): anything PostgreSQL prints as text. A domain
    /// over any of these is one too: a domain is checked and read by the
    /// type it is over, an array by its elements.
    Text,
    /// `bytea`
    Bytes,
    /// `numeric`, kept exact as its decimal text.
    Numeric,
    /// `timestamp with time zone`
    Timestamptz,
    /// `timestamp without time zone`
    Timestamp,
    /// `date`
    Date,
    /// `json` or `jsonb`
    Json,
    /// An array of the inner kind.
    Array(&'static Kind),
}

impl Kind {
    /// Whether a PostgreSQL column of type `pg_type` (as `format_type` names it)
    /// can hold every value of this kind and give back only values this kind takes.
    /// `pg_type` is a base type: a domain's is the type it is over, an enum's
    /// `text`, an array's its elements' with `[]`.
    pub fn fits_postgres(&self, pg_type: &str) -> bool {
        let t = pg_type.trim();
        if let Some(inner) = t.strip_suffix("[]") {
            return matches!(self, Kind::Array(k) if k.fits_postgres(inner));
        }
        let base = t.split('(').next().unwrap_or(t).trim();
        match self {
            Kind::Bool => base == "boolean",
            Kind::Int16 => base == "smallint",
            Kind::Int32 => matches!(base, "integer" | "smallint"),
            Kind::Int64 => matches!(base, "bigint" | "integer" | "smallint"),
            Kind::Float32 => base == "real",
            Kind::Float64 => matches!(base, "double precision" | "real"),
            Kind::Text => matches!(
                base,
                "text" | "character varying" | "character" | "uuid" | "citext" | "name"
            ),
            Kind::Bytes => base == "bytea",
            Kind::Numeric => base == "numeric",
            Kind::Timestamptz => base == "timestamp with time zone",
            Kind::Timestamp => base == "timestamp without time zone",
            Kind::Date => base == "date",
            Kind::Json => matches!(base, "json" | "jsonb"),
            Kind::Array(_) => false,
        }
    }
}

impl Kind {
    /// The kind its [`Display`](fmt::Display) text names (`i64`, `array of
    /// text`); `None` for a text no kind writes.
    pub fn named(text: &str) -> Option<Kind> {
        if let Some(inner) = text.strip_prefix("array of ") {
            return Kind::scalar_named(inner).map(Kind::Array);
        }
        Kind::scalar_named(text).copied()
    }

    fn scalar_named(text: &str) -> Option<&'static Kind> {
        Some(match text {
            "bool" => &Kind::Bool,
            "i16" => &Kind::Int16,
            "i32" => &Kind::Int32,
            "i64" => &Kind::Int64,
            "f32" => &Kind::Float32,
            "f64" => &Kind::Float64,
            "text" => &Kind::Text,
            "bytes" => &Kind::Bytes,
            "numeric" => &Kind::Numeric,
            "timestamptz" => &Kind::Timestamptz,
            "timestamp" => &Kind::Timestamp,
            "date" => &Kind::Date,
            "json" => &Kind::Json,
            _ => return None,
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Bool => f.write_str("bool"),
            Kind::Int16 => f.write_str("i16"),
            Kind::Int32 => f.write_str("i32"),
            Kind::Int64 => f.write_str("i64"),
            Kind::Float32 => f.write_str("f32"),
            Kind::Float64 => f.write_str("f64"),
            Kind::Text => f.write_str("text"),
            Kind::Bytes => f.write_str("bytes"),
            Kind::Numeric => f.write_str("numeric"),
            Kind::Timestamptz => f.write_str("timestamptz"),
            Kind::Timestamp => f.write_str("timestamp"),
            Kind::Date => f.write_str("date"),
            Kind::Json => f.write_str("json"),
            Kind::Array(k) => write!(f, "array of {k}"),
        }
    }
}

/// One column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A boolean.
    Bool(bool),
    /// Any integer column.
    Int(i64),
    /// Any floating-point column.
    Float(f64),
    /// Text.
    Text(String),
    /// Binary.
    Bytes(Vec<u8>),
    /// An exact decimal, as text.
    Numeric(String),
    /// A point in time.
    Timestamptz(DateTime<Utc>),
    /// A wall-clock time without zone.
    Timestamp(NaiveDateTime),
    /// A calendar date.
    Date(NaiveDate),
    /// A JSON document.
    Json(serde_json::Value),
    /// An array.
    Array(Vec<Value>),
}

/// A value that does not fit where it was put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    /// The column it was meant for, once known.
    pub column: Option<String>,
    /// What the field takes.
    pub expected: String,
    /// What came.
    pub found: String,
}

impl ValueError {
    /// `found` did not fit a field of kind `expected`.
    pub fn mismatch(expected: impl fmt::Display, found: &Value) -> Self {
        ValueError {
            column: None,
            expected: expected.to_string(),
            found: found.describe(),
        }
    }

    /// Names the column the value was meant for.
    pub fn in_column(mut self, column: &str) -> Self {
        self.column.get_or_insert_with(|| column.to_string());
        self
    }
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(c) = &self.column {
            write!(f, "column `{c}`: ")?;
        }
        write!(f, "expected {}, found {}", self.expected, self.found)
    }
}

impl std::error::Error for ValueError {}

/// The text form of timestamps in JSON and SQLite: RFC 3339, microseconds, `Z`.
pub fn format_timestamptz(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

const TIMESTAMP_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.6f";
const DATE_FORMAT: &str = "%Y-%m-%d";

impl Value {
    /// A short description for error messages (never the whole value).
    pub fn describe(&self) -> String {
        match self {
            Value::Null => "NULL".into(),
            Value::Bool(_) => "a boolean".into(),
            Value::Int(i) => format!("integer {i}"),
            Value::Float(_) => "a float".into(),
            Value::Text(_) => "text".into(),
            Value::Bytes(_) => "bytes".into(),
            Value::Numeric(_) => "a numeric".into(),
            Value::Timestamptz(_) => "a timestamptz".into(),
            Value::Timestamp(_) => "a timestamp".into(),
            Value::Date(_) => "a date".into(),
            Value::Json(_) => "JSON".into(),
            Value::Array(_) => "an array".into(),
        }
    }

    /// The value as JSON, the way [`Codec::json`](crate::codec::Codec::json) writes it.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(J::Number)
                .unwrap_or_else(|| J::String(f.to_string())),
            Value::Text(s) | Value::Numeric(s) => J::String(s.clone()),
            Value::Bytes(b) => J::String(BASE64.encode(b)),
            Value::Timestamptz(t) => J::String(format_timestamptz(t)),
            Value::Timestamp(t) => J::String(t.format(TIMESTAMP_FORMAT).to_string()),
            Value::Date(d) => J::String(d.format(DATE_FORMAT).to_string()),
            Value::Json(j) => j.clone(),
            Value::Array(items) => J::Array(items.iter().map(Value::to_json).collect()),
        }
    }

    /// Writes [`Value::to_json`]'s form into `out`, byte for byte as
    /// `serde_json` prints it, without building it first: what a snapshot
    /// of a million rows encodes a million times.
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        match self {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(true) => out.extend_from_slice(b"true"),
            Value::Bool(false) => out.extend_from_slice(b"false"),
            Value::Int(i) => out.extend_from_slice(itoa::Buffer::new().format(*i).as_bytes()),
            Value::Text(s) | Value::Numeric(s) => serde_json::to_writer(&mut *out, s.as_str())?,
            Value::Timestamptz(t) => {
                serde_json::to_writer(&mut *out, format_timestamptz(t).as_str())?
            }
            Value::Timestamp(t) => {
                let text = t.format(TIMESTAMP_FORMAT).to_string();
                serde_json::to_writer(&mut *out, text.as_str())?
            }
            Value::Date(d) => {
                let text = d.format(DATE_FORMAT).to_string();
                serde_json::to_writer(&mut *out, text.as_str())?
            }
            Value::Float(_) | Value::Bytes(_) | Value::Json(_) | Value::Array(_) => {
                serde_json::to_writer(&mut *out, &self.to_json())?
            }
        }
        Ok(())
    }

    /// Reads a value of kind `kind` back from [`Value::to_json`]'s form.
    pub fn from_json(kind: Kind, json: serde_json::Value) -> Result<Value, ValueError> {
        use serde_json::Value as J;
        let wrong = |json: &J| ValueError {
            column: None,
            expected: kind.to_string(),
            found: format!("JSON {}", json_type(json)),
        };
        Ok(match (kind, json) {
            (_, J::Null) => Value::Null,
            (Kind::Json, j) => Value::Json(j),
            (Kind::Bool, J::Bool(b)) => Value::Bool(b),
            (Kind::Int16 | Kind::Int32 | Kind::Int64, J::Number(n)) => {
                Value::Int(n.as_i64().ok_or_else(|| wrong(&J::Number(n)))?)
            }
            (Kind::Float32 | Kind::Float64, J::Number(n)) => {
                Value::Float(n.as_f64().ok_or_else(|| wrong(&J::Number(n)))?)
            }
            (Kind::Float32 | Kind::Float64, J::String(s)) => match s.parse::<f64>() {
                Ok(f) => Value::Float(f),
                Err(_) => return Err(wrong(&J::String(s))),
            },
            (Kind::Text, J::String(s)) => Value::Text(s),
            (Kind::Numeric, J::String(s)) => Value::Numeric(s),
            (Kind::Bytes, J::String(s)) => match BASE64.decode(&s) {
                Ok(b) => Value::Bytes(b),
                Err(_) => return Err(wrong(&J::String(s))),
            },
            (Kind::Timestamptz, J::String(s)) => match DateTime::parse_from_rfc3339(&s) {
                Ok(t) => Value::Timestamptz(t.with_timezone(&Utc)),
                Err(_) => return Err(wrong(&J::String(s))),
            },
            (Kind::Timestamp, J::String(s)) => {
                match NaiveDateTime::parse_from_str(&s, TIMESTAMP_FORMAT) {
                    Ok(t) => Value::Timestamp(t),
                    Err(_) => return Err(wrong(&J::String(s))),
                }
            }
            (Kind::Date, J::String(s)) => match NaiveDate::parse_from_str(&s, DATE_FORMAT) {
                Ok(d) => Value::Date(d),
                Err(_) => return Err(wrong(&J::String(s))),
            },
            (Kind::Array(inner), J::Array(items)) => Value::Array(
                items
                    .into_iter()
                    .map(|j| Value::from_json(*inner, j))
                    .collect::<Result<_, _>>()?,
            ),
            (_, j) => return Err(wrong(&j)),
        })
    }
}

fn json_type(j: &serde_json::Value) -> &'static str {
    match j {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// An exact decimal, for `numeric` columns: kept as PostgreSQL prints it.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Numeric(pub String);

impl fmt::Display for Numeric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A Rust type a declared field may have.
pub trait Field: Sized {
    /// The column kind it maps to.
    const KIND: Kind;
    /// Whether it takes NULL.
    const NULLABLE: bool = false;
    /// Whether `from_value` may refuse or change a value of its kind beyond
    /// what the crate's own types do (range, precision, NULL). A host's own
    /// type is taken to, unless it says otherwise: replicas then read its
    /// table's rows through the codec, never by the column kinds alone.
    const CHECKED: bool = true;
    /// The field as a value.
    fn to_value(&self) -> Value;
    /// The field from a value.
    fn from_value(value: Value) -> Result<Self, ValueError>;
}

impl<T: Field> Field for Option<T> {
    const KIND: Kind = T::KIND;
    const NULLABLE: bool = true;
    const CHECKED: bool = T::CHECKED;
    fn to_value(&self) -> Value {
        match self {
            Some(v) => v.to_value(),
            None => Value::Null,
        }
    }
    fn from_value(value: Value) -> Result<Self, ValueError> {
        match value {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

macro_rules! int_field {
    ($t:ty, $kind:expr) => {
        impl Field for $t {
            const KIND: Kind = $kind;
            const CHECKED: bool = false;
            fn to_value(&self) -> Value {
                Value::Int(i64::from(*self))
            }
            fn from_value(value: Value) -> Result<Self, ValueError> {
                match value {
                    Value::Int(i) => <$t>::try_from(i).map_err(|_| ValueError {
                        column: None,
                        expected: $kind.to_string(),
                        found: format!("integer {i}, out of range"),
                    }),
                    v => Err(ValueError::mismatch($kind, &v)),
                }
            }
        }
    };
}
int_field!(i16, Kind::Int16);
int_field!(i32, Kind::Int32);
int_field!(i64, Kind::Int64);

macro_rules! simple_field {
    ($t:ty, $kind:expr, $variant:ident, |$v:ident| $to:expr, |$w:ident| $from:expr) => {
        impl Field for $t {
            const KIND: Kind = $kind;
            const CHECKED: bool = false;
            fn to_value(&self) -> Value {
                let $v = self;
                Value::$variant($to)
            }
            fn from_value(value: Value) -> Result<Self, ValueError> {
                match value {
                    Value::$variant($w) => Ok($from),
                    v => Err(ValueError::mismatch($kind, &v)),
                }
            }
        }
    };
}
simple_field!(bool, Kind::Bool, Bool, |v| *v, |b| b);
simple_field!(f64, Kind::Float64, Float, |v| *v, |f| f);
simple_field!(f32, Kind::Float32, Float, |v| f64::from(*v), |f| f as f32);
simple_field!(String, Kind::Text, Text, |v| v.clone(), |s| s);
simple_field!(Vec<u8>, Kind::Bytes, Bytes, |v| v.clone(), |b| b);
simple_field!(Numeric, Kind::Numeric, Numeric, |v| v.0.clone(), |s| {
    Numeric(s)
});
simple_field!(DateTime<Utc>, Kind::Timestamptz, Timestamptz, |v| *v, |t| t);
simple_field!(NaiveDateTime, Kind::Timestamp, Timestamp, |v| *v, |t| t);
simple_field!(NaiveDate, Kind::Date, Date, |v| *v, |d| d);
simple_field!(serde_json::Value, Kind::Json, Json, |v| v.clone(), |j| j);

macro_rules! array_field {
    ($t:ty, $kind:expr) => {
        impl Field for Vec<$t> {
            const KIND: Kind = Kind::Array(&$kind);
            const CHECKED: bool = false;
            fn to_value(&self) -> Value {
                Value::Array(self.iter().map(Field::to_value).collect())
            }
            fn from_value(value: Value) -> Result<Self, ValueError> {
                match value {
                    Value::Array(items) => items.into_iter().map(<$t>::from_value).collect(),
                    v => Err(ValueError::mismatch(Kind::Array(&$kind), &v)),
                }
            }
        }
    };
}
array_field!(i32, Kind::Int32);
array_field!(i64, Kind::Int64);
array_field!(String, Kind::Text);
array_field!(bool, Kind::Bool);
array_field!(f64, Kind::Float64);

/// The canonical text of a key: the JSON array of its values as
/// [`Value::to_json`] writes them, with no whitespace. Keys travel in it and
/// are compared in it, on the server and on every replica.
pub fn canonical_key(values: &[Value]) -> String {
    serde_json::Value::Array(values.iter().map(Value::to_json).collect()).to_string()
}

#[cfg(test)]
mod tests {
    use super::Value;
    use chrono::{DateTime, NaiveDate};
    use proptest::prelude::*;

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int),
            any::<f64>().prop_map(Value::Float),
            any::<String>().prop_map(Value::Text),
            "-?[0-9]{1,30}(\\.[0-9]{1,20})?".prop_map(Value::Numeric),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bytes),
            (-62_135_596_800_000_000i64..253_402_300_799_000_000).prop_map(|us| {
                Value::Timestamptz(DateTime::from_timestamp_micros(us).expect("in range"))
            }),
            (-62_135_596_800_000_000i64..253_402_300_799_000_000).prop_map(|us| {
                Value::Timestamp(
                    DateTime::from_timestamp_micros(us)
                        .expect("in range")
                        .naive_utc(),
                )
            }),
            (1i32..3_000_000).prop_map(|d| Value::Date(
                NaiveDate::from_num_days_from_ce_opt(d).expect("in range")
            )),
            any::<String>()
                .prop_map(|s| Value::Json(serde_json::json!({ "s": s, "n": [1, null] }))),
        ]
    }

    proptest! {
        #[test]
        fn a_value_is_written_as_serde_json_prints_its_json(
            value in prop_oneof![scalar(), proptest::collection::vec(scalar(), 0..4).prop_map(Value::Array)]
        ) {
            let mut written = Vec::new();
            value.write_json(&mut written).expect("writes");
            prop_assert_eq!(written, serde_json::to_vec(&value.to_json()).expect("prints"));
        }
    }
}
