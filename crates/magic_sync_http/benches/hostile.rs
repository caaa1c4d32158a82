//! A hostile replica beside an honest one (issue 20): what the flood costs
//! the honest one, and what it costs the server's memory.
//!
//! cargo bench -p magic_sync_http --bench hostile
//!
//! One database, the relay's runner, a `Hub` served on loopback. The honest
//! replica is a real replica loop over `client::Socket`; the server writes
//! one row a MAGIC_SYNC_BENCH_EVERY_MS (default 20 ms), stamped with the
//! time of the write, and a watcher polling the replica's file every
//! millisecond records when each stamp arrived. The hostile replica holds
//! an authenticated raw connection and, in the second half of the run,
//! sends as fast as the hub reads it: uploads of 16 MiB less a little, as
//! many rows as an upload may carry, under table names it makes up (a new
//! one every upload) and keys never seen twice, each with a gap in an epoch
//! that never was; closed, it connects again.
//!
//! Printed, for a quiet stretch and then the flood, each of
//! MAGIC_SYNC_BENCH_SECONDS (default 15): the honest replica's
//! commit-to-applied p50 and p99 and their ratio; the hostile uploads the
//! hub read; the most the hub's queue held; the rows and distinct table
//! names in the inbox and in the operator's health; this process's peak
//! RSS (VmHWM) after each stretch.

use futures_util::SinkExt;
use magic_sync::envelope::{Gap, RowData, Up, UpRows};
use magic_sync::relay::{ReplicaInfo, Settings as RelaySettings};
use magic_sync::replica::Replica;
use magic_sync::{Engine, Row};
use magic_sync_http::client::{Settings as ClientSettings, Socket};
use magic_sync_http::credentials::{self, Credentials};
use magic_sync_http::server::{serve, Hub, Security, Settings};
use magic_sync_testkit::bench::{env_u64, now_micros, show, Latencies};
use prost::Message as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, all, key(id))]
struct Item {
    id: i64,
    stamp: i64,
}

fn engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| Engine::builder().table::<Item>().build().unwrap())
}

/// This process's peak RSS, in MiB.
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// An upload of about `bytes` bytes, as many rows as one may carry, of a
/// table named for the round.
fn hostile_up(round: u64, bytes: usize) -> Vec<u8> {
    let count = magic_sync::run::MAX_UPLOAD_ROWS;
    let filler = "x".repeat(bytes / count - 40);
    let rows = (0..count)
        .map(|i| RowData {
            key: format!("[{round}{i:08}]").into_bytes(),
            data: format!(r#"{{"x":"{filler}"}}"#).into_bytes(),
        })
        .collect();
    Up {
        send_id: round.to_be_bytes().to_vec(),
        tables: vec![UpRows {
            table: format!("made_up_{round}"),
            rows,
            ..UpRows::default()
        }],
        gap: Some(Gap {
            epoch: vec![0xBA; 16],
            number: round,
        }),
        ..Up::default()
    }
    .encode_to_vec()
}

/// Applied stamps, as (stamp, applied at), from polling the replica's file.
fn watch(path: std::path::PathBuf, done: Arc<AtomicBool>, seen: Arc<Mutex<Vec<(i64, i64)>>>) {
    let mut last = 0i64;
    while !done.load(Ordering::Relaxed) {
        if let Ok(conn) = rusqlite::Connection::open(&path) {
            while !done.load(Ordering::Relaxed) {
                let stamp: i64 = conn
                    .query_row("SELECT coalesce(max(stamp), 0) FROM items", [], |r| {
                        r.get(0)
                    })
                    .unwrap_or(0);
                if stamp > last {
                    last = stamp;
                    seen.lock().unwrap().push((stamp, now_micros()));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    magic_sync_testkit::bench::logs();
    let seconds = env_u64("MAGIC_SYNC_BENCH_SECONDS", 15);
    let every = Duration::from_millis(env_u64("MAGIC_SYNC_BENCH_EVERY_MS", 20));
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute("CREATE TABLE items (id bigint PRIMARY KEY, stamp bigint NOT NULL)")
        .await
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    magic_sync::trigger::ensure(engine(), &mut client, &Default::default())
        .await
        .unwrap();
    let honest = credentials::issue(&client, "honest").await.unwrap();
    let hostile = credentials::issue(&client, "hostile").await.unwrap();
    let key = magic_sync::store::keys::public(&client).await.unwrap();
    let settings = Settings::default();
    let queue_bound = settings.max_queued_total;
    let hub = Hub::new(settings, Credentials::new(db.config()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stopped.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let serving = tokio::spawn(serve(hub.clone(), listener, Security::Plain, stopped()));
    let relay = {
        let (hub, config, stopped) = (hub.clone(), db.config(), stopped());
        let fleet = vec![
            ReplicaInfo::live("honest", None),
            ReplicaInfo::live("hostile", None),
        ];
        tokio::spawn(async move {
            magic_sync::run::server::server(
                config,
                engine().clone(),
                RelaySettings::default(),
                &fleet,
                &hub,
                &hub,
                stopped,
            )
            .await
        })
    };

    // The honest replica, and what it applies.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("honest.sqlite");
    let socket = Arc::new(Socket::connect(ClientSettings::new(&url, "honest", honest)).unwrap());
    let replica_thread = {
        let (socket, path) = (socket.clone(), path.clone());
        std::thread::spawn(move || {
            let mut replica = Replica::open(&path, "honest", engine()).unwrap();
            replica.trust(&key).unwrap();
            magic_sync::run::replica::replica(&mut replica, &*socket).unwrap();
        })
    };
    let done = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let watcher = {
        let (done, seen) = (done.clone(), seen.clone());
        std::thread::spawn(move || watch(path, done, seen))
    };

    // The hostile one: authenticated, and silent until the flood.
    let mut request = format!("{url}{}", magic_sync_http::PATH)
        .into_client_request()
        .unwrap();
    {
        use base64::Engine as _;
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("hostile:{hostile}"));
        request
            .headers_mut()
            .insert("authorization", format!("Basic {basic}").parse().unwrap());
    }
    let flooding = Arc::new(AtomicBool::new(false));
    let flooded = Arc::new(AtomicU64::new(0));
    let flood = {
        let (flooding, flooded) = (flooding.clone(), flooded.clone());
        tokio::spawn(async move {
            let mut round = 1u64;
            loop {
                let Ok((ws, _)) = tokio_tungstenite::connect_async(request.clone()).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let (mut out, mut incoming) = futures_util::StreamExt::split(ws);
                // It reads what it is sent (and answers pings), so the hub keeps it.
                tokio::spawn(async move {
                    while futures_util::StreamExt::next(&mut incoming).await.is_some() {}
                });
                loop {
                    if !flooding.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    let frame = hostile_up(round, (16 << 20) - (64 << 10));
                    round += 1;
                    if out.send(Message::Binary(frame.into())).await.is_err() {
                        break;
                    }
                    flooded.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    let writer = db.connect().await;
    let write = |id: i64| {
        let writer = &writer;
        async move {
            writer
                .execute(
                    "INSERT INTO items VALUES ($1, $2)
                     ON CONFLICT (id) DO UPDATE SET stamp = excluded.stamp",
                    &[&id, &now_micros()],
                )
                .await
                .unwrap();
        }
    };
    // Ready: the honest replica provisioned and holding a first write.
    write(0).await;
    let ready = Instant::now();
    while seen.lock().unwrap().is_empty() {
        assert!(
            ready.elapsed() < Duration::from_secs(120),
            "never provisioned"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "hostile replica beside an honest one: one write every {every:?}, {seconds} s a stretch"
    );
    let mut max_queued = 0usize;
    let mut results = Vec::new();
    for (stretch, flood_on) in [("quiet", false), ("flood", true)] {
        flooding.store(flood_on, Ordering::Relaxed);
        let before = flooded.load(Ordering::Relaxed);
        seen.lock().unwrap().clear();
        let started = Instant::now();
        let mut written = Vec::new();
        let mut id = 1;
        while started.elapsed() < Duration::from_secs(seconds) {
            let at = Instant::now();
            write(id % 100).await;
            written.push(id);
            id += 1;
            max_queued = max_queued.max(hub.queued("hostile").0);
            tokio::time::sleep(every.saturating_sub(at.elapsed())).await;
        }
        // Let the last writes land, up to a few seconds.
        let settle = Instant::now();
        while settle.elapsed() < Duration::from_secs(5) {
            max_queued = max_queued.max(hub.queued("hostile").0);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let seen: Vec<(i64, i64)> = seen.lock().unwrap().clone();
        let applied: Vec<u64> = seen
            .iter()
            .map(|(stamp, at)| (at - stamp).max(0) as u64)
            .collect();
        let missing = written.len().saturating_sub(applied.len());
        let latencies = Latencies::new(applied, 0);
        let (p50, p99) = (
            latencies.quantile(0.5).unwrap_or_default(),
            latencies.quantile(0.99).unwrap_or_default(),
        );
        println!(
            "{stretch}: commit-to-applied {} (writes coalesced in one message counted once: {} of {} seen), {} hostile uploads read, peak RSS {:.1} MiB",
            latencies.describe(),
            written.len() - missing,
            written.len(),
            flooded.load(Ordering::Relaxed) - before,
            peak_mib()
        );
        results.push((p50, p99));
    }
    flooding.store(false, Ordering::Relaxed);
    let (quiet, flood_p) = (results[0], results[1]);
    println!(
        "the flood against quiet: p50 {:.2}x ({} vs {}), p99 {:.2}x ({} vs {})",
        flood_p.0.as_secs_f64() / quiet.0.as_secs_f64().max(1e-9),
        show(flood_p.0),
        show(quiet.0),
        flood_p.1.as_secs_f64() / quiet.1.as_secs_f64().max(1e-9),
        show(flood_p.1),
        show(quiet.1),
    );
    let inbox = writer
        .query_one(
            "SELECT count(*), count(DISTINCT table_name) FROM sync.inbox WHERE replica = 'hostile'",
            &[],
        )
        .await
        .unwrap();
    let (rows, tables): (i64, i64) = (inbox.get(0), inbox.get(1));
    let mut ops_client = db.connect().await;
    let health = magic_sync::ops::health(&mut ops_client, &magic_sync::ops::Scope::All)
        .await
        .unwrap();
    println!(
        "the hub's queue held at most {:.1} MiB (bound {} MiB); the inbox holds {rows} rows of {tables} made-up tables (bound {} rows), which health lists as {} item(s)",
        max_queued as f64 / (1 << 20) as f64,
        queue_bound >> 20,
        magic_sync::file::INBOX_ROWS,
        health.items.len()
    );

    done.store(true, Ordering::Relaxed);
    socket.close();
    replica_thread.join().unwrap();
    watcher.join().unwrap();
    flood.abort();
    let _ = stop.send(true);
    relay.await.unwrap().unwrap();
    serving.await.unwrap().unwrap();
}
