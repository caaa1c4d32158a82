//! A hot parent (issue 9): one row updated 1,000 times a second, held by
//! 100 replicas as the parent of their rows, against the same run with a row
//! nothing points at that every replica holds by its rule.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench hot_parent
//!
//! `items` are sent by `replica = "unit"`, 100 to each of 100 replicas
//! (each replica's written together), and every one points at row 1 of
//! `hot` (declared `referenced`; as is usual, no index on `items.hot_id`). `bulletin` is declared `all`: every replica
//! holds its row 1 by rule, and nothing points at it. Each run updates one
//! of the two rows at the rate (the baseline, `bulletin`, first), the row
//! carrying its commit clock (`clock_timestamp()` under the row's lock, so
//! versions and clocks rise together). It reports:
//!
//! - the relay's pass time, median and p99: the time between two of the
//!   runner's asks for the replica list, which it makes before every pass
//!   (a pass that found nothing to do adds the runner's idle wait);
//! - commit-to-applied p50 and p99 per change and replica: from a change's
//!   commit to the moment that replica applied a message carrying that
//!   version of the row or a newer one (a pass sends a row once, however
//!   often it changed). Changes a replica had not applied by the end of the
//!   settling limit count as slower than all that it had;
//! - the hot run's figures as ratios of the baseline's.
//!
//! MAGIC_SYNC_BENCH_SECONDS: each run (default 30). MAGIC_SYNC_BENCH_RATE:
//! changes per second (default 1,000). MAGIC_SYNC_BENCH_REPLICAS (default
//! 100), MAGIC_SYNC_BENCH_ITEMS: items per replica (default 100).
//! MAGIC_SYNC_BENCH_SETTLE_SECONDS: the settling limit (default 60).
//! `MAGIC_SYNC_RECORD_BY_RULE=0` runs the relay with the record by rule
//! off: `bulletin`'s row recorded, and each change to it written, for
//! every replica rather than once for their cohort.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync_testkit::bench as support;

use magic_sync::relay::ReplicaInfo;
use magic_sync::{Engine, Row};
use magic_sync_testdb::TestDb;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{describe_settle, env_u64, settle, Backlog, Fleet, Latencies, Passes};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "hot", down, referenced, key(id))]
struct Hot {
    id: i64,
    v: i64,
    stamp: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "bulletin", down, all, key(id))]
struct Bulletin {
    id: i64,
    v: i64,
    stamp: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, replica = "unit", key(id))]
struct Item {
    id: i64,
    unit: String,
    hot_id: i64,
    v: i64,
}

fn engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::builder()
            .table::<Hot>()
            .table::<Bulletin>()
            .table::<Item>()
            .build()
            .expect("declarations")
    })
}

const SCHEMA: &str = "
CREATE TABLE hot (id bigint PRIMARY KEY, v bigint NOT NULL, stamp bigint NOT NULL);
CREATE TABLE bulletin (id bigint PRIMARY KEY, v bigint NOT NULL, stamp bigint NOT NULL);
CREATE TABLE items (
    id     bigint PRIMARY KEY,
    unit   text NOT NULL,
    hot_id bigint NOT NULL REFERENCES hot (id),
    v      bigint NOT NULL
);
INSERT INTO hot VALUES (1, 0, 0);
INSERT INTO bulletin VALUES (1, 0, 0);";

/// The replica ids: `u000`, `u001`, ...
fn unit(i: u64) -> String {
    format!("u{i:03}")
}

/// The schema, `per_replica` items for each of `replicas` pointing at hot
/// row 1, and the engine's schema and triggers. A replica's items are
/// written together, as a unit's rows usually are, so they lie together in
/// the table.
async fn setup(db: &TestDb, engine: &Engine, replicas: u64, per_replica: u64) {
    let mut client = db.connect().await;
    client.batch_execute(SCHEMA).await.expect("the schema");
    client
        .execute(
            "INSERT INTO items SELECT i, 'u' || lpad(((i - 1) / $2::bigint)::text, 3, '0'), 1, 0
             FROM generate_series(1, $1::bigint * $2::bigint) i",
            &[&(replicas as i64), &(per_replica as i64)],
        )
        .await
        .expect("the items");
    client.batch_execute("ANALYZE").await.expect("analyze");
    magic_sync::schema::migrate(&mut client)
        .await
        .expect("migrate");
    magic_sync::trigger::install(engine, &mut client)
        .await
        .expect("install the triggers");
}

/// For each replica, in the order it applied them: the `stamp` of each
/// version of the measured row, and when it applied (microseconds since 1970).
type Arrivals = Arc<Mutex<HashMap<String, Vec<(i64, i64)>>>>;

/// Keeps what the replicas applied of `table` in `arrivals`, once measuring.
fn watch(table: Arc<Mutex<&'static str>>, arrivals: Arrivals) -> support::Watcher {
    Arc::new(move |replica, name, data, applied| {
        if name != *table.lock().unwrap() {
            return;
        }
        let row: serde_json::Value = serde_json::from_slice(data).expect("a JSON row");
        let stamp = row["stamp"].as_i64().expect("a stamp");
        arrivals
            .lock()
            .unwrap()
            .entry(replica.to_string())
            .or_default()
            .push((stamp, applied));
    })
}

/// Updates row 1 of `table` `rate` times a second for `length`, from two
/// connections; the commit clock of every change.
async fn write(db: &TestDb, table: &str, rate: u64, length: Duration) -> Vec<i64> {
    let sql = format!(
        "UPDATE {table} SET v = v + 1, stamp = (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
         WHERE id = 1 RETURNING stamp"
    );
    let writers = 2;
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let client = db.connect().await;
        let sql = sql.clone();
        tasks.push(tokio::spawn(async move {
            let statement = client.prepare(&sql).await.expect("prepare");
            let per_writer = rate as f64 / writers as f64;
            let started = Instant::now();
            let mut stamps = Vec::new();
            while started.elapsed() < length {
                let due = (started.elapsed().as_secs_f64() * per_writer) as usize;
                if stamps.len() >= due {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let row = client.query_one(&statement, &[]).await.expect("update");
                stamps.push(row.get::<_, i64>(0));
            }
            stamps
        }));
    }
    let mut stamps = Vec::new();
    for task in tasks {
        stamps.extend(task.await.expect("a writer"));
    }
    stamps.sort_unstable();
    stamps
}

/// Every (change, replica) pair's latency: from the change's commit to the
/// first message the replica applied with that version or a newer one.
fn per_change(
    stamps: &[i64],
    arrivals: &HashMap<String, Vec<(i64, i64)>>,
    replicas: &[String],
) -> Latencies {
    let mut applied = Vec::with_capacity(stamps.len() * replicas.len());
    let mut missing = 0;
    let nothing = Vec::new();
    for replica in replicas {
        let seen = arrivals.get(replica).unwrap_or(&nothing);
        let (mut next, mut newest, mut at) = (0, i64::MIN, 0);
        for &stamp in stamps {
            while newest < stamp && next < seen.len() {
                if seen[next].0 > newest {
                    (newest, at) = seen[next];
                }
                next += 1;
            }
            if newest >= stamp {
                applied.push((at - stamp).max(0) as u64);
            } else {
                missing += 1;
            }
        }
    }
    Latencies::new(applied, missing)
}

/// What one run measured.
#[derive(Debug)]
struct Run {
    changes: usize,
    passes: Passes,
    latencies: Latencies,
    settled: Result<Duration, Backlog>,
}

/// The settings, from the environment.
#[derive(Debug)]
struct Plan {
    replicas: u64,
    items: u64,
    rate: u64,
    length: Duration,
    settle: Duration,
}

/// One run: `table`'s row 1 updated at the rate, then the wait for every
/// replica to have the last version.
async fn run(
    plan: &Plan,
    db: &TestDb,
    fleet: &Fleet,
    measured: &Mutex<&'static str>,
    arrivals: &Arrivals,
    table: &'static str,
) -> Run {
    let client = db.connect().await;
    arrivals.lock().unwrap().clear();
    *measured.lock().unwrap() = table;
    let from = Instant::now();
    let stamps = write(db, table, plan.rate, plan.length).await;
    let to = Instant::now();
    let settled = settle(&client, plan.replicas as usize, plan.settle).await;
    if settled.is_err() {
        println!("  {}", support::longest_statement(&client).await);
    }
    *measured.lock().unwrap() = "";
    let replicas: Vec<String> = (0..plan.replicas).map(unit).collect();
    Run {
        changes: stamps.len(),
        passes: fleet.host.passes(from, to),
        latencies: per_change(&stamps, &arrivals.lock().unwrap(), &replicas),
        settled,
    }
}

fn report(plan: &Plan, what: &str, run: &Run) {
    println!(
        "{what}: {} changes in {} s ({:.0}/s)",
        run.changes,
        plan.length.as_secs(),
        run.changes as f64 / plan.length.as_secs_f64()
    );
    println!("  relay: {}", run.passes.describe());
    println!(
        "  commit-to-applied per change and replica: {}",
        run.latencies.describe()
    );
    println!(
        "  after the load: {}",
        describe_settle(&run.settled, plan.settle, plan.replicas as usize)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let plan = Plan {
        replicas: env_u64("MAGIC_SYNC_BENCH_REPLICAS", 100),
        items: env_u64("MAGIC_SYNC_BENCH_ITEMS", 100),
        rate: env_u64("MAGIC_SYNC_BENCH_RATE", 1000),
        length: Duration::from_secs(env_u64("MAGIC_SYNC_BENCH_SECONDS", 30)),
        settle: Duration::from_secs(env_u64("MAGIC_SYNC_BENCH_SETTLE_SECONDS", 60)),
    };
    let engine = engine();
    support::child_if_asked(engine);
    println!("{plan:?}");
    println!("{}", support::Apart::from_env().describe());
    let db = magic_sync_testdb::database().await;
    setup(&db, engine, plan.replicas, plan.items).await;

    let measured = Arc::new(Mutex::new(""));
    let arrivals = Arrivals::default();
    let replicas = (0..plan.replicas)
        .map(|i| ReplicaInfo::live(unit(i), None))
        .collect();
    let fleet = Fleet::start(
        &db,
        engine,
        replicas,
        watch(measured.clone(), arrivals.clone()),
    )
    .await;
    let client = db.connect().await;
    match settle(&client, plan.replicas as usize, Duration::from_secs(300)).await {
        Ok(took) => println!(
            "{} replicas provisioned ({} items each) in {:.1} s",
            plan.replicas,
            plan.items,
            took.as_secs_f64()
        ),
        Err(backlog) => {
            println!(
                "provisioning: {}",
                describe_settle(
                    &Err(backlog),
                    Duration::from_secs(300),
                    plan.replicas as usize
                )
            );
            fleet.stop().await;
            return;
        }
    }

    let flat = run(&plan, &db, &fleet, &measured, &arrivals, "bulletin").await;
    report(
        &plan,
        "baseline: `bulletin` row 1 (all; nothing points at it)",
        &flat,
    );
    let hot = run(&plan, &db, &fleet, &measured, &arrivals, "hot").await;
    report(
        &plan,
        &format!(
            "hot parent: `hot` row 1 (referenced by {} items of {} replicas)",
            plan.items * plan.replicas,
            plan.replicas
        ),
        &hot,
    );
    println!(
        "hot / baseline: pass p50 {}, p99 {}; commit-to-applied p50 {}, p99 {}",
        ratio(hot.passes.quantile(0.50), flat.passes.quantile(0.50)),
        ratio(hot.passes.quantile(0.99), flat.passes.quantile(0.99)),
        ratio(hot.latencies.quantile(0.50), flat.latencies.quantile(0.50)),
        ratio(hot.latencies.quantile(0.99), flat.latencies.quantile(0.99)),
    );
    fleet.stop().await;
}

/// `a / b` as "2.31x", or "-" when either is missing.
fn ratio(a: Option<Duration>, b: Option<Duration>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if !b.is_zero() => format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64()),
        _ => "-".to_string(),
    }
}
