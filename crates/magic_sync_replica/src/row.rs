//! A row as it came, read into the values SQLite stores, and the canonical
//! text of its key.
//!
//! Rows of the JSON codec are read by their columns' kinds straight from the
//! message's bytes: no map of the object, no `serde_json::Value` per column,
//! no struct, and text without escapes is bound from the message itself.
//! That reading is optimistic: whatever it does not take as it is (a value
//! of the wrong type, a NULL where the column takes none, an integer out of
//! range, a document that is not one object) is read again by the table's
//! codec, which decides, and whose error is the one a refusal records. So a
//! row is taken or refused exactly as the codec would take or refuse it, and
//! is stored exactly as its decoded [`Value`]s would be
//! ([`lite::to_sqlite`]). Rows of any other codec go through the codec.
//!
//! What the JSON reading checks is what the declared fields' own
//! conversions ([`crate::value::Field`]) check for every kind the crate
//! provides: NULL only where the field is an `Option`, `i16` and `i32`
//! ranges, `f32` precision, arrays without NULL items. A table with a field
//! of the host's own type (one that may check more, `Field::CHECKED`) is
//! read through the codec.

use crate::codec::CodecError;
use crate::lite;
use crate::shape::{Codec, Column, Table};
use crate::value::{Kind, Value};
use rusqlite::types::{ToSqlOutput, Value as Lite, ValueRef};
use rusqlite::ToSql;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// One column's value as SQLite stores it, borrowing from the message where
/// it can.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Param<'m> {
    Null,
    Integer(i64),
    Real(f64),
    Text(Cow<'m, str>),
    Blob(Vec<u8>),
}

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Param::Null => ValueRef::Null,
            Param::Integer(i) => ValueRef::Integer(*i),
            Param::Real(f) => ValueRef::Real(*f),
            Param::Text(s) => ValueRef::Text(s.as_bytes()),
            Param::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

impl Param<'_> {
    /// The same value, owning what it borrowed.
    pub fn owned(&self) -> Lite {
        match self {
            Param::Null => Lite::Null,
            Param::Integer(i) => Lite::Integer(*i),
            Param::Real(f) => Lite::Real(*f),
            Param::Text(s) => Lite::Text(s.to_string()),
            Param::Blob(b) => Lite::Blob(b.clone()),
        }
    }

    fn of<'x>(value: &Value) -> Param<'x> {
        match lite::to_sqlite(value) {
            Lite::Null => Param::Null,
            Lite::Integer(i) => Param::Integer(i),
            Lite::Real(f) => Param::Real(f),
            Lite::Text(s) => Param::Text(Cow::Owned(s)),
            Lite::Blob(b) => Param::Blob(b),
        }
    }
}

/// Reads the row in `bytes` into `out`, one value per declared column in
/// order; the codec's error when it does not decode.
pub(crate) fn read<'m>(
    codec: &Codec,
    bytes: &'m [u8],
    out: &mut Vec<Param<'m>>,
) -> Result<(), CodecError> {
    let columns = &codec.table().columns;
    let plain = columns.iter().all(|c| !c.checked);
    if plain && codec.format() == "json" && read_json(columns, bytes, out).is_ok() {
        return Ok(());
    }
    let values = codec.decode(bytes)?;
    out.clear();
    out.extend(values.iter().map(Param::of));
    Ok(())
}

/// The JSON reading; any error means "let the codec decide".
fn read_json<'m>(
    columns: &[Column],
    bytes: &'m [u8],
    out: &mut Vec<Param<'m>>,
) -> serde_json::Result<()> {
    out.clear();
    out.resize(columns.len(), Param::Null);
    let mut seen = 0u64;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    RowSeed {
        columns,
        out,
        seen: &mut seen,
    }
    .deserialize(&mut de)?;
    de.end()?;
    // A column the object leaves out is NULL, which only an `Option` takes.
    let missing = columns
        .iter()
        .enumerate()
        .any(|(i, c)| !c.nullable && (i >= 64 || seen & (1 << i) == 0));
    if missing {
        return Err(serde::de::Error::custom(
            "a column that takes no NULL is missing",
        ));
    }
    Ok(())
}

/// Writes into `out` the canonical text of the row's key
/// ([`crate::value::canonical_key`]) from the row's values, for keys whose
/// columns are integers, booleans, or stored as the text their JSON string
/// holds (text, numerics, times, dates). `false` for any other key: the
/// caller works it out from [`Value`]s.
pub(crate) fn canonical_key(
    table: &Table,
    key: &[usize],
    row: &[Param<'_>],
    out: &mut Vec<u8>,
) -> bool {
    use std::io::Write;
    out.clear();
    out.push(b'[');
    for (n, &i) in key.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let written = match (table.columns[i].kind, &row[i]) {
            (Kind::Int16 | Kind::Int32 | Kind::Int64, Param::Integer(v)) => {
                write!(out, "{v}").is_ok()
            }
            (Kind::Bool, Param::Integer(v)) => {
                out.extend_from_slice(if *v != 0 { b"true" } else { b"false" });
                true
            }
            (
                Kind::Text | Kind::Numeric | Kind::Timestamptz | Kind::Timestamp | Kind::Date,
                Param::Text(s),
            ) => serde_json::to_writer(&mut *out, s.as_ref()).is_ok(),
            _ => false,
        };
        if !written {
            return false;
        }
    }
    out.push(b']');
    true
}

struct RowSeed<'c, 'o, 'm> {
    columns: &'c [Column],
    out: &'o mut Vec<Param<'m>>,
    seen: &'o mut u64,
}

impl<'de, 'c, 'o> DeserializeSeed<'de> for RowSeed<'c, 'o, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, 'c, 'o> Visitor<'de> for RowSeed<'c, 'o, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of the row's columns")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(column) = map.next_key_seed(ColumnSeed(self.columns))? {
            match column {
                Some(i) => {
                    let c = &self.columns[i];
                    self.out[i] = map.next_value_seed(ValueSeed {
                        kind: c.kind,
                        nullable: c.nullable,
                    })?;
                    if i < 64 {
                        *self.seen |= 1 << i;
                    }
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A member's name: the position of the column it names, if any.
struct ColumnSeed<'c>(&'c [Column]);

impl<'de> DeserializeSeed<'de> for ColumnSeed<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for ColumnSeed<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a column's name")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|c| c.name == name))
    }
}

/// One column's value, read as its kind says.
struct ValueSeed {
    kind: Kind,
    nullable: bool,
}

fn decline<T, E: serde::de::Error>() -> Result<T, E> {
    Err(E::custom("not a value this column takes as it is"))
}

impl<'de> DeserializeSeed<'de> for ValueSeed {
    type Value = Param<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Param<'de>, D::Error> {
        match self.kind {
            // Documents and arrays: the codec's own reading of the value,
            // then the checks the field would make.
            Kind::Json | Kind::Array(_) => {
                let json = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
                let value = Value::from_json(self.kind, json)
                    .map_err(|e| serde::de::Error::custom(e.to_string()))?;
                if fits(self.kind, self.nullable, &value) {
                    Ok(Param::of(&value))
                } else {
                    decline()
                }
            }
            _ => d.deserialize_any(self),
        }
    }
}

/// Whether a value read by `Value::from_json` would pass the field's own
/// conversion, for the kinds that can hold NULL items or values out of range.
fn fits(kind: Kind, nullable: bool, value: &Value) -> bool {
    match (kind, value) {
        (_, Value::Null) => nullable,
        (Kind::Array(inner), Value::Array(items)) => {
            items.iter().all(|item| fits(*inner, false, item))
        }
        (Kind::Int16, Value::Int(i)) => i16::try_from(*i).is_ok(),
        (Kind::Int32, Value::Int(i)) => i32::try_from(*i).is_ok(),
        (Kind::Float32, _) => false,
        _ => true,
    }
}

impl<'de> Visitor<'de> for ValueSeed {
    type Value = Param<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a value of kind {}", self.kind)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Param<'de>, E> {
        if self.nullable {
            Ok(Param::Null)
        } else {
            decline()
        }
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Param<'de>, E> {
        match self.kind {
            Kind::Bool => Ok(Param::Integer(i64::from(b))),
            _ => decline(),
        }
    }

    fn visit_i64<E: serde::de::Error>(self, i: i64) -> Result<Param<'de>, E> {
        match self.kind {
            Kind::Int64 => Ok(Param::Integer(i)),
            Kind::Int32 if i32::try_from(i).is_ok() => Ok(Param::Integer(i)),
            Kind::Int16 if i16::try_from(i).is_ok() => Ok(Param::Integer(i)),
            Kind::Float64 | Kind::Float32 => self.visit_f64(i as f64),
            _ => decline(),
        }
    }

    fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Param<'de>, E> {
        match (self.kind, i64::try_from(u)) {
            (Kind::Float64 | Kind::Float32, _) => self.visit_f64(u as f64),
            (_, Ok(i)) => self.visit_i64(i),
            (_, Err(_)) => decline(),
        }
    }

    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Param<'de>, E> {
        match self.kind {
            Kind::Float64 => Ok(Param::Real(f)),
            Kind::Float32 => Ok(Param::Real(f64::from(f as f32))),
            _ => decline(),
        }
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Param<'de>, E> {
        match self.kind {
            Kind::Text | Kind::Numeric => Ok(Param::Text(Cow::Borrowed(s))),
            _ => self.visit_str(s),
        }
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Param<'de>, E> {
        match self.kind {
            Kind::Text | Kind::Numeric => Ok(Param::Text(Cow::Owned(s.to_string()))),
            Kind::Float64 | Kind::Float32 => match s.parse::<f64>() {
                Ok(f) => self.visit_f64(f),
                Err(_) => decline(),
            },
            // Bytes, times and dates: the codec's own reading of the text,
            // stored in its canonical form.
            Kind::Bytes | Kind::Timestamptz | Kind::Timestamp | Kind::Date => {
                match Value::from_json(self.kind, serde_json::Value::String(s.to_string())) {
                    Ok(value) => Ok(Param::of(&value)),
                    Err(_) => decline(),
                }
            }
            _ => decline(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
    use magic_sync_core::wire;
    use magic_sync_core::{Numeric, Row};

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "every_kind", down, all, key(id, code, day))]
    struct EveryKind {
        id: i64,
        code: String,
        day: NaiveDate,
        small: i16,
        medium: i32,
        flag: bool,
        single: f32,
        double: f64,
        note: Option<String>,
        raw: Vec<u8>,
        price: Numeric,
        at: DateTime<Utc>,
        local: NaiveDateTime,
        doc: Option<serde_json::Value>,
        counts: Vec<i32>,
        tags: Option<Vec<String>>,
    }

    fn document(changes: &[(&str, serde_json::Value)]) -> Vec<u8> {
        let mut object = serde_json::json!({
            "id": 7, "code": "a\"b", "day": "2024-02-29", "small": -3, "medium": 70000,
            "flag": true, "single": 1.1, "double": 2.5, "note": null, "raw": "AAEC",
            "price": "12.50", "at": "2024-01-02T03:04:05.123+02:00",
            "local": "2024-01-02T03:04:05", "doc": {"a": [1, null]}, "counts": [1, 2],
            "tags": ["x"]
        });
        for (name, value) in changes {
            object[*name] = value.clone();
        }
        serde_json::to_vec(&object).expect("encodes")
    }

    /// Whatever the document, the row is read into exactly the values the
    /// codec's decoding stores, or refused with the codec's error; and when
    /// the JSON reading takes it as it is, it agrees with the codec.
    /// Documents of every kind of value, good and bad, and each column
    /// left out in turn.
    fn documents(table: &Table) -> Vec<Vec<u8>> {
        use serde_json::json;
        let mut documents = vec![
            document(&[]),
            document(&[
                ("note", json!("hi")),
                ("tags", json!(null)),
                ("doc", json!(null)),
            ]),
            document(&[("small", json!(40000))]),
            document(&[("medium", json!(1_i64 << 40))]),
            document(&[("id", json!(u64::MAX))]),
            document(&[("id", json!(1.0))]),
            document(&[("double", json!(3))]),
            document(&[("double", json!("NaN"))]),
            document(&[("single", json!(1e300))]),
            document(&[("flag", json!(1))]),
            document(&[("code", json!(null))]),
            document(&[("code", json!("\u{e9}\\n"))]),
            document(&[("price", json!(12.5))]),
            document(&[("at", json!("yesterday"))]),
            document(&[("day", json!("2024-02-30"))]),
            document(&[("raw", json!("not base64!"))]),
            document(&[("counts", json!([1, null]))]),
            document(&[("counts", json!([1, 1_i64 << 40]))]),
            document(&[("tags", json!([]))]),
            document(&[("unknown", json!({"deep": [1]}))]),
            br#"{"id": 7, "id": 8}"#.to_vec(),
            br#"[1, 2]"#.to_vec(),
            br#"{"id": 7} trailing"#.to_vec(),
            b"not json".to_vec(),
        ];
        // Every column left out in turn.
        let full: serde_json::Value = serde_json::from_slice(&document(&[])).expect("json");
        for column in &table.columns {
            let mut object = full.clone();
            object.as_object_mut().expect("object").remove(&column.name);
            documents.push(serde_json::to_vec(&object).expect("encodes"));
        }
        documents
    }

    #[test]
    fn rows_are_read_as_the_codec_reads_them() {
        let codec = Codec::new(wire::Codec::of::<EveryKind>());
        let table = codec.table();
        let documents = documents(table);
        let mut fast = 0;
        for bytes in &documents {
            let expected = codec
                .decode(bytes)
                .map(|values| values.iter().map(lite::to_sqlite).collect::<Vec<_>>());
            let mut out = Vec::new();
            let read = read(&codec, bytes, &mut out);
            let text = String::from_utf8_lossy(bytes);
            match (&expected, read) {
                (Ok(values), Ok(())) => {
                    let got: Vec<Lite> = out.iter().map(Param::owned).collect();
                    // As text, so that NaN is NaN.
                    assert_eq!(format!("{got:?}"), format!("{values:?}"), "{text}");
                }
                (Err(e), Err(got)) => assert_eq!(got.to_string(), e.to_string(), "{text}"),
                (expected, got) => panic!("{text}: the codec {expected:?}, read {got:?}"),
            }
            let mut direct = Vec::new();
            if read_json(&table.columns, bytes, &mut direct).is_ok() {
                fast += 1;
                let got: Vec<Lite> = direct.iter().map(Param::owned).collect();
                let expected = expected.as_ref().expect("the codec takes it too");
                assert_eq!(format!("{got:?}"), format!("{expected:?}"), "{text}");
                let mut key = Vec::new();
                if canonical_key(table, &table.key_positions(), &direct, &mut key) {
                    let values = codec.decode(bytes).expect("decodes");
                    let of_row: Vec<Value> = table
                        .key_positions()
                        .into_iter()
                        .map(|i| values[i].clone())
                        .collect();
                    assert_eq!(
                        String::from_utf8(key).expect("text"),
                        crate::value::canonical_key(&of_row),
                        "{text}"
                    );
                }
            }
        }
        assert!(
            fast >= 5,
            "the JSON reading took {fast} documents as they are"
        );
    }

    /// A table read from the server's description takes, refuses and
    /// writes every row as the host's declaration of it does.
    #[test]
    fn a_described_table_reads_and_writes_rows_as_its_declaration() {
        let declared = Codec::new(wire::Codec::of::<EveryKind>());
        let engine = magic_sync_core::engine::Engine::builder()
            .table::<EveryKind>()
            .build()
            .expect("declarations");
        let schema = magic_sync_core::schema::Schema::new(&engine, &[]);
        let shapes = crate::shape::Shapes::described(&schema).expect("all JSON");
        let described = shapes.codec("every_kind").expect("described");
        assert_eq!(described.table(), declared.table());
        let mut taken = 0;
        for bytes in &documents(declared.table()) {
            let text = String::from_utf8_lossy(bytes);
            let (want, got) = (declared.decode(bytes), described.decode(bytes));
            match (&want, &got) {
                (Ok(want), Ok(got)) => {
                    taken += 1;
                    assert_eq!(format!("{got:?}"), format!("{want:?}"), "{text}");
                    let written = declared.encode(want.clone()).expect("encodes");
                    assert_eq!(
                        described.encode(got.clone()).expect("encodes"),
                        written,
                        "{text}"
                    );
                }
                (Err(want), Err(got)) => assert_eq!(got.to_string(), want.to_string(), "{text}"),
                _ => panic!("{text}: declared {want:?}, described {got:?}"),
            }
        }
        assert!(taken >= 5, "{taken} documents taken");
    }
}
