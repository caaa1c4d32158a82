//! The note trigger's cost on writes: single-row updates per second with
//! pgbench against a mirrored table and against an identical table without
//! triggers, alternating, in one run on one throwaway cluster.
//!
//! Then what sharing notes among relay partitions would cost (issue 23;
//! partitions are designed, not built: docs/scale.md, section 5), the two
//! ways a note written once could reach P partitions:
//!
//! - **A copy per partition, written by the trigger.** Measured as the
//!   engine's trigger plus one more row trigger writing P - 1 copies of
//!   the note: updates a second at P = 1, 2 and 4 against the table without
//!   triggers, alternating, three rounds (fsync off).
//! - **One note, read by every partition.** Writers pay what they pay
//!   today; each partition reads every note. Measured as the time to read
//!   MAGIC_SYNC_BENCH_NOTES notes (default 200,000) whole, as a pass reads
//!   them, once per partition.
//!
//! cargo bench -p magic_sync --features postgres --bench trigger_overhead
//! (MAGIC_SYNC_BENCH_SECONDS sets the length of each run, default 10;
//! MAGIC_SYNC_BENCH_SHARING=no leaves the second part out.)

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::{Engine, Row};
use std::process::Command;
use std::time::Instant;

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
    if std::env::var("MAGIC_SYNC_BENCH_SHARING").as_deref() != Ok("no") {
        sharing(&db, &client, seconds).await;
    }
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

/// The two ways of sharing notes among P relay partitions.
async fn sharing(db: &magic_sync_testdb::TestDb, client: &tokio_postgres::Client, seconds: u64) {
    let notes: i64 = std::env::var("MAGIC_SYNC_BENCH_NOTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    println!("fan-out at the write: single-row updates a second, fsync off, 2 clients, {seconds} s a run");
    let partitions = [1usize, 2, 4];
    let mut plain = Vec::new();
    let mut noted: Vec<Vec<f64>> = vec![Vec::new(); partitions.len()];
    for round in 1..=3 {
        client
            .batch_execute("TRUNCATE sync.notes")
            .await
            .expect("truncate");
        plain.push(pgbench(&db.conninfo(), "accounts_plain", seconds, false));
        let mut line = format!("  round {round}: no trigger {:.0}", plain[round - 1]);
        for (i, &p) in partitions.iter().enumerate() {
            copies(client, p - 1).await;
            client
                .batch_execute("TRUNCATE sync.notes")
                .await
                .expect("truncate");
            let tps = pgbench(&db.conninfo(), "accounts", seconds, false);
            noted[i].push(tps);
            line.push_str(&format!(", P = {p}: {tps:.0}"));
        }
        println!("{line}");
    }
    copies(client, 0).await;
    let plain = median(&mut plain);
    for (i, &p) in partitions.iter().enumerate() {
        let tps = median(&mut noted[i]);
        println!(
            "  median P = {p}: {tps:.0} updates/s, {:.3} of no trigger; {:.1} µs a write more than no trigger",
            tps / plain,
            (1.0 / tps - 1.0 / plain) * 1e6 * 2.0
        );
    }

    println!("one note read by every partition: {notes} notes, read whole as a pass reads them");
    client
        .batch_execute("TRUNCATE sync.notes")
        .await
        .expect("truncate");
    client
        .execute(
            "INSERT INTO sync.notes (table_name, source, key, parents)
             SELECT 'accounts', 'public.accounts', jsonb_build_array(i), NULL
             FROM generate_series(1, $1::bigint) i",
            &[&notes],
        )
        .await
        .expect("notes");
    client
        .batch_execute("VACUUM ANALYZE sync.notes")
        .await
        .expect("vacuum");
    let read = "SELECT seq, table_name, source, key, parents, xid FROM sync.notes \
                WHERE pg_visible_in_snapshot(xid, pg_current_snapshot())";
    // Warm, then timed.
    client.query(read, &[]).await.expect("read");
    let mut times = Vec::new();
    for _ in 0..5 {
        let began = Instant::now();
        client.query(read, &[]).await.expect("read");
        times.push(began.elapsed().as_secs_f64());
    }
    let once = median(&mut times);
    for p in partitions {
        println!(
            "  P = {p}: {:.1} ms ({:.2} µs a note, each partition {:.2} µs)",
            once * p as f64 * 1e3,
            once * p as f64 * 1e6 / notes as f64,
            once * 1e6 / notes as f64
        );
    }
}

/// Makes the trigger write `copies` more notes per row changed (none
/// drops it).
async fn copies(client: &tokio_postgres::Client, copies: usize) {
    client
        .batch_execute("DROP TRIGGER IF EXISTS bench_fan_out ON accounts")
        .await
        .expect("drop");
    if copies == 0 {
        return;
    }
    client
        .batch_execute(&format!(
            "CREATE OR REPLACE FUNCTION bench_fan_out() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 FOR i IN 1..{copies} LOOP
                     INSERT INTO sync.notes (table_name, source, key, parents)
                     VALUES ('accounts', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME,
                             jsonb_build_array(NEW.id), NULL);
                 END LOOP;
                 RETURN NULL;
             END $$;
             CREATE TRIGGER bench_fan_out AFTER UPDATE ON accounts
                 FOR EACH ROW EXECUTE FUNCTION bench_fan_out();"
        ))
        .await
        .expect("the fan-out trigger");
}
