//! What `#[derive(Row)]` and `#[derive(Columns)]` generate, checked at run time (no database).

use magic_sync::codec::{CodecError, ProtoMapping};
use magic_sync::row::{Column, GroupRule, Mirror, Row, Rule, Table};
use magic_sync::value::{Kind, Value, ValueError};
use magic_sync::{Columns, Numeric};

#[derive(Debug, Clone, PartialEq, magic_sync::Row)]
#[row(down, replica = "unit_id", key(id))]
struct Order {
    id: i64,
    unit_id: i32,
    price: Numeric,
    note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, magic_sync::Row)]
#[row(table = "order_lines", schema = "sales", down)]
#[row(follows = "region, order_number", key(region, order_number, line))]
#[row(retired = "retired")]
struct OrderLine {
    region: String,
    order_number: i64,
    line: i32,
}

#[derive(Debug, Clone, PartialEq, magic_sync::Row)]
#[row(both, partition = "region_id", key(id))]
struct Shelf {
    id: i64,
    region_id: i32,
    #[row(owned)]
    label: Option<String>,
    #[row(owned)]
    r#type: String,
}

#[derive(Debug, Clone, PartialEq, magic_sync::Row)]
#[row(up, key(origin_id, number))]
struct Sale {
    #[row(origin)]
    origin_id: String,
    number: i64,
    #[row(version)]
    revision: i64,
    total: f64,
}

#[derive(Debug, Clone, PartialEq, magic_sync::Row)]
#[row(
    down,
    key(id),
    group(
        members = "promotion_members",
        member = "promotion_id",
        grants = "unit_groups",
        replica = "unit_id"
    )
)]
struct Promotion {
    id: i64,
}

#[derive(Debug, Clone, PartialEq, magic_sync::Row)]
#[row(down, all, key(code))]
struct HTTPStatus {
    code: i32,
}

#[derive(Debug, Clone, PartialEq, magic_sync::Row)]
#[row(down, referenced, key(id), codec = json)]
struct Unit {
    id: i32,
}

#[derive(Debug, Clone, PartialEq, magic_sync::Columns)]
struct Totals {
    count: i64,
    sum: Option<f64>,
    tags: Vec<String>,
}

const fn col(name: &'static str, kind: Kind, nullable: bool) -> Column {
    Column {
        name,
        kind,
        nullable,
        checked: false,
    }
}

fn order() -> Order {
    Order {
        id: 7,
        unit_id: 3,
        price: Numeric("12.50".into()),
        note: None,
    }
}

#[test]
fn down_replica_table() {
    const EXPECTED: Table = Table {
        name: "order",
        schema: "public",
        rust_type: "Order",
        mirror: Mirror::Down,
        rule: Rule::Replica("unit_id"),
        columns: &[
            col("id", Kind::Int64, false),
            col("unit_id", Kind::Int32, false),
            col("price", Kind::Numeric, false),
            col("note", Kind::Text, true),
        ],
        key: &["id"],
        owned: &[],
        version: None,
        origin: None,
        retired: None,
        lane: None,
    };
    assert_eq!(Order::TABLE, EXPECTED);
    assert_eq!(Order::COLUMNS, EXPECTED.columns);
}

#[test]
fn down_follows_composite_table() {
    const EXPECTED: Table = Table {
        name: "order_lines",
        schema: "sales",
        rust_type: "OrderLine",
        mirror: Mirror::Down,
        rule: Rule::Follows(&["region", "order_number"]),
        columns: &[
            col("region", Kind::Text, false),
            col("order_number", Kind::Int64, false),
            col("line", Kind::Int32, false),
        ],
        key: &["region", "order_number", "line"],
        owned: &[],
        version: None,
        origin: None,
        retired: Some("retired"),
        lane: None,
    };
    assert_eq!(OrderLine::TABLE, EXPECTED);
}

#[test]
fn both_partition_table_with_owned_columns() {
    const EXPECTED: Table = Table {
        name: "shelf",
        schema: "public",
        rust_type: "Shelf",
        mirror: Mirror::Both,
        rule: Rule::Partition("region_id"),
        columns: &[
            col("id", Kind::Int64, false),
            col("region_id", Kind::Int32, false),
            col("label", Kind::Text, true),
            col("type", Kind::Text, false),
        ],
        key: &["id"],
        owned: &["label", "type"],
        version: None,
        origin: None,
        retired: None,
        lane: None,
    };
    assert_eq!(Shelf::TABLE, EXPECTED);
}

#[test]
fn up_table() {
    const EXPECTED: Table = Table {
        name: "sale",
        schema: "public",
        rust_type: "Sale",
        mirror: Mirror::Up,
        rule: Rule::Origin,
        columns: &[
            col("origin_id", Kind::Text, false),
            col("number", Kind::Int64, false),
            col("revision", Kind::Int64, false),
            col("total", Kind::Float64, false),
        ],
        key: &["origin_id", "number"],
        owned: &[],
        version: Some("revision"),
        origin: Some("origin_id"),
        retired: None,
        lane: None,
    };
    assert_eq!(Sale::TABLE, EXPECTED);
}

#[test]
fn group_rule_defaults_its_group_column() {
    let expected = Rule::Group(GroupRule {
        members: "promotion_members",
        member: &["promotion_id"],
        group: "group_id",
        grants: "unit_groups",
        replica: "unit_id",
    });
    assert_eq!(Promotion::TABLE.rule, expected);
    assert_eq!(Promotion::TABLE.mirror, Mirror::Down);
    assert_eq!(Promotion::TABLE.key, &["id"]);
}

#[test]
fn all_and_referenced_rules_and_default_names() {
    assert_eq!(HTTPStatus::TABLE.rule, Rule::All);
    assert_eq!(HTTPStatus::TABLE.name, "http_status");
    assert_eq!(Unit::TABLE.rule, Rule::Referenced);
    assert_eq!(Unit::codec().format(), "json");
}

#[test]
fn values_round_trip_with_options() {
    let with_note = Order {
        note: Some("fragile".into()),
        ..order()
    };
    for row in [order(), with_note] {
        let values = row.to_values();
        assert_eq!(values.len(), Order::COLUMNS.len());
        assert_eq!(Order::from_values(values).unwrap(), row);
    }
    assert_eq!(
        order().to_values(),
        vec![
            Value::Int(7),
            Value::Int(3),
            Value::Numeric("12.50".into()),
            Value::Null
        ]
    );
}

#[test]
fn columns_derive_round_trips() {
    let totals = Totals {
        count: 2,
        sum: None,
        tags: vec!["a".into(), "b".into()],
    };
    assert_eq!(
        Totals::COLUMNS,
        &[
            col("count", Kind::Int64, false),
            col("sum", Kind::Float64, true),
            col("tags", Kind::Array(&Kind::Text), false),
        ]
    );
    assert_eq!(Totals::from_values(totals.to_values()).unwrap(), totals);
}

#[test]
fn missing_values_are_null() {
    let row = Order::from_values(vec![
        Value::Int(1),
        Value::Int(2),
        Value::Numeric("1".into()),
    ]);
    assert_eq!(row.unwrap().note, None);
    let err = Order::from_values(vec![Value::Int(1), Value::Int(2)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "column `price`: expected numeric, found NULL"
    );
}

#[test]
fn surplus_values_are_an_error() {
    let mut values = order().to_values();
    values.push(Value::Null);
    let err = Order::from_values(values).unwrap_err();
    assert_eq!(err.to_string(), "expected 4 values, found 5 values");
}

#[test]
fn value_errors_name_the_column() {
    let mut values = order().to_values();
    values[2] = Value::Text("twelve".into());
    let err = Order::from_values(values).unwrap_err();
    assert_eq!(err.column.as_deref(), Some("price"));
    assert_eq!(
        err.to_string(),
        "column `price`: expected numeric, found text"
    );

    let mut values = order().to_values();
    values[1] = Value::Int(i64::MAX);
    let err: ValueError = Order::from_values(values).unwrap_err();
    assert_eq!(err.column.as_deref(), Some("unit_id"));
}

#[test]
fn json_codec_round_trip() {
    let codec = Order::codec();
    assert_eq!(codec.format(), "json");
    let row = Order {
        note: Some("x".into()),
        ..order()
    };
    let bytes = codec.encode(&row).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"id": 7, "unit_id": 3, "price": "12.50", "note": "x"})
    );
    assert_eq!(codec.decode(&bytes).unwrap(), row);
}

#[test]
fn json_codec_errors_name_the_column() {
    let err = Order::codec()
        .decode(br#"{"id": 7, "unit_id": 3, "price": 12}"#)
        .unwrap_err();
    assert!(
        matches!(&err, CodecError::Value(e) if e.column.as_deref() == Some("price")),
        "{err}"
    );
}

#[derive(Clone, PartialEq, prost::Message)]
struct ReadingProto {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(double, optional, tag = "2")]
    celsius: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, magic_sync::Row)]
#[row(down, all, key(id), codec = protobuf(ReadingProto))]
struct Reading {
    id: i64,
    celsius: Option<f64>,
}

impl ProtoMapping<ReadingProto> for Reading {
    fn to_proto(&self) -> ReadingProto {
        ReadingProto {
            id: self.id,
            celsius: self.celsius,
        }
    }
    fn from_proto(message: ReadingProto) -> Result<Self, String> {
        if message.id <= 0 {
            return Err(format!("id {} is not positive", message.id));
        }
        Ok(Reading {
            id: message.id,
            celsius: message.celsius,
        })
    }
}

#[test]
fn protobuf_codec_round_trip() {
    let codec = Reading::codec();
    assert_eq!(codec.format(), "protobuf");
    for row in [
        Reading {
            id: 1,
            celsius: Some(21.5),
        },
        Reading {
            id: 2,
            celsius: None,
        },
    ] {
        let bytes = codec.encode(&row).unwrap();
        assert_eq!(
            bytes,
            prost::Message::encode_to_vec(&row.to_proto()),
            "the codec writes the mapped message"
        );
        assert_eq!(codec.decode(&bytes).unwrap(), row);
    }
    let refused = codec.decode(&[]).unwrap_err();
    assert_eq!(refused, CodecError::Mapping("id 0 is not positive".into()));
}
