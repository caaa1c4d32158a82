//! The steady state: 100 replicas (10 per partition) kept up while the
//! server takes single-row changes, each wanted by the 10 replicas of its
//! partition. The relay runs its runner (`run::server`); every replica
//! applies into a SQLite file of its own and reports back what it applied,
//! in a child process over WebSocket on loopback, as devices would
//! (issue 22, decision 2), or with MAGIC_SYNC_BENCH_FLEET=threads on
//! threads of this process over the in-process network
//! (`magic_sync_testkit::apart`).
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench steady
//!
//! Idle: nothing changes for MAGIC_SYNC_BENCH_IDLE_SECONDS (default 10):
//!    the CPU the relay's PostgreSQL backends, this process and the
//!    fleet's (when apart) use.
//! 0. Light load: 20 changes per second for 10 s, the pipeline's own
//!    latency when a pass carries a change or two: the baseline for 1.
//! 1. Paced: 1,000 changes per second for MAGIC_SYNC_BENCH_SECONDS (default
//!    60): commit-to-applied latency (each change carries its commit clock;
//!    a replica takes the clock when the message holding it has applied),
//!    and the backlog (pending notes, messages in the outbox) sampled every
//!    second, to see whether it grows.
//! 2. Higher rates (2,000 and 4,000 changes per second, 20 s each): row
//!    deliveries per second applied, and whether the backlog stays bounded.
//!
//! 3. Away: MAGIC_SYNC_BENCH_AWAY replicas (default 10, one per region; 0
//!    skips it) are switched off for good, their connections closed, and
//!    the paced load runs again: the others' latency against part 1's,
//!    which a replica away should not move (what it is sent waits in its
//!    outbox, and publishing passes it over).
//!
//! MAGIC_SYNC_BENCH_RATE sets the paced rate (default 1,000 changes per
//! second); MAGIC_SYNC_BENCH_HIGHER=no skips part 2.
//!
//! MAGIC_SYNC_BENCH_REPLICA_SYNC=normal runs the replicas' SQLite files with
//! `synchronous = NORMAL` instead of the default FULL: the hundred replicas
//! here share one disk and wait in one fsync queue, which devices in a fleet
//! do not.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::relay::ReplicaInfo;
use magic_sync::{Engine, Row};
use magic_sync_testkit::bench::{self as support, Fleet, Watcher};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, partition = "region", key(id))]
struct Item {
    id: i64,
    region: i64,
    value: i64,
    stamp: i64,
}

const REPLICAS: usize = 100;
const REGIONS: i64 = 10;
const ITEMS: i64 = 10_000;

fn engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::builder()
            .table::<Item>()
            .build()
            .expect("declarations")
    })
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// What the replicas saw.
#[derive(Default)]
struct Seen {
    measuring: AtomicBool,
    latencies: Mutex<Vec<u64>>,
    rows: AtomicU64,
}

/// Counts every row applied and, while measuring, takes its latency from
/// the commit clock it carries.
fn watch(seen: Arc<Seen>) -> Watcher {
    Arc::new(move |_replica, _table, data, applied| {
        seen.rows.fetch_add(1, Ordering::Relaxed);
        if !seen.measuring.load(Ordering::Relaxed) {
            return;
        }
        let json: serde_json::Value = serde_json::from_slice(data).expect("json");
        if let Some(stamp) = json.get("stamp").and_then(serde_json::Value::as_i64) {
            seen.latencies
                .lock()
                .unwrap()
                .push((applied - stamp).max(0) as u64);
        }
    })
}

async fn backlog(client: &tokio_postgres::Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM sync.notes), (SELECT count(*) FROM sync.outbox)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Writers updating random items: `rate` changes per second in all, or as
/// fast as they go when `rate` is 0, until `stop`.
async fn write(
    db: &magic_sync_testdb::TestDb,
    writers: usize,
    rate: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut tasks = Vec::new();
    for w in 0..writers {
        let client = db.connect().await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let statement = client
                .prepare("UPDATE items SET value = value + 1, stamp = $2 WHERE id = $1")
                .await
                .unwrap();
            let mut done = 0u64;
            let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15 ^ (w as u64));
            let per_writer = rate as f64 / writers as f64;
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if rate > 0 {
                    let due = (started.elapsed().as_secs_f64() * per_writer) as u64;
                    if done >= due {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
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

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// What a paced run measured.
struct Paced {
    changes: u64,
    delivered: u64,
    measured: usize,
    p50: f64,
    p99: f64,
    max: f64,
    /// Pending notes and outbox messages, averaged over the first and the
    /// last 10 seconds.
    first: (f64, f64),
    last: (f64, f64),
    max_notes: i64,
}

/// Writes `rate` changes per second for `seconds`, sampling the backlog
/// every second, and waits for what was written to arrive.
async fn paced(
    db: &magic_sync_testdb::TestDb,
    client: &tokio_postgres::Client,
    seen: &Seen,
    rate: u64,
    seconds: u64,
) -> Paced {
    seen.measuring.store(true, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let writers = write(db, 2, rate, stop.clone());
    let sampler = async {
        let mut samples = Vec::new();
        for _ in 0..seconds {
            tokio::time::sleep(Duration::from_secs(1)).await;
            samples.push(backlog(client).await);
        }
        stop.store(true, Ordering::Relaxed);
        samples
    };
    let rows_before = seen.rows.load(Ordering::Relaxed);
    let (changes, samples) = tokio::join!(writers, sampler);
    // Let what was written arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    seen.measuring.store(false, Ordering::Relaxed);
    let delivered = seen.rows.load(Ordering::Relaxed) - rows_before;
    let mut latencies = std::mem::take(&mut *seen.latencies.lock().unwrap());
    latencies.sort_unstable();
    let avg = |s: &[&(i64, i64)]| {
        (
            s.iter().map(|x| x.0).sum::<i64>() as f64 / s.len().max(1) as f64,
            s.iter().map(|x| x.1).sum::<i64>() as f64 / s.len().max(1) as f64,
        )
    };
    let first: Vec<_> = samples.iter().take(10).collect();
    let last: Vec<_> = samples.iter().rev().take(10).collect();
    Paced {
        changes,
        delivered,
        measured: latencies.len(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        max: percentile(&latencies, 1.0),
        first: avg(&first),
        last: avg(&last),
        max_notes: samples.iter().map(|s| s.0).max().unwrap_or(0),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds: u64 = std::env::var("MAGIC_SYNC_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let rate: u64 = std::env::var("MAGIC_SYNC_BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let engine = engine();
    support::child_if_asked(engine);
    println!("{}", support::Apart::from_env().describe());
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE items (id bigint PRIMARY KEY, region bigint NOT NULL, value bigint NOT NULL, stamp bigint NOT NULL);
             INSERT INTO items SELECT i, i % {REGIONS}, 0, 0 FROM generate_series(1, {ITEMS}) i;"
        ))
        .await
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    magic_sync::trigger::install(engine, &mut client)
        .await
        .unwrap();

    let seen = Arc::new(Seen::default());
    let infos = (0..REPLICAS)
        .map(|i| ReplicaInfo::live(format!("r{i:03}"), Some(&(i as i64 % REGIONS).to_string())))
        .collect();
    let mut fleet = Fleet::start(&db, engine, infos, watch(seen.clone())).await;
    // Provisioned and confirmed, every one. Both counts in one statement,
    // so they are of one moment: read apart, an empty list could be counted
    // as nothing waiting, then the list the first pass committed as complete.
    let started = Instant::now();
    loop {
        let row = client
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE provision OR coalesce(a.number, 0) < last_number OR last_number = 0)
                 FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id",
                &[],
            )
            .await
            .unwrap();
        let (known, waiting): (i64, i64) = (row.get(0), row.get(1));
        if known == REPLICAS as i64 && waiting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "{REPLICAS} replicas provisioned ({} rows each) in {:.2} s",
        ITEMS / REGIONS,
        started.elapsed().as_secs_f64()
    );

    // Idle: nothing changes. What keeping the fleet up costs when there is
    // nothing to send, in CPU.
    let idle = Duration::from_secs(support::env_u64("MAGIC_SYNC_BENCH_IDLE_SECONDS", 10));
    let child = || fleet.child_pid().map_or(Duration::ZERO, support::cpu_of);
    let (own, backends) = support::cpu_used(&client).await;
    let fleet_before = child();
    tokio::time::sleep(idle).await;
    let (own_after, backends_after) = support::cpu_used(&client).await;
    let fleet_used = child().saturating_sub(fleet_before);
    let share = |d: Duration| 100.0 * d.as_secs_f64() / idle.as_secs_f64();
    println!(
        "idle {} s: the relay's PostgreSQL backends used {:.0} ms of CPU ({:.1}% of a core), this process {:.0} ms ({:.1}%), the fleet's process {:.0} ms ({:.1}%)",
        idle.as_secs(),
        (backends_after.saturating_sub(backends)).as_secs_f64() * 1e3,
        share(backends_after.saturating_sub(backends)),
        (own_after.saturating_sub(own)).as_secs_f64() * 1e3,
        share(own_after.saturating_sub(own)),
        fleet_used.as_secs_f64() * 1e3,
        share(fleet_used),
    );

    // 0. The pipeline's own latency: a light load, where a pass carries a
    //    change or two; the baseline the paced figures compare with.
    let light = paced(&db, &client, &seen, 20, 10).await;
    println!(
        "light load (20 changes/s, 10 s): commit-to-applied p50 {:.1} ms, p99 {:.1} ms",
        light.p50, light.p99
    );
    // 1. Paced.
    let run = paced(&db, &client, &seen, rate, seconds).await;
    println!(
        "paced: {} changes in {seconds} s ({:.0}/s), {} row deliveries applied",
        run.changes,
        run.changes as f64 / seconds as f64,
        run.delivered
    );
    println!(
        "  commit-to-applied latency: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} deliveries measured); p50 {:.1}x, p99 {:.1}x the light load's",
        run.p50,
        run.p99,
        run.max,
        run.measured,
        run.p50 / light.p50,
        run.p99 / light.p99
    );
    println!(
        "  backlog (pending notes, outbox messages): first 10 s avg {:.1}, {:.1}; last 10 s avg {:.1}, {:.1}; max notes {}",
        run.first.0, run.first.1, run.last.0, run.last.1, run.max_notes
    );

    // 2. Higher rates, 20 s each: does the backlog stay bounded?
    let higher: &[u64] = if std::env::var("MAGIC_SYNC_BENCH_HIGHER").as_deref() == Ok("no") {
        &[]
    } else {
        &[2_000, 4_000]
    };
    for &rate in higher {
        let stop = Arc::new(AtomicBool::new(false));
        let rows_before = seen.rows.load(Ordering::Relaxed);
        let started = Instant::now();
        let sampler = async {
            let mut samples = Vec::new();
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                samples.push(backlog(&client).await.0);
            }
            stop.store(true, Ordering::Relaxed);
            samples
        };
        let (changes, samples) = tokio::join!(write(&db, 4, rate, stop.clone()), sampler);
        let elapsed = started.elapsed().as_secs_f64();
        let delivered = seen.rows.load(Ordering::Relaxed) - rows_before;
        let first = samples[..5].iter().sum::<i64>() as f64 / 5.0;
        let last = samples[15..].iter().sum::<i64>() as f64 / 5.0;
        println!(
            "at {rate}/s: {:.0} changes/s written, {:.0} row deliveries/s applied; pending notes first 5 s avg {first:.0}, last 5 s avg {last:.0}{}",
            changes as f64 / elapsed,
            delivered as f64 / elapsed,
            if last > 2.0 * first.max(100.0) { " (growing: beyond what the relay sustains)" } else { " (bounded)" }
        );
        // Let the backlog drain before the next rate.
        loop {
            if backlog(&client).await.0 == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // 3. Replicas away: one of each region's ten switched off for good,
    //    what they are sent waiting in their outboxes; the others at the
    //    paced rate again, against part 1.
    let away = support::env_u64("MAGIC_SYNC_BENCH_AWAY", 10) as usize;
    if away > 0 {
        for i in 0..away.min(REPLICAS) {
            fleet.away(&format!("r{i:03}"));
        }
        let gone = paced(&db, &client, &seen, rate, seconds).await;
        let waiting: i64 = client
            .query_one(
                &format!(
                    "SELECT count(*) FROM sync.outbox WHERE replica < 'r{:03}'",
                    away.min(REPLICAS)
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        println!(
            "{away} replicas away (one a region), the others at {rate} changes/s for {seconds} s: commit-to-applied p50 {:.1} ms, p99 {:.1} ms ({} deliveries measured); p50 {:.2}x, p99 {:.2}x of none away; {waiting} messages waiting for those away at the end",
            gone.p50,
            gone.p99,
            gone.measured,
            gone.p50 / run.p50,
            gone.p99 / run.p99
        );
    }
    fleet.stop().await;
}
