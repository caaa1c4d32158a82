//! Applying a snapshot on the replica, against what SQLite itself takes to
//! write the same rows, in the same run. No PostgreSQL: the snapshot's
//! messages are built in memory the way the server builds them (the JSON
//! codec, canonical keys, bodies of up to 1 MiB, parents' tables first,
//! numbered, chained and sealed under a stand-in secret), encoded to bytes,
//! and only then is the clock started.
//!
//! cargo bench -p magic_sync --features sqlite --bench replica_apply
//!
//! - **Into empty tables.** Baseline: a fresh SQLite file with the replica's
//!   tables, every row inserted by one prepared `INSERT` per table in one
//!   transaction (values already SQLite values), then the replica's
//!   foreign-key indexes and one of the host's own (orders by time) built,
//!   in the same transaction. Replica: a fresh replica with the same
//!   indexes applies every message of the snapshot, `EndSnapshot` included.
//! - **Over stale rows.** The replica already holds half the rows (every
//!   other one, with other values) and a tenth more that the snapshot no
//!   longer has. Baseline: the same file, every row written by one prepared
//!   upsert, then every row the snapshot lacks deleted by one prepared
//!   delete, in one transaction, indexes kept. Replica: applies the snapshot
//!   over a copy of that file.
//! - **A replica with no declarations** (`Replica::open_described`): the
//!   same snapshot, begun by the server's description as the server begins
//!   one, applied into empty tables; its time against the declared
//!   replica's in the same run (issue 43's target: at most 1.1x).
//! - **Decoding alone**: every message's envelope and every row's JSON,
//!   nothing written.
//!
//! Both sides run with the replica's settings: WAL, `synchronous = FULL`.
//! Each replica result is compared with its baseline's file, row for row.
//!
//! MAGIC_SYNC_BENCH_ROWS sets the rows of the snapshot (default 1,000,000),
//! MAGIC_SYNC_BENCH_RUNS how many times each is timed (default 3).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use chrono::{DateTime, Duration as Span, TimeZone, Utc};
use magic_sync::envelope::{to_replica::Body, Down, EndSnapshot, RowData, TableRows, ToReplica};
use magic_sync::replica::{ForeignKey, Outcome, Replica};
use magic_sync::value::canonical_key;
use magic_sync::{Engine, Numeric, Row, Table, Value};
use prost::Message;
use rusqlite::types::Value as Lite;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
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
    placed_at: DateTime<Utc>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "lines", down, follows = "order_id", key(order_id, line_no))]
struct Line {
    order_id: i64,
    line_no: i32,
    product_id: i64,
    qty: i32,
}

const REPLICA: &str = "r1";
const SECRET: &[u8] = b"a stand-in for the epoch's secret";
/// The transport's limit, less what the relay keeps for the head and seal.
const BODY_LIMIT: usize = (1 << 20) - 256;

/// A message number from the wire, as the seal takes it.
fn wire(number: u64) -> magic_sync::MessageNo {
    magic_sync::MessageNo::from_wire(number).expect("a number the server could draw")
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

/// The foreign keys, as the server's catalogue would list them.
fn foreign_keys() -> Vec<ForeignKey> {
    vec![
        ForeignKey::new("products", &["store_id"], "stores", &["id"]),
        ForeignKey::new("orders", &["customer_id"], "customers", &["id"]),
        ForeignKey::new("lines", &["order_id"], "orders", &["id"]),
        ForeignKey::new("lines", &["product_id"], "products", &["id"]),
    ]
}

/// The indexes the replica keeps on those foreign keys, as the baseline builds them.
const FOREIGN_KEY_INDEXES: &str = "
CREATE INDEX bench_products_store_id ON products (store_id);
CREATE INDEX bench_orders_customer_id ON orders (customer_id);
CREATE INDEX bench_lines_order_id ON lines (order_id);
CREATE INDEX bench_lines_product_id ON lines (product_id);";

/// An index of the host's own, on both sides: a till lists its orders by time.
const HOST_INDEX: &str = "CREATE INDEX host_orders_placed_at ON orders (placed_at);";

/// One table's rows, in the order the server would send them.
struct Rows {
    table: &'static Table,
    rows: Vec<Vec<Value>>,
}

/// The rows of the provisioning benchmark's schema (`benches/provision.rs`),
/// `total` in all, as PostgreSQL would hold them.
fn snapshot_rows(total: i64) -> Vec<Rows> {
    let stores = (total / 1000).max(1);
    let products = total * 99 / 1000;
    let customers = total / 10;
    let orders = total * 3 / 10;
    let lines = total / 2;
    let start = Utc
        .with_ymd_and_hms(2026, 11, 30, 9, 0, 0)
        .single()
        .expect("a time");
    let text = |s: String| Value::Text(s);
    vec![
        Rows {
            table: &Store::TABLE,
            rows: (1..=stores)
                .map(|i| vec![Value::Int(i), text(format!("store {i}"))])
                .collect(),
        },
        Rows {
            table: &Product::TABLE,
            rows: (1..=products)
                .map(|i| {
                    let cents = i % 1000;
                    vec![
                        Value::Int(i),
                        text(format!("product number {i}")),
                        Value::Numeric(format!("{}.{}0", cents / 10, cents % 10)),
                        Value::Int(1 + i % stores),
                    ]
                })
                .collect(),
        },
        Rows {
            table: &Customer::TABLE,
            rows: (1..=customers)
                .map(|i| {
                    let email = if i % 3 == 0 {
                        Value::Null
                    } else {
                        text(format!("c{i}@example.com"))
                    };
                    vec![Value::Int(i), text(format!("customer {i}")), email]
                })
                .collect(),
        },
        Rows {
            table: &Order::TABLE,
            rows: (1..=orders)
                .map(|i| {
                    vec![
                        Value::Int(i),
                        text(REPLICA.into()),
                        Value::Int(1 + i % customers),
                        Value::Timestamptz(start + Span::seconds(i)),
                    ]
                })
                .collect(),
        },
        Rows {
            table: &Line::TABLE,
            rows: (0..lines)
                .map(|i| {
                    vec![
                        Value::Int(1 + i % orders),
                        Value::Int(1 + i / orders),
                        Value::Int(1 + i % products),
                        Value::Int(1 + i % 7),
                    ]
                })
                .collect(),
        },
    ]
}

/// What a replica held before: every other row of `current`, with other
/// values in its columns that are not key, and a tenth as many rows again
/// that the current snapshot no longer has (keys past its own).
fn stale_rows(current: &[Rows]) -> Vec<Rows> {
    current
        .iter()
        .map(|t| {
            let keys = t.table.key_positions();
            let older = |row: &Vec<Value>| -> Vec<Value> {
                row.iter()
                    .enumerate()
                    .map(|(c, v)| match v {
                        _ if keys.contains(&c) => v.clone(),
                        Value::Text(s) => Value::Text(format!("{s} (old)")),
                        Value::Int(i) => Value::Int(i + 100),
                        other => other.clone(),
                    })
                    .collect()
            };
            let mut rows: Vec<Vec<Value>> = t.rows.iter().step_by(2).map(older).collect();
            let past = t.rows.len() as i64;
            let gone = (t.rows.len() / 10).max(1);
            rows.extend(t.rows.iter().take(gone).zip(1..).map(|(row, n)| {
                let mut row = older(row);
                // The first key column moves past every key the snapshot has.
                row[keys[0]] = Value::Int(past + n);
                row
            }));
            Rows {
                table: t.table,
                rows,
            }
        })
        .collect()
}

/// Numbers, chains and seals a replica's messages, as the server does.
struct Chain {
    epoch: Vec<u8>,
    next: u64,
    last: Option<(u64, Vec<u8>)>,
}

/// The key the bench's stand-in server signs with.
fn signer() -> magic_sync::sign::Signer {
    magic_sync::sign::Signer::new(&[0x42; 32], Vec::new())
}

impl Chain {
    fn new(epoch: u8) -> Self {
        Chain {
            epoch: vec![epoch; 16],
            next: 1,
            last: None,
        }
    }

    fn message(&mut self, begins_snapshot: bool, body: Body) -> Vec<u8> {
        let number = self.next;
        self.next += 1;
        let mut nonce = number.to_be_bytes().to_vec();
        nonce.extend_from_slice(&[0xA5; 8]);
        let (previous, previous_nonce) = self.last.take().unwrap_or((0, Vec::new()));
        let seal = magic_sync::seal::seal(SECRET, REPLICA, &self.epoch, wire(number), &nonce);
        self.last = Some((number, nonce.clone()));
        let message = ToReplica {
            replica: REPLICA.into(),
            epoch: self.epoch.clone(),
            number,
            nonce,
            previous,
            previous_nonce,
            begins_snapshot,
            body: Some(body),
            seal: seal.to_vec(),
            ..ToReplica::default()
        };
        // Signed as the server signs: verifying is part of applying.
        signer().to_replica(&message)
    }
}

/// A snapshot of `tables` as the bytes of its messages: rows packed into
/// bodies of up to [`BODY_LIMIT`] (the relay's count: key, data and two field
/// headers a row), parents' tables first, then `EndSnapshot` naming every
/// table.
fn snapshot_messages(engine: &Engine, tables: &[Rows], chain: &mut Chain) -> Vec<Vec<u8>> {
    snapshot_messages_as(engine, tables, chain, None)
}

/// [`snapshot_messages`], begun by `described` as the server begins a
/// snapshot when given one: what a replica with no declarations needs.
fn snapshot_messages_as(
    engine: &Engine,
    tables: &[Rows],
    chain: &mut Chain,
    described: Option<&magic_sync::envelope::ReplicaSchema>,
) -> Vec<Vec<u8>> {
    let mut messages = Vec::new();
    if let Some(described) = described {
        messages.push(chain.message(true, Body::Described(described.clone())));
    }
    let mut open: Vec<TableRows> = Vec::new();
    let mut bytes = 0;
    let mut flush = |open: &mut Vec<TableRows>, messages: &mut Vec<Vec<u8>>| {
        let down = Down {
            tables: std::mem::take(open),
        };
        let first = messages.is_empty();
        messages.push(chain.message(first, Body::Down(down)));
    };
    for t in tables {
        let codec = engine.codec(t.table.name).expect("declared");
        let keys = t.table.key_positions();
        for row in &t.rows {
            let key: Vec<Value> = keys.iter().map(|&k| row[k].clone()).collect();
            let data = RowData {
                key: canonical_key(&key).into_bytes(),
                data: codec.encode(row.clone()).expect("a bench row encodes"),
            };
            let size = data.key.len() + data.data.len() + 12;
            if bytes > 0 && bytes + size > BODY_LIMIT {
                flush(&mut open, &mut messages);
                bytes = 0;
            }
            if open.last().is_none_or(|o| o.table != t.table.name) {
                open.push(TableRows {
                    table: t.table.name.into(),
                    ..Default::default()
                });
            }
            open.last_mut().expect("pushed").upserts.push(data);
            bytes += size;
        }
    }
    if bytes > 0 {
        flush(&mut open, &mut messages);
    }
    let names = tables.iter().map(|t| t.table.name.to_string()).collect();
    messages.push(chain.message(
        false,
        Body::EndSnapshot(EndSnapshot {
            tables: names,
            schema: Vec::new(),
            described: None,
        }),
    ));
    messages
}

/// Every row as the SQLite values the replica stores.
fn lite_rows(t: &Rows) -> Vec<Vec<Lite>> {
    t.rows
        .iter()
        .map(|r| r.iter().map(magic_sync::lite::to_sqlite).collect())
        .collect()
}

fn open_like_a_replica(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("opens");
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0))
        .expect("WAL");
    conn
}

fn columns(table: &Table) -> (String, String) {
    let names: Vec<String> = table
        .columns
        .iter()
        .map(|c| magic_sync::sql::ident(c.name))
        .collect();
    let marks: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    (names.join(", "), marks.join(", "))
}

/// Baseline into empty tables: see the module's comment.
fn baseline_empty(path: &Path, tables: &[(&'static Table, Vec<Vec<Lite>>)]) -> Took {
    let clock = Clock::start();
    let mut conn = open_like_a_replica(path);
    let tx = conn.transaction().expect("begins");
    for (table, rows) in tables {
        tx.execute_batch(&magic_sync::lite::create_table(table))
            .expect("creates");
        let (names, marks) = columns(table);
        let mut insert = tx
            .prepare(&format!(
                "INSERT INTO {} ({names}) VALUES ({marks})",
                magic_sync::sql::ident(table.name)
            ))
            .expect("prepares");
        for row in rows {
            insert
                .execute(rusqlite::params_from_iter(row))
                .expect("inserts");
        }
    }
    tx.execute_batch(FOREIGN_KEY_INDEXES).expect("indexes");
    tx.execute_batch(HOST_INDEX).expect("the host's index");
    tx.commit().expect("commits");
    clock.took()
}

/// Baseline over stale rows: see the module's comment. `gone` are the keys
/// of the rows the snapshot no longer has, per table.
fn baseline_stale(
    path: &Path,
    tables: &[(&'static Table, Vec<Vec<Lite>>)],
    gone: &[Vec<Vec<Lite>>],
) -> Took {
    let clock = Clock::start();
    let mut conn = open_like_a_replica(path);
    let tx = conn.transaction().expect("begins");
    for ((table, rows), gone) in tables.iter().zip(gone) {
        let ident = magic_sync::sql::ident;
        let (names, marks) = columns(table);
        let key: Vec<String> = table.key.iter().map(|k| ident(k)).collect();
        let set: Vec<String> = table
            .columns
            .iter()
            .filter(|c| !table.key.contains(&c.name))
            .map(|c| format!("{0} = excluded.{0}", ident(c.name)))
            .collect();
        let mut upsert = tx
            .prepare(&format!(
                "INSERT INTO {} ({names}) VALUES ({marks}) ON CONFLICT ({}) DO UPDATE SET {}",
                ident(table.name),
                key.join(", "),
                set.join(", ")
            ))
            .expect("prepares");
        for row in rows {
            upsert
                .execute(rusqlite::params_from_iter(row))
                .expect("upserts");
        }
        let matching: Vec<String> = key
            .iter()
            .enumerate()
            .map(|(i, k)| format!("{k} = ?{}", i + 1))
            .collect();
        let mut delete = tx
            .prepare(&format!(
                "DELETE FROM {} WHERE {}",
                ident(table.name),
                matching.join(" AND ")
            ))
            .expect("prepares");
        for key in gone {
            delete
                .execute(rusqlite::params_from_iter(key))
                .expect("deletes");
        }
    }
    tx.commit().expect("commits");
    clock.took()
}

/// Applies `messages` to the replica at `path`; returns the time it took.
/// With `engine`, the replica is opened with its declarations; without,
/// it follows the description the messages begin with.
fn apply(engine: Option<&Engine>, path: &Path, messages: &[Vec<u8>]) -> Took {
    let mut replica = match engine {
        Some(engine) => Replica::open_with_foreign_keys(path, REPLICA, engine, foreign_keys()),
        None => Replica::open_described(path, REPLICA),
    }
    .expect("opens");
    replica.trust(&signer().public()).expect("pins the key");
    let host_index = |replica: &Replica| {
        replica
            .connection()
            .execute_batch(&HOST_INDEX.replace("INDEX", "INDEX IF NOT EXISTS"))
            .expect("the host's index")
    };
    if engine.is_some() {
        host_index(&replica);
    }
    let clock = Clock::start();
    for (n, bytes) in messages.iter().enumerate() {
        // A replica that follows the description has its tables once the
        // first message made them, where its host makes its index.
        if n == 1 && engine.is_none() {
            host_index(&replica);
        }
        match replica.apply(bytes).expect("applies") {
            Outcome::Applied { refused: 0, .. } => {}
            other => panic!("a message did not apply whole: {other:?}"),
        }
    }
    clock.took()
}

/// Decodes every envelope and every row, and writes nothing.
fn decode_only(engine: &Engine, messages: &[Vec<u8>]) -> Took {
    let clock = Clock::start();
    let mut rows = 0usize;
    for bytes in messages {
        let message = ToReplica::decode(bytes.as_slice()).expect("a message");
        if let Some(Body::Down(down)) = message.body {
            for t in &down.tables {
                let codec = engine.codec(&t.table).expect("declared");
                for row in &t.upserts {
                    let key: serde_json::Value = serde_json::from_slice(&row.key).expect("a key");
                    let values = codec.decode(&row.data).expect("a row");
                    rows += values.len() + usize::from(key.is_array());
                }
            }
        }
    }
    assert!(rows > 0);
    clock.took()
}

/// Asserts the replica's tables hold exactly what the baseline's do.
fn same_rows(replica: &Path, baseline: &Path, tables: &[Rows]) {
    let conn = Connection::open(replica).expect("opens");
    conn.execute("ATTACH DATABASE ?1 AS base", [baseline.to_string_lossy()])
        .expect("attaches");
    for t in tables {
        let (names, _) = columns(t.table);
        let name = magic_sync::sql::ident(t.table.name);
        for (a, b) in [("main", "base"), ("base", "main")] {
            let differ: i64 = conn
                .query_row(
                    &format!(
                        "SELECT count(*) FROM (SELECT {names} FROM {a}.{name}
                         EXCEPT SELECT {names} FROM {b}.{name})"
                    ),
                    [],
                    |r| r.get(0),
                )
                .expect("compares");
            assert_eq!(differ, 0, "`{}`: {a} has rows {b} has not", t.table.name);
        }
        let count: i64 = conn
            .query_row(&format!("SELECT count(*) FROM main.{name}"), [], |r| {
                r.get(0)
            })
            .expect("counts");
        assert_eq!(count as usize, t.rows.len(), "`{}`", t.table.name);
    }
}

/// A copy of the closed SQLite file `from` (no WAL left beside it) at `to`.
fn copy_file(from: &Path, to: &Path) {
    std::fs::copy(from, to).expect("copies");
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Time on the clock and time this thread spent on a CPU: on a machine
/// shared with other work the second is the steadier figure (it leaves out
/// waiting for a core, and waiting for the disk).
#[derive(Debug, Clone, Copy)]
struct Took {
    wall: Duration,
    cpu: Duration,
}

/// Starts timing; `Clock::took` says how long since.
struct Clock {
    wall: Instant,
    cpu: Duration,
}

impl Clock {
    fn start() -> Self {
        Clock {
            wall: Instant::now(),
            cpu: on_cpu(),
        }
    }

    fn took(&self) -> Took {
        Took {
            wall: self.wall.elapsed(),
            cpu: on_cpu().saturating_sub(self.cpu),
        }
    }
}

/// This thread's time on a CPU so far (Linux: `/proc/thread-self/schedstat`).
fn on_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map(Duration::from_nanos)
        .unwrap_or_default()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn env(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn main() {
    let total = env("MAGIC_SYNC_BENCH_ROWS", 1_000_000);
    let runs = env("MAGIC_SYNC_BENCH_RUNS", 3).max(1);
    let engine = engine();
    let dir = tempfile::tempdir().expect("a directory");
    let at = |name: &str| -> PathBuf { dir.path().join(name) };

    let current = snapshot_rows(total);
    let stale = stale_rows(&current);
    let messages = snapshot_messages(&engine, &current, &mut Chain::new(0xE1));
    let bytes: usize = messages.iter().map(Vec::len).sum();
    let rows: usize = current.iter().map(|t| t.rows.len()).sum();
    println!(
        "a snapshot of {rows} rows in {} tables: {} messages, {:.1} MiB",
        current.len(),
        messages.len(),
        bytes as f64 / (1 << 20) as f64
    );
    let lite: Vec<(&'static Table, Vec<Vec<Lite>>)> =
        current.iter().map(|t| (t.table, lite_rows(t))).collect();
    let gone: Vec<Vec<Vec<Lite>>> = stale
        .iter()
        .map(|t| {
            let keys = t.table.key_positions();
            let past = current
                .iter()
                .find(|c| c.table.name == t.table.name)
                .map_or(0, |c| c.rows.len() as i64);
            t.rows
                .iter()
                .filter(|r| matches!(r[keys[0]], Value::Int(k) if k > past))
                .map(|r| {
                    keys.iter()
                        .map(|&k| magic_sync::lite::to_sqlite(&r[k]))
                        .collect()
                })
                .collect()
        })
        .collect();

    // The stale replica, made once by a snapshot of its own in an earlier
    // epoch (the current snapshot begins the next), then copied.
    let stale_file = at("stale.sqlite");
    let stale_messages = snapshot_messages(&engine, &stale, &mut Chain::new(0xE0));
    apply(Some(&engine), &stale_file, &stale_messages);
    let stale_held: usize = stale.iter().map(|t| t.rows.len()).sum();
    println!("the stale replica holds {stale_held} rows");

    let described = magic_sync::core::schema::Schema::new(&engine, &foreign_keys()).described();
    let described_messages =
        snapshot_messages_as(&engine, &current, &mut Chain::new(0xE1), Some(&described));
    let mut ratios: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    let mut described_ratios = Vec::new();
    for run in 1..=runs {
        let (base, mine) = (
            at(&format!("base-{run}.sqlite")),
            at(&format!("r-{run}.sqlite")),
        );
        let baseline = baseline_empty(&base, &lite);
        let applied = apply(Some(&engine), &mine, &messages);
        same_rows(&mine, &base, &current);
        ratios[0].push(report(run, "into empty tables", rows, baseline, applied));
        // The same snapshot to a replica with no declarations of its own,
        // against the declared replica's time in the same run.
        let bare = at(&format!("d-{run}.sqlite"));
        let followed = apply(None, &bare, &described_messages);
        same_rows(&bare, &base, &current);
        let ratio = secs(followed.wall) / secs(applied.wall);
        println!(
            "run {run}, described into empty tables: {:.2} s ({:.0} rows/s): {ratio:.2}x the declared replica",
            secs(followed.wall),
            rows as f64 / secs(followed.wall),
        );
        described_ratios.push((ratio, secs(followed.cpu) / secs(applied.cpu)));
        for f in [&base, &mine, &bare] {
            std::fs::remove_file(f).expect("removes");
        }

        let (base, mine) = (
            at(&format!("stale-base-{run}.sqlite")),
            at(&format!("stale-r-{run}.sqlite")),
        );
        copy_file(&stale_file, &base);
        copy_file(&stale_file, &mine);
        let baseline = baseline_stale(&base, &lite, &gone);
        let applied = apply(Some(&engine), &mine, &messages);
        same_rows(&mine, &base, &current);
        ratios[1].push(report(run, "over stale rows", rows, baseline, applied));
        for f in [&base, &mine] {
            std::fs::remove_file(f).expect("removes");
        }
    }
    let decoded = decode_only(&engine, &messages);
    println!(
        "decoding alone (envelopes, keys, rows by the codec): {:.2} s, on CPU {:.2} s",
        secs(decoded.wall),
        secs(decoded.cpu)
    );
    let (wall, cpu): (Vec<f64>, Vec<f64>) = described_ratios.into_iter().unzip();
    println!(
        "median ratio of a replica with no declarations to the declared one, into empty tables: {:.2}x, on CPU {:.2}x",
        median(wall),
        median(cpu)
    );
    for (what, ratios) in ["into empty tables", "over stale rows"].iter().zip(ratios) {
        let (wall, cpu): (Vec<f64>, Vec<f64>) = ratios.into_iter().unzip();
        println!(
            "median ratio to the baseline, {what}: {:.2}x, on CPU {:.2}x",
            median(wall),
            median(cpu)
        );
    }
}

/// Prints one run's figures; returns its ratios (wall, on CPU).
fn report(run: i64, what: &str, rows: usize, baseline: Took, applied: Took) -> (f64, f64) {
    let ratio = (
        secs(applied.wall) / secs(baseline.wall),
        secs(applied.cpu) / secs(baseline.cpu),
    );
    println!(
        "run {run}, {what:<17}: baseline {:.2} s ({:.0} rows/s, on CPU {:.2} s), replica {:.2} s ({:.0} rows/s, on CPU {:.2} s): {:.2}x, on CPU {:.2}x",
        secs(baseline.wall),
        rows as f64 / secs(baseline.wall),
        secs(baseline.cpu),
        secs(applied.wall),
        rows as f64 / secs(applied.wall),
        secs(applied.cpu),
        ratio.0,
        ratio.1,
    );
    ratio
}
