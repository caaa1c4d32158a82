//! Deploying changed declarations on pgbench's schema (issue 21), against
//! provisioning the same fleet from scratch in the same run.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench deploy
//!
//! The schema is pgbench's at scale 10 (1M accounts, 100 tellers, 10
//! branches) with its foreign keys, written in SQL, and 100,000 history
//! rows (`hid` keyed, as the OLTP bench keys it). Ten replicas, "1" to
//! "10", each holding its branch's rows (`replica = "bid"`), on SQLite
//! files, applied in this process as the relay writes.
//!
//! 1. Baseline: the fleet provisioned from nothing (1.1M rows).
//! 2. The history's rule changed so that it is no longer sent
//!    (`partition = "bid"`, and the replicas have no partition). Every
//!    history row is planned again and taken back; nothing else is read or
//!    sent.
//! 3. A column added to accounts (`note`), and declared: accounts alone
//!    are sent again, the other tables untouched.
//!
//! Each deployment is timed from the new build's relay starting until every
//! replica says it holds the new configuration whole
//! (`Replica::configuration`). The rows sent and taken back are the
//! passes' own counts.
//!
//! MAGIC_SYNC_BENCH_SCALE: pgbench's scale (default 10), one replica per
//! branch. MAGIC_SYNC_BENCH_HISTORY: history rows (default 100,000).
//! MAGIC_SYNC_BENCH_ONLY=history: the baseline and the history's
//! deployment, not the column's.
//! MAGIC_SYNC_BENCH_DEPLOY_CHUNK and MAGIC_SYNC_BENCH_DEPLOY_BUDGET_MS: the
//! most rows a pass works through and the time a pass aims at
//! (`Settings::deploy_chunk_rows`, `deploy_pass_budget`; their defaults).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::Engine;
use magic_sync_testkit::bench::env_u64;
use magic_sync_testkit::fleet::Fleet;
use magic_sync_testkit::pgbench::{Account, Branch, Teller};
use std::time::{Duration, Instant};

mod later {
    use chrono::NaiveDateTime;
    use magic_sync::Row;

    /// The history, by partition: the replicas have none, so it goes to
    /// no replica.
    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "pgbench_history", down, partition = "bid", key(hid))]
    pub struct History {
        pub hid: i64,
        pub tid: Option<i32>,
        pub bid: Option<i32>,
        pub aid: Option<i32>,
        pub delta: Option<i32>,
        pub mtime: Option<NaiveDateTime>,
        pub filler: Option<String>,
    }

    /// Accounts with a note.
    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "pgbench_accounts", down, replica = "bid", key(aid))]
    pub struct Account {
        pub aid: i32,
        pub bid: Option<i32>,
        pub abalance: Option<i32>,
        pub filler: Option<String>,
        pub note: Option<String>,
    }
}

fn schema(scale: u64, history: u64) -> String {
    format!(
        "CREATE TABLE pgbench_branches (bid int PRIMARY KEY, bbalance int, filler char(88));
         CREATE TABLE pgbench_tellers (tid int PRIMARY KEY, bid int REFERENCES pgbench_branches,
                                       tbalance int, filler char(84));
         CREATE TABLE pgbench_accounts (aid int PRIMARY KEY, bid int REFERENCES pgbench_branches,
                                        abalance int, filler char(84));
         CREATE TABLE pgbench_history (hid bigserial PRIMARY KEY, tid int REFERENCES pgbench_tellers,
                                       bid int REFERENCES pgbench_branches,
                                       aid int REFERENCES pgbench_accounts, delta int,
                                       mtime timestamp, filler char(22));
         INSERT INTO pgbench_branches SELECT b, 0, '' FROM generate_series(1, {scale}) b;
         INSERT INTO pgbench_tellers SELECT t, (t - 1) / 10 + 1, 0, '' FROM generate_series(1, {tellers}) t;
         INSERT INTO pgbench_accounts SELECT a, (a - 1) / 100000 + 1, 0, '' FROM generate_series(1, {accounts}) a;
         INSERT INTO pgbench_history (tid, bid, aid, delta, mtime)
             SELECT (h % {tellers}) + 1, (h % {scale}) + 1, (h % {scale}) * 100000 + (h % 1000) + 1,
                    h % 5000 - 2500, now()::timestamp
             FROM generate_series(1, {history}) h;
         ANALYZE;",
        tellers = scale * 10,
        accounts = scale * 100_000,
    )
}

/// What one deployment did, until every replica held it whole.
struct Deployed {
    took: Duration,
    /// Of which in the relay's passes (the rest: replicas applying).
    passing: Duration,
    sends: u64,
    deletes: u64,
    passes: u64,
}

/// Passes and deliveries until every replica is told it holds the
/// configuration it runs whole.
async fn until_configured(fleet: &mut Fleet, from: Instant, provisions: bool) -> Deployed {
    let (mut sends, mut deletes, mut passes) = (0, 0, 0);
    let mut passing = Duration::ZERO;
    loop {
        let t0 = Instant::now();
        let step = fleet.record().await;
        passing += t0.elapsed();
        assert!(
            provisions || step.provisioned.is_empty(),
            "a deployment provisions no one"
        );
        sends += step.planned.sends;
        deletes += step.planned.deletes;
        passes += 1;
        fleet.deliver().await;
        let whole = fleet.configured();
        if whole {
            return Deployed {
                took: from.elapsed(),
                passing,
                sends,
                deletes,
                passes,
            };
        }
    }
}

async fn deploy(fleet: &mut Fleet, engine: Engine, name: &str, baseline: Duration) -> Deployed {
    let dry = magic_sync::deploy::dry_run(&mut fleet.writer, &engine)
        .await
        .expect("the dry run");
    println!("{name}: dry run\n{dry}");
    let started = Instant::now();
    fleet.redeploy(engine).await;
    let deployed = until_configured(fleet, started, false).await;
    println!(
        "{name}: every replica holds it whole in {:.2} s ({:.3}x provisioning the fleet; \
         {:.2} s in the relay's passes), {} rows sent, {} taken back, {} passes",
        deployed.took.as_secs_f64(),
        deployed.took.as_secs_f64() / baseline.as_secs_f64(),
        deployed.passing.as_secs_f64(),
        deployed.sends,
        deployed.deletes,
        deployed.passes
    );
    deployed
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    magic_sync_testkit::bench::logs();
    let scale = env_u64("MAGIC_SYNC_BENCH_SCALE", 10);
    let history = env_u64("MAGIC_SYNC_BENCH_HISTORY", 100_000);
    let defaults = magic_sync::relay::Settings::default();
    let chunk = env_u64(
        "MAGIC_SYNC_BENCH_DEPLOY_CHUNK",
        defaults.deploy_chunk_rows as u64,
    ) as i64;
    let budget = Duration::from_millis(env_u64(
        "MAGIC_SYNC_BENCH_DEPLOY_BUDGET_MS",
        defaults.deploy_pass_budget.as_millis() as u64,
    ));
    let first = magic_sync_testkit::pgbench::engine();
    let made = Instant::now();
    let mut fleet = Fleet::of_sized(&schema(scale, history), first, 1 << 20).await;
    println!(
        "pgbench schema at scale {scale} with {history} history rows in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    fleet
        .reconfigure(|s| {
            s.chunk_rows = 2_000;
            s.flush_bytes = magic_sync::relay::ByteSize::mib(1);
            s.deploy_chunk_rows = chunk;
            s.deploy_pass_budget = budget;
        })
        .await;
    for b in 1..=scale {
        fleet.add(&b.to_string(), None);
    }
    let started = Instant::now();
    let provisioned = until_configured(&mut fleet, started, true).await;
    let baseline = provisioned.took;
    let held: i64 = fleet
        .writer
        .query_one("SELECT count(*) FROM sync.held", &[])
        .await
        .expect("count")
        .get(0);
    println!(
        "baseline: {scale} replicas provisioned from nothing in {:.2} s ({held} rows held)",
        baseline.as_secs_f64()
    );
    let second = Engine::builder()
        .table::<Branch>()
        .table::<Teller>()
        .table::<Account>()
        .table::<later::History>()
        .build()
        .expect("declarations");
    let gone = deploy(&mut fleet, second, "history no longer sent", baseline).await;
    assert_eq!(gone.sends, 0);
    if std::env::var("MAGIC_SYNC_BENCH_ONLY").as_deref() == Ok("history") {
        fleet.check().await;
        return;
    }
    fleet
        .writer
        .batch_execute("ALTER TABLE pgbench_accounts ADD COLUMN note text")
        .await
        .expect("add the column");
    let third = Engine::builder()
        .table::<Branch>()
        .table::<Teller>()
        .table::<later::Account>()
        .table::<later::History>()
        .build()
        .expect("declarations");
    let resent = deploy(&mut fleet, third, "a column added to accounts", baseline).await;
    assert_eq!(resent.deletes, 0);
    fleet.check().await;
}
