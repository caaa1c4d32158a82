//! Fan-out: one catalogue change published to every till of a large
//! fleet, per replica (a message in each till's outbox, one body shared)
//! and by rule (one batch of the cohort, each member owed it, stamped for
//! it as it is sent). The fleets are written straight into the `sync`
//! schema, as the engine leaves them after one pass; publishing goes to
//! the in-process network.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench fan_out
//!
//! MAGIC_SYNC_BENCH_TILLS (default 1,000 and 10,000), MAGIC_SYNC_BENCH_REPEATS
//! (default 5): prints each publishing's time, the medians, and their ratio.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::{Engine, Row};
use magic_sync_testkit::bench::env_u64;
use magic_sync_testkit::fleet::Fleet;
use std::time::{Duration, Instant};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
struct Product {
    id: i64,
    name: String,
}

const SCHEMA: &str = "CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL);";

/// One till's message as a pass leaves it: a product's new name.
const BODY: &str = "'\\x52360a340a056974656d731a2b0a035b325d12247b2263617465676f7279223a312c226964223a322c226e616d65223a22617373616d227d'";

/// A fleet of `tills`, each owed the change: in its outbox, or through the
/// cohort's batch.
async fn fleet(tills: u64, by_rule: bool) -> Fleet {
    let engine = Engine::builder().table::<Product>().build().unwrap();
    let fleet = Fleet::of(SCHEMA, engine).await;
    let owed = match by_rule {
        false => {
            "INSERT INTO sync.outbox (replica, number, nonce, head, body, seal)
             SELECT id, 1000, '\\x01', '\\x0a02', (SELECT id FROM sync.bodies), '\\x02'
             FROM sync.replicas;
             UPDATE sync.replicas SET last_number = 1000;"
        }
        true => {
            "INSERT INTO sync.cohorts (id, kind, newest, newest_nonce)
             VALUES (E'\\x01all', 'all', 1000, '\\x03');
             INSERT INTO sync.members (replica, cohort, since, since_nonce)
             SELECT id, E'\\x01all', 500, '\\x04' FROM sync.replicas;
             INSERT INTO sync.batches (cohort, number, pass_last, nonce, body)
             SELECT E'\\x01all', 1000, 1000, '\\x03', id FROM sync.bodies;"
        }
    };
    fleet
        .write(&format!(
            "INSERT INTO sync.replicas (id, live, provision, last_number, last_nonce)
             SELECT 't' || lpad(i::text, 6, '0'), true, false, 500, '\\x04'
             FROM generate_series(1, {tills}) i;
             INSERT INTO sync.acks (replica, number, at, nonce)
             SELECT id, 500, now(), '\\x04' FROM sync.replicas;
             INSERT INTO sync.bodies (hash, bytes) VALUES (sha256({BODY}), {BODY});
             {owed}
             ANALYZE;"
        ))
        .await;
    fleet
}

/// Publishing every message owed, `repeats` times, each as the first (by
/// a publisher that starts afresh, of a relay recording `by_rule` or not).
async fn publish(fleet: &Fleet, tills: u64, repeats: u64, by_rule: bool) -> Vec<Duration> {
    let mut times = Vec::new();
    for _ in 0..repeats {
        fleet.write("UPDATE sync.outbox SET sent_at = NULL").await;
        let wait = magic_sync::relay::RESEND_AFTER;
        let mut away = magic_sync::relay::Away::new(wait, wait).by_rule(by_rule);
        let t0 = Instant::now();
        let published = magic_sync::relay::publish_beside(
            &fleet.client,
            &fleet.network,
            16,
            magic_sync::relay::BATCH_FROM,
            &mut away,
        )
        .await
        .unwrap();
        times.push(t0.elapsed());
        assert_eq!(published.sent, tills, "one message to every till");
        for i in 1..=tills {
            fleet.network.take(&format!("t{i:06}"));
        }
    }
    times.sort();
    times
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let repeats = env_u64("MAGIC_SYNC_BENCH_REPEATS", 5);
    let sizes = match std::env::var("MAGIC_SYNC_BENCH_TILLS") {
        Ok(_) => vec![env_u64("MAGIC_SYNC_BENCH_TILLS", 1_000)],
        Err(_) => vec![1_000, 10_000],
    };
    for tills in sizes {
        let mut medians = Vec::new();
        for by_rule in [false, true] {
            let fleet = fleet(tills, by_rule).await;
            let times = publish(&fleet, tills, repeats, by_rule).await;
            let ms: Vec<String> = times
                .iter()
                .map(|t| format!("{:.1}", t.as_secs_f64() * 1e3))
                .collect();
            let median = times[times.len() / 2];
            println!(
                "{tills} tills, {}: publishing one change to every till {} ms (median {:.1})",
                if by_rule { "by rule" } else { "per replica" },
                ms.join(" "),
                median.as_secs_f64() * 1e3
            );
            medians.push(median);
        }
        println!(
            "{tills} tills: by rule / per replica {:.2}x",
            medians[1].as_secs_f64() / medians[0].as_secs_f64()
        );
    }
}
