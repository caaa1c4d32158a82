//! The steady state while one row in a hundred cannot go down, against the
//! same run without, in one process: does a row in quarantine hold back
//! only itself?
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench quarantine
//!
//! 20 replicas (2 per partition of 10) are kept up by the runner
//! (`run::server`) over the in-process network while writers change random
//! items at MAGIC_SYNC_BENCH_RATE changes per second (default 200). The
//! relay's codec refuses an item whose value is negative (a codec bug).
//! After a warm-up stretch not counted, four stretches of
//! MAGIC_SYNC_BENCH_SECONDS each (default 20) alternate:
//!
//! - clean: every item encodes;
//! - quarantined: one item in a hundred has a negative value. The writers
//!   keep writing those too (a negative value stays negative), so each of
//!   their changes is tried, fails and is set aside again, at the cost of a
//!   plan made again in that pass.
//!
//! Printed: commit-to-applied p50 and p99 of the rows that go (each change
//! carries its commit clock; a replica takes the clock when the message
//! holding it has applied), per stretch and pooled per kind, and the ratio
//! quarantined / clean.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::codec::{Codec, CodecError};
use magic_sync::envelope::{to_replica::Body, ToReplica};
use magic_sync::relay::{ReplicaInfo, Settings};
use magic_sync::replica::Replica;
use magic_sync::run::memory::Network;
use magic_sync::{Engine, Row};
use magic_sync_testkit::bench::{env_u64, now_micros, Listed};
use prost::Message;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, partition = "region", key(id))]
struct Item {
    id: i64,
    region: i64,
    value: i64,
    stamp: i64,
}

const REPLICAS: usize = 20;
const REGIONS: i64 = 10;
const ITEMS: i64 = 10_000;

/// The replicas' engine: the codec the table declares.
fn replica_engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::builder()
            .table::<Item>()
            .build()
            .expect("declarations")
    })
}

/// The relay's: JSON, but refusing a negative value.
fn relay_engine() -> Engine {
    let (encoder, decoder) = (Codec::<Item>::json(), Codec::<Item>::json());
    Engine::builder()
        .table_with::<Item>(Codec::custom(
            "json",
            move |item: &Item| match item.value < 0 {
                true => Err(CodecError::Mapping("a negative value (a codec bug)".into())),
                false => encoder.encode(item),
            },
            move |bytes| decoder.decode(bytes),
        ))
        .build()
        .expect("declarations")
}

#[derive(Default)]
struct Seen {
    measuring: AtomicBool,
    latencies: Mutex<Vec<u64>>,
}

fn replica_loop(
    id: String,
    path: std::path::PathBuf,
    engine: &'static Engine,
    network: Network,
    seen: Arc<Seen>,
    key: magic_sync::sign::ServerKey,
) {
    let mut replica = Replica::open(&path, &id, engine).expect("open");
    replica.trust(&key).expect("pins the server's key");
    while let Some(message) = network.next(&id) {
        let report = magic_sync::run::replica::deliver(&mut replica, &message).expect("apply");
        let applied = now_micros();
        if let Some(report) = report {
            network.report(&id, report);
        }
        if !seen.measuring.load(Ordering::Relaxed) {
            continue;
        }
        let Ok(ToReplica {
            body: Some(Body::Down(down)),
            ..
        }) = ToReplica::decode(message.as_slice())
        else {
            continue;
        };
        let latencies: Vec<u64> = down
            .tables
            .iter()
            .flat_map(|t| &t.upserts)
            .filter_map(|row| {
                let json: serde_json::Value = serde_json::from_slice(&row.data).ok()?;
                let stamp = json.get("stamp")?.as_i64()?;
                (stamp > 0).then(|| (applied - stamp).max(0) as u64)
            })
            .collect();
        seen.latencies.lock().unwrap().extend(latencies);
    }
}

/// Writers changing random items, `rate` changes per second in all, until
/// `stop`. A negative value stays negative.
async fn write(db: &magic_sync_testdb::TestDb, rate: u64, stop: Arc<AtomicBool>) {
    let writers = 2;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let client = db.connect().await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let statement = client
                .prepare(
                    "UPDATE items SET value = CASE WHEN value < 0 THEN value - 1 ELSE value + 1 END,
                                      stamp = $2 WHERE id = $1",
                )
                .await
                .unwrap();
            let mut done = 0u64;
            let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15 ^ (w as u64));
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
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// One stretch: writes for `seconds`, lets them arrive, and returns the
/// latencies measured, sorted.
async fn stretch(db: &magic_sync_testdb::TestDb, seen: &Seen, rate: u64, seconds: u64) -> Vec<u64> {
    seen.measuring.store(true, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let writing = write(db, rate, stop.clone());
    let timer = async {
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(writing, timer);
    tokio::time::sleep(Duration::from_secs(2)).await;
    seen.measuring.store(false, Ordering::Relaxed);
    let mut latencies = std::mem::take(&mut *seen.latencies.lock().unwrap());
    latencies.sort_unstable();
    latencies
}

/// Waits until the relay is idle: no note pending, every replica caught up.
async fn settled(client: &tokio_postgres::Client) {
    loop {
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM sync.notes),
                        (SELECT count(*) FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
                         WHERE r.provision OR coalesce(a.number, 0) < r.last_number OR r.last_number = 0)",
                &[],
            )
            .await
            .unwrap();
        let (notes, behind): (i64, i64) = (row.get(0), row.get(1));
        if notes == 0 && behind == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = env_u64("MAGIC_SYNC_BENCH_SECONDS", 20);
    let rate = env_u64("MAGIC_SYNC_BENCH_RATE", 200);
    let engine = replica_engine();
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

    let dir = tempfile::tempdir().unwrap();
    let network = Network::new(1 << 20);
    let seen = Arc::new(Seen::default());
    let key = magic_sync::store::keys::public(&client).await.unwrap();
    let mut infos = Vec::new();
    let mut threads = Vec::new();
    for i in 0..REPLICAS {
        let id = format!("r{i:03}");
        let region = (i as i64 % REGIONS).to_string();
        infos.push(ReplicaInfo::live(&id, Some(&region)));
        let (network, seen, path) = (
            network.clone(),
            seen.clone(),
            dir.path().join(format!("{id}.sqlite")),
        );
        threads.push(std::thread::spawn(move || {
            replica_loop(id, path, engine, network, seen, key)
        }));
    }
    let (stop_relay, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = {
        let config = db.config();
        let network = network.clone();
        tokio::spawn(async move {
            let host = Listed(infos);
            magic_sync::run::server::server(
                config,
                relay_engine(),
                Settings::default(),
                &host,
                &network,
                &network,
                async {
                    stopped.await.ok();
                },
            )
            .await
            .unwrap();
        })
    };
    settled(&client).await;
    println!(
        "{REPLICAS} replicas provisioned ({} rows each); {rate} changes/s, stretches of {seconds} s",
        ITEMS / REGIONS
    );

    // A stretch not counted: the first after provisioning runs slower
    // (caches, statistics) whatever it carries.
    stretch(&db, &seen, rate, seconds.min(5)).await;
    let mut pooled: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..2 {
        for (kind, quarantined) in [(0, false), (1, true)] {
            // One item in a hundred refused, or none.
            let value = if quarantined { "-1" } else { "0" };
            client
                .batch_execute(&format!(
                    "UPDATE items SET value = {value}, stamp = 0 WHERE id % 100 = 0"
                ))
                .await
                .unwrap();
            settled(&client).await;
            let set_aside: i64 = client
                .query_one("SELECT count(*) FROM sync.quarantine", &[])
                .await
                .unwrap()
                .get(0);
            let latencies = stretch(&db, &seen, rate, seconds).await;
            println!(
                "round {round}, {}: p50 {:.1} ms, p99 {:.1} ms ({} deliveries; {set_aside} rows in quarantine before)",
                if quarantined { "quarantined" } else { "clean" },
                percentile(&latencies, 0.50),
                percentile(&latencies, 0.99),
                latencies.len()
            );
            pooled[kind].extend(latencies);
        }
    }
    for p in &mut pooled {
        p.sort_unstable();
    }
    let [clean, quarantined] = &pooled;
    println!(
        "pooled: clean p50 {:.1} ms, p99 {:.1} ms; quarantined p50 {:.1} ms, p99 {:.1} ms; quarantined / clean: p50 {:.2}x, p99 {:.2}x",
        percentile(clean, 0.5),
        percentile(clean, 0.99),
        percentile(quarantined, 0.5),
        percentile(quarantined, 0.99),
        percentile(quarantined, 0.5) / percentile(clean, 0.5),
        percentile(quarantined, 0.99) / percentile(clean, 0.99)
    );

    stop_relay.send(()).unwrap();
    relay.await.unwrap();
    network.close();
    for t in threads {
        t.join().unwrap();
    }
}
