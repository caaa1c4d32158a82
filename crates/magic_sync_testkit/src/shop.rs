//! The test shop's declarations (see shop.sql).

use chrono::{DateTime, Utc};
use magic_sync::codec::{Codec, CodecError};
use magic_sync::{Columns, Engine, Numeric, Row};

pub const SQL: &str = include_str!("shop.sql");

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id), retired = "retired")]
pub struct Product {
    pub id: i64,
    pub name: String,
    pub price: Numeric,
    pub barcode: Option<String>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "customers", down, referenced, key(id), retired = "retired")]
pub struct Customer {
    pub id: i64,
    pub name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "unit_id", key(id))]
pub struct Order {
    pub id: i64,
    pub unit_id: String,
    pub customer_id: Option<i64>,
    pub placed_at: DateTime<Utc>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(
    table = "order_lines",
    down,
    follows = "order_id",
    key(order_id, line_no)
)]
pub struct OrderLine {
    pub order_id: i64,
    pub line_no: i32,
    pub product_id: i64,
    pub qty: i32,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "notices", down, partition = "region_id", key(id))]
pub struct Notice {
    pub id: i64,
    pub region_id: String,
    pub body: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(
    table = "promotions",
    down,
    group(
        members = "promotion_members",
        member = "promotion_id",
        grants = "unit_groups",
        replica = "unit_id"
    ),
    key(id)
)]
pub struct Promotion {
    pub id: i64,
    pub product_id: i64,
    pub discount: i32,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "stock", both, replica = "unit_id", key(unit_id, product_id))]
pub struct Stock {
    pub unit_id: String,
    pub product_id: i64,
    pub on_hand: i32,
    #[row(owned)]
    pub counted: Option<i32>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "sales", up, key(id), key_without_origin)]
pub struct Sale {
    pub id: String,
    #[row(origin)]
    pub unit_id: String,
    pub customer_id: Option<i64>,
    pub total: Numeric,
    #[row(version)]
    pub version: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "events", down, partition = "region", key(region, id))]
pub struct Event {
    pub region: String,
    pub id: i64,
    pub body: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(
    table = "shipments",
    schema = "logistics",
    down,
    follows = "region, event_id",
    key(id)
)]
pub struct Shipment {
    pub id: i64,
    pub region: String,
    pub event_id: i64,
    pub parent_id: Option<i64>,
}

/// The engine over every shop table.
pub fn engine() -> Engine {
    builder()
        .build()
        .expect("the shop's declarations agree with each other")
}

/// Every shop table, for a test that adds to the engine.
pub fn builder() -> magic_sync::engine::Builder {
    Engine::builder()
        .table::<Product>()
        .table::<Customer>()
        .table::<Order>()
        .table::<OrderLine>()
        .table::<Notice>()
        .table::<Promotion>()
        .table::<Stock>()
        .table::<Sale>()
        .table::<Event>()
        .table::<Shipment>()
}

/// A fresh database with the shop's tables, the sync schema and the triggers.
pub async fn installed() -> (magic_sync_testdb::TestDb, tokio_postgres::Client) {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(SQL).await.expect("shop schema");
    magic_sync::schema::migrate(&mut client)
        .await
        .expect("migrate");
    magic_sync::trigger::install(&engine(), &mut client)
        .await
        .expect("install triggers");
    (db, client)
}

/// The shop's rows most tests start from: a few of every table, for two
/// tills of the north and one of the south.
pub const ROWS: &str = "
    INSERT INTO products VALUES (1, 'tea', 2.5, 'B1'), (2, 'milk', 1, 'B2'), (3, 'jam', 4, NULL);
    INSERT INTO customers VALUES (7, 'Ada'), (8, 'Bob'), (9, 'Cy');
    INSERT INTO orders (id, unit_id, customer_id, placed_at) VALUES
        (1, 'u1', 7, '2026-11-30 10:00:00+00'), (2, 'u2', 8, '2026-11-30 10:00:00+00'),
        (3, 'u1', NULL, '2026-11-30 10:00:00+00');
    INSERT INTO order_lines VALUES (1, 1, 1, 2), (1, 2, 2, 1), (2, 1, 3, 5);
    INSERT INTO notices VALUES (1, 'north', 'early close'), (2, 'south', 'late open');
    INSERT INTO promotions VALUES (10, 3, 15), (11, 2, 5);
    INSERT INTO promotion_members VALUES (100, 10), (200, 11);
    INSERT INTO unit_groups VALUES ('u1', 100), ('u2', 200);
    INSERT INTO stock VALUES ('u1', 1, 5, NULL), ('u2', 2, 3, NULL);
    INSERT INTO events VALUES ('north', 1, 'fair'), ('south', 2, 'market');
    INSERT INTO logistics.shipments VALUES (1, 'north', 1, NULL), (2, 'north', 1, 1), (3, 'south', 2, NULL);
";

/// JSON, as the shop declares, but refusing every row `bad` picks: a codec
/// with a bug.
pub fn refusing<R: Columns + 'static>(bad: fn(&R) -> bool) -> Codec<R> {
    let (encoder, decoder) = (Codec::<R>::json(), Codec::<R>::json());
    Codec::custom(
        "json",
        move |row| match bad(row) {
            true => Err(CodecError::Mapping("a bug in this build's codec".into())),
            false => encoder.encode(row),
        },
        move |bytes| decoder.decode(bytes),
    )
}

/// The shop's engine, its products and customers encoded by codecs that
/// refuse a row whose name says "bug": a build with a bug, which deploying
/// [`engine`] fixes.
/// The shop's notices, to every till rather than its region's.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "notices", down, all, key(id))]
pub struct NoticeToAll {
    pub id: i64,
    pub region_id: String,
    pub body: String,
}

/// The shop with its notices sent to every till: a build whose
/// declarations differ from [`engine`]'s in one rule, for a deployment.
pub fn redeclared() -> Engine {
    Engine::builder()
        .table::<Product>()
        .table::<Customer>()
        .table::<Order>()
        .table::<OrderLine>()
        .table::<NoticeToAll>()
        .table::<Promotion>()
        .table::<Stock>()
        .table::<Sale>()
        .table::<Event>()
        .table::<Shipment>()
        .build()
        .expect("the shop's declarations")
}

pub fn buggy_engine() -> Engine {
    Engine::builder()
        .table_with::<Product>(refusing(|p: &Product| p.name.contains("bug")))
        .table_with::<Customer>(refusing(|c: &Customer| c.name.contains("bug")))
        .table::<Order>()
        .table::<OrderLine>()
        .table::<Notice>()
        .table::<Promotion>()
        .table::<Stock>()
        .table::<Sale>()
        .table::<Event>()
        .table::<Shipment>()
        .build()
        .expect("the shop's declarations")
}
