//! The record by rule (issue 42), what it saves so far: a shared
//! catalogue of 10,000 products (`all`, each pointing at one of 50
//! categories) and, per till, 100 orders of 3 lines (its own), with the
//! relay recording per replica (the setting off) and by rule (on), run one
//! after the other in one process.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench cohort_record
//!
//! For a fleet of 50 tills, then the same fleet grown to 100, it prints:
//!
//! - the `sync` schema's size on disk (tables, indexes and TOAST, after
//!   `VACUUM FULL`, so dead rows count for nothing), and the rows of the
//!   record of what is held (`sync.held`);
//! - for one product changed, until every till applied and acknowledged
//!   it, the rows written to the `sync` schema (inserted, updated and
//!   deleted, from `pg_stat_user_tables`), per till and (for the larger
//!   fleet) per table, the time of the pass that recorded it and of
//!   publishing what it wrote to every till (medians of seven changes).
//!
//! MAGIC_SYNC_BENCH_PRODUCTS (default 10,000), MAGIC_SYNC_BENCH_TILLS: the
//! smaller fleet (default 50; the larger is twice it).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::{Engine, Row};
use magic_sync_testkit::bench::env_u64;
use magic_sync_testkit::fleet::Fleet;

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "categories", down, referenced, key(id))]
struct Category {
    id: i64,
    name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
struct Product {
    id: i64,
    category_id: i64,
    name: String,
    price: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "unit_id", key(id))]
struct Order {
    id: i64,
    unit_id: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "order_lines", down, replica = "unit_id", key(order_id, line))]
struct OrderLine {
    order_id: i64,
    line: i64,
    unit_id: String,
    product_id: i64,
    quantity: i64,
}

fn engine() -> Engine {
    Engine::builder()
        .table::<Category>()
        .table::<Product>()
        .table::<Order>()
        .table::<OrderLine>()
        .build()
        .expect("declarations")
}

fn schema(products: u64) -> String {
    format!(
        "CREATE TABLE categories (id bigint PRIMARY KEY, name text NOT NULL);
         CREATE TABLE products (id bigint PRIMARY KEY,
             category_id bigint NOT NULL REFERENCES categories,
             name text NOT NULL, price bigint NOT NULL);
         CREATE TABLE orders (id bigint PRIMARY KEY, unit_id text NOT NULL);
         CREATE TABLE order_lines (order_id bigint REFERENCES orders, line bigint,
             unit_id text NOT NULL, product_id bigint NOT NULL REFERENCES products,
             quantity bigint NOT NULL, PRIMARY KEY (order_id, line));
         INSERT INTO categories SELECT i, 'category ' || i FROM generate_series(1, 50) i;
         INSERT INTO products SELECT i, 1 + i % 50, 'product ' || i, 100 + i % 7
             FROM generate_series(1, {products}) i;"
    )
}

/// The orders of tills `from..to` (numbered from 1): 100 each, 3 lines.
fn orders(from: u64, to: u64, products: u64) -> String {
    format!(
        "INSERT INTO orders SELECT t * 1000 + o, 'u' || t
             FROM generate_series({from}, {to}) t, generate_series(1, 100) o;
         INSERT INTO order_lines SELECT t * 1000 + o, l, 'u' || t,
             1 + (t * 7919 + o * 31 + l) % {products}, l
             FROM generate_series({from}, {to}) t, generate_series(1, 100) o,
                  generate_series(1, 3) l;"
    )
}

/// The `sync` schema's size on disk, live rows only, and the rows of the
/// record of what is held.
async fn size(fleet: &Fleet) -> (i64, i64) {
    let tables: Vec<String> = fleet
        .writer
        .query(
            "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables
             WHERE schemaname = 'sync'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for table in tables {
        fleet
            .writer
            .batch_execute(&format!("VACUUM FULL {table}"))
            .await
            .unwrap();
    }
    let row = fleet
        .writer
        .query_one(
            "SELECT (SELECT sum(pg_total_relation_size(c.oid))::int8 FROM pg_class c
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = 'sync' AND c.relkind = 'r'),
                    (SELECT count(*) FROM sync.held)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Rows inserted, updated and deleted in the `sync` schema so far. Each
/// session keeps its counts until it flushes them (within ten seconds of
/// going idle, or at once when asked): the fleet's three sessions (the
/// relay's, the snapshots', the host's) are asked first.
/// Rows written so far to each table of the `sync` schema.
async fn written(fleet: &Fleet) -> Written {
    for session in [&fleet.client, &fleet.snapshots, &fleet.writer] {
        session
            .batch_execute("SELECT pg_stat_force_next_flush()")
            .await
            .unwrap();
    }
    fleet
        .writer
        .query(
            "SELECT relname::text, (n_tup_ins + n_tup_upd + n_tup_del)::int8
             FROM pg_stat_user_tables WHERE schemaname = 'sync'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Rows written, per table of the `sync` schema.
type Written = std::collections::BTreeMap<String, i64>;

/// What `after` counts beyond `before`, the tables written to only.
fn beyond(before: &Written, after: &Written) -> Written {
    after
        .iter()
        .map(|(t, n)| (t.clone(), n - before.get(t).copied().unwrap_or(0)))
        .filter(|(_, n)| *n != 0)
        .collect()
}

/// Rows written to the `sync` schema for one product changed, until every
/// till applied and acknowledged it, and how long the pass that recorded
/// it took.
async fn one_change(fleet: &mut Fleet, round: i64) -> (Written, [std::time::Duration; 2]) {
    let before = written(fleet).await;
    fleet
        .writer
        .batch_execute(&format!("UPDATE products SET price = {round} WHERE id = 1"))
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    fleet.pass().await;
    let pass = t0.elapsed();
    let t0 = std::time::Instant::now();
    fleet.publish().await;
    let publish = t0.elapsed();
    fleet.sync().await;
    (beyond(&before, &written(fleet).await), [pass, publish])
}

/// Changes one product `ROUNDS` times: the rows written for the last, and
/// the median pass.
async fn changes(fleet: &mut Fleet, round: i64) -> (Written, [std::time::Duration; 2]) {
    let (mut passes, mut publishes) = (Vec::new(), Vec::new());
    let mut writes = Written::new();
    for r in 0..ROUNDS {
        let (w, [pass, publish]) = one_change(fleet, round * 100 + r).await;
        writes = w;
        passes.push(pass);
        publishes.push(publish);
    }
    passes.sort();
    publishes.sort();
    (
        writes,
        [passes[passes.len() / 2], publishes[publishes.len() / 2]],
    )
}

const ROUNDS: i64 = 7;

struct Figures {
    bytes: i64,
    held: i64,
    /// Rows written for the last change, per table.
    tables: Written,
    writes: i64,
    pass: std::time::Duration,
    /// Publishing what the pass wrote, to every till.
    publish: std::time::Duration,
}

async fn run(by_rule: bool, products: u64, tills: u64) -> [Figures; 2] {
    let mut fleet = Fleet::of_sized(&schema(products), engine(), 1 << 20).await;
    fleet
        .reconfigure(|s| {
            s.chunk_rows = 2_000;
            s.flush_bytes = magic_sync::relay::ByteSize::mib(1);
            s.record_by_rule = by_rule;
        })
        .await;
    let mut figures = Vec::new();
    for (from, to) in [(1, tills), (tills + 1, 2 * tills)] {
        fleet
            .writer
            .batch_execute(&orders(from, to, products))
            .await
            .unwrap();
        for t in from..=to {
            fleet.add(&format!("u{t}"), None);
        }
        // Provisioned, then (by rule) joined, a few at a time.
        fleet.sync().await;
        for _ in 0..(2 * tills).div_ceil(16) {
            fleet.sync().await;
        }
        let (writes, [pass, publish]) = changes(&mut fleet, to as i64).await;
        let (bytes, held) = size(&fleet).await;
        figures.push(Figures {
            bytes,
            held,
            writes: writes.values().sum(),
            tables: writes,
            pass,
            publish,
        });
    }
    fleet.check().await;
    let [a, b]: [Figures; 2] = figures.try_into().ok().expect("two fleets");
    [a, b]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let products = env_u64("MAGIC_SYNC_BENCH_PRODUCTS", 10_000);
    let tills = env_u64("MAGIC_SYNC_BENCH_TILLS", 50);
    println!(
        "a catalogue of {products} products in 50 categories, 100 orders of 3 lines per till; \
         {tills} tills, then {}",
        2 * tills
    );
    for by_rule in [false, true] {
        let [small, large] = run(by_rule, products, tills).await;
        let name = match by_rule {
            false => "per replica",
            true => "by rule",
        };
        let mib = |b: i64| b as f64 / (1 << 20) as f64;
        println!(
            "{name:>11}: sync schema {:.1} MiB at {tills}, {:.1} MiB at {} ({:.2}x); \
             held rows {} / {}; one product changed: {} rows written ({:.1} per till) / {} ({:.1} per till), \
             its pass {:.1} / {:.1} ms, publishing it {:.1} / {:.1} ms (medians of {ROUNDS})",
            mib(small.bytes),
            mib(large.bytes),
            2 * tills,
            large.bytes as f64 / small.bytes as f64,
            small.held,
            large.held,
            small.writes,
            small.writes as f64 / tills as f64,
            large.writes,
            large.writes as f64 / (2 * tills) as f64,
            small.pass.as_secs_f64() * 1e3,
            large.pass.as_secs_f64() * 1e3,
            small.publish.as_secs_f64() * 1e3,
            large.publish.as_secs_f64() * 1e3,
        );
        let tables: Vec<String> = large
            .tables
            .iter()
            .map(|(t, n)| format!("{t} {n}"))
            .collect();
        println!(
            "{name:>11}: rows written at {}, by table: {}",
            2 * tills,
            tables.join(", ")
        );
    }
}
