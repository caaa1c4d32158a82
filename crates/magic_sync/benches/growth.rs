//! Does the `sync` schema stop growing under a steady load? 20 replicas
//! (2 per partition of 10) kept up by the runner while writers change
//! random items of 10,000 at MAGIC_SYNC_BENCH_RATE changes per second
//! (default 500) for MAGIC_SYNC_BENCH_SECONDS (default 600), and the tills
//! write at MAGIC_SYNC_BENCH_UP_RATE rows per second over all of them
//! (default 100): half sales (an up table), half a note on one of 100
//! items they hold (a column they own), uploaded by each till's own loop. Every 30 s
//! the size on disk of the `sync` schema's tables (with their indexes and
//! TOAST) is sampled, with the rows of the ones that come and go: notes,
//! the outbox and its bodies, the record of what is held, and the up
//! path's: which upload each owned column was last taken from
//! (`sync.filed`), uploads waiting to be reached (`sync.checkpoints`),
//! rows refused (`sync.inbox`), and the answered-upload record.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench growth
//!
//! What a pass is done with goes in the pass itself: notes planned are
//! deleted, bodies no message carries go in its closing batch, a message
//! leaves the outbox once the transport took it, a held row sent again is
//! updated in place. PostgreSQL's autovacuum reclaims the dead rows that
//! leaves; the figure says whether it keeps up.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::relay::{ReplicaInfo, Settings};
use magic_sync::replica::Replica;
use magic_sync::run::memory::Network;
use magic_sync::{Engine, Row};
use magic_sync_testkit::bench::{env_u64, Listed};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", both, partition = "region", key(id))]
struct Item {
    id: i64,
    region: i64,
    value: i64,
    /// A till's note on the item: its own.
    #[row(owned)]
    note: Option<i64>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "sales", up, key(unit_id, number))]
struct Sale {
    #[row(origin)]
    unit_id: String,
    number: i64,
    item: i64,
}

const REPLICAS: usize = 20;
const REGIONS: i64 = 10;
const ITEMS: i64 = 10_000;
/// Items each till writes notes on.
const NOTED: u64 = 100;

async fn write(client: tokio_postgres::Client, rate: u64, stop: Arc<AtomicBool>) -> u64 {
    let statement = client
        .prepare("UPDATE items SET value = value + 1 WHERE id = $1")
        .await
        .unwrap();
    let (mut done, mut rng) = (0u64, StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15));
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if done >= (started.elapsed().as_secs_f64() * rate as f64) as u64 {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let id = rng.gen_range(1..=ITEMS);
        client.execute(&statement, &[&id]).await.unwrap();
        done += 1;
    }
    done
}

/// The `sync` schema's size in bytes, and the rows of its busiest tables:
/// notes, outbox, bodies, held; filed, checkpoints, inbox, answered.
async fn sample(client: &tokio_postgres::Client) -> (i64, [i64; 8]) {
    let row = client
        .query_one(
            "SELECT (SELECT sum(pg_total_relation_size(c.oid))::int8 FROM pg_class c
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = 'sync' AND c.relkind IN ('r', 'p')),
                    (SELECT count(*) FROM sync.notes), (SELECT count(*) FROM sync.outbox),
                    (SELECT count(*) FROM sync.bodies), (SELECT count(*) FROM sync.held),
                    (SELECT count(*) FROM sync.filed), (SELECT count(*) FROM sync.checkpoints),
                    (SELECT count(*) FROM sync.inbox), (SELECT count(*) FROM sync.uploads_answered)",
            &[],
        )
        .await
        .unwrap();
    let counts = std::array::from_fn(|i| row.get(i + 1));
    (row.get(0), counts)
}

/// The tills' own writes: `rate` rows a second over every till's file, on
/// connections of the host's own, half sales and half notes on an item the
/// till holds, until `stop`. Returns the rows written.
fn till_writes(paths: Vec<(String, std::path::PathBuf)>, rate: u64, stop: Arc<AtomicBool>) -> u64 {
    let conns: Vec<(String, rusqlite::Connection)> = paths
        .into_iter()
        .map(|(id, path)| {
            let conn = rusqlite::Connection::open(path).expect("the till's file");
            conn.busy_timeout(Duration::from_secs(30)).unwrap();
            (id, conn)
        })
        .collect();
    let (mut done, mut rng) = (0u64, StdRng::seed_from_u64(0x2545_f491_4f6c_dd1d));
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if done >= (started.elapsed().as_secs_f64() * rate as f64) as u64 {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let (id, conn) = &conns[rng.gen_range(0..conns.len())];
        if done % 2 == 0 {
            conn.execute(
                "INSERT INTO sales (unit_id, number, item) VALUES (?1, ?2, ?3)",
                rusqlite::params![id, done as i64, rng.gen_range(1..=ITEMS)],
            )
            .expect("a sale");
        } else {
            // One of the first NOTED items it holds: a till keeps notes on
            // a few, again and again, so what the server keeps of them
            // (`sync.filed`, a row per till and item) reaches its size.
            conn.execute(
                "UPDATE items SET note = ?1 WHERE id = (SELECT id FROM items ORDER BY id LIMIT 1 OFFSET ?2)",
                rusqlite::params![done as i64, rng.gen_range(0..NOTED)],
            )
            .expect("a note");
        }
        done += 1;
    }
    done
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = env_u64("MAGIC_SYNC_BENCH_SECONDS", 600);
    let rate = env_u64("MAGIC_SYNC_BENCH_RATE", 500);
    let engine = &Engine::builder()
        .table::<Item>()
        .table::<Sale>()
        .build()
        .expect("declarations");
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE items (id bigint PRIMARY KEY, region bigint NOT NULL, value bigint NOT NULL,
                                 note bigint);
             INSERT INTO items SELECT i, i % {REGIONS}, 0 FROM generate_series(1, {ITEMS}) i;
             CREATE TABLE sales (unit_id text NOT NULL, number bigint NOT NULL, item bigint NOT NULL,
                                 PRIMARY KEY (unit_id, number));"
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
    let mut paths = Vec::new();
    for i in 0..REPLICAS {
        let id = format!("r{i:03}");
        infos.push(ReplicaInfo::live(
            &id,
            Some(&(i as i64 % REGIONS).to_string()),
        ));
        let (network, path) = (network.clone(), dir.path().join(format!("{id}.sqlite")));
        paths.push((id.clone(), path.clone()));
        let engine = engine.clone();
        threads.push(std::thread::spawn(move || {
            let mut replica = Replica::open(&path, &id, &engine).expect("open");
            replica.trust(&key).expect("pins the key");
            magic_sync::run::replica::replica(&mut replica, &network.link(&id)).expect("the till");
        }));
    }
    let (stop_relay, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = {
        let (config, network, engine) = (db.config(), network.clone(), engine.clone());
        tokio::spawn(async move {
            magic_sync::run::server::server(
                config,
                engine,
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
        let (_, [_, outbox, _, held, ..]) = sample(&client).await;
        if held >= ITEMS * 2 && outbox == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let up_rate = env_u64("MAGIC_SYNC_BENCH_UP_RATE", 100);
    println!(
        "{REPLICAS} replicas provisioned; {rate} changes/s and {up_rate} till rows/s for {seconds} s"
    );
    println!("| at | sync schema | notes | outbox | bodies | held | filed | checkpoints | inbox | answered |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write(db.connect().await, rate, stop.clone()));
    let tills = {
        let stop = stop.clone();
        std::thread::spawn(move || till_writes(paths, up_rate, stop))
    };
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed().as_secs() < seconds {
        tokio::time::sleep(Duration::from_secs(30).min(Duration::from_secs(seconds))).await;
        let (bytes, [notes, outbox, bodies, held, filed, checkpoints, inbox, answered]) =
            sample(&client).await;
        println!(
            "| {} s | {:.1} MiB | {notes} | {outbox} | {bodies} | {held} | {filed} | {checkpoints} | {inbox} | {answered} |",
            started.elapsed().as_secs(),
            bytes as f64 / (1 << 20) as f64
        );
        samples.push(bytes);
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    let till_rows = tills.join().unwrap();
    let filed: i64 = client
        .query_one("SELECT count(*) FROM sales", &[])
        .await
        .unwrap()
        .get(0);
    println!("{till_rows} till rows written, {filed} sales on the server");
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
