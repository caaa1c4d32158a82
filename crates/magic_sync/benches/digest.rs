//! What comparing a replica's digest with the record costs, for a replica
//! of a million rows: the server reads the replica's whole record, turns
//! each key into the form it travels in, and fingerprints them (the summed form).
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench digest
//!
//! The record is written directly (one replica holding 1M rows of one
//! table); the digest is the replica's computation over the same keys.
//! Printed, alternating three times: the comparison, and the bare read of
//! the same keys from `sync.held` as the baseline it cannot go below.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::envelope::{Ack, Digest, TableDigest};
use magic_sync::relay::Compared;
use magic_sync::{Engine, Row};
use std::time::Instant;

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, all, key(id))]
struct Item {
    id: i64,
    value: i64,
}

const ROWS: i64 = 1_000_000;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Engine::builder()
        .table::<Item>()
        .build()
        .expect("declarations");
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute("CREATE TABLE items (id bigint PRIMARY KEY, value bigint NOT NULL)")
        .await
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let started = Instant::now();
    client
        .batch_execute(&format!(
            "INSERT INTO sync.replicas (id, live, provision, last_number) VALUES ('r1', true, false, 5);
             INSERT INTO sync.held (replica, table_name, key, version, message, ruled, refs)
             SELECT 'r1', 'items', '[' || i || ']', 0, 5, true, 0 FROM generate_series(1, {ROWS}) i;"
        ))
        .await
        .unwrap();
    client
        .batch_execute("VACUUM ANALYZE sync.held")
        .await
        .unwrap();
    println!(
        "a record of {ROWS} rows written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let keys: Vec<String> = (1..=ROWS).map(|i| format!("[{i}]")).collect();
    let digest = Digest {
        tables: vec![TableDigest {
            table: "items".into(),
            rows: ROWS as u64,
            fingerprint: 0,
            summed: Some(magic_sync::replica::fingerprint(&keys)),
        }],
        ..Digest::default()
    };
    let applied = Ack {
        number: 5,
        ..Ack::default()
    };
    let (mut compared, mut read) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        client
            .batch_execute("UPDATE sync.replicas SET digest_compared_at = NULL")
            .await
            .unwrap();
        let t = Instant::now();
        let outcome = magic_sync::relay::compare_digest(
            &mut client,
            &engine,
            "r1",
            &digest,
            Some(&applied),
            &[],
        )
        .await
        .unwrap();
        compared.push(t.elapsed().as_secs_f64());
        assert_eq!(outcome, Compared::Matched);
        let t = Instant::now();
        let rows = client
            .query(
                "SELECT key::jsonb FROM sync.held WHERE replica = 'r1' AND table_name = 'items'",
                &[],
            )
            .await
            .unwrap();
        read.push(t.elapsed().as_secs_f64());
        assert_eq!(rows.len() as i64, ROWS);
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "comparing a digest of {ROWS} rows: {:.2} s best of 3 ({:?}); reading the keys alone {:.2} s ({:.2}x)",
        best(&compared),
        compared.iter().map(|s| format!("{s:.2}")).collect::<Vec<_>>(),
        best(&read),
        best(&compared) / best(&read)
    );
}
