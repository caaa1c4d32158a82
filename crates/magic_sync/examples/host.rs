//! A whole host, as small as it can be: the README shows this file as it
//! is (a test checks they agree), and the tests build it.
//!
//! DATABASE_URL=postgres://user@host/db cargo run -p magic_sync --features postgres,sqlite --example host

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows what it does"
)]

use magic_sync::relay::{ReplicaInfo, Settings};
use magic_sync::replica::Replica;
use magic_sync::run::memory::Network;
use magic_sync::{Engine, Row};

// Each table is a struct: which way it travels and which replicas hold
// which rows. Foreign keys come from PostgreSQL's catalogue.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
struct Product {
    id: i64,
    name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "sales", up, key(till, id))]
struct Sale {
    id: i64,
    #[row(origin)]
    till: String,
    product_id: i64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // An error in the engine's words (what is wrong, and what to do), not
    // in its debug form.
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("host: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let config: tokio_postgres::Config = std::env::var("DATABASE_URL")?.parse()?;
    let mut client = magic_sync::tls::connect(&config).await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS products (id bigint PRIMARY KEY, name text NOT NULL);
             CREATE TABLE IF NOT EXISTS sales (id bigint, till text, product_id bigint NOT NULL,
                                               PRIMARY KEY (till, id));",
        )
        .await?;
    let engine = Engine::builder()
        .table::<Product>()
        .table::<Sale>()
        .build()?;
    // On every start: the sync schema, then the triggers that note changes.
    magic_sync::schema::migrate(&mut client).await?;
    magic_sync::trigger::ensure(&engine, &mut client, &Default::default()).await?;

    // The fleet, and how bytes reach it: here one till, in this process.
    let fleet = vec![ReplicaInfo::live("till-1", None)];
    let network = Network::new(1 << 20);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let (engine, network) = (engine.clone(), network.clone());
        tokio::spawn(async move {
            magic_sync::run::server::server(
                config,
                engine,
                Settings::default(),
                &fleet,
                &network,
                &network,
                async {
                    let _ = stopped.await;
                },
            )
            .await
        })
    };

    // The till: a SQLite file that trusts the server's key, and its loop.
    let key = magic_sync::store::keys::public(&client).await?;
    let mut till = Replica::open("till-1.sqlite", "till-1", &engine)?;
    till.trust(&key)?;
    let reader = rusqlite::Connection::open("till-1.sqlite")?;
    let link = network.link("till-1");
    let till = std::thread::spawn(move || magic_sync::run::replica::replica(&mut till, &link));

    // The server writes; the till holds it moments later.
    client
        .execute(
            "INSERT INTO products VALUES (1, 'tea') ON CONFLICT (id) DO UPDATE SET name = 'tea'",
            &[],
        )
        .await?;
    let held = || -> rusqlite::Result<i64> {
        reader.query_row(
            "SELECT count(*) FROM products WHERE name = 'tea'",
            [],
            |r| r.get(0),
        )
    };
    while held().unwrap_or(0) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    println!("till-1 holds what the server wrote");

    let _ = stop.send(());
    server.await??;
    network.close();
    till.join().expect("the till's loop")?;
    Ok(())
}
