//! The tables as this replica holds them, owned: what each is made of and
//! how its rows are read and written.
//!
//! Everything in the replica that builds SQL, reads keys or notes writes
//! works from these, never from a host's `'static` declarations. They are
//! made from the host's engine ([`Shapes::of`]), or from the server's
//! description of the tables ([`Shapes::described`]) for a replica with no
//! declarations of its own, whose rows are read and written as JSON by
//! their columns' kinds exactly as a Rust field of that kind would take
//! them ([`fit`]).

use crate::value::{Kind, Value, ValueError};
use magic_sync_core::codec::CodecError;
use magic_sync_core::engine::Engine;
use magic_sync_core::row::Mirror;
use magic_sync_core::schema::{Schema, TableSchema};
use magic_sync_core::wire;
use std::collections::HashMap;

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    /// Its name, in PostgreSQL and SQLite alike.
    pub name: String,
    /// The kind of value it holds.
    pub kind: Kind,
    /// Whether it takes NULL.
    pub nullable: bool,
    /// Whether its values are checked beyond their kind by the codec
    /// (`Field::CHECKED`), so that a row is read through the codec.
    pub checked: bool,
}

/// One table: its columns, key, direction and the columns the replica
/// treats apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    /// Its name.
    pub name: String,
    /// Which way its rows travel.
    pub mirror: Mirror,
    /// Its columns, in declared order.
    pub columns: Vec<Column>,
    /// Its key columns, in declared order.
    pub key: Vec<String>,
    /// The columns the replica owns (two-way tables).
    pub owned: Vec<String>,
    /// The column naming the replica that wrote a record (up tables).
    pub origin: Option<String>,
    /// The replica-side column set when a row is retired.
    pub retired: Option<String>,
    /// The upload lane its writes go on; `None`: the first lane.
    pub lane: Option<String>,
}

impl Table {
    /// The table a host declared.
    pub fn of(declared: &magic_sync_core::row::Table) -> Table {
        let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        Table {
            name: declared.name.to_string(),
            mirror: declared.mirror,
            columns: declared
                .columns
                .iter()
                .map(|c| Column {
                    name: c.name.to_string(),
                    kind: c.kind,
                    nullable: c.nullable,
                    checked: c.checked,
                })
                .collect(),
            key: names(declared.key),
            owned: names(declared.owned),
            origin: declared.origin.map(str::to_string),
            retired: declared.retired.map(str::to_string),
            lane: declared.lane.map(str::to_string),
        }
    }

    /// The table the server described; its writes go on the first lane.
    pub fn described(described: &TableSchema) -> Table {
        Table {
            name: described.name.clone(),
            mirror: described.mirror,
            columns: described
                .columns
                .iter()
                .map(|c| Column {
                    name: c.name.clone(),
                    kind: c.kind,
                    nullable: c.nullable,
                    checked: false,
                })
                .collect(),
            key: described.key.clone(),
            owned: described.owned.clone(),
            origin: described.origin.clone(),
            retired: described.retired.clone(),
            lane: None,
        }
    }

    /// The column called `name`, if the table has one.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Whether the replica owns column `column`.
    pub fn owns(&self, column: &str) -> bool {
        self.owned.iter().any(|o| o == column)
    }

    /// The positions of the key columns among the columns, in key order.
    pub fn key_positions(&self) -> Vec<usize> {
        self.key
            .iter()
            .filter_map(|k| self.columns.iter().position(|c| &c.name == k))
            .collect()
    }
}

/// A table with the codec its rows travel in.
#[derive(Debug, Clone)]
pub(crate) struct Codec {
    table: Table,
    inner: Inner,
}

#[derive(Debug, Clone)]
enum Inner {
    /// The codec the host declared.
    Declared(wire::Codec),
    /// JSON by the table's columns, for a table the server described.
    Described {
        /// Column positions in the order an object's keys are written: by
        /// name, as the declared JSON codec writes them.
        order: Vec<usize>,
    },
}

impl Codec {
    /// The table `inner` declares, travelling in it.
    pub fn new(inner: wire::Codec) -> Codec {
        Codec {
            table: Table::of(inner.table()),
            inner: Inner::Declared(inner),
        }
    }

    /// `table` in JSON by its columns.
    pub fn described(table: Table) -> Codec {
        let mut order: Vec<usize> = (0..table.columns.len()).collect();
        order.sort_by(|&a, &b| table.columns[a].name.cmp(&table.columns[b].name));
        Codec {
            table,
            inner: Inner::Described { order },
        }
    }

    /// The table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// `json` or `protobuf`.
    pub fn format(&self) -> &'static str {
        match &self.inner {
            Inner::Declared(codec) => codec.format(),
            Inner::Described { .. } => "json",
        }
    }

    /// Encodes a row given as its column values, in column order.
    pub fn encode(&self, values: Vec<Value>) -> Result<Vec<u8>, CodecError> {
        let order = match &self.inner {
            Inner::Declared(codec) => return codec.encode(values),
            Inner::Described { order } => order,
        };
        let columns = &self.table.columns;
        if values.len() != columns.len() {
            return Err(CodecError::Mapping(format!(
                "{} values for {} columns",
                values.len(),
                columns.len()
            )));
        }
        let values = columns
            .iter()
            .zip(values)
            .map(|(c, v)| fit(c.kind, c.nullable, v).map_err(|e| e.in_column(&c.name)))
            .collect::<Result<Vec<Value>, ValueError>>()?;
        magic_sync_core::codec::json_object(order, |i| &columns[i].name, &values)
    }

    /// Decodes a row into its column values, in column order.
    pub fn decode(&self, bytes: &[u8]) -> Result<Vec<Value>, CodecError> {
        if let Inner::Declared(codec) = &self.inner {
            return codec.decode(bytes);
        }
        let mut object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes)
            .map_err(|e| CodecError::Malformed {
                format: "json",
                reason: e.to_string(),
            })?;
        let mut values = Vec::with_capacity(self.table.columns.len());
        for c in &self.table.columns {
            let json = object.remove(&c.name).unwrap_or(serde_json::Value::Null);
            let value = Value::from_json(c.kind, json)
                .and_then(|v| fit(c.kind, c.nullable, v))
                .map_err(|e| e.in_column(&c.name))?;
            values.push(value);
        }
        Ok(values)
    }
}

/// What a declared field of `kind` (an `Option` when `nullable`) makes of
/// `value`, read as that kind: the checks and conversions of the crate's
/// own fields (`Field::from_value`), so that a table read from the
/// server's description takes or refuses a row exactly as a host's
/// declaration of it would.
fn fit(kind: Kind, nullable: bool, value: Value) -> Result<Value, ValueError> {
    let out_of_range = |i: i64| ValueError {
        column: None,
        expected: kind.to_string(),
        found: format!("integer {i}, out of range"),
    };
    match (kind, value) {
        (_, Value::Null) if nullable => Ok(Value::Null),
        (_, Value::Null) => Err(ValueError::mismatch(kind, &Value::Null)),
        (Kind::Int16, Value::Int(i)) => match i16::try_from(i) {
            Ok(_) => Ok(Value::Int(i)),
            Err(_) => Err(out_of_range(i)),
        },
        (Kind::Int32, Value::Int(i)) => match i32::try_from(i) {
            Ok(_) => Ok(Value::Int(i)),
            Err(_) => Err(out_of_range(i)),
        },
        (Kind::Float32, Value::Float(f)) => Ok(Value::Float(f64::from(f as f32))),
        (Kind::Array(inner), Value::Array(items)) => items
            .into_iter()
            .map(|item| fit(*inner, false, item))
            .collect::<Result<Vec<Value>, ValueError>>()
            .map(Value::Array),
        // Read as `kind` already: nothing more to check.
        (_, value) => Ok(value),
    }
}

/// Every table the replica holds or writes, in the order they were
/// declared.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shapes {
    codecs: Vec<Codec>,
    by_name: HashMap<String, usize>,
}

impl Shapes {
    /// The tables `engine` declares.
    pub fn of(engine: &Engine) -> Shapes {
        Shapes::from_codecs(
            engine
                .codecs()
                .iter()
                .map(|c| Codec::new(c.clone()))
                .collect(),
        )
    }

    /// The tables of `schema`, as the server described them. A table whose
    /// rows travel in any codec but JSON cannot be read without the host's
    /// declaration of it: each is named, and nothing is made.
    pub fn described(schema: &Schema) -> Result<Shapes, Vec<String>> {
        let unreadable: Vec<String> = schema
            .tables()
            .iter()
            .filter(|t| t.codec != "json")
            .map(|t| {
                format!(
                    "table `{}`: its rows travel in {}, which a replica without the host's declarations cannot read (declare it in Rust, or have it travel in JSON)",
                    t.name, t.codec
                )
            })
            .collect();
        if !unreadable.is_empty() {
            return Err(unreadable);
        }
        Ok(Shapes::from_codecs(
            schema
                .tables()
                .iter()
                .map(|t| Codec::described(Table::described(t)))
                .collect(),
        ))
    }

    fn from_codecs(codecs: Vec<Codec>) -> Shapes {
        let by_name = codecs
            .iter()
            .enumerate()
            .map(|(i, c)| (c.table.name.clone(), i))
            .collect();
        Shapes { codecs, by_name }
    }

    /// The table called `name`, with its codec.
    pub fn codec(&self, name: &str) -> Option<&Codec> {
        self.by_name.get(name).map(|&i| &self.codecs[i])
    }

    /// Every table, in declared order.
    pub fn tables(&self) -> impl Iterator<Item = &Table> {
        self.codecs.iter().map(|c| &c.table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magic_sync_core::codec::Codec as Declared;
    use magic_sync_core::Row;

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "readings", down, all, key(id))]
    struct Reading {
        id: i64,
        value: f64,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "notes", down, all, key(id))]
    struct Note {
        id: i64,
        body: String,
    }

    #[test]
    fn a_table_in_another_codec_than_json_is_named_and_nothing_is_made() {
        let engine = Engine::builder()
            .table_with::<Reading>(Declared::custom(
                "protobuf",
                |_| Ok(Vec::new()),
                |_| Err(CodecError::Mapping("unused".into())),
            ))
            .table::<Note>()
            .build()
            .expect("declarations");
        let schema = Schema::new(&engine, &[]);
        let problems = Shapes::described(&schema).expect_err("protobuf is refused");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("table `readings`: its rows travel in protobuf"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_described_table_writes_its_columns_by_name_and_checks_their_ranges() {
        let engine = Engine::builder().table::<Note>().build().expect("ok");
        let shapes = Shapes::described(&Schema::new(&engine, &[])).expect("json");
        let notes = shapes.codec("notes").expect("described");
        let row = vec![Value::Int(7), Value::Text("hi".into())];
        assert_eq!(
            notes.encode(row).expect("encodes"),
            br#"{"body":"hi","id":7}"#
        );
        let wrong = notes
            .encode(vec![Value::Int(7)])
            .expect_err("one value short");
        assert_eq!(
            wrong.to_string(),
            "the mapping refused the row: 1 values for 2 columns"
        );
        let missing = notes
            .decode(br#"{"id": 7}"#)
            .expect_err("body takes no NULL");
        assert!(missing.to_string().contains("body"), "{missing}");
    }
}
