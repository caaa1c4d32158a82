//! The down path end to end in one process: a shop's server database, the
//! relay's runner, and two tills on SQLite files of their own, linked by the
//! in-process network. The server writes; each till ends holding exactly its
//! own orders, the customers they point at, and every product.
//!
//! cargo run -p magic_sync --features postgres,sqlite --example shop
//!
//! With DATABASE_URL set, it uses (a fresh database on) that server instead of
//! starting a private cluster.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows what it does"
)]

use magic_sync::relay::{ReplicaInfo, Replicas, Settings};
use magic_sync::replica::Replica;
use magic_sync::run::memory::Network;
use magic_sync::trigger::InstallSettings;
use magic_sync::{Engine, Numeric, Row};
use std::time::{Duration, Instant};

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
CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL);
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id bigint PRIMARY KEY, unit_id text NOT NULL, customer_id bigint REFERENCES customers);
INSERT INTO products VALUES (1, 'tea', 2.50), (2, 'milk', 1.10);
INSERT INTO customers VALUES (7, 'Ada'), (8, 'Bob');
INSERT INTO orders VALUES (1, 'till-1', 7);
";

/// The host's list of tills: both live, in one region.
struct Tills;

impl Replicas for Tills {
    async fn replicas(&self) -> magic_sync::Result<Vec<ReplicaInfo>> {
        Ok(vec![
            ReplicaInfo::live("till-1", Some("north")),
            ReplicaInfo::live("till-2", Some("north")),
        ])
    }
}

fn rows(path: &std::path::Path, sql: &str) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).expect("open the till's file");
    let mut stmt = match conn.prepare(sql) {
        Ok(stmt) => stmt,
        // The till has not created its tables yet.
        Err(_) => return Vec::new(),
    };
    stmt.query_map([], |r| r.get::<_, String>(0))
        .expect("read the till")
        .map(Result::unwrap)
        .collect()
}

#[tokio::main]
async fn main() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(SCHEMA).await.expect("schema");
    let engine = &Engine::builder()
        .table::<Product>()
        .table::<Customer>()
        .table::<Order>()
        .build()
        .expect("declarations");
    // How a host deploys: bring the sync schema up to date, install or
    // repair the triggers (a step of its own, which locks only tables whose
    // triggers are wrong, and gives way to the application's writes), then
    // start the runner.
    magic_sync::schema::migrate(&mut client)
        .await
        .expect("migrate");
    let ensured = magic_sync::trigger::ensure(engine, &mut client, &InstallSettings::default())
        .await
        .expect("triggers");
    println!(
        "triggers installed on {} tables ({} attempts gave way); replicas to provision again: {:?}",
        ensured.installed.len(),
        ensured.retries,
        ensured.provisioned
    );

    let network = Network::new(1 << 20);
    let dir = tempfile::tempdir().expect("a temporary directory");
    // The server's public key: a till is given it with its credentials
    // when it is enrolled, and applies only what that key signed.
    let key = magic_sync::store::keys::public(&client)
        .await
        .expect("the server's key");
    let mut tills = Vec::new();
    for id in ["till-1", "till-2"] {
        let path = dir.path().join(format!("{id}.sqlite"));
        let (network, engine) = (network.clone(), engine.clone());
        let thread_path = path.clone();
        let thread = std::thread::spawn(move || {
            let mut replica = Replica::open(&thread_path, id, &engine).expect("open the till");
            replica.trust(&key).expect("pin the server's key");
            magic_sync::run::replica::replica(&mut replica, &network.link(id))
        });
        tills.push((id, path, thread));
    }

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = {
        let (config, network, engine) = (db.config(), network.clone(), engine.clone());
        tokio::spawn(async move {
            magic_sync::run::server::server(
                config,
                engine,
                Settings::default(),
                &Tills,
                &network,
                &network,
                async {
                    stopped.await.ok();
                },
            )
            .await
        })
    };

    // The server's writes, as any application makes them.
    client
        .batch_execute(
            "INSERT INTO orders VALUES (2, 'till-2', 8);
             UPDATE products SET price = 2.75 WHERE id = 1;
             UPDATE orders SET customer_id = 8 WHERE id = 1;",
        )
        .await
        .expect("writes");

    let deadline = Instant::now() + Duration::from_secs(30);
    for (id, path, _) in &tills {
        let want = if *id == "till-1" { "1 -> 8" } else { "2 -> 8" };
        loop {
            let orders = rows(path, "SELECT id || ' -> ' || customer_id FROM orders");
            let tea = rows(path, "SELECT price FROM products WHERE id = 1");
            if orders == [want] && tea == ["2.75"] {
                break;
            }
            assert!(Instant::now() < deadline, "{id} did not catch up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("{id}:");
        println!(
            "  products:  {:?}",
            rows(
                path,
                "SELECT id || ' ' || name || ' ' || price FROM products ORDER BY id"
            )
        );
        println!(
            "  customers: {:?}",
            rows(path, "SELECT id || ' ' || name FROM customers ORDER BY id")
        );
        println!(
            "  orders:    {:?}",
            rows(
                path,
                "SELECT id || ' -> customer ' || customer_id FROM orders ORDER BY id"
            )
        );
    }

    // Stopping cancels what the relay's sessions run and gives back its
    // lock before the runner returns: a new relay can start at once.
    stop.send(()).expect("the relay is running");
    relay.await.expect("the relay's task").expect("the relay");
    network.close();
    for (_, _, thread) in tills {
        thread.join().expect("a till's thread").expect("a till");
    }
}
