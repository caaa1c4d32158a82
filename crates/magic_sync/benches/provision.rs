//! Provisioning one replica from scratch, against the physical limit on the
//! same data in the same run, and the relay's peak memory for two sizes.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench provision
//!
//! - Baseline: `COPY` of every table out of PostgreSQL into one bulk SQLite
//!   insert transaction (text format, prepared inserts).
//! - Engine: a pass finds the replica waiting for a snapshot; the snapshot
//!   begins, and streams on a connection of its own (planned, read,
//!   encoded, packed, sealed, handed to the in-process transport as it
//!   fills) while the replica applies each message as it arrives, on a
//!   thread of its own. Two figures: the time until the replica holds its
//!   rows (its `EndSnapshot` applied), and until it is kept up again (what
//!   the snapshot sent recorded as held, and a pass run after it).
//! - Memory: the relay alone (a snapshot streamed into a transport that
//!   drops the bytes) in a child process per size, its peak RSS (VmHWM)
//!   compared.
//! - Floor: what the design cannot do without, timed alone on the same data:
//!   recording the held set (one row per row held, as `sync.held` does, and
//!   grouped into pages of keys for comparison) and staging the snapshot's
//!   bytes in PostgreSQL, as the outbox must before anything is sent (rows in
//!   their text form, the cheapest encoding PostgreSQL has, in 10,000-row
//!   bodies). Added to the baseline, which already reads every row and
//!   writes it into SQLite, they give the least any implementation of this
//!   design could take here.
//!
//! - A deep graph: a DVD-rental chain of 15 tables (country ← city ← address
//!   ← store / staff / customer ← inventory ← rental ← payment, films with
//!   their languages, categories and actors), one replica per store, three
//!   stores: small referenced tables over a cycle (a store and its
//!   manager) and followers that are parents too (rentals, which payments
//!   point at). One store's replica, about 27,000 rows, against `COPY` of
//!   the same rows into SQLite in the same run (copied out of the
//!   replica's record into tables of their own first, so `COPY` reads them
//!   whole). The ratio is the figure: the snapshot's work per table over a
//!   set this small.
//!
//! MAGIC_SYNC_BENCH_ROWS sets the total rows of the first case (default
//! 1,000,000); MAGIC_SYNC_BENCH_ONLY=deep runs the deep graph alone,
//! MAGIC_SYNC_BENCH_ONLY=flat the rest alone.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::relay::{Relay, ReplicaInfo, SendError, Settings, Transport};
use magic_sync::replica::Replica;
use magic_sync::run::memory::Network;
use magic_sync::{Engine, Numeric, Row};
use std::time::{Duration, Instant};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "stores", down, all, key(id))]
struct Store {
    id: i64,
    name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
struct Product {
    id: i64,
    name: String,
    price: Numeric,
    store_id: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "customers", down, referenced, key(id))]
struct Customer {
    id: i64,
    name: String,
    email: Option<String>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "unit_id", key(id))]
struct Order {
    id: i64,
    unit_id: String,
    customer_id: Option<i64>,
    placed_at: chrono::DateTime<chrono::Utc>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "lines", down, follows = "order_id", key(order_id, line_no))]
struct Line {
    order_id: i64,
    line_no: i32,
    product_id: i64,
    qty: i32,
}

fn engine() -> Engine {
    Engine::builder()
        .table::<Store>()
        .table::<Product>()
        .table::<Customer>()
        .table::<Order>()
        .table::<Line>()
        .build()
        .expect("declarations")
}

/// Rows per table for `total` rows in all.
fn sizes(total: i64) -> [(&'static str, i64); 5] {
    [
        ("stores", (total / 1000).max(1)),
        ("products", total * 99 / 1000),
        ("customers", total / 10),
        ("orders", total * 3 / 10),
        ("lines", total / 2),
    ]
}

fn schema(total: i64) -> String {
    let [(_, stores), (_, products), (_, customers), (_, orders), (_, lines)] = sizes(total);
    format!(
        "CREATE TABLE stores (id bigint PRIMARY KEY, name text NOT NULL);
         CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL,
                                store_id bigint NOT NULL REFERENCES stores);
         CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text);
         CREATE TABLE orders (id bigint PRIMARY KEY, unit_id text NOT NULL, customer_id bigint REFERENCES customers,
                              placed_at timestamptz NOT NULL);
         CREATE TABLE lines (order_id bigint REFERENCES orders, line_no integer, product_id bigint NOT NULL REFERENCES products,
                             qty integer NOT NULL, PRIMARY KEY (order_id, line_no));
         INSERT INTO stores SELECT i, 'store ' || i FROM generate_series(1, {stores}) i;
         INSERT INTO products SELECT i, 'product number ' || i, (i % 1000) / 10.0, 1 + i % {stores} FROM generate_series(1, {products}) i;
         INSERT INTO customers SELECT i, 'customer ' || i, CASE WHEN i % 3 = 0 THEN NULL ELSE 'c' || i || '@example.com' END
             FROM generate_series(1, {customers}) i;
         INSERT INTO orders SELECT i, 'r1', 1 + i % {customers}, timestamptz '2026-11-30 09:00:00+00' + i * interval '1 second'
             FROM generate_series(1, {orders}) i;
         INSERT INTO lines SELECT 1 + i % {orders}, 1 + i / {orders}, 1 + i % {products}, 1 + i % 7
             FROM generate_series(0, {lines} - 1) i;
         ANALYZE;"
    )
}

async fn prepared(total: i64) -> magic_sync_testdb::TestDb {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(&schema(total)).await.expect("data");
    magic_sync::schema::migrate(&mut client)
        .await
        .expect("migrate");
    magic_sync::trigger::install(&engine(), &mut client)
        .await
        .expect("triggers");
    db
}

/// COPY every table of `engine`, read whole from the schema `from`, into
/// one SQLite transaction.
async fn baseline(
    db: &magic_sync_testdb::TestDb,
    dir: &std::path::Path,
    engine: &Engine,
    from: &str,
) -> (Duration, u64) {
    use futures_util::StreamExt;
    let client = db.connect().await;
    let started = Instant::now();
    let mut lite = rusqlite::Connection::open(dir.join(format!("baseline-{from}.sqlite"))).unwrap();
    lite.pragma_update(None, "journal_mode", "WAL").unwrap();
    let tx = lite.transaction().unwrap();
    let mut rows = 0u64;
    for table in engine.tables() {
        tx.execute_batch(&magic_sync::lite::create_table(table))
            .unwrap();
        let cols: Vec<&str> = table.columns.iter().map(|c| c.name).collect();
        let marks: Vec<String> = (1..=cols.len()).map(|i| format!("?{i}")).collect();
        let mut insert = tx
            .prepare(&format!(
                "INSERT INTO {} ({}) VALUES ({})",
                table.name,
                cols.join(", "),
                marks.join(", ")
            ))
            .unwrap();
        let copy = client
            .copy_out(&format!(
                "COPY {from}.{} ({}) TO STDOUT",
                table.name,
                cols.join(", ")
            ))
            .await
            .unwrap();
        futures_util::pin_mut!(copy);
        let mut pending = Vec::new();
        while let Some(chunk) = copy.next().await {
            pending.extend_from_slice(&chunk.unwrap());
            let mut start = 0;
            while let Some(end) = pending[start..].iter().position(|&b| b == b'\n') {
                let line = std::str::from_utf8(&pending[start..start + end]).unwrap();
                let values: Vec<Option<&str>> = line
                    .split('\t')
                    .map(|v| if v == "\\N" { None } else { Some(v) })
                    .collect();
                insert.execute(rusqlite::params_from_iter(values)).unwrap();
                rows += 1;
                start += end + 1;
            }
            pending.drain(..start);
        }
    }
    tx.commit().unwrap();
    (started.elapsed(), rows)
}

struct Timings {
    /// From the snapshot's start until the replica applied its end.
    holds: Duration,
    /// From the snapshot's start until it was recorded as held and a pass
    /// ran after it: the replica kept up again.
    kept_up: Duration,
    rows: u64,
    messages: u64,
}

/// The engine provisions `replica` into a fresh SQLite file, the replica
/// applying each message as it arrives.
async fn engine_run(
    db: &magic_sync_testdb::TestDb,
    dir: &std::path::Path,
    engine: &Engine,
    replica: &str,
) -> Timings {
    let mut client = db.connect().await;
    let mut worker = db.connect().await;
    let mut relay = Relay::new(&client, engine.clone(), Settings::default())
        .await
        .unwrap();
    assert!(Relay::lock(&client).await.unwrap());
    let network = Network::new(1 << 20);
    let replicas = [ReplicaInfo::live(replica, None)];
    let pass = relay
        .record(&mut client, &replicas, network.max_message_bytes())
        .await
        .unwrap();
    assert_eq!(pass.waiting, [replica]);

    let path = dir.join(format!("{replica}.sqlite"));
    let key = magic_sync::store::keys::public(&client).await.unwrap();
    let applier = {
        let (network, engine, id) = (network.clone(), engine.clone(), replica.to_string());
        std::thread::spawn(move || {
            let engine = &engine;
            let mut replica = Replica::open(path, &id, engine).unwrap();
            replica.trust(&key).unwrap();
            while let Some(message) = network.next(&id) {
                replica.apply(&message).unwrap();
                if ends_snapshot(&message) {
                    let ended = Instant::now();
                    assert!(replica.refused().unwrap().is_empty());
                    let rows: u64 = engine
                        .tables()
                        .map(|t| {
                            replica
                                .connection()
                                .query_row(&format!("SELECT count(*) FROM {}", t.name), [], |r| {
                                    r.get::<_, i64>(0)
                                })
                                .unwrap() as u64
                        })
                        .sum();
                    return (ended, rows);
                }
            }
            panic!("the network closed before the snapshot ended");
        })
    };
    let started = Instant::now();
    let snapshot = relay
        .begin_snapshot(&mut client, replica)
        .await
        .unwrap()
        .expect("the replica waits for a snapshot");
    let streamed = snapshot.stream(&mut worker, &network).await.unwrap();
    assert!(streamed.recorded);
    relay
        .record(&mut client, &replicas, network.max_message_bytes())
        .await
        .unwrap();
    let kept_up = started.elapsed();
    let (ended, rows) = tokio::task::spawn_blocking(move || applier.join().unwrap())
        .await
        .unwrap();
    Timings {
        holds: ended - started,
        kept_up,
        rows,
        messages: streamed.messages,
    }
}

/// Whether `message` is a snapshot's end.
fn ends_snapshot(message: &[u8]) -> bool {
    use magic_sync::envelope::{to_replica::Body, ToReplica};
    use prost::Message;
    matches!(
        ToReplica::decode(message).map(|m| m.body),
        Ok(Some(Body::EndSnapshot(_)))
    )
}

/// A transport that takes every message and keeps none.
struct Drop;

impl Transport for Drop {
    fn max_message_bytes(&self) -> usize {
        1 << 20
    }
    async fn send(&self, _: &magic_sync::ReplicaId, _: &str, _: Vec<u8>) -> Result<(), SendError> {
        Ok(())
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// Child process: provision `r1` over the database at `conninfo`, relay only.
async fn relay_only(conninfo: &str) {
    let connect = || async {
        let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    };
    let (mut client, mut worker) = (connect().await, connect().await);
    let mut relay = Relay::new(&client, engine(), Settings::default())
        .await
        .unwrap();
    assert!(Relay::lock(&client).await.unwrap());
    relay
        .record(&mut client, &[ReplicaInfo::live("r1", None)], 1 << 20)
        .await
        .unwrap();
    let snapshot = relay
        .begin_snapshot(&mut client, "r1")
        .await
        .unwrap()
        .expect("r1 waits for a snapshot");
    let streamed = snapshot.stream(&mut worker, &Drop).await.unwrap();
    println!("{} {}", streamed.rows, peak_rss_kib());
}

fn measure_memory(conninfo: &str) -> (u64, u64) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .env("MAGIC_SYNC_RELAY_ONLY", conninfo)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap();
    let mut parts = line.split_whitespace().map(|p| p.parse::<u64>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

/// The tables and the columns of their keys, as the bench declares them.
const KEYS: [(&str, &str); 5] = [
    ("stores", "id"),
    ("products", "id"),
    ("customers", "id"),
    ("orders", "id"),
    ("lines", "order_id, line_no"),
];

struct Floor {
    held_rows: Duration,
    held_pages: Duration,
    staged: Duration,
}

/// Times, each in a transaction of its own, the writes the design needs
/// beyond reading and applying the rows: see the module's comment.
async fn floor(db: &magic_sync_testdb::TestDb) -> Floor {
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE floor_held (LIKE sync.held INCLUDING ALL);
             CREATE TABLE floor_pages (replica text, table_name text, bucket int, keys jsonb[],
                 versions int8[], messages int8[], PRIMARY KEY (table_name, bucket, replica));
             CREATE INDEX ON floor_pages (replica);
             CREATE TABLE floor_bodies (LIKE sync.bodies INCLUDING ALL);
             CHECKPOINT;",
        )
        .await
        .unwrap();
    let timed = |sql: String| {
        let client = &client;
        async move {
            let started = Instant::now();
            client
                .batch_execute(&format!("BEGIN; {sql} COMMIT;"))
                .await
                .unwrap();
            let took = started.elapsed();
            client.batch_execute("CHECKPOINT").await.unwrap();
            took
        }
    };
    let each = |f: &dyn Fn(&str, &str) -> String| {
        KEYS.iter()
            .map(|(t, k)| f(t, k))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let held_rows = timed(each(&|t, k| {
        format!(
            "INSERT INTO floor_held (replica, table_name, key, version, message)
             SELECT 'r1', '{t}', jsonb_build_array({k})::text, 0, 1 FROM {t};"
        )
    }))
    .await;
    let held_pages = timed(each(&|t, k| {
        format!(
            "INSERT INTO floor_pages
             SELECT 'r1', '{t}', hashtext(jsonb_build_array({k})::text) & 4095,
                    array_agg(jsonb_build_array({k})), array_agg(0::int8), array_agg(1::int8)
             FROM {t} GROUP BY 3;"
        )
    }))
    .await;
    let staged = timed(each(&|t, _| {
        format!(
            "INSERT INTO floor_bodies (hash, bytes)
             SELECT sha224(b), b FROM (
                 SELECT convert_to(string_agg(x::text, ''), 'UTF8') AS b
                 FROM (SELECT *, row_number() OVER () / 10000 AS chunk FROM {t}) x GROUP BY chunk) bodies;"
        )
    }))
    .await;
    client
        .batch_execute("DROP TABLE floor_held, floor_pages, floor_bodies")
        .await
        .unwrap();
    Floor {
        held_rows,
        held_pages,
        staged,
    }
}

/// What the replica's record takes in `sync.held`: rows, bytes per row of
/// the table and of its indexes, and of the pointers each row records.
async fn held_size(db: &magic_sync_testdb::TestDb) {
    let client = db.connect().await;
    client.batch_execute("VACUUM sync.held").await.unwrap();
    let row = client
        .query_one(
            "SELECT count(*), pg_table_size('sync.held'), pg_indexes_size('sync.held'),
                    coalesce(avg(pg_column_size(ptrs)), 0)::float8
             FROM sync.held",
            &[],
        )
        .await
        .unwrap();
    let (rows, table, indexes, ptrs): (i64, i64, i64, f64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let per = |bytes: i64| bytes as f64 / rows.max(1) as f64;
    println!(
        "sync.held: {rows} rows, {:.0} bytes a row in the table and {:.0} in its indexes; pointers {ptrs:.0} bytes a row",
        per(table),
        per(indexes)
    );
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[tokio::main]
async fn main() {
    magic_sync_testkit::bench::logs();
    if let Ok(conninfo) = std::env::var("MAGIC_SYNC_RELAY_ONLY") {
        relay_only(&conninfo).await;
        return;
    }
    let only = std::env::var("MAGIC_SYNC_BENCH_ONLY").unwrap_or_default();
    let dir = tempfile::tempdir().unwrap();
    if only != "deep" {
        let total: i64 = std::env::var("MAGIC_SYNC_BENCH_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        flat(total, dir.path()).await;
    }
    if only != "flat" {
        rentals::deep(dir.path()).await;
    }
}

/// One replica of `total` rows across the five tables of `engine()`.
async fn flat(total: i64, dir: &std::path::Path) {
    println!("provisioning one replica of {total} rows across 5 tables");
    let db = prepared(total).await;

    let (copy, copied) = baseline(&db, dir, &engine(), "public").await;
    let t = engine_run(&db, dir, &engine(), "r1").await;
    assert_eq!(t.rows, copied, "the replica holds every row");
    println!(
        "baseline COPY -> SQLite:   {:>6.2} s  {:>9.0} rows/s",
        secs(copy),
        copied as f64 / secs(copy)
    );
    println!(
        "engine, until the replica holds its rows (EndSnapshot applied): {:>6.2} s  {:>9.0} rows/s  {:.2}x the baseline  ({} messages)",
        secs(t.holds),
        t.rows as f64 / secs(t.holds),
        secs(t.holds) / secs(copy),
        t.messages
    );
    println!(
        "engine, until it is kept up again (held recorded, a pass after): {:>6.2} s  {:.2}x the baseline",
        secs(t.kept_up),
        secs(t.kept_up) / secs(copy)
    );

    held_size(&db).await;
    let f = floor(&db).await;
    let ratio = |d: Duration| secs(copy + d) / secs(copy);
    println!(
        "floor, held as one row per row:   {:>6.2} s",
        secs(f.held_rows)
    );
    println!(
        "floor, held as pages of keys:     {:>6.2} s",
        secs(f.held_pages)
    );
    println!(
        "floor, snapshot bytes staged:     {:>6.2} s",
        secs(f.staged)
    );
    println!(
        "floor of the design: baseline + staged + held rows {:.2} s ({:.2}x the baseline); with held pages {:.2} s ({:.2}x)",
        secs(copy + f.staged + f.held_rows),
        ratio(f.staged + f.held_rows),
        secs(copy + f.staged + f.held_pages),
        ratio(f.staged + f.held_pages)
    );

    // The relay-only runs provision `r1` again from scratch.
    db.connect()
        .await
        .batch_execute("DELETE FROM sync.replicas; DELETE FROM sync.held; DELETE FROM sync.outbox; DELETE FROM sync.bodies;")
        .await
        .unwrap();
    let small = prepared(total / 10).await;
    let (small_rows, small_rss) = measure_memory(&small.conninfo());
    let (large_rows, large_rss) = measure_memory(&db.conninfo());
    println!(
        "relay peak RSS: {} rows {:.1} MiB, {} rows {:.1} MiB: {:.2}x",
        small_rows,
        small_rss as f64 / 1024.0,
        large_rows,
        large_rss as f64 / 1024.0,
        large_rss as f64 / small_rss as f64
    );
}

/// The deep graph: a DVD-rental chain, one replica per store.
mod rentals {
    use super::{baseline, engine_run, secs};
    use magic_sync::{Engine, Numeric, Row};

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "country", down, referenced, key(country_id))]
    struct Country {
        country_id: i32,
        country: String,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "city", down, referenced, key(city_id))]
    struct City {
        city_id: i32,
        city: String,
        country_id: i32,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "address", down, referenced, key(address_id))]
    struct Address {
        address_id: i32,
        address: String,
        district: String,
        city_id: i32,
        postal_code: Option<String>,
        phone: String,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "language", down, referenced, key(language_id))]
    struct Language {
        language_id: i32,
        name: String,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "category", down, referenced, key(category_id))]
    struct Category {
        category_id: i32,
        name: String,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "actor", down, referenced, key(actor_id))]
    struct Actor {
        actor_id: i32,
        first_name: String,
        last_name: String,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "film", down, referenced, key(film_id))]
    struct Film {
        film_id: i32,
        title: String,
        description: Option<String>,
        release_year: Option<i32>,
        language_id: i32,
        rental_rate: Numeric,
        length: Option<i32>,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(
        table = "film_category",
        down,
        follows = "film_id",
        key(film_id, category_id)
    )]
    struct FilmCategory {
        film_id: i32,
        category_id: i32,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(
        table = "film_actor",
        down,
        follows = "film_id",
        key(actor_id, film_id)
    )]
    struct FilmActor {
        actor_id: i32,
        film_id: i32,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "store", down, replica = "store_id", key(store_id))]
    struct Store {
        store_id: i32,
        manager_staff_id: Option<i32>,
        address_id: i32,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "staff", down, replica = "store_id", key(staff_id))]
    struct Staff {
        staff_id: i32,
        first_name: String,
        last_name: String,
        address_id: i32,
        store_id: i32,
        username: String,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "customer", down, replica = "store_id", key(customer_id))]
    struct Customer {
        customer_id: i32,
        store_id: i32,
        first_name: String,
        last_name: String,
        email: Option<String>,
        address_id: i32,
        active: i32,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "inventory", down, replica = "store_id", key(inventory_id))]
    struct Inventory {
        inventory_id: i32,
        film_id: i32,
        store_id: i32,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "rental", down, follows = "inventory_id", key(rental_id))]
    struct Rental {
        rental_id: i32,
        rental_date: chrono::DateTime<chrono::Utc>,
        inventory_id: i32,
        customer_id: i32,
        return_date: Option<chrono::DateTime<chrono::Utc>>,
        staff_id: i32,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "payment", down, follows = "rental_id", key(payment_id))]
    struct Payment {
        payment_id: i32,
        customer_id: i32,
        staff_id: i32,
        rental_id: i32,
        amount: Numeric,
        payment_date: chrono::DateTime<chrono::Utc>,
    }

    fn engine() -> Engine {
        Engine::builder()
            .table::<Country>()
            .table::<City>()
            .table::<Address>()
            .table::<Language>()
            .table::<Category>()
            .table::<Actor>()
            .table::<Film>()
            .table::<FilmCategory>()
            .table::<FilmActor>()
            .table::<Store>()
            .table::<Staff>()
            .table::<Customer>()
            .table::<Inventory>()
            .table::<Rental>()
            .table::<Payment>()
            .build()
            .expect("the rentals' declarations")
    }

    /// Three stores. Each has 3 staff, 200 customers, 2,500 copies of the
    /// 1,000 films (every film at every store), 8,000 rentals and a
    /// payment for each. One rental in 20 is by another store's customer
    /// and one in 50 taken by another store's staff, so a store's replica
    /// holds some of the others' people, their stores, their managers and
    /// their addresses too. Customers share 400 addresses in 120 cities of
    /// 20 countries.
    const SCHEMA: &str = "
        CREATE TABLE country (country_id integer PRIMARY KEY, country text NOT NULL);
        CREATE TABLE city (city_id integer PRIMARY KEY, city text NOT NULL,
                           country_id integer NOT NULL REFERENCES country);
        CREATE TABLE address (address_id integer PRIMARY KEY, address text NOT NULL,
                              district text NOT NULL, city_id integer NOT NULL REFERENCES city,
                              postal_code text, phone text NOT NULL);
        CREATE TABLE language (language_id integer PRIMARY KEY, name text NOT NULL);
        CREATE TABLE category (category_id integer PRIMARY KEY, name text NOT NULL);
        CREATE TABLE actor (actor_id integer PRIMARY KEY, first_name text NOT NULL,
                            last_name text NOT NULL);
        CREATE TABLE film (film_id integer PRIMARY KEY, title text NOT NULL, description text,
                           release_year integer, language_id integer NOT NULL REFERENCES language,
                           rental_rate numeric(4, 2) NOT NULL, length integer);
        CREATE TABLE film_category (film_id integer REFERENCES film,
                                    category_id integer REFERENCES category,
                                    PRIMARY KEY (film_id, category_id));
        CREATE TABLE film_actor (actor_id integer REFERENCES actor, film_id integer REFERENCES film,
                                 PRIMARY KEY (actor_id, film_id));
        CREATE INDEX ON film_actor (film_id);
        CREATE TABLE store (store_id integer PRIMARY KEY, manager_staff_id integer,
                            address_id integer NOT NULL REFERENCES address);
        CREATE TABLE staff (staff_id integer PRIMARY KEY, first_name text NOT NULL,
                            last_name text NOT NULL, address_id integer NOT NULL REFERENCES address,
                            store_id integer NOT NULL REFERENCES store, username text NOT NULL);
        ALTER TABLE store ADD FOREIGN KEY (manager_staff_id) REFERENCES staff;
        CREATE INDEX ON staff (store_id);
        CREATE TABLE customer (customer_id integer PRIMARY KEY,
                               store_id integer NOT NULL REFERENCES store,
                               first_name text NOT NULL, last_name text NOT NULL, email text,
                               address_id integer NOT NULL REFERENCES address, active integer NOT NULL);
        CREATE INDEX ON customer (store_id);
        CREATE TABLE inventory (inventory_id integer PRIMARY KEY,
                                film_id integer NOT NULL REFERENCES film,
                                store_id integer NOT NULL REFERENCES store);
        CREATE INDEX ON inventory (store_id);
        CREATE TABLE rental (rental_id integer PRIMARY KEY, rental_date timestamptz NOT NULL,
                             inventory_id integer NOT NULL REFERENCES inventory,
                             customer_id integer NOT NULL REFERENCES customer,
                             return_date timestamptz,
                             staff_id integer NOT NULL REFERENCES staff);
        CREATE INDEX ON rental (inventory_id);
        CREATE TABLE payment (payment_id integer PRIMARY KEY,
                              customer_id integer NOT NULL REFERENCES customer,
                              staff_id integer NOT NULL REFERENCES staff,
                              rental_id integer NOT NULL REFERENCES rental,
                              amount numeric(5, 2) NOT NULL, payment_date timestamptz NOT NULL);
        CREATE INDEX ON payment (rental_id);

        INSERT INTO country SELECT i, 'country ' || i FROM generate_series(1, 20) i;
        INSERT INTO city SELECT i, 'city ' || i, 1 + i % 20 FROM generate_series(1, 120) i;
        INSERT INTO address SELECT i, i || ' Main Street', 'district ' || i % 30, 1 + i % 120,
                                   CASE WHEN i % 5 = 0 THEN NULL ELSE lpad(i::text, 5, '0') END,
                                   '555-' || lpad(i::text, 4, '0')
            FROM generate_series(1, 412) i;
        INSERT INTO language SELECT i, 'language ' || i FROM generate_series(1, 6) i;
        INSERT INTO category SELECT i, 'category ' || i FROM generate_series(1, 16) i;
        INSERT INTO actor SELECT i, 'first ' || i, 'last ' || i FROM generate_series(1, 200) i;
        INSERT INTO film SELECT i, 'film ' || i, 'a film about the number ' || i, 2000 + i % 20,
                                1 + i % 6, 0.99 + (i % 3) * 2, 60 + i % 120
            FROM generate_series(1, 1000) i;
        INSERT INTO film_category SELECT i, 1 + i % 16 FROM generate_series(1, 1000) i;
        INSERT INTO film_actor SELECT 1 + (i * 7 + j * 13) % 200, i
            FROM generate_series(1, 1000) i, generate_series(0, 4) j;
        INSERT INTO store SELECT s, NULL, s FROM generate_series(1, 3) s;
        INSERT INTO staff SELECT i, 'staff ' || i, 'last ' || i, 3 + i, 1 + (i - 1) / 3, 'user' || i
            FROM generate_series(1, 9) i;
        UPDATE store SET manager_staff_id = 3 * store_id - 2;
        INSERT INTO customer SELECT i, 1 + i % 3, 'first ' || i, 'last ' || i,
                                    CASE WHEN i % 4 = 0 THEN NULL ELSE 'c' || i || '@example.com' END,
                                    13 + i % 400, (i % 10 <> 0)::int
            FROM generate_series(1, 600) i;
        INSERT INTO inventory SELECT i, 1 + (i * 7) % 1000, 1 + i % 3 FROM generate_series(1, 7500) i;
        -- The store of rental i is its item's, 1 + (1 + i % 7500) % 3; its
        -- customer is that store's (customer c is at 1 + c % 3), one in 20
        -- the next store's; its staff that store's, one in 50 the next's.
        INSERT INTO rental
            SELECT i, timestamptz '2026-11-01 10:00:00+00' + i * interval '1 minute', 1 + i % 7500,
                   3 * (1 + i % 199) + (st - 1 + (i % 20 = 0)::int) % 3,
                   CASE WHEN i % 7 = 0 THEN NULL
                        ELSE timestamptz '2026-11-03 10:00:00+00' + i * interval '1 minute' END,
                   3 * ((st - 1 + (i % 50 = 0)::int) % 3) + 1 + i % 3
            FROM (SELECT i, 1 + (1 + i % 7500) % 3 AS st FROM generate_series(1, 24000) i) r;
        INSERT INTO payment
            SELECT rental_id, customer_id, staff_id, rental_id, 0.99 + rental_id % 5,
                   rental_date + interval '1 hour'
            FROM rental;
        ANALYZE;";

    async fn prepared() -> magic_sync_testdb::TestDb {
        let db = magic_sync_testdb::database().await;
        let mut client = db.connect().await;
        client.batch_execute(SCHEMA).await.expect("the rentals");
        magic_sync::schema::migrate(&mut client)
            .await
            .expect("migrate");
        magic_sync::trigger::install(&engine(), &mut client)
            .await
            .expect("triggers");
        db
    }

    /// Copies the rows `replica`'s record holds into tables of their own,
    /// in the schema `held`, for the baseline to read whole.
    async fn copy_held(db: &magic_sync_testdb::TestDb, engine: &Engine, replica: &str) {
        let client = db.connect().await;
        let mut sql = String::from("CREATE SCHEMA held;");
        for table in engine.tables() {
            let key: Vec<&str> = table.key.to_vec();
            sql.push_str(&format!(
                "CREATE TABLE held.{t} AS SELECT * FROM public.{t}
                 WHERE jsonb_build_array({k}) IN (SELECT key::jsonb FROM sync.held
                                                  WHERE replica = '{replica}' AND table_name = '{t}');",
                t = table.name,
                k = key.join(", "),
            ));
        }
        sql.push_str("ANALYZE;");
        client.batch_execute(&sql).await.expect("the copies");
    }

    /// One store's replica against COPY of the same rows into SQLite.
    pub async fn deep(dir: &std::path::Path) {
        let engine = engine();
        let tables = engine.tables().count();
        println!("provisioning one store of three: a DVD-rental chain of {tables} tables");
        let db = prepared().await;
        let t = engine_run(&db, dir, &engine, "1").await;
        copy_held(&db, &engine, "1").await;
        let (copy, copied) = baseline(&db, dir, &engine, "held").await;
        assert_eq!(t.rows, copied, "the baseline copies the replica's rows");
        println!(
            "deep graph, {copied} rows across {tables} tables: baseline COPY -> SQLite {:.1} ms; \
             engine until the replica holds its rows {:.1} ms, {:.2}x the baseline ({} messages); \
             until kept up again {:.1} ms",
            secs(copy) * 1000.0,
            secs(t.holds) * 1000.0,
            secs(t.holds) / secs(copy),
            t.messages,
            secs(t.kept_up) * 1000.0,
        );
    }
}
