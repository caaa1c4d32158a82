//! The note trigger's cost on writes: single-row updates per second with
//! pgbench against a mirrored table and against an identical table without
//! triggers, alternating, in one run on one throwaway cluster.
//!
//! cargo bench -p magic_sync --features postgres --bench trigger_overhead
//! (MAGIC_SYNC_BENCH_SECONDS sets the length of each run, default 10.)

use magic_sync::{Engine, Row};
use std::process::Command;

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "accounts", down, partition = "branch", key(id))]
struct Account {
    id: i64,
    branch: i64,
    balance: i64,
    filler: String,
}

const ROWS: i64 = 100_000;

fn schema(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, branch bigint NOT NULL, balance bigint NOT NULL, filler text NOT NULL);
         INSERT INTO {table} SELECT i, i % 10, 0, repeat('x', 84) FROM generate_series(1, {ROWS}) i;"
    )
}

fn pgbench(conninfo: &str, table: &str, seconds: u64, durable: bool) -> f64 {
    let script = std::env::temp_dir().join(format!("magic_sync_bench_{table}.sql"));
    std::fs::write(
        &script,
        format!(
            "\\set id random(1, {ROWS})\nUPDATE {table} SET balance = balance + 1 WHERE id = :id;\n"
        ),
    )
    .expect("write pgbench script");
    let commit = if durable { "on" } else { "off" };
    let output = Command::new(magic_sync_testdb::server().bin("pgbench"))
        .env("PGOPTIONS", format!("-c synchronous_commit={commit}"))
        .args(["-n", "-M", "prepared", "-c", "2", "-j", "2", "-T"])
        .arg(seconds.to_string())
        .arg("-f")
        .arg(&script)
        .arg(conninfo)
        .output()
        .expect("run pgbench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench failed: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench output:\n{stdout}"))
}

#[tokio::main]
async fn main() {
    let seconds: u64 = std::env::var("MAGIC_SYNC_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute(&(schema("accounts") + &schema("accounts_plain")))
        .await
        .expect("tables");
    for table in ["accounts", "accounts_plain"] {
        client
            .batch_execute(&format!("VACUUM ANALYZE {table}"))
            .await
            .expect("vacuum");
    }
    magic_sync::schema::migrate(&mut client)
        .await
        .expect("migrate");
    let engine = Engine::builder()
        .table::<Account>()
        .build()
        .expect("engine");
    magic_sync::trigger::install(&engine, &mut client)
        .await
        .expect("triggers");

    println!("CPU-bound: fsync off, synchronous_commit off (the worst case for the trigger)");
    let (p, n) = compare(&db.conninfo(), seconds, false);
    report(p, n);
    if magic_sync_testdb::server().cluster().is_some() {
        set_fsync(&client, "ALTER SYSTEM SET fsync = on").await;
        println!("durable: fsync on, synchronous_commit on (how a production server runs)");
        let (p, n) = compare(&db.conninfo(), seconds, true);
        report(p, n);
        set_fsync(&client, "ALTER SYSTEM RESET fsync").await;
    }
    let notes: i64 = client
        .query_one("SELECT count(*) FROM sync.notes", &[])
        .await
        .expect("count notes")
        .get(0);
    println!("notes written: {notes}");
}

async fn set_fsync(client: &tokio_postgres::Client, statement: &str) {
    client.batch_execute(statement).await.expect("alter system");
    client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
}

/// Three alternating rounds of each; the medians.
fn compare(conninfo: &str, seconds: u64, durable: bool) -> (f64, f64) {
    let mut plain = Vec::new();
    let mut noted = Vec::new();
    for round in 1..=3 {
        plain.push(pgbench(conninfo, "accounts_plain", seconds, durable));
        noted.push(pgbench(conninfo, "accounts", seconds, durable));
        println!(
            "  round {round}: without triggers {:.0} updates/s, with triggers {:.0} updates/s",
            plain[round - 1],
            noted[round - 1]
        );
    }
    (median(&mut plain), median(&mut noted))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(p: f64, n: f64) {
    println!(
        "  median: without triggers {p:.0} updates/s, with triggers {n:.0} updates/s; the trigger costs {:.1}% of throughput (ratio {:.3})",
        (1.0 - n / p) * 100.0,
        n / p
    );
}
