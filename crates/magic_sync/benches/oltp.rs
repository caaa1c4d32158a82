//! magic_sync under an OLTP load (issue 9): pgbench's own schema and its
//! built-in TPC-B-like script, one replica per branch, every table sent by
//! branch.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench oltp
//!
//! The schema is pgbench's at scale 10 (1M accounts), with the foreign keys
//! `pgbench --foreign-keys` adds and, as is usual, no index on any
//! foreign-key column; `pgbench_history` gets a key (`hid bigserial`), which
//! pgbench's has not and the engine needs. Ten replicas, ids "1" to "10",
//! each applying into a SQLite file of its own, behind the relay's runner
//! (`run::server`): in a child process over WebSocket on loopback, or with
//! `MAGIC_SYNC_BENCH_FLEET=threads` on threads of this process over the
//! in-process network (`magic_sync_testkit::apart`). History
//! rows point at accounts and tellers of other branches, so through the
//! closure every replica comes to hold other branches' rows as parents.
//!
//! The workload is `pgbench -b tpcb-like -c 4 -j 2 -n`, a child process
//! against the test database. It reports:
//!
//! - (a) transactions per second without the triggers (a second database of
//!   the same shape, no engine), with the triggers only (the same database
//!   after `trigger::install`, no relay), and with the triggers and
//!   the relay running, as ratios of the first;
//! - (b) the highest paced rate (`pgbench -R`, a ladder of rates) at which
//!   pending notes stay bounded: sampled every second, bounded when the
//!   last third of the run's samples average no more than the first third's
//!   plus one second of the workload's notes, and pgbench reached 90% of the
//!   rate (above that the database, not the relay, is the limit);
//! - (c) commit-to-applied p50 and p99 at half of that rate: each history
//!   row's `mtime` (pgbench writes `CURRENT_TIMESTAMP`, the transaction's
//!   start, in UTC here) against the moment the replica applied the message
//!   carrying it; rows not applied by the end of the settling limit count as
//!   slower than every row that was;
//! - (d) the time to settle after a full load stops: no pending notes, no
//!   message in `sync.outbox`, every replica's acknowledgement at its last
//!   message;
//! - (e) an outage: the relay stopped while the full load runs, then
//!   started again on the backlog it left: how many notes waited, how long
//!   the first pass took (every pass plans every pending note, decision 39),
//!   and how long until everything settled.
//!
//! Every phase has a time limit: a relay that stalls shows as "did not
//! settle in N s", and the phases after it say what they found waiting.
//!
//! MAGIC_SYNC_BENCH_SECONDS: each full-load run (default 30).
//! MAGIC_SYNC_BENCH_RATES: the ladder (default 250,500,1000,1500,2000).
//! MAGIC_SYNC_BENCH_STEP_SECONDS: each rung and the latency run (default 20).
//! MAGIC_SYNC_BENCH_SETTLE_SECONDS: the settling limit (default 60).
//! MAGIC_SYNC_BENCH_PROVISION_SECONDS: the provisioning limit (default 300).
//! MAGIC_SYNC_BENCH_SCALE: pgbench's scale, one replica per branch (default 10).
//! MAGIC_SYNC_BENCH_LATENCY_RATE: the rate of (c), instead of half the
//! ladder's best (an empty MAGIC_SYNC_BENCH_RATES skips the ladder).
//! MAGIC_SYNC_BENCH_ONLY=provision: only the fleet made ready from nothing:
//! until every replica applied its snapshot's end (it holds its rows), and
//! until everything is recorded and acknowledged.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync_testkit::bench as support;

use chrono::NaiveDateTime;
use magic_sync::relay::ReplicaInfo;
use magic_sync::Engine;
use magic_sync_testdb::TestDb;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{describe_settle, env_u64, now_micros, settle, Backlog, Fleet, Latencies};
use tokio_postgres::Client;

fn engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(magic_sync_testkit::pgbench::engine)
}

/// The benchmark's settings, from the environment.
#[derive(Debug)]
struct Plan {
    scale: u64,
    full: Duration,
    rates: Vec<u64>,
    step: Duration,
    settle: Duration,
    provision: Duration,
    /// The rate (c) runs at, when not half the ladder's best.
    latency_rate: Option<u64>,
}

impl Plan {
    fn from_env() -> Plan {
        let seconds = |name, default| Duration::from_secs(env_u64(name, default));
        let rates = std::env::var("MAGIC_SYNC_BENCH_RATES")
            .ok()
            .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![250, 500, 1000, 1500, 2000]);
        Plan {
            scale: env_u64("MAGIC_SYNC_BENCH_SCALE", 10),
            full: seconds("MAGIC_SYNC_BENCH_SECONDS", 30),
            rates,
            step: seconds("MAGIC_SYNC_BENCH_STEP_SECONDS", 20),
            settle: seconds("MAGIC_SYNC_BENCH_SETTLE_SECONDS", 60),
            provision: seconds("MAGIC_SYNC_BENCH_PROVISION_SECONDS", 300),
            latency_rate: std::env::var("MAGIC_SYNC_BENCH_LATENCY_RATE")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
        }
    }

    fn replicas(&self) -> usize {
        self.scale as usize
    }
}

/// Runs pgbench against `db` with `args`, killed if it outlives `limit`;
/// its standard output.
async fn pgbench(db: &TestDb, args: &[String], limit: Duration) -> String {
    let run = tokio::process::Command::new(magic_sync_testdb::server().bin("pgbench"))
        .args(args)
        .arg(db.conninfo())
        // `mtime` is a timestamp without zone: written in UTC, it reads
        // on the replicas' clock.
        .env("PGTZ", "UTC")
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(limit, run).await {
        Ok(output) => output.expect("run pgbench"),
        Err(_) => panic!("pgbench {args:?} did not finish in {} s", limit.as_secs()),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "pgbench {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A database with pgbench's tables at `scale`, its foreign keys, and a key
/// on the history.
async fn pgbench_database(scale: u64) -> TestDb {
    let db = magic_sync_testdb::database().await;
    let started = Instant::now();
    let init = ["-i", "-q", "-I", "dtgvpf", "-s", &scale.to_string()].map(String::from);
    pgbench(&db, &init, Duration::from_secs(600)).await;
    db.connect()
        .await
        .batch_execute(
            "ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY;
             ANALYZE pgbench_history;",
        )
        .await
        .expect("key the history");
    println!(
        "pgbench schema at scale {scale} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    db
}

/// The engine's schema and triggers on `db`.
async fn install(db: &TestDb, engine: &Engine) -> Client {
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client)
        .await
        .expect("migrate");
    magic_sync::trigger::install(engine, &mut client)
        .await
        .expect("install the triggers");
    client
}

/// What one pgbench run of the TPC-B-like script did.
#[derive(Debug)]
struct Load {
    tps: f64,
    transactions: u64,
    /// The backlog, every second of the run.
    samples: Vec<Backlog>,
    /// The run's stretch, on the monotonic clock and in microseconds since 1970.
    from: Instant,
    to: Instant,
    window: (i64, i64),
}

/// `pgbench -b tpcb-like -c 4 -j 2` for `length`, paced at `rate` if given,
/// sampling the backlog every second when `client` is given.
async fn run_load(
    db: &TestDb,
    client: Option<&Client>,
    length: Duration,
    rate: Option<u64>,
) -> Load {
    let mut args = ["-n", "-b", "tpcb-like", "-c", "4", "-j", "2", "-T"]
        .map(String::from)
        .to_vec();
    args.push(length.as_secs().to_string());
    if let Some(rate) = rate {
        args.extend(["-R".to_string(), rate.to_string()]);
    }
    let (from, start) = (Instant::now(), now_micros());
    let bench = pgbench(db, &args, length + Duration::from_secs(120));
    tokio::pin!(bench);
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let stdout = loop {
        tokio::select! {
            stdout = &mut bench => break stdout,
            _ = tick.tick(), if client.is_some() => {
                samples.push(Backlog::read(client.expect("a client")).await);
            }
        }
    };
    Load {
        tps: figure(&stdout, "tps = "),
        transactions: figure(&stdout, "number of transactions actually processed: ") as u64,
        samples,
        from,
        to: Instant::now(),
        window: (start, now_micros()),
    }
}

/// The number after `prefix` on a line of pgbench's report.
fn figure(stdout: &str, prefix: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}` in pgbench's report:\n{stdout}"))
}

/// The pending notes averaged over the first and the last third of the run.
fn thirds(samples: &[Backlog]) -> (f64, f64) {
    let third = (samples.len() / 3).max(1).min(samples.len());
    let average =
        |s: &[Backlog]| s.iter().map(|b| b.notes as f64).sum::<f64>() / s.len().max(1) as f64;
    (
        average(&samples[..third]),
        average(&samples[samples.len() - third..]),
    )
}

/// Whether pending notes grew over the run: the last third of the samples
/// averages more than the first third plus `allowance` notes.
fn grew(samples: &[Backlog], allowance: f64) -> bool {
    let (first, last) = thirds(samples);
    last > first + allowance
}

/// "pending notes: first third avg 120, last third avg 130, max 400; outbox max 3"
fn describe_backlog(samples: &[Backlog]) -> String {
    let (first, last) = thirds(samples);
    format!(
        "pending notes: first third avg {first:.0}, last third avg {last:.0}, max {}; outbox max {}",
        samples.iter().map(|b| b.notes).max().unwrap_or(0),
        samples.iter().map(|b| b.outbox).max().unwrap_or(0)
    )
}

/// (a), the first two: full load without the engine, then with its
/// triggers and no relay, on a database of its own. Returns both rates and
/// the notes the triggers wrote per transaction.
async fn without_relay(plan: &Plan, engine: &Engine) -> (f64, f64, f64) {
    let db = pgbench_database(plan.scale).await;
    let bare = run_load(&db, None, plan.full, None).await;
    println!("(a) without the triggers: {:.0} transactions/s", bare.tps);
    let client = install(&db, engine).await;
    let noted = run_load(&db, None, plan.full, None).await;
    let notes: i64 = client
        .query_one("SELECT count(*) FROM sync.notes", &[])
        .await
        .expect("count the notes")
        .get(0);
    let per_transaction = notes as f64 / noted.transactions.max(1) as f64;
    println!(
        "(a) with the triggers, no relay: {:.0} transactions/s, {:.3}x; {per_transaction:.2} notes per transaction",
        noted.tps,
        noted.tps / bare.tps
    );
    (bare.tps, noted.tps, per_transaction)
}

/// Every history row a replica applied: its `mtime` and when it applied,
/// in microseconds since 1970.
type Arrivals = Arc<Mutex<Vec<(i64, i64)>>>;

fn watch_history(arrivals: Arrivals) -> support::Watcher {
    Arc::new(move |_replica, table, data, applied| {
        if table != "pgbench_history" {
            return;
        }
        let row: serde_json::Value = serde_json::from_slice(data).expect("a JSON row");
        let Some(mtime) = row.get("mtime").and_then(serde_json::Value::as_str) else {
            return;
        };
        let mtime = NaiveDateTime::parse_from_str(mtime, "%Y-%m-%dT%H:%M:%S%.f")
            .expect("a timestamp")
            .and_utc()
            .timestamp_micros();
        arrivals.lock().unwrap().push((mtime, applied));
    })
}

/// One rung of the ladder.
#[derive(Debug)]
struct Rung {
    rate: u64,
    tps: f64,
    grew: bool,
    settled: Result<Duration, Backlog>,
}

impl Rung {
    /// The relay kept up with the rate asked for.
    fn sustained(&self) -> bool {
        !self.grew && self.tps >= 0.9 * self.rate as f64
    }
}

/// (b): each rate of the ladder in turn, until one is not sustained or its
/// backlog does not settle.
async fn ladder(
    plan: &Plan,
    db: &TestDb,
    client: &Client,
    fleet: &Fleet,
    notes_per_transaction: f64,
) -> Vec<Rung> {
    let mut rungs = Vec::new();
    for &rate in &plan.rates {
        let load = run_load(db, Some(client), plan.step, Some(rate)).await;
        let settled = settle(client, plan.replicas(), plan.settle).await;
        let rung = Rung {
            rate,
            tps: load.tps,
            grew: grew(&load.samples, rate as f64 * notes_per_transaction),
            settled,
        };
        println!(
            "(b) paced at {rate}/s: {:.0} transactions/s, backlog {}; {}; relay {}; {}",
            rung.tps,
            if rung.grew { "growing" } else { "bounded" },
            describe_backlog(&load.samples),
            fleet.host.passes(load.from, load.to).describe(),
            describe_settle(&rung.settled, plan.settle, plan.replicas())
        );
        if rung.settled.is_err() {
            println!("    {}", support::longest_statement(client).await);
        }
        let go_on = rung.sustained() && rung.settled.is_ok();
        rungs.push(rung);
        if !go_on {
            break;
        }
    }
    rungs
}

/// (c): the workload at `rate`; every history row it wrote, from commit to
/// applied.
async fn latency(
    plan: &Plan,
    db: &TestDb,
    client: &Client,
    arrivals: &Arrivals,
    rate: u64,
) -> (Load, Result<Duration, Backlog>, Latencies) {
    let load = run_load(db, Some(client), plan.step, Some(rate)).await;
    let settled = settle(client, plan.replicas(), plan.settle).await;
    let (from, to) = load.window;
    let in_window = |us: i64| us >= from && us < to;
    let applied: Vec<u64> = arrivals
        .lock()
        .unwrap()
        .iter()
        .filter(|(mtime, _)| in_window(*mtime))
        .map(|(mtime, at)| (at - mtime).max(0) as u64)
        .collect();
    let timestamp = |us: i64| {
        chrono::DateTime::from_timestamp_micros(us)
            .expect("a time")
            .naive_utc()
    };
    let written: i64 = client
        .query_one(
            "SELECT count(*) FROM pgbench_history WHERE mtime >= $1 AND mtime < $2",
            &[&timestamp(from), &timestamp(to)],
        )
        .await
        .expect("count the history")
        .get(0);
    let missing = (written as usize).saturating_sub(applied.len());
    (load, settled, Latencies::new(applied, missing))
}

/// (c), once the ladder's backlog has settled: `latency` at `rate`, printed.
async fn latency_at(
    plan: &Plan,
    db: &TestDb,
    client: &Client,
    arrivals: &Arrivals,
    rate: u64,
) -> Option<(u64, Latencies)> {
    let ready = settle(client, plan.replicas(), plan.settle).await;
    if ready.is_err() {
        println!(
            "(c) skipped: the ladder's backlog {}",
            describe_settle(&ready, plan.settle, plan.replicas())
        );
        return None;
    }
    let (load, settled, latencies) = latency(plan, db, client, arrivals, rate).await;
    println!(
        "(c) at {rate}/s: {:.0} transactions/s; commit-to-applied {}; {}",
        load.tps,
        latencies.describe(),
        describe_settle(&settled, plan.settle, plan.replicas())
    );
    Some((rate, latencies))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let plan = Plan::from_env();
    let engine = engine();
    support::child_if_asked(engine);
    println!("{plan:?}");
    println!("{}", support::Apart::from_env().describe());

    // MAGIC_SYNC_BENCH_ONLY=provision: the fleet made ready from nothing,
    // and nothing else.
    let only_provision = std::env::var("MAGIC_SYNC_BENCH_ONLY").as_deref() == Ok("provision");
    // (a) without the relay, on a database of its own.
    let (bare, noted, notes_per_transaction) = match only_provision {
        true => (0.0, 0.0, 0.0),
        false => without_relay(&plan, engine).await,
    };

    // The database the relay serves.
    let db = pgbench_database(plan.scale).await;
    let client = install(&db, engine).await;
    let arrivals = Arrivals::default();
    let replicas = (1..=plan.scale)
        .map(|b| ReplicaInfo::live(b.to_string(), None))
        .collect();
    let mut fleet = Fleet::start(&db, engine, replicas, watch_history(arrivals.clone())).await;
    // Clocked from the relay's start, the replicas connected.
    let started = fleet.relay_started();
    match settle(&client, plan.replicas(), plan.provision).await {
        Ok(took) => {
            let ends = fleet.snapshot_ends();
            let holding = match ends.len() == plan.replicas() {
                true => ends.values().max().map(|last| *last - started),
                false => None,
            };
            println!(
                "{} replicas hold their rows (each applied its snapshot's end) in {}; \
                 provisioned (recorded, acknowledged, nothing pending) in {:.2} s",
                plan.replicas(),
                holding.map_or("-".into(), |h| format!("{:.2} s", h.as_secs_f64())),
                took.as_secs_f64()
            )
        }
        Err(backlog) => {
            println!(
                "provisioning: {}",
                describe_settle(&Err(backlog), plan.provision, plan.replicas())
            );
            fleet.stop().await;
            return;
        }
    }
    let provisioned = started.elapsed();
    if only_provision {
        fleet.stop().await;
        return;
    }

    // (b) the ladder, (c) latency at half the highest sustained rate.
    let rungs = ladder(&plan, &db, &client, &fleet, notes_per_transaction).await;
    let best = rungs
        .iter()
        .take_while(|r| r.sustained())
        .map(|r| r.rate)
        .last();
    let measured = match plan.latency_rate.or(best.map(|b| b / 2)) {
        Some(rate) => latency_at(&plan, &db, &client, &arrivals, rate).await,
        None => {
            println!("(c) skipped: no rate of the ladder was sustained");
            None
        }
    };

    // (a) with the relay, and (d) settling after it.
    let before = Backlog::read(&client).await;
    let full = run_load(&db, Some(&client), plan.full, None).await;
    let settled = settle(&client, plan.replicas(), plan.settle).await;
    println!(
        "(a) with the triggers and the relay: {:.0} transactions/s, {:.3}x (backlog before: {} notes); {}; relay {}",
        full.tps,
        full.tps / bare,
        before.notes,
        describe_backlog(&full.samples),
        fleet.host.passes(full.from, full.to).describe()
    );
    println!(
        "(d) after {} s at full load: {}; the relay's pass under way had run {}",
        plan.full.as_secs(),
        describe_settle(&settled, plan.settle, plan.replicas()),
        support::show(fleet.host.passes(full.to, Instant::now()).running)
    );
    if settled.is_err() {
        println!("    {}", support::longest_statement(&client).await);
    }

    // (e) an outage at full load, and the relay back on its backlog.
    let outage = outage(&plan, &db, &client, &mut fleet).await;

    println!();
    println!(
        "summary (scale {}, {} replicas, provisioned in {:.1} s):",
        plan.scale,
        plan.replicas(),
        provisioned.as_secs_f64()
    );
    println!(
        "  (a) transactions/s: without triggers {bare:.0}; triggers only {noted:.0} ({:.3}x); triggers and relay {:.0} ({:.3}x)",
        noted / bare,
        full.tps,
        full.tps / bare
    );
    println!(
        "  (b) highest sustained rate: {}",
        best.map_or("none of the ladder".to_string(), |r| format!("{r}/s"))
    );
    if let Some((rate, latencies)) = &measured {
        println!(
            "  (c) at {rate}/s: commit-to-applied {}",
            latencies.describe()
        );
    }
    println!(
        "  (d) after full load: {}",
        describe_settle(&settled, plan.settle, plan.replicas())
    );
    println!("  (e) {outage}");
    fleet.stop().await;
}

/// (e): the relay stopped for a full-load run, then started again: the
/// backlog it finds, its first pass over all of it, and the time to settle.
async fn outage(plan: &Plan, db: &TestDb, client: &Client, fleet: &mut Fleet) -> String {
    if settle(client, plan.replicas(), plan.settle).await.is_err() {
        return "skipped: the backlog before it did not settle".into();
    }
    fleet.stop_relay().await;
    let load = run_load(db, None, plan.full, None).await;
    let backlog = Backlog::read(client).await;
    let restarted = Instant::now();
    fleet.start_relay();
    let settled = settle(client, plan.replicas(), plan.settle).await;
    // The runner asks for the replicas before every pass: the first pass is
    // the time between its first two asks.
    let first = fleet.host.first_pass(restarted);
    let line = format!(
        "after {} s of full load ({:.0} transactions/s) with the relay stopped: {} notes pending; \
         the first pass took {}; {}",
        plan.full.as_secs(),
        load.tps,
        backlog.notes,
        first.map_or("-".into(), support::show),
        describe_settle(&settled, plan.settle, plan.replicas())
    );
    println!("(e) {line}");
    line
}
