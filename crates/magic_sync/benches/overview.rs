//! The operator's overview over a large fleet: 200 replicas holding 3M rows
//! in all (15,000 each, over three tables), read twice: when every replica
//! is caught up, and when every replica has all its rows unconfirmed (it
//! acknowledged a message before the one that carried them, as after a
//! snapshot whose end it has not acknowledged yet). Then the same fleet
//! recorded by rule: two of the three tables held once for the cohort of
//! the `all` tables, every replica its member, read the same two ways.
//!
//! cargo bench -p magic_sync --features postgres --bench overview
//!
//! The record is written straight into `sync.replicas`, `sync.acks` and
//! `sync.held` with `generate_series`, in a state the engine could be in:
//! each replica's rows carried by its last message. Each case runs
//! MAGIC_SYNC_BENCH_REPEATS times (default 5) and prints every time and the
//! median. Targets: 10 ms caught up, 1 s all unconfirmed.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::ops::{self, Scope};
use std::time::{Duration, Instant};

const REPLICAS: i64 = 200;
const ROWS_EACH: i64 = 15_000;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let repeats: usize = std::env::var("MAGIC_SYNC_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let t0 = Instant::now();
    client
        .batch_execute(&format!(
            "INSERT INTO sync.replicas (id, live, partition_id, provision, last_number)
             SELECT 'r' || lpad(i::text, 3, '0'), true, 'p' || (i % 10), false, 1000 + i
             FROM generate_series(1, {REPLICAS}) i;
             INSERT INTO sync.acks (replica, number, at)
             SELECT id, last_number, now() FROM sync.replicas;
             INSERT INTO sync.held (replica, table_name, key, version, message, ruled)
             SELECT r.id, (ARRAY['items', 'prices', 'tasks'])[1 + k % 3], '[' || k || ']', 0,
                    r.last_number, true
             FROM sync.replicas r CROSS JOIN generate_series(1, {ROWS_EACH}) k;"
        ))
        .await
        .unwrap();
    vacuum(&client).await;
    println!(
        "record: {REPLICAS} replicas, {} held rows, written in {:.1} s",
        REPLICAS * ROWS_EACH,
        t0.elapsed().as_secs_f64()
    );

    let caught_up = measure(&mut client, repeats, |o| {
        assert_eq!(o.states.caught_up, REPLICAS);
    })
    .await;
    report("caught up", &caught_up, Duration::from_millis(10));

    client
        .batch_execute("UPDATE sync.acks SET number = 500")
        .await
        .unwrap();
    vacuum(&client).await;
    let unconfirmed = measure(&mut client, repeats, |o| {
        assert_eq!(o.states.on_its_way, REPLICAS);
        let rows: i64 = o.tables.iter().map(|t| t.rows_on_their_way).sum();
        assert_eq!(rows, REPLICAS * ROWS_EACH);
    })
    .await;
    report("all rows unconfirmed", &unconfirmed, Duration::from_secs(1));

    // The same fleet recorded by rule: the 10,000 rows of `items` and
    // `prices` once, for the cohort of the `all` tables, every replica its
    // member, holding its 5,000 `tasks` itself, and 50 of the cohort's
    // items too (as a till's own rows can reach rows the cohort holds).
    let cohort_rows = ROWS_EACH * 2 / 3;
    client
        .batch_execute(&format!(
            "TRUNCATE sync.held, sync.acks, sync.members, sync.batches, sync.cohorts;
             INSERT INTO sync.acks (replica, number, at)
             SELECT id, last_number, now() FROM sync.replicas;
             INSERT INTO sync.cohorts (id, kind) VALUES (E'\\x01all', 'all');
             INSERT INTO sync.members (replica, cohort, since, since_nonce)
             SELECT id, E'\\x01all', 600, '\\x00' FROM sync.replicas;
             INSERT INTO sync.held (replica, table_name, key, version, message, ruled)
             SELECT E'\\x01all', (ARRAY['items', 'prices'])[1 + k % 2], '[' || k || ']', 0, 900, true
             FROM generate_series(1, {cohort_rows}) k;
             INSERT INTO sync.held (replica, table_name, key, version, message, ruled)
             SELECT r.id, 'tasks', '[' || k || ']', 0, r.last_number, true
             FROM sync.replicas r CROSS JOIN generate_series(1, {}) k;
             INSERT INTO sync.held (replica, table_name, key, version, message, ruled)
             SELECT r.id, 'items', '[' || (2 * k + 2) || ']', 0, r.last_number, false
             FROM sync.replicas r CROSS JOIN generate_series(0, 49) k;",
            ROWS_EACH - cohort_rows
        ))
        .await
        .unwrap();
    vacuum(&client).await;
    println!(
        "by rule: a cohort of {cohort_rows} rows, {REPLICAS} members each holding {} rows of its own \
         (50 of them the cohort's too)",
        ROWS_EACH - cohort_rows + 50
    );
    let caught_up = measure(&mut client, repeats, |o| {
        assert_eq!(o.states.caught_up, REPLICAS);
    })
    .await;
    report("by rule, caught up", &caught_up, Duration::from_millis(10));
    client
        .batch_execute("UPDATE sync.acks SET number = 500")
        .await
        .unwrap();
    vacuum(&client).await;
    let unconfirmed = measure(&mut client, repeats, |o| {
        assert_eq!(o.states.on_its_way, REPLICAS);
        let rows: i64 = o.tables.iter().map(|t| t.rows_on_their_way).sum();
        assert_eq!(rows, REPLICAS * ROWS_EACH, "each row once");
    })
    .await;
    report(
        "by rule, all rows unconfirmed",
        &unconfirmed,
        Duration::from_secs(1),
    );
}

/// Each alone: VACUUM cannot run in the transaction a batch makes.
async fn vacuum(client: &tokio_postgres::Client) {
    for table in [
        "sync.replicas",
        "sync.acks",
        "sync.held",
        "sync.held_carried",
        "sync.members",
    ] {
        client
            .batch_execute(&format!("VACUUM ANALYZE {table}"))
            .await
            .unwrap();
    }
}

async fn measure(
    client: &mut tokio_postgres::Client,
    repeats: usize,
    check: impl Fn(&ops::Overview),
) -> Vec<Duration> {
    let mut times = Vec::new();
    for _ in 0..repeats {
        let t0 = Instant::now();
        let overview = ops::overview(client, &Scope::All, 10).await.unwrap();
        times.push(t0.elapsed());
        check(&overview);
    }
    times
}

fn report(case: &str, times: &[Duration], target: Duration) {
    let mut sorted = times.to_vec();
    sorted.sort();
    let ms = |d: &Duration| format!("{:.1}", d.as_secs_f64() * 1e3);
    println!(
        "overview, {case}: median {} ms (target {} ms); runs: {} ms",
        ms(&sorted[sorted.len() / 2]),
        target.as_millis(),
        times.iter().map(ms).collect::<Vec<_>>().join(", ")
    );
}
