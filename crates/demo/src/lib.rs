//! The demo's shop, declared once: what the server and every till share.
//!
//! - products go to every till;
//! - price lists reach a till through the groups it belongs to;
//! - customers go only where an order points at them;
//! - orders go to their till, and their lines follow them;
//! - sales are the tills' own records, sent up;
//! - stock is two-way: the server keeps `on_hand`, the till owns `counted`.

pub mod till;

/// What the engine and the transport log goes to standard error: warnings
/// and worse, or as `RUST_LOG` says (`RUST_LOG=magic_sync=debug` times
/// every step of a pass).
pub fn logs() {
    magic_sync_cli::logs();
}

use magic_sync::{Engine, Numeric, Row};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
pub struct Product {
    pub id: i64,
    pub name: String,
    pub price: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(
    table = "price_lists",
    down,
    group(
        members = "price_list_members",
        member = "price_list_id",
        grants = "till_groups",
        replica = "till"
    ),
    key(id)
)]
pub struct PriceList {
    pub id: i64,
    pub product_id: i64,
    pub price: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "customers", down, referenced, key(id))]
pub struct Customer {
    pub id: i64,
    pub name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "till", key(id))]
pub struct Order {
    pub id: i64,
    pub till: String,
    pub customer_id: Option<i64>,
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
#[row(table = "sales", up, key(id), key_without_origin)]
pub struct Sale {
    pub id: String,
    #[row(origin)]
    pub till: String,
    pub product_id: i64,
    pub total: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "stock", both, replica = "till", key(till, product_id))]
pub struct Stock {
    pub till: String,
    pub product_id: i64,
    pub on_hand: i32,
    #[row(owned)]
    pub counted: Option<i32>,
}

/// The shop's tables on the server (created when missing).
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS products (
    id bigint PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL);
CREATE TABLE IF NOT EXISTS price_lists (
    id bigint PRIMARY KEY, product_id bigint NOT NULL REFERENCES products,
    price numeric(10, 2) NOT NULL);
CREATE TABLE IF NOT EXISTS price_list_members (
    group_id bigint, price_list_id bigint REFERENCES price_lists ON DELETE CASCADE,
    PRIMARY KEY (group_id, price_list_id));
CREATE INDEX IF NOT EXISTS price_list_members_list ON price_list_members (price_list_id);
CREATE TABLE IF NOT EXISTS till_groups (
    till text, group_id bigint, PRIMARY KEY (till, group_id));
CREATE TABLE IF NOT EXISTS customers (id bigint PRIMARY KEY, name text NOT NULL);
CREATE TABLE IF NOT EXISTS orders (
    id bigint PRIMARY KEY, till text NOT NULL, customer_id bigint REFERENCES customers);
CREATE INDEX IF NOT EXISTS orders_till ON orders (till);
CREATE TABLE IF NOT EXISTS order_lines (
    order_id bigint REFERENCES orders ON DELETE CASCADE, line_no integer,
    product_id bigint NOT NULL REFERENCES products, qty integer NOT NULL,
    PRIMARY KEY (order_id, line_no));
CREATE TABLE IF NOT EXISTS sales (
    id text PRIMARY KEY, till text NOT NULL, product_id bigint NOT NULL,
    total numeric(10, 2) NOT NULL);
CREATE TABLE IF NOT EXISTS stock (
    till text, product_id bigint REFERENCES products ON DELETE CASCADE,
    on_hand integer NOT NULL, counted integer, PRIMARY KEY (till, product_id));
";

/// The shop's engine.
pub fn engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::builder()
            .table::<Product>()
            .table::<PriceList>()
            .table::<Customer>()
            .table::<Order>()
            .table::<OrderLine>()
            .table::<Sale>()
            .table::<Stock>()
            .build()
            .expect("the shop's declarations agree with each other")
    })
}
