//! Does the `sync` schema stop growing under a steady load? 20 replicas
//! (2 per partition of 10) kept up by the runner while writers change
//! random items of 10,000 at MAGIC_SYNC_BENCH_RATE changes per second
//! (default 500) for MAGIC_SYNC_BENCH_SECONDS (default 600). Every 30 s the
//! size on disk of the `sync` schema's tables (with their indexes and
//! TOAST) is sampled, with the rows of the ones that come and go: notes,
//! the outbox and its bodies, and the record of what is held.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench growth
//!
//! What a pass is done with goes in the pass itself: notes planned are
//! deleted, bodies no message carries go in its closing batch, a message
//! leaves the outbox once the transport took it, a held row sent again is
//! updated in place. PostgreSQL's autovacuum reclaims the dead rows that
//! leaves; the figure says whether it keeps up.

use magic_sync::relay::{ReplicaInfo, Settings};
use magic_sync::replica::Replica;
use magic_sync::run::memory::Network;
use magic_sync::{Engine, Row};
use magic_sync_testkit::bench::{env_u64, Listed};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, partition = "region", key(id))]
struct Item {
    id: i64,
    region: i64,
    value: i64,
}

const REPLICAS: usize = 20;
const REGIONS: i64 = 10;
const ITEMS: i64 = 10_000;

async fn write(client: tokio_postgres::Client, rate: u64, stop: Arc<AtomicBool>) -> u64 {
    let statement = client
        .prepare("UPDATE items SET value = value + 1 WHERE id = $1")
        .await
        .unwrap();
    let (mut done, mut x) = (0u64, 0x9e37_79b9_7f4a_7c15u64);
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if done >= (started.elapsed().as_secs_f64() * rate as f64) as u64 {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = 1 + (x % ITEMS as u64) as i64;
        client.execute(&statement, &[&id]).await.unwrap();
        done += 1;
    }
    done
}

/// The `sync` schema's size in bytes, and the rows of its busiest tables.
async fn sample(client: &tokio_postgres::Client) -> (i64, [i64; 4]) {
    let row = client
        .query_one(
            "SELECT (SELECT sum(pg_total_relation_size(c.oid))::int8 FROM pg_class c
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = 'sync' AND c.relkind IN ('r', 'p')),
                    (SELECT count(*) FROM sync.notes), (SELECT count(*) FROM sync.outbox),
                    (SELECT count(*) FROM sync.bodies), (SELECT count(*) FROM sync.held)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), [row.get(1), row.get(2), row.get(3), row.get(4)])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = env_u64("MAGIC_SYNC_BENCH_SECONDS", 600);
    let rate = env_u64("MAGIC_SYNC_BENCH_RATE", 500);
    let engine: &'static Engine = Box::leak(Box::new(
        Engine::builder()
            .table::<Item>()
            .build()
            .expect("declarations"),
    ));
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE items (id bigint PRIMARY KEY, region bigint NOT NULL, value bigint NOT NULL);
             INSERT INTO items SELECT i, i % {REGIONS}, 0 FROM generate_series(1, {ITEMS}) i;"
        ))
        .await
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    magic_sync::trigger::install(engine, &mut client)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let network = Network::new(1 << 20);
    let key = magic_sync::store::keys::public(&client).await.unwrap();
    let mut infos = Vec::new();
    let mut threads = Vec::new();
    for i in 0..REPLICAS {
        let id = format!("r{i:03}");
        infos.push(ReplicaInfo::live(
            &id,
            Some(&(i as i64 % REGIONS).to_string()),
        ));
        let (network, path) = (network.clone(), dir.path().join(format!("{id}.sqlite")));
        threads.push(std::thread::spawn(move || {
            let mut replica = Replica::open(&path, &id, engine).expect("open");
            replica.trust(&key).expect("pins the key");
            while let Some(message) = network.next(&id) {
                if let Some(report) =
                    magic_sync::run::replica::deliver(&mut replica, &message).expect("apply")
                {
                    network.report(&id, report);
                }
            }
        }));
    }
    let (stop_relay, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = {
        let (config, network) = (db.config(), network.clone());
        tokio::spawn(async move {
            magic_sync::run::server::server(
                config,
                engine.clone(),
                Settings::default(),
                &Listed(infos),
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
    // Provisioned first.
    loop {
        let (_, [_, outbox, _, held]) = sample(&client).await;
        if held >= ITEMS * 2 && outbox == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("{REPLICAS} replicas provisioned; {rate} changes/s for {seconds} s");
    println!("| at | sync schema | notes | outbox | bodies | held |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write(db.connect().await, rate, stop.clone()));
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed().as_secs() < seconds {
        tokio::time::sleep(Duration::from_secs(30).min(Duration::from_secs(seconds))).await;
        let (bytes, [notes, outbox, bodies, held]) = sample(&client).await;
        println!(
            "| {} s | {:.1} MiB | {notes} | {outbox} | {bodies} | {held} |",
            started.elapsed().as_secs(),
            bytes as f64 / (1 << 20) as f64
        );
        samples.push(bytes);
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    let half = samples.len() / 2;
    println!(
        "{written} changes written; the schema's size at the end against half-way: {:.2}x",
        *samples.last().unwrap() as f64 / samples[half.max(1) - 1] as f64
    );
    stop_relay.send(()).unwrap();
    relay.await.unwrap();
    network.close();
    for t in threads {
        t.join().unwrap();
    }
}
