//! The smallest shop, for tests of what sits around the engine (the
//! transports, the C ABI): products every till holds, orders by till, and
//! sales each till writes and sends up.

use magic_sync::{Engine, Numeric, Row};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
pub struct Product {
    pub id: i64,
    pub name: String,
    pub price: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "till", key(id))]
pub struct Order {
    pub id: i64,
    pub till: String,
    pub note: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "sales", up, key(id), key_without_origin)]
pub struct Sale {
    pub id: String,
    #[row(origin)]
    pub till: String,
    pub total: Numeric,
}

/// The tables, on the server.
pub const SCHEMA: &str = "
CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL);
CREATE TABLE orders (id bigint PRIMARY KEY, till text NOT NULL, note text NOT NULL);
CREATE TABLE sales (id text PRIMARY KEY, till text NOT NULL, total numeric(10, 2) NOT NULL);
";

/// The three tables' declarations.
pub fn engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::builder()
            .table::<Product>()
            .table::<Order>()
            .table::<Sale>()
            .build()
            .expect("declarations")
    })
}

/// Rows of `sql` in the SQLite file at `path`, each as text; none when the
/// file or its table is not there yet.
pub fn read(path: &std::path::Path, sql: &str) -> Vec<String> {
    let Ok(conn) = rusqlite::Connection::open(path) else {
        return Vec::new();
    };
    let Ok(mut stmt) = conn.prepare(sql) else {
        return Vec::new();
    };
    stmt.query_map([], |r| r.get::<_, String>(0))
        .map(|rows| rows.map(Result::unwrap).collect())
        .unwrap_or_default()
}
