//! Uploads (issue 11): a hundred replicas each writing a hundred rows a
//! second while the down path runs, filed by the relay's runner.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench uploads
//!
//! Each replica runs the runner's loop (`run::replica::replica_with`) on a
//! thread of its own; its host writes on a SQLite connection of its own to
//! the same file, ten rows a transaction every 100 ms, each row stamped
//! with its commit clock, and nudges the loop after each commit. The relay's
//! runner files uploads on its publishing connection; the server stamps
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

use magic_sync_testkit::bench as support;

use magic_sync::relay::{ReplicaInfo, Settings};
use magic_sync::run::memory::Network;
use magic_sync::run::replica::Uploads;
use magic_sync::{Engine, Row};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{env_u64, now_micros, show};

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

struct Host(Vec<ReplicaInfo>);

impl magic_sync::relay::Replicas for Host {
    async fn replicas(&self) -> magic_sync::Result<Vec<ReplicaInfo>> {
        Ok(self.0.clone())
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let replicas = env_u64("MAGIC_SYNC_BENCH_REPLICAS", 100) as usize;
    let rate = env_u64("MAGIC_SYNC_BENCH_RATE", 100);
    let seconds = env_u64("MAGIC_SYNC_BENCH_SECONDS", 20);
    let engine: &'static Engine = Box::leak(Box::new(
        Engine::builder()
            .table::<Reading>()
            .table::<Item>()
            .build()
            .expect("declarations"),
    ));
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
    let network = Network::new(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let mut threads = Vec::new();
    let key = magic_sync::store::keys::public(&client).await.unwrap();
    for info in &infos {
        let path = dir.path().join(format!("{}.sqlite", info.id));
        let mut replica = magic_sync::replica::Replica::open(&path, &info.id, engine).unwrap();
        replica.trust(&key).unwrap();
        let (network, id) = (network.clone(), info.id.to_string());
        threads.push(std::thread::spawn(move || {
            magic_sync::run::replica::replica_with(
                &mut replica,
                &network.link(&id),
                &Uploads::default(),
            )
            .expect("the replica's loop");
        }));
    }
    let (stop_relay, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = {
        let (config, network, host) = (db.config(), network.clone(), Host(infos.clone()));
        tokio::spawn(async move {
            magic_sync::run::server::server(
                config,
                engine.clone(),
                Settings::default(),
                &host,
                &network,
                &network,
                async {
                    stopped.await.ok();
                },
            )
            .await
            .expect("the relay's runner");
        })
    };
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
    let written = Arc::new(AtomicU64::new(0));
    let reached: Arc<std::sync::Mutex<Vec<Duration>>> = Default::default();
    let done_writing = Arc::new(AtomicU64::new(0));
    let mut hosts = Vec::new();
    for info in &infos {
        let (path, id, stop, written, network) = (
            dir.path().join(format!("{}.sqlite", info.id)),
            info.id.to_string(),
            stop.clone(),
            written.clone(),
            network.clone(),
        );
        let (reached, done_writing) = (reached.clone(), done_writing.clone());
        hosts.push(std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(30)).unwrap();
            let per_tick = (rate / 10).max(1);
            let mut n = 0u64;
            let begun = Instant::now();
            let mut tick = 0u64;
            // Each commit's mark, until it reads back.
            type Waiting = std::collections::VecDeque<(magic_sync::replica::Mark, Instant)>;
            let mut waiting = Waiting::new();
            let mut waited: Vec<Duration> = Vec::new();
            // Waits up to `wait` for the oldest commit to read back, as a
            // host showing "everyone sees it" would (`wait_written`: woken
            // by its replica's loop in this process), then takes every
            // commit that reads back by then.
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
            while !stop.load(Ordering::Relaxed) {
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
                written.fetch_add(per_tick, Ordering::Relaxed);
                network.nudge(&id);
                // Until the next tick, wait for marks to read back.
                let due = Duration::from_millis(100 * tick);
                while let Some(wait) = due.checked_sub(begun.elapsed()) {
                    check(&mut waiting, &mut waited, wait);
                }
            }
            done_writing.fetch_add(1, Ordering::Relaxed);
            // The load stopped: wait for the rest to read back.
            let since = Instant::now();
            while !waiting.is_empty() && since.elapsed() < Duration::from_secs(600) {
                check(&mut waiting, &mut waited, Duration::from_secs(1));
            }
            reached.lock().unwrap().extend(waited);
        }));
    }
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
    server_writer.await.unwrap();
    // Every host's last tick counted.
    while done_writing.load(Ordering::Relaxed) < replicas as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let total = written.load(Ordering::Relaxed);
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
    for h in hosts {
        h.join().unwrap();
    }
    let mut reached = std::mem::take(&mut *reached.lock().unwrap());
    reached.sort();
    let r = |p: f64| support::quantile(&reached, p).map_or("-".into(), show);
    println!(
        "replica commit to reading its own write back: p50 {}, p99 {}, max {} ({} commits)",
        r(0.50),
        r(0.99),
        r(1.0),
        reached.len()
    );
    stop_relay.send(()).ok();
    relay.await.unwrap();
    network.close();
    for t in threads {
        t.join().unwrap();
    }
}
