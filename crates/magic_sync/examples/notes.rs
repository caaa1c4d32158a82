//! Installs the sync schema and the triggers into a throwaway database, makes
//! a few writes, and prints the notes they left for the relay.
//!
//! cargo run -p magic_sync --features postgres --example notes
//!
//! With DATABASE_URL set, it uses (a fresh database on) that server instead of
//! starting a private cluster.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows what it does"
)]

use magic_sync::trigger::{self, InstallSettings};
use magic_sync::{check, Engine, Numeric, Row};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
struct Product {
    id: i64,
    name: String,
    price: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "customers", down, referenced, key(id))]
struct Customer {
    id: i64,
    name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "unit_id", key(id))]
struct Order {
    id: i64,
    unit_id: String,
    customer_id: Option<i64>,
}

const SCHEMA: &str = "
CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, price numeric(10,2) NOT NULL);
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id bigint PRIMARY KEY, unit_id text NOT NULL, customer_id bigint REFERENCES customers);
";

const WRITES: &[&str] = &[
    "INSERT INTO products VALUES (1, 'tea', 2.50), (2, 'milk', 1.10)",
    "INSERT INTO customers VALUES (7, 'Ada'), (8, 'Grace')",
    "INSERT INTO orders VALUES (100, 'till-1', 7)",
    "UPDATE orders SET customer_id = 8 WHERE id = 100",
    "UPDATE products SET id = 10 WHERE id = 1",
    "DELETE FROM products WHERE id = 2",
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(SCHEMA).await?;

    let engine = Engine::builder()
        .table::<Product>()
        .table::<Customer>()
        .table::<Order>()
        .build()?;
    let version = magic_sync::schema::migrate(&mut client).await?;
    let ensured = trigger::ensure(&engine, &mut client, &InstallSettings::default()).await?;
    let installed: Vec<String> = ensured
        .installed
        .iter()
        .map(|i| format!("{}.{}", i.schema, i.table))
        .collect();
    println!("sync schema at version {version}");
    println!("triggers installed on {}", installed.join(", "));
    let catalog = check::startup(&engine, &client).await?;
    println!("start-up checks passed; foreign keys:");
    for fk in &catalog.foreign_keys {
        println!(
            "  {}({}) -> {}({})",
            fk.child,
            fk.child_columns.join(", "),
            fk.parent,
            fk.parent_columns.join(", ")
        );
    }

    for write in WRITES {
        println!("\n> {write}");
        client.batch_execute(write).await?;
    }
    println!("\nnotes waiting for the relay:");
    println!(
        "{:>4}  {:<10} {:<18} {:<8} parents before",
        "seq", "table", "source", "key"
    );
    for row in client
        .query(
            "SELECT seq, table_name, source, key::text, coalesce(parents::text, '(new)') FROM sync.notes ORDER BY seq",
            &[],
        )
        .await?
    {
        println!(
            "{:>4}  {:<10} {:<18} {:<8} {}",
            row.get::<_, i64>(0),
            row.get::<_, String>(1),
            row.get::<_, String>(2),
            row.get::<_, String>(3),
            row.get::<_, String>(4)
        );
    }

    let refused = client.batch_execute("TRUNCATE products").await;
    if let Err(e) = refused {
        let message = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string());
        println!("\n> TRUNCATE products\nrefused: {message}");
    }
    Ok(())
}
