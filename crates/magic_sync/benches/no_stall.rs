//! No stall (issue 10): a hundred replicas kept up at 1,000 changes a
//! second while a replica of a million rows is provisioned in the middle of
//! the run. The others' commit-to-applied latency while its snapshot
//! streams, against the same run's before it began.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench no_stall
//!
//! 100 replicas (10 per region) hold `items` by `partition = "region"`
//! (10,000 rows); a hundred-and-first, `big`, holds `archive` by
//! `replica = "unit"` (1,000,000 rows, all its own) and is not live at
//! first. Writers update random items at the rate, each change carrying its
//! commit clock; every replica applies into a SQLite file of its own behind
//! the runner: in a child process over WebSocket on loopback, or with
//! `MAGIC_SYNC_BENCH_FLEET=threads` on threads of this process over the
//! in-process network (`magic_sync_testkit::apart`).
//!
//! 1. Before: the rate for MAGIC_SYNC_BENCH_SECONDS (default 20): the
//!    others' latency.
//! 2. During: `big` made live, the same rate until its snapshot is applied
//!    and acknowledged: the others' latency while it streamed, and how long
//!    it took.
//!
//! MAGIC_SYNC_BENCH_RATE sets the rate (default 1,000 changes a second);
//! MAGIC_SYNC_BENCH_ROWS the archive's rows (default 1,000,000).
//! MAGIC_SYNC_BENCH_PACE sets the snapshot's pace (`Settings::snapshot_pace`):
//! `unpaced` (the default) or a budget of rows a second.
//! MAGIC_SYNC_BENCH_TIMELINE=1 prints the others' latency second by second
//! while `big` provisions (with `RUST_LOG=magic_sync::pass=debug`, the
//! snapshot's steps are timed in the log beside it).
//! MAGIC_SYNC_BENCH_NICE=1 measures an option rather than the engine: the
//! backends snapshots stream on (`magic_sync relay: snapshot` in
//! `pg_stat_activity`) are given the lowest CPU priority (`renice 19`) as
//! soon as they appear, which needs the bench to run on the database's
//! machine with the right to renice them.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync_testkit::bench as support;
use rand::{rngs::StdRng, Rng, SeedableRng};

use magic_sync::relay::ReplicaInfo;
use magic_sync::{Engine, Row};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{env_u64, now_micros, settle, Fleet, Latencies};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, partition = "region", key(id))]
struct Item {
    id: i64,
    region: i64,
    value: i64,
    stamp: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "archive", down, replica = "unit", key(id))]
struct Archive {
    id: i64,
    unit: String,
    payload: String,
}

const REPLICAS: usize = 100;
const REGIONS: i64 = 10;
const ITEMS: i64 = 10_000;

fn engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::builder()
            .table::<Item>()
            .table::<Archive>()
            .build()
            .expect("declarations")
    })
}

/// Every item row a replica other than `big` applied: its commit clock and
/// when it applied, in microseconds since 1970.
type Arrivals = Arc<Mutex<Vec<(i64, i64)>>>;

fn watch(arrivals: Arrivals) -> support::Watcher {
    Arc::new(move |replica, table, data, applied| {
        if table != "items" || replica == "big" {
            return;
        }
        let row: serde_json::Value = serde_json::from_slice(data).expect("a JSON row");
        if let Some(stamp) = row.get("stamp").and_then(serde_json::Value::as_i64) {
            if stamp > 0 {
                arrivals.lock().unwrap().push((stamp, applied));
            }
        }
    })
}

/// Writers updating random items at `rate` changes a second until `stop`.
async fn write(db: &magic_sync_testdb::TestDb, rate: u64, stop: Arc<AtomicBool>) -> u64 {
    let writers = 2;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let client = db.connect().await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let statement = client
                .prepare("UPDATE items SET value = value + 1, stamp = $2 WHERE id = $1")
                .await
                .unwrap();
            let (mut done, mut rng) = (0u64, StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15 ^ w));
            let per_writer = rate as f64 / writers as f64;
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let due = (started.elapsed().as_secs_f64() * per_writer) as u64;
                if done >= due {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let id = rng.gen_range(1..=ITEMS);
                client
                    .execute(&statement, &[&id, &now_micros()])
                    .await
                    .unwrap();
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

/// The others' latencies of the changes committed between `from` and `to`
/// (microseconds since 1970).
fn window(arrivals: &Arrivals, from: i64, to: i64) -> Latencies {
    let applied = arrivals
        .lock()
        .unwrap()
        .iter()
        .filter(|(stamp, _)| *stamp >= from && *stamp < to)
        .map(|(stamp, at)| (at - stamp).max(0) as u64)
        .collect();
    Latencies::new(applied, 0)
}

/// Whether `big` holds its snapshot: kept up, and its last message applied.
async fn big_caught_up(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT NOT r.provision AND r.snapshot_attempt IS NULL AND r.last_number > 0
                    AND coalesce(a.number, 0) >= r.last_number
             FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
             WHERE r.id = 'big'",
            &[],
        )
        .await
        .map(|row| row.get::<_, bool>(0))
        .unwrap_or(false)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = env_u64("MAGIC_SYNC_BENCH_SECONDS", 20);
    let rate = env_u64("MAGIC_SYNC_BENCH_RATE", 1_000);
    let rows = env_u64("MAGIC_SYNC_BENCH_ROWS", 1_000_000);
    let engine = engine();
    support::child_if_asked(engine);
    println!("{}", support::Apart::from_env().describe());
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE items (id bigint PRIMARY KEY, region bigint NOT NULL, value bigint NOT NULL, stamp bigint NOT NULL);
             INSERT INTO items SELECT i, i % {REGIONS}, 0, 0 FROM generate_series(1, {ITEMS}) i;
             CREATE TABLE archive (id bigint PRIMARY KEY, unit text NOT NULL, payload text NOT NULL);
             INSERT INTO archive SELECT i, 'big', 'an archived line of some length, number ' || i
                 FROM generate_series(1, {rows}) i;
             ANALYZE items, archive;"
        ))
        .await
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    magic_sync::trigger::install(engine, &mut client)
        .await
        .unwrap();

    let mut replicas: Vec<ReplicaInfo> = (0..REPLICAS)
        .map(|i| ReplicaInfo::live(format!("r{i:03}"), Some(&(i as i64 % REGIONS).to_string())))
        .collect();
    replicas.push(ReplicaInfo {
        id: "big".into(),
        live: false,
        partition: None,
    });
    let arrivals = Arrivals::default();
    let fleet = Fleet::start(&db, engine, replicas, watch(arrivals.clone())).await;
    let provisioned = settle(&client, REPLICAS, Duration::from_secs(300))
        .await
        .expect("the hundred replicas provisioned");
    println!("the snapshots' pace: {:?}", support::snapshot_pace());
    println!(
        "{REPLICAS} replicas provisioned ({} items each) in {:.1} s; `big` waits with {rows} rows",
        ITEMS / REGIONS,
        provisioned.as_secs_f64()
    );

    // 1. Before.
    let stop = Arc::new(AtomicBool::new(false));
    let from = now_micros();
    let before = async {
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
    };
    let (changes, ()) = tokio::join!(write(&db, rate, stop.clone()), before);
    let to = now_micros();
    settle(&client, REPLICAS, Duration::from_secs(60))
        .await
        .expect("the load's changes settled");
    let before = window(&arrivals, from, to);
    println!(
        "before: {changes} changes in {seconds} s; the others' commit-to-applied {}",
        before.describe()
    );

    // 2. During: `big` made live at the start, the load until it holds its
    // snapshot.
    let stop = Arc::new(AtomicBool::new(false));
    let from = now_micros();
    let started = Instant::now();
    fleet.host.set_live("big", true);
    let until_big = async {
        while !big_caught_up(&client).await {
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "`big` was not provisioned in 600 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::Relaxed);
    };
    let nice = async {
        if env_u64("MAGIC_SYNC_BENCH_NICE", 0) == 0 {
            return;
        }
        let watcher = db.connect().await;
        let mut reniced = std::collections::BTreeSet::new();
        while !stop.load(Ordering::Relaxed) {
            for row in watcher
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE application_name LIKE '%: snapshot'",
                    &[],
                )
                .await
                .unwrap()
            {
                let pid: i32 = row.get(0);
                if reniced.insert(pid) {
                    let done = std::process::Command::new("renice")
                        .args(["-n", "19", "-p", &pid.to_string()])
                        .output()
                        .map(|o| o.status.success())
                        .unwrap_or(false);
                    println!("snapshot backend {pid} reniced to 19: {done}");
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (changes, (), ()) = tokio::join!(write(&db, rate, stop.clone()), until_big, nice);
    let took = started.elapsed();
    let to = now_micros();
    settle(&client, REPLICAS + 1, Duration::from_secs(60))
        .await
        .expect("the load's changes settled");
    let during = window(&arrivals, from, to);
    println!(
        "during: `big` ({rows} rows) provisioned and acknowledged in {:.1} s, {changes} changes meanwhile; the others' commit-to-applied {}",
        took.as_secs_f64(),
        during.describe()
    );
    let ratio = |p: f64| match (during.quantile(p), before.quantile(p)) {
        (Some(d), Some(b)) => format!("{:.2}x", d.as_secs_f64() / b.as_secs_f64()),
        _ => "-".into(),
    };
    println!(
        "during / before: p50 {}, p99 {} (target: at most 1.5x)",
        ratio(0.50),
        ratio(0.99)
    );
    if env_u64("MAGIC_SYNC_BENCH_TIMELINE", 0) != 0 {
        // Which part of the snapshot the others feel: their latency by the
        // second its change was committed in.
        let mut second = from;
        while second < to {
            let slice = window(&arrivals, second, second + 1_000_000);
            println!(
                "  second {:>3}: {}",
                (second - from) / 1_000_000,
                slice.describe()
            );
            second += 1_000_000;
        }
    }
    fleet.stop().await;
}
