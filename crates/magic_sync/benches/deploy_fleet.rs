//! One table's rule changed in a fleet of 100 replicas holding 50,000 rows
//! each over 6 tables (issue 21), against provisioning the fleet from
//! nothing in the same run.
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench deploy_fleet
//!
//! Per replica: its store, the 10 regions and 2,000 products (`all`), 8,000
//! orders of its own and their 32,000 lines (`follows`), and the 8,000
//! notices of its partition (region). The deployment changes the notices'
//! rule from their region to their area, which is the region for nine in
//! ten of them: each replica takes back the notices that left its
//! partition and gets those that came. While it runs, each pass also plans
//! an order changed just before it, as ongoing traffic.
//!
//! Reported: the rows sent and taken back against the exact difference of
//! the old and new wanted sets (worked out in SQL from the notices alone);
//! the time until every replica holds the new configuration whole, against
//! provisioning; the source rows read per table during the deployment
//! (PostgreSQL's own counters); and how long each pass with ongoing
//! changes took during the deployment, against before it.
//!
//! MAGIC_SYNC_BENCH_REPLICAS (default 100), MAGIC_SYNC_BENCH_ORDERS: orders
//! per replica (default 8,000; 4 lines each). `MAGIC_SYNC_RECORD_BY_RULE=0`
//! runs the relay with the record by rule off: the regions and products
//! recorded for every replica rather than once for their cohort.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::{Engine, Numeric, Row};
use magic_sync_testkit::bench::{env_u64, show};
use magic_sync_testkit::fleet::Fleet;
use std::time::{Duration, Instant};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "regions", down, all, key(id))]
struct Region {
    id: i32,
    name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "stores", down, replica = "id", key(id))]
struct Store {
    id: String,
    region: i32,
    name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
struct Product {
    id: i32,
    name: String,
    price: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "unit", key(id))]
struct Order {
    id: i64,
    unit: String,
    region: i32,
    placed: chrono::DateTime<chrono::Utc>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "lines", down, follows = "order_id", key(order_id, line))]
struct Line {
    order_id: i64,
    line: i32,
    product: i32,
    qty: i32,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "notices", down, partition = "region", key(id))]
struct Notice {
    id: i32,
    region: i32,
    area: i32,
    body: String,
}

/// The notices by area instead.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "notices", down, partition = "area", key(id))]
struct NoticeByArea {
    id: i32,
    region: i32,
    area: i32,
    body: String,
}

fn engine(by_area: bool) -> Engine {
    let builder = Engine::builder()
        .table::<Region>()
        .table::<Store>()
        .table::<Product>()
        .table::<Order>()
        .table::<Line>();
    match by_area {
        false => builder.table::<Notice>(),
        true => builder.table::<NoticeByArea>(),
    }
    .build()
    .expect("declarations")
}

fn unit(i: u64) -> String {
    format!("u{i:03}")
}

fn schema(replicas: u64, orders: u64) -> String {
    format!(
        "CREATE TABLE regions (id int PRIMARY KEY, name text NOT NULL);
         CREATE TABLE stores (id text PRIMARY KEY, region int NOT NULL REFERENCES regions, name text NOT NULL);
         CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, price numeric NOT NULL);
         CREATE TABLE orders (id bigint PRIMARY KEY, unit text NOT NULL, region int NOT NULL REFERENCES regions,
                              placed timestamptz NOT NULL);
         CREATE TABLE lines (order_id bigint NOT NULL REFERENCES orders, line int NOT NULL,
                             product int NOT NULL REFERENCES products, qty int NOT NULL,
                             PRIMARY KEY (order_id, line));
         CREATE TABLE notices (id int PRIMARY KEY, region int NOT NULL REFERENCES regions,
                               area int NOT NULL REFERENCES regions, body text NOT NULL);
         INSERT INTO regions SELECT r, 'region ' || r FROM generate_series(1, 10) r;
         INSERT INTO stores SELECT 'u' || lpad(i::text, 3, '0'), (i - 1) % 10 + 1, 'store ' || i
             FROM generate_series(1, {replicas}) i;
         INSERT INTO products SELECT p, 'product ' || p, p % 100 + 0.5 FROM generate_series(1, 2000) p;
         INSERT INTO orders SELECT o, 'u' || lpad(((o - 1) % {replicas} + 1)::text, 3, '0'),
                                   ((o - 1) % {replicas}) % 10 + 1, now()
             FROM generate_series(1, {total_orders}) o;
         INSERT INTO lines SELECT o, l, (o * 7 + l * 13) % 2000 + 1, l
             FROM generate_series(1, {total_orders}) o, generate_series(1, 4) l;
         INSERT INTO notices SELECT n, n % 10 + 1, CASE WHEN n % 10 = 3 THEN (n + 1) % 10 + 1 ELSE n % 10 + 1 END,
                                    'notice ' || n
             FROM generate_series(1, 80000) n;
         ANALYZE;",
        total_orders = replicas * orders,
    )
}

/// Source rows read so far, per table: sequential and index fetches.
async fn rows_read(fleet: &Fleet) -> Vec<(String, i64)> {
    // Other sessions' counters reach the shared statistics at most a second
    // after their transactions end.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fleet
        .writer
        .query(
            "SELECT relname, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
             FROM pg_stat_user_tables WHERE schemaname = 'public' ORDER BY relname",
            &[],
        )
        .await
        .expect("read the counters")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    magic_sync_testkit::bench::logs();
    let replicas = env_u64("MAGIC_SYNC_BENCH_REPLICAS", 100);
    let orders = env_u64("MAGIC_SYNC_BENCH_ORDERS", 8_000);
    let made = Instant::now();
    let mut fleet = Fleet::of_sized(&schema(replicas, orders), engine(false), 1 << 20).await;
    // The ongoing changes below each change one existing order.
    assert!(replicas * orders > 1_000);
    println!(
        "schema: {replicas} replicas' rows in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    fleet
        .reconfigure(|s| {
            let defaults = magic_sync::relay::Settings::default();
            s.chunk_rows = defaults.chunk_rows;
            s.flush_bytes = defaults.flush_bytes;
            s.deploy_chunk_rows = defaults.deploy_chunk_rows;
            s.deploy_pass_budget = defaults.deploy_pass_budget;
        })
        .await;
    for i in 1..=replicas {
        let partition = ((i - 1) % 10 + 1).to_string();
        fleet.add(&unit(i), Some(&partition));
    }
    let started = Instant::now();
    loop {
        fleet.record().await;
        fleet.deliver().await;
        if fleet.configured() {
            break;
        }
    }
    let provisioning = started.elapsed();
    let held: i64 = fleet
        .writer
        .query_one("SELECT count(*) FROM sync.held", &[])
        .await
        .expect("count")
        .get(0);
    println!(
        "baseline: {replicas} replicas provisioned from nothing in {:.1} s ({held} rows held, {:.0} per replica)",
        provisioning.as_secs_f64(),
        held as f64 / replicas as f64
    );
    // Ongoing traffic before the deployment: a pass planning one changed
    // order, and the replicas applying it.
    let mut steady = Vec::new();
    for k in 0..20_i64 {
        let t0 = Instant::now();
        fleet
            .write(&format!(
                "UPDATE orders SET placed = now() WHERE id = {}",
                k + 1
            ))
            .await;
        fleet.record().await;
        fleet.deliver().await;
        steady.push(t0.elapsed());
    }
    // The exact difference: a notice whose area is another region leaves
    // the replicas of its region and reaches those of its area.
    let per_partition = (replicas / 10) as i64;
    let moved: i64 = fleet
        .writer
        .query_one("SELECT count(*) FROM notices WHERE area <> region", &[])
        .await
        .expect("count")
        .get(0);
    let (expected_sends, expected_deletes) = (moved * per_partition, moved * per_partition);
    let dry = magic_sync::deploy::dry_run(&mut fleet.writer, &engine(true))
        .await
        .expect("the dry run");
    println!("dry run:\n{dry}");
    let read_before = rows_read(&fleet).await;
    let started = Instant::now();
    fleet.redeploy(engine(true)).await;
    let (mut sends, mut deletes, mut passes) = (0, 0, 0);
    let mut during = Vec::new();
    loop {
        let t0 = Instant::now();
        fleet
            .write(&format!(
                "UPDATE orders SET placed = now() WHERE id = {}",
                passes % (replicas * orders) + 1
            ))
            .await;
        let step = fleet.record().await;
        assert!(step.provisioned.is_empty(), "nobody is provisioned again");
        sends += step.planned.sends;
        deletes += step.planned.deletes;
        passes += 1;
        fleet.deliver().await;
        if step.deployed.is_some() {
            during.push(t0.elapsed());
        }
        if fleet.configured() {
            break;
        }
        assert!(
            passes < 10_000,
            "the deployment did not end: {:?}",
            magic_sync::deploy::progress(&fleet.writer).await
        );
    }
    let deployed = started.elapsed();
    let read_after = rows_read(&fleet).await;
    // The ongoing order changes were sent too: one row per pass.
    let ongoing = passes;
    println!(
        "deployment: every replica holds it whole in {:.2} s, {:.1}x faster than provisioning; {passes} passes",
        deployed.as_secs_f64(),
        provisioning.as_secs_f64() / deployed.as_secs_f64()
    );
    println!(
        "rows sent {} (the difference: {expected_sends}), taken back {deletes} (the difference: {expected_deletes}); \
         besides, {ongoing} ongoing order changes",
        sends - ongoing,
    );
    assert_eq!(
        sends - ongoing,
        expected_sends as u64,
        "sent: the exact difference"
    );
    assert_eq!(
        deletes, expected_deletes as u64,
        "taken back: the exact difference"
    );
    let read: Vec<String> = read_after
        .iter()
        .map(|(t, after)| {
            let before = read_before
                .iter()
                .find(|(b, _)| b == t)
                .map_or(0, |(_, n)| *n);
            format!("{t} {}", after - before)
        })
        .collect();
    println!(
        "source rows read during the deployment: {}",
        read.join(", ")
    );
    let quantile = |v: &mut Vec<Duration>, p: f64| {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    println!(
        "a pass with an ongoing change, replicas applying it: before p50 {} max {}; during the deployment p50 {} max {}",
        show(quantile(&mut steady, 0.5)),
        show(quantile(&mut steady, 1.0)),
        show(quantile(&mut during, 0.5)),
        show(quantile(&mut during, 1.0)),
    );
}
