//! The fixed cost of a pass: how many round trips and statements the relay
//! makes on its connection when nothing changed, when one row of one
//! replica changed, and when one row every replica holds changed; and what
//! publishing the messages and hearing the acknowledgements cost beside it;
//! and the one-row case again while `MAGIC_SYNC_BENCH_AWAY` tills (default
//! 10) are away with `MAGIC_SYNC_BENCH_WAITING` messages each (default
//! 4,000; the outbox's bound is 50,000) waiting for them: what outboxes
//! that grew cost the others' passes and publishing, which should be
//! nothing. Publishing remembers the tills away, as the runner does
//! (`relay::Away`, with the default settings' waits).
//!
//! cargo bench -p magic_sync --features postgres,sqlite --bench pass_cost
//!
//! `MAGIC_SYNC_RECORD_BY_RULE=0` runs it with the record by rule off;
//! `MAGIC_SYNC_RECORD_RULED=0` with the rows a rule gives left to it.
//!
//! The test shop with ten tills on SQLite files, the relay with its default
//! settings on a connection whose protocol messages are counted
//! (`magic_sync_testkit::wire`). Each case runs `MAGIC_SYNC_BENCH_ROUNDS`
//! times (default 20); the counts are printed as the least and the most
//! seen, the pass's time as its median. Round trips are what latency is
//! paid in: on this machine's local socket each is some tens of
//! microseconds plus the statement's own work, over a network a
//! millisecond or more.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::run;
use magic_sync_testkit::bench::{env_u64, record_by_rule, record_ruled_rows, show};
use magic_sync_testkit::fleet::Fleet;
use magic_sync_testkit::shop;
use magic_sync_testkit::wire::{self, Counter, Counts};
use std::time::{Duration, Instant};

const TILLS: usize = 10;

/// What one case cost, over its rounds.
#[derive(Default)]
struct Cost {
    pass: Vec<Counts>,
    publish: Vec<Counts>,
    publish_time: Vec<Duration>,
    heed: Vec<Counts>,
    pass_time: Vec<Duration>,
    /// The last pass's requests, when traced.
    trace: Vec<String>,
}

impl Cost {
    /// The pass's median time.
    fn median(&self) -> Duration {
        median_of(&self.pass_time)
    }

    fn print(&self, case: &str) {
        let range = |v: &[Counts]| {
            format!(
                "{} round trips, {} statements ({} parsed)",
                span(v.iter().map(|c| c.round_trips)),
                span(v.iter().map(|c| c.statements)),
                span(v.iter().map(|c| c.parsed))
            )
        };
        let median = self.median();
        println!("{case}:");
        for line in &self.trace {
            println!("    | {line}");
        }
        println!("  pass:    {} (median {})", range(&self.pass), show(median));
        if !self.publish.is_empty() {
            let mut trips: Vec<u64> = self.publish.iter().map(|c| c.round_trips).collect();
            trips.sort();
            println!(
                "  publish: {} (median {} round trips, {})",
                range(&self.publish),
                trips[trips.len() / 2],
                show(median_of(&self.publish_time))
            );
            println!("  heed:    {}", range(&self.heed));
        }
    }
}

/// The median of `times`.
fn median_of(times: &[Duration]) -> Duration {
    let mut times = times.to_vec();
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// The least and the most of `values`, or the one value they all are.
fn span(values: impl Iterator<Item = u64> + Clone) -> String {
    match (values.clone().min(), values.max()) {
        (Some(lo), Some(hi)) if lo == hi => lo.to_string(),
        (Some(lo), Some(hi)) => format!("{lo}-{hi}"),
        _ => "-".into(),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    magic_sync_testkit::bench::logs();
    let rounds = env_u64("MAGIC_SYNC_BENCH_ROUNDS", 20) as usize;
    let mut fleet = Fleet::new(shop::ROWS).await;
    for i in 1..=TILLS {
        let region = if i % 2 == 0 { "south" } else { "north" };
        fleet.add(&format!("u{i}"), Some(region));
    }
    let away_tills: Vec<String> = (1..=env_u64("MAGIC_SYNC_BENCH_AWAY", 10))
        .map(|i| format!("u{}", TILLS as u64 + i))
        .collect();
    for id in &away_tills {
        fleet.add(id, Some("north"));
    }
    fleet.sync().await;
    // As production runs it: the defaults (the record by rule as
    // `MAGIC_SYNC_RECORD_BY_RULE` says, the rows a rule gives recorded as
    // `MAGIC_SYNC_RECORD_RULED` says), on a connection counted.
    let (client, counter) = wire::connect(&fleet.db).await;
    fleet.reconnect_on(client).await;
    fleet
        .reconfigure(|s| {
            *s = magic_sync::relay::Settings {
                record_by_rule: record_by_rule(),
                record_ruled_rows: record_ruled_rows(),
                ..Default::default()
            }
        })
        .await;
    fleet.sync().await;
    fleet.check().await;

    if std::env::var_os("MAGIC_SYNC_BENCH_TRACE").is_some() {
        // Each case's last pass, statement by statement.
        counter.start_trace();
    }
    let idle = measure(&mut fleet, &counter, rounds, |_| String::new()).await;
    idle.print("nothing changed");
    let one = measure(&mut fleet, &counter, rounds, |i| {
        format!(
            "UPDATE orders SET placed_at = placed_at + interval '{} seconds' WHERE id = 1",
            i + 1
        )
    })
    .await;
    one.print("one row of one till changed (an order of u1)");
    let all = measure(&mut fleet, &counter, rounds, |i| {
        format!("UPDATE products SET price = {}.5 WHERE id = 1", i % 7 + 1)
    })
    .await;
    all.print(&format!(
        "one row every till holds changed (a product, {} tills)",
        TILLS + away_tills.len()
    ));
    fleet.check().await;

    // Tills away, their outboxes grown: messages put there directly,
    // numbered past anything the relay writes, never sent (they are cut
    // off).
    let waiting = env_u64("MAGIC_SYNC_BENCH_WAITING", 4_000);
    for id in &away_tills {
        fleet.network.cut(id, true);
        fleet
            .writer
            .batch_execute(&format!(
                "WITH b AS (
                     INSERT INTO sync.bodies (hash, bytes)
                     SELECT sha256(b), b FROM (SELECT convert_to(rpad('{id} ' || i, 200, '.'), 'UTF8') AS b
                     FROM generate_series(1, {waiting}) i) m RETURNING id)
                 INSERT INTO sync.outbox (replica, number, nonce, head, body, seal)
                 SELECT '{id}', {FAR} + row_number() OVER (), '\\x00', '\\x00', id, '\\x00' FROM b"
            ))
            .await
            .unwrap();
    }
    fleet
        .writer
        .batch_execute("ANALYZE sync.outbox; ANALYZE sync.bodies;")
        .await
        .unwrap();
    let away = measure(&mut fleet, &counter, rounds, |i| {
        format!(
            "UPDATE orders SET placed_at = placed_at + interval '{} seconds' WHERE id = 1",
            i + 1
        )
    })
    .await;
    away.print(&format!(
        "one row of one till changed, {} tills away with {waiting} messages waiting each",
        away_tills.len()
    ));
    println!(
        "  away against none waiting, pass median: {:.2}x",
        away.median().as_secs_f64() / one.median().as_secs_f64()
    );
    // Back: the messages put there go, the tills take what they missed.
    fleet
        .writer
        .batch_execute(&format!("DELETE FROM sync.outbox WHERE number > {FAR}"))
        .await
        .unwrap();
    for id in &away_tills {
        fleet.network.cut(id, false);
    }
    fleet.sync().await;
    // The next pass that writes forgets what no message carries.
    fleet
        .write("UPDATE products SET price = 9.5 WHERE id = 1")
        .await;
    fleet.sync().await;
    fleet.check().await;
    let left: i64 = fleet
        .writer
        .query_one("SELECT count(*) FROM sync.bodies", &[])
        .await
        .unwrap()
        .get(0);
    assert!(left < 100, "{left} bodies left once every till is back");
}

/// Past any message number the relay draws in this run.
const FAR: i64 = 1_000_000_000;

/// `rounds` times: `write(round)` (if any) committed, then one pass, and
/// if it wrote messages, their publishing, delivery and acknowledgement.
async fn measure(
    fleet: &mut Fleet,
    counter: &Counter,
    rounds: usize,
    write: impl Fn(usize) -> String,
) -> Cost {
    let mut cost = Cost::default();
    let settings = fleet.relay.settings();
    let mut away = magic_sync::relay::Away::new(settings.backoff_min, settings.backoff_max)
        .by_rule(settings.record_by_rule);
    for round in 0..rounds {
        let sql = write(round);
        if !sql.is_empty() {
            fleet.write(&sql).await;
        }
        counter.take_trace();
        let before = counter.counts();
        let started = Instant::now();
        let recorded = fleet.pass().await;
        cost.pass_time.push(started.elapsed());
        cost.pass.push(counter.counts() - before);
        cost.trace = counter.take_trace();
        assert_eq!(recorded.messages > 0, !sql.is_empty(), "{recorded:?}");
        if recorded.messages == 0 {
            continue;
        }
        let before = counter.counts();
        let started = Instant::now();
        magic_sync::relay::publish_beside(
            &fleet.client,
            &fleet.network,
            16,
            magic_sync::relay::BATCH_FROM,
            &mut away,
        )
        .await
        .expect("publishing");
        cost.publish_time.push(started.elapsed());
        cost.publish.push(counter.counts() - before);
        for (id, unit) in &mut fleet.units {
            for message in fleet.network.take(id) {
                if let Some(report) = run::replica::deliver(&mut unit.replica, &message).unwrap() {
                    fleet.network.report(id, report);
                }
            }
        }
        let before = counter.counts();
        fleet.heed().await;
        cost.heed.push(counter.counts() - before);
    }
    cost
}
