//! What publishing one change to N replicas costs, each message signed on
//! its own against a page's messages signed together (decision 165), in the
//! same run, alternating.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench publish
//!
//! The outbox is written directly, as a pass that changed a row every
//! replica holds leaves it: one message for each of N replicas, all
//! carrying one body of about 1 KiB, each replica's acknowledgement saying
//! it reads batches. Each round marks every message unsent, empties the
//! in-process network's inboxes, and times `relay::publish` sending them
//! all: with `batch_from` past N (a signature each, as before batches) and
//! with the default (`relay::BATCH_FROM`). `MAGIC_SYNC_BENCH_ROUNDS`
//! rounds each (default 7) for N of 100, 1,000 and 5,000; the medians and
//! their ratio are printed, with the bytes a message grew by.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::envelope::{to_replica::Body, Down, RowData, TableRows, ToReplica};
use magic_sync::run::memory::Network;
use magic_sync_testkit::bench::env_u64;
use prost::Message;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// Writes one message for each of `n` replicas into a fresh outbox, all
/// with one body.
async fn fill(client: &Client, n: usize) -> Vec<String> {
    client
        .batch_execute(
            "TRUNCATE sync.outbox, sync.acks; DELETE FROM sync.replicas; DELETE FROM sync.bodies",
        )
        .await
        .unwrap();
    let body = ToReplica {
        body: Some(Body::Down(Down {
            tables: vec![TableRows {
                table: "products".into(),
                upserts: vec![
                    RowData {
                        key: b"[1]".to_vec(),
                        data: vec![b'x'; 90],
                    };
                    10
                ],
                ..TableRows::default()
            }],
        })),
        ..ToReplica::default()
    }
    .encode_to_vec();
    let id: i64 = client
        .query_one(
            "INSERT INTO sync.bodies (hash, bytes) VALUES (sha256($1), $1) RETURNING id",
            &[&body],
        )
        .await
        .unwrap()
        .get(0);
    let ids: Vec<String> = (0..n).map(|i| format!("till-{i:05}")).collect();
    let heads: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| {
            ToReplica {
                replica: id.clone(),
                epoch: vec![7; 24],
                number: 1_000,
                nonce: vec![9; 16],
                previous: 999,
                previous_nonce: vec![8; 16],
                ..ToReplica::default()
            }
            .encode_to_vec()
        })
        .collect();
    client
        .execute(
            "WITH r AS (INSERT INTO sync.replicas (id, live, provision)
                        SELECT id, true, false FROM unnest($1::text[]) id RETURNING id),
                  a AS (INSERT INTO sync.acks (replica, number, at, reads_batches)
                        SELECT id, 999, now(), true FROM r RETURNING replica)
             INSERT INTO sync.outbox (replica, number, nonce, head, body, seal)
             SELECT u.id, 1000, '\\x0909090909090909', u.head, $3, sha256(u.id::bytea)
             FROM unnest($1::text[], $2::bytea[]) AS u (id, head)",
            &[&ids, &heads, &id],
        )
        .await
        .unwrap();
    ids
}

/// One round: every message unsent, the inboxes empty, then one publish
/// timed; returns the time and the bytes of the first message sent.
async fn round(
    client: &Client,
    network: &Network,
    ids: &[String],
    batch_from: usize,
) -> (Duration, usize) {
    client
        .batch_execute("UPDATE sync.outbox SET sent_at = NULL")
        .await
        .unwrap();
    for id in ids {
        network.take(id);
    }
    let started = Instant::now();
    let published = magic_sync::relay::publish(client, network, 16, batch_from)
        .await
        .expect("publishing");
    let took = started.elapsed();
    assert_eq!(published.sent as usize, ids.len(), "{published:?}");
    let first = network.take(&ids[0]);
    (took, first[0].len())
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds = env_u64("MAGIC_SYNC_BENCH_ROUNDS", 7) as usize;
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    // The server's key, made on first use.
    magic_sync::store::keys::public(&client).await.unwrap();
    let network = Network::new(1 << 20);
    println!("| replicas | a signature each | signed together | ratio | bytes a message grew by |");
    println!("| --- | --- | --- | --- | --- |");
    for n in [100, 1_000, 5_000] {
        let ids = fill(&client, n).await;
        // Once each way first: the statements prepared, the pages cached.
        round(&client, &network, &ids, usize::MAX).await;
        round(&client, &network, &ids, magic_sync::relay::BATCH_FROM).await;
        let (mut each, mut together) = (Vec::new(), Vec::new());
        let (mut alone_bytes, mut batch_bytes) = (0, 0);
        for _ in 0..rounds {
            let (took, bytes) = round(&client, &network, &ids, usize::MAX).await;
            each.push(took);
            alone_bytes = bytes;
            let (took, bytes) = round(&client, &network, &ids, magic_sync::relay::BATCH_FROM).await;
            together.push(took);
            batch_bytes = bytes;
        }
        let (each, together) = (median(each), median(together));
        println!(
            "| {n} | {:.1} ms | {:.1} ms | {:.2}x | {} |",
            each.as_secs_f64() * 1e3,
            together.as_secs_f64() * 1e3,
            each.as_secs_f64() / together.as_secs_f64(),
            batch_bytes as i64 - alone_bytes as i64
        );
    }
}
