//! Codec round trips through a real PostgreSQL row and a real SQLite row.

use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone, Utc};
use magic_sync::codec::ProtoMapping;
use magic_sync::value::Value;
use magic_sync::{lite, pg, wire, Columns, Numeric, Row};

const SQL: &str = "
CREATE TABLE kinds (
    id      bigint PRIMARY KEY,
    flag    boolean,
    small   smallint,
    medium  integer,
    big     bigint,
    real4   real,
    double8 double precision,
    label   text,
    name    varchar(40),
    blob    bytea,
    amount  numeric,
    at      timestamptz,
    local   timestamp,
    day     date,
    doc     jsonb,
    tags    text[],
    counts  integer[]
);
INSERT INTO kinds (id) VALUES (1);
INSERT INTO kinds VALUES (2, true, -32768, 2147483647, -9223372036854775808, 1.5, 0.1,
    'naïve café ☕ 日本語 😀', 'O''Brien \"quoted\"', '\\x00ff10', '12345678901234567890.123456789',
    '2024-03-01 12:34:56.123456+05:30', '1999-12-31 23:59:59.999999', '2024-02-29',
    '{\"a\": [1, 2.5, null, \"x\"], \"b\": {\"c\": true}}', ARRAY['a', 'b,c', '', 'ü'], ARRAY[1, -2, 3]);
INSERT INTO kinds (id, label, blob, amount, tags, counts)
    VALUES (3, repeat('long text ✓ ', 100000), decode(repeat('00ff7f80', 262144), 'hex'), 'NaN', '{}', '{}');
INSERT INTO kinds (id, flag, amount, at, double8)
    VALUES (4, false, '-0.000000000000000000000000000001', '1970-01-01 00:00:00+00', -1e300);
";

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "kinds", down, all, key(id), codec = json)]
struct Kinds {
    id: i64,
    flag: Option<bool>,
    small: Option<i16>,
    medium: Option<i32>,
    big: Option<i64>,
    real4: Option<f32>,
    double8: Option<f64>,
    label: Option<String>,
    name: Option<String>,
    blob: Option<Vec<u8>>,
    amount: Option<Numeric>,
    at: Option<DateTime<Utc>>,
    local: Option<NaiveDateTime>,
    day: Option<NaiveDate>,
    doc: Option<serde_json::Value>,
    tags: Option<Vec<String>>,
    counts: Option<Vec<i32>>,
}

/// The same table, travelling as a protobuf message of its own.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "kinds", down, all, key(id), codec = protobuf(KindsPb))]
struct KindsProto {
    id: i64,
    flag: Option<bool>,
    small: Option<i16>,
    medium: Option<i32>,
    big: Option<i64>,
    real4: Option<f32>,
    double8: Option<f64>,
    label: Option<String>,
    name: Option<String>,
    blob: Option<Vec<u8>>,
    amount: Option<Numeric>,
    at: Option<DateTime<Utc>>,
    local: Option<NaiveDateTime>,
    day: Option<NaiveDate>,
    doc: Option<serde_json::Value>,
    tags: Option<Vec<String>>,
    counts: Option<Vec<i32>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct KindsPb {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(bool, optional, tag = "2")]
    flag: Option<bool>,
    #[prost(int32, optional, tag = "3")]
    small: Option<i32>,
    #[prost(int32, optional, tag = "4")]
    medium: Option<i32>,
    #[prost(int64, optional, tag = "5")]
    big: Option<i64>,
    #[prost(float, optional, tag = "6")]
    real4: Option<f32>,
    #[prost(double, optional, tag = "7")]
    double8: Option<f64>,
    #[prost(string, optional, tag = "8")]
    label: Option<String>,
    #[prost(string, optional, tag = "9")]
    name: Option<String>,
    #[prost(bytes = "vec", optional, tag = "10")]
    blob: Option<Vec<u8>>,
    #[prost(string, optional, tag = "11")]
    amount: Option<String>,
    #[prost(int64, optional, tag = "12")]
    at_micros: Option<i64>,
    #[prost(string, optional, tag = "13")]
    local: Option<String>,
    #[prost(string, optional, tag = "14")]
    day: Option<String>,
    #[prost(string, optional, tag = "15")]
    doc: Option<String>,
    #[prost(string, repeated, tag = "16")]
    tags: Vec<String>,
    #[prost(bool, tag = "17")]
    has_tags: bool,
    #[prost(int32, repeated, tag = "18")]
    counts: Vec<i32>,
    #[prost(bool, tag = "19")]
    has_counts: bool,
}

const LOCAL: &str = "%Y-%m-%dT%H:%M:%S%.6f";

impl ProtoMapping<KindsPb> for KindsProto {
    fn to_proto(&self) -> KindsPb {
        KindsPb {
            id: self.id,
            flag: self.flag,
            small: self.small.map(i32::from),
            medium: self.medium,
            big: self.big,
            real4: self.real4,
            double8: self.double8,
            label: self.label.clone(),
            name: self.name.clone(),
            blob: self.blob.clone(),
            amount: self.amount.as_ref().map(|a| a.0.clone()),
            at_micros: self.at.map(|t| t.timestamp_micros()),
            local: self.local.map(|t| t.format(LOCAL).to_string()),
            day: self.day.map(|d| d.to_string()),
            doc: self.doc.as_ref().map(|d| d.to_string()),
            tags: self.tags.clone().unwrap_or_default(),
            has_tags: self.tags.is_some(),
            counts: self.counts.clone().unwrap_or_default(),
            has_counts: self.counts.is_some(),
        }
    }

    fn from_proto(m: KindsPb) -> Result<Self, String> {
        Ok(KindsProto {
            id: m.id,
            flag: m.flag,
            small: m
                .small
                .map(i16::try_from)
                .transpose()
                .map_err(|e| e.to_string())?,
            medium: m.medium,
            big: m.big,
            real4: m.real4,
            double8: m.double8,
            label: m.label,
            name: m.name,
            blob: m.blob,
            amount: m.amount.map(Numeric),
            at: m
                .at_micros
                .map(|us| {
                    Utc.timestamp_micros(us)
                        .single()
                        .ok_or("timestamp out of range")
                })
                .transpose()?,
            local: m
                .local
                .map(|s| NaiveDateTime::parse_from_str(&s, LOCAL).map_err(|e| e.to_string()))
                .transpose()?,
            day: m
                .day
                .map(|s| s.parse().map_err(|e: chrono::ParseError| e.to_string()))
                .transpose()?,
            doc: m
                .doc
                .map(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
                .transpose()?,
            tags: m.has_tags.then_some(m.tags),
            counts: m.has_counts.then_some(m.counts),
        })
    }
}

/// Every row of `kinds`, read out of PostgreSQL the way the loader reads rows.
async fn from_postgres() -> Vec<Vec<Value>> {
    let db = magic_sync_testdb::database().await;
    let client = db.connect().await;
    client.batch_execute(SQL).await.expect("kinds table");
    let query = format!(
        "SELECT {} FROM kinds AS k ORDER BY id",
        pg::select_list("k", &Kinds::TABLE)
    );
    client
        .query(&query, &[])
        .await
        .expect("select kinds")
        .iter()
        .map(|r| pg::read_row(r, 0, &Kinds::TABLE).expect("every row reads"))
        .collect()
}

#[tokio::test]
async fn postgres_values_arrive_as_the_fields_say() {
    let rows = from_postgres().await;
    assert_eq!(rows.len(), 4);
    let all_null = Kinds::from_values(rows[0].clone()).unwrap();
    assert_eq!(all_null.label, None);
    assert_eq!(all_null.tags, None);
    let full = Kinds::from_values(rows[1].clone()).unwrap();
    assert_eq!(full.flag, Some(true));
    assert_eq!(full.small, Some(i16::MIN));
    assert_eq!(full.medium, Some(i32::MAX));
    assert_eq!(full.big, Some(i64::MIN));
    assert_eq!(full.real4, Some(1.5));
    assert_eq!(full.double8, Some(0.1));
    assert_eq!(full.label.as_deref(), Some("naïve café ☕ 日本語 😀"));
    assert_eq!(full.name.as_deref(), Some("O'Brien \"quoted\""));
    assert_eq!(full.blob, Some(vec![0x00, 0xff, 0x10]));
    assert_eq!(
        full.amount,
        Some(Numeric("12345678901234567890.123456789".into()))
    );
    assert_eq!(
        full.at,
        Some(
            Utc.with_ymd_and_hms(2024, 3, 1, 7, 4, 56).unwrap()
                + chrono::Duration::microseconds(123456)
        )
    );
    assert_eq!(
        full.local.unwrap().format(LOCAL).to_string(),
        "1999-12-31T23:59:59.999999"
    );
    assert_eq!(full.day, NaiveDate::from_ymd_opt(2024, 2, 29));
    assert_eq!(
        full.doc,
        Some(serde_json::json!({"a": [1, 2.5, null, "x"], "b": {"c": true}}))
    );
    assert_eq!(
        full.tags,
        Some(vec!["a".into(), "b,c".into(), "".into(), "ü".into()])
    );
    assert_eq!(full.counts, Some(vec![1, -2, 3]));
    let large = Kinds::from_values(rows[2].clone()).unwrap();
    assert_eq!(
        large.label.as_ref().map(|l| l.chars().count()),
        Some(1_200_000)
    );
    assert_eq!(large.blob.as_ref().map(Vec::len), Some(1 << 20));
    assert_eq!(large.amount, Some(Numeric("NaN".into())));
    assert_eq!(large.tags, Some(vec![]));
    let edge = Kinds::from_values(rows[3].clone()).unwrap();
    assert_eq!(
        edge.amount,
        Some(Numeric("-0.000000000000000000000000000001".into()))
    );
    assert_eq!(edge.double8, Some(-1e300));
}

#[tokio::test]
async fn json_and_protobuf_codecs_round_trip_every_kind() {
    let rows = from_postgres().await;
    for codec in [wire::Codec::of::<Kinds>(), wire::Codec::of::<KindsProto>()] {
        for values in &rows {
            let bytes = codec.encode(values.clone()).expect("encodes");
            let back = codec.decode(&bytes).expect("decodes");
            assert_eq!(&back, values, "{} round trip", codec.format());
        }
    }
    assert_eq!(wire::Codec::of::<Kinds>().format(), "json");
    assert_eq!(wire::Codec::of::<KindsProto>().format(), "protobuf");
}

#[tokio::test]
async fn json_is_an_object_of_the_columns() {
    let rows = from_postgres().await;
    let bytes = wire::Codec::of::<Kinds>().encode(rows[1].clone()).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(json["label"], "naïve café ☕ 日本語 😀");
    assert_eq!(json["amount"], "12345678901234567890.123456789");
    assert_eq!(json["at"], "2024-03-01T07:04:56.123456Z");
    assert_eq!(json["blob"], "AP8Q");
    assert_eq!(json["tags"], serde_json::json!(["a", "b,c", "", "ü"]));
}

#[tokio::test]
async fn json_is_written_byte_for_byte_as_serde_json_prints_the_object() {
    // The codec writes the object straight rather than building it; the
    // bytes (stored once per body, by their hash) are the object's.
    let columns = wire::Codec::of::<Kinds>();
    for values in from_postgres().await {
        let bytes = columns.encode(values.clone()).unwrap();
        let mut object = serde_json::Map::new();
        for (column, value) in <Kinds as magic_sync::Columns>::COLUMNS.iter().zip(&values) {
            object.insert(column.name.to_string(), value.to_json());
        }
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            serde_json::to_string(&object).unwrap()
        );
    }
}

#[tokio::test]
async fn rows_round_trip_through_a_real_sqlite_file() {
    let rows = from_postgres().await;
    let dir = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("replica.sqlite")).unwrap();
    conn.execute_batch(&lite::create_table(&Kinds::TABLE))
        .unwrap();
    let columns: Vec<&str> = Kinds::COLUMNS.iter().map(|c| c.name).collect();
    let insert = format!(
        "INSERT INTO kinds ({}) VALUES ({})",
        columns.join(", "),
        vec!["?"; columns.len()].join(", ")
    );
    for values in &rows {
        let params: Vec<rusqlite::types::Value> = values.iter().map(lite::to_sqlite).collect();
        conn.execute(&insert, rusqlite::params_from_iter(params))
            .unwrap();
    }
    drop(conn);
    let conn = rusqlite::Connection::open(dir.path().join("replica.sqlite")).unwrap();
    let mut select = conn
        .prepare(&format!(
            "SELECT {} FROM kinds ORDER BY id",
            columns.join(", ")
        ))
        .unwrap();
    let back: Vec<Vec<Value>> = select
        .query_map([], |r| Ok(lite::read_row(r, 0, &Kinds::TABLE)))
        .unwrap()
        .map(|r| r.unwrap().unwrap())
        .collect();
    assert_eq!(back, rows);
}

#[test]
fn a_row_that_does_not_fit_its_fields_does_not_encode() {
    let codec = wire::Codec::of::<Kinds>();
    let mut values = vec![Value::Null; Kinds::COLUMNS.len()];
    // `id` is not an Option.
    let err = codec.encode(values.clone()).expect_err("NULL key");
    assert!(err.to_string().contains("column `id`"), "{err}");
    values[0] = Value::Int(1);
    values[2] = Value::Int(70_000);
    let err = codec.encode(values).expect_err("out of range");
    assert!(err.to_string().contains("column `small`"), "{err}");
    let err = codec.decode(b"{not json").expect_err("malformed");
    assert!(err.to_string().contains("malformed json"), "{err}");
}
