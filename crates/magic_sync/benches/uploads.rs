//! Uploads (issue 11): a hundred replicas each writing a hundred rows a
//! second while the down path runs, filed by the relay's runner.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench uploads
//!
//! Each replica runs the runner's loop (`run::replica::replica`) and its
//! host beside it, in a child process over WebSocket on loopback, as
//! devices would (issue 22, decision 2), or with
//! MAGIC_SYNC_BENCH_FLEET=threads on threads of this process over the
//! in-process network (`magic_sync_testkit::apart`). The host writes on a
//! SQLite connection of its own to the replica's file, ten rows a
//! transaction every 100 ms, each row stamped with its commit clock, and
//! nudges the loop after each commit. The relay's runner files uploads on
//! its publishing connection; the server stamps
//! each row as it is inserted (`clock_timestamp()`, in the filing
//! transaction, a moment before it commits). Meanwhile a writer updates
//! 100 rows a second of a table that goes down to every replica.
//!
//! Each host waits for its commits to read back with
//! `replica::wait_written` between its ticks.
//!
//! Reported: rows filed per second while the load runs, against the rate
//! written; rows written and not yet filed when it stops, and how long
//! they take to drain; the time from a replica's commit to the server's,
//! p50 and p99; and the time from a replica's commit until its host reads
//! the write back (`replica::written` says `Reached`: the server's
//! `Reached` message for it was applied), p50 and p99.
//!
//! MAGIC_SYNC_BENCH_REPLICAS (default 100), MAGIC_SYNC_BENCH_RATE rows a
//! second per replica (default 100), MAGIC_SYNC_BENCH_SECONDS (default 20).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync_testkit::bench as support;

use magic_sync::relay::ReplicaInfo;
use magic_sync::{Engine, Row};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{env_u64, now_micros, show, Device, Fleet};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "readings", up, key(id), key_without_origin)]
struct Reading {
    id: String,
    #[row(origin)]
    unit: String,
    value: i64,
    written_at: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, all, key(id))]
struct Item {
    id: i64,
    value: i64,
}

/// A device's host: ten rows a transaction every 100 ms (MAGIC_SYNC_BENCH_RATE
/// rows a second in all), each stamped with its commit clock, nudging the
/// replica's loop after each commit and waiting between ticks for its
/// commits to read back. Tells `written N` once it stops writing, then
/// `reached` and the microseconds each commit took to read back.
fn host(device: &Device<'_>) {
    let rate = env_u64("MAGIC_SYNC_BENCH_RATE", 100);
    let id = device.id;
    let conn = rusqlite::Connection::open(device.path).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    let per_tick = (rate / 10).max(1);
    let mut n = 0u64;
    let begun = Instant::now();
    let mut tick = 0u64;
    // Each commit's mark, until it reads back.
    type Waiting = std::collections::VecDeque<(magic_sync::replica::Mark, Instant)>;
    let mut waiting = Waiting::new();
    let mut waited: Vec<Duration> = Vec::new();
    // Waits up to `wait` for the oldest commit to read back, as a host
    // showing "everyone sees it" would (`wait_written`: woken by its
    // replica's loop in this process), then takes every commit that reads
    // back by then.
    let check = |waiting: &mut Waiting, waited: &mut Vec<Duration>, wait: Duration| {
        let mut wait = wait;
        while let Some(&(mark, at)) = waiting.front() {
            let now = magic_sync::replica::wait_written(
                &conn,
                mark,
                magic_sync::replica::Written::Reached,
                wait,
            )
            .unwrap();
            if now != magic_sync::replica::Written::Reached {
                return;
            }
            waited.push(at.elapsed());
            waiting.pop_front();
            wait = Duration::ZERO;
        }
        std::thread::sleep(wait);
    };
    while !device.stopped() {
        tick += 1;
        let tx = conn.unchecked_transaction().unwrap();
        for _ in 0..per_tick {
            n += 1;
            tx.prepare_cached(
                "INSERT INTO readings (id, unit, value, written_at) VALUES (?1, ?2, ?3, ?4)",
            )
            .unwrap()
            .execute(rusqlite::params![
                format!("{id}-{n}"),
                id,
                n as i64,
                now_micros()
            ])
            .unwrap();
        }
        tx.commit().unwrap();
        let committed = Instant::now();
        waiting.push_back((magic_sync::replica::mark(&conn).unwrap(), committed));
        device.nudge();
        // Until the next tick, wait for marks to read back.
        let due = Duration::from_millis(100 * tick);
        while let Some(wait) = due.checked_sub(begun.elapsed()) {
            check(&mut waiting, &mut waited, wait);
        }
    }
    device.tell(&format!("written {n}"));
    // The load stopped: wait for the rest to read back.
    let since = Instant::now();
    while !waiting.is_empty() && since.elapsed() < Duration::from_secs(600) {
        check(&mut waiting, &mut waited, Duration::from_secs(1));
    }
    let micros: Vec<String> = waited.iter().map(|d| d.as_micros().to_string()).collect();
    device.tell(&format!("reached {}", micros.join(" ")));
}

/// The hosts' lines that begin with `word`, once every one of `replicas`
/// told one.
async fn told(fleet: &Fleet, word: &str, replicas: usize) -> Vec<String> {
    let since = Instant::now();
    loop {
        let lines: Vec<String> = fleet
            .told()
            .into_iter()
            .filter_map(|l| l.strip_prefix(word).map(str::to_string))
            .collect();
        if lines.len() >= replicas {
            return lines;
        }
        assert!(
            since.elapsed() < Duration::from_secs(900),
            "{} of {replicas} hosts told `{word}`",
            lines.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let replicas = env_u64("MAGIC_SYNC_BENCH_REPLICAS", 100) as usize;
    let rate = env_u64("MAGIC_SYNC_BENCH_RATE", 100);
    let seconds = env_u64("MAGIC_SYNC_BENCH_SECONDS", 20);
    let engine = &Engine::builder()
        .table::<Reading>()
        .table::<Item>()
        .build()
        .expect("declarations");
    support::child_if_asked_with(engine, Some(host));
    println!("{}", support::Apart::from_env().describe());
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE readings (id text PRIMARY KEY, unit text NOT NULL, value bigint NOT NULL,
                 written_at bigint NOT NULL, filed_at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE TABLE items (id bigint PRIMARY KEY, value bigint NOT NULL);
             INSERT INTO items SELECT i, 0 FROM generate_series(1, 1000) i;",
        )
        .await
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    magic_sync::trigger::install(engine, &mut client)
        .await
        .unwrap();
    let infos: Vec<ReplicaInfo> = (0..replicas)
        .map(|i| ReplicaInfo::live(format!("r{i:03}"), None))
        .collect();
    let nothing: support::Watcher = std::sync::Arc::new(|_, _, _, _| {});
    let mut fleet = Fleet::start_with(&db, engine, infos.clone(), nothing, Some(host)).await;
    // Every replica provisioned (items), before the load.
    let started = Instant::now();
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM sync.replicas WHERE provision OR snapshot_attempt IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let known: i64 = client
            .query_one("SELECT count(*) FROM sync.replicas", &[])
            .await
            .unwrap()
            .get(0);
        if known == replicas as i64 && waiting == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "never provisioned"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "{replicas} replicas provisioned in {:.1} s; each writes {rate} rows/s for {seconds} s",
        started.elapsed().as_secs_f64()
    );

    // The load: every replica's host, and the server's own writer.
    let stop = Arc::new(AtomicBool::new(false));
    fleet.load();
    let server_writer = {
        let (stop, writer) = (stop.clone(), db.connect().await);
        tokio::spawn(async move {
            let mut i = 0i64;
            let begun = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                writer
                    .execute(
                        "UPDATE items SET value = value + 1 WHERE id = $1",
                        &[&(1 + i % 1000)],
                    )
                    .await
                    .unwrap();
                let due = Duration::from_millis(10 * i as u64);
                if let Some(wait) = due.checked_sub(begun.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        })
    };
    let from = now_micros();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let to = now_micros();
    fleet.stop_load();
    server_writer.await.unwrap();
    // Every host's last tick counted.
    let total: u64 = told(&fleet, "written ", replicas)
        .await
        .iter()
        .map(|n| n.parse::<u64>().expect("rows written"))
        .sum();
    let filed_by_end: i64 = client
        .query_one(
            "SELECT count(*) FROM readings WHERE filed_at <= to_timestamp($1::float8 / 1e6)",
            &[&(to as f64)],
        )
        .await
        .unwrap()
        .get(0);
    let drain = Instant::now();
    loop {
        let filed: i64 = client
            .query_one("SELECT count(*) FROM readings", &[])
            .await
            .unwrap()
            .get(0);
        if filed as u64 >= total {
            break;
        }
        assert!(
            drain.elapsed() < Duration::from_secs(600),
            "{filed} of {total} filed 600 s after the load stopped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained = drain.elapsed();
    let window = (to - from) as f64 / 1e6;
    let latencies: Vec<Duration> = client
        .query(
            "SELECT (extract(epoch FROM filed_at) * 1e6)::int8 - written_at FROM readings
             WHERE written_at BETWEEN $1 AND $2 ORDER BY 1",
            &[&from, &to],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Duration::from_micros(r.get::<_, i64>(0).max(0) as u64))
        .collect();
    let q = |p: f64| support::quantile(&latencies, p).map_or("-".into(), show);
    println!(
        "written {total} rows in {window:.1} s ({:.0} rows/s); filed by the end {filed_by_end} ({:.0} rows/s); \
         not filed when the load stopped: {}; drained in {:.2} s",
        total as f64 / window,
        filed_by_end as f64 / window,
        total as i64 - filed_by_end,
        drained.as_secs_f64()
    );
    println!(
        "replica commit to server insert: p50 {}, p99 {}, max {} ({} rows)",
        q(0.50),
        q(0.99),
        q(1.0),
        latencies.len()
    );
    let mut reached: Vec<Duration> = told(&fleet, "reached", replicas)
        .await
        .iter()
        .flat_map(|l| {
            l.split_whitespace()
                .map(|m| m.parse::<u64>().expect("micros"))
        })
        .map(Duration::from_micros)
        .collect();
    reached.sort();
    let r = |p: f64| support::quantile(&reached, p).map_or("-".into(), show);
    println!(
        "replica commit to reading its own write back: p50 {}, p99 {}, max {} ({} commits)",
        r(0.50),
        r(0.99),
        r(1.0),
        reached.len()
    );
    fleet.stop().await;
}
