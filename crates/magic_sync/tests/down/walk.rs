//! The random walk: seeded server writes over the whole shop — inserts,
//! updates, deletes, key changes, foreign keys re-pointed, group members
//! joining and leaving, groups given and taken — and replicas becoming live,
//! leaving, moving partition and dropping off the network. After every step
//! every replica holds exactly what the reference says, and never a row
//! without the rows it points at ([`Fleet::check`]).
//!
//! A second walk runs with a dozen tills over a hot parent: customer 1,
//! pointed at by an order of every till from the start, written to again and
//! again while orders come to it and leave it. The shop has no index on any
//! foreign-key column but the two the relay asks for (a shipment's event, a
//! promotion's groups): what points at a customer or a product is never
//! looked up in the host's tables.
//!
//! Each walk deploys twice on the way, at steps its seed picks: a build
//! that sends the notices to every till rather than its region's, and later
//! the shop's own build again. Each deployment is worked through a few rows
//! a pass while the walk goes on writing, and the tills open with the new
//! build; at no pass does a replica hold a row without its parents, and
//! once settled every replica is exact under the build that runs.
//!
//! The first walk records every replica's rows for it alone (the record by
//! rule off); the hot walk and the cohort walk record by rule, as a relay
//! does by default.
//!
//! `MAGIC_SYNC_SEED=n` replays one seed; `MAGIC_SYNC_SEEDS` and
//! `MAGIC_SYNC_STEPS` change the budget (default 6 seeds of 40 steps; the
//! hot walk runs half as many seeds).

use crate::fleet::Fleet;
pub(crate) use magic_sync_testkit::walk::{env, seeds};
use magic_sync_testkit::walk::{hot_write, pick, write, REGIONS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What a walk runs over.
struct Walk {
    units: Vec<String>,
    /// Whether writes crowd around customer 1.
    hot: bool,
    /// Whether the relay records the `all` tables' rows for their cohort.
    by_rule: bool,
    /// Whether the record leaves the rows a rule gives to it
    /// (`Settings::record_ruled_rows` off); otherwise as the environment
    /// says.
    thinned: bool,
}

impl Walk {
    fn units(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("u{i}")).collect()
    }
}

#[tokio::test]
async fn every_replica_holds_exactly_what_its_rules_say_after_every_step() {
    let steps = env("MAGIC_SYNC_STEPS").unwrap_or(40);
    for seed in seeds(6, 0x5eed) {
        println!("random walk: seed {seed} ({steps} steps); replay with MAGIC_SYNC_SEED={seed}");
        let shape = Walk {
            units: Walk::units(5),
            hot: false,
            by_rule: false,
            thinned: false,
        };
        walk(seed, steps, &shape).await;
    }
}

#[tokio::test]
async fn a_hot_parent_held_by_a_dozen_tills_stays_exact() {
    let steps = env("MAGIC_SYNC_STEPS").unwrap_or(40);
    for seed in seeds(3, 0x407) {
        println!("hot walk: seed {seed} ({steps} steps); replay with MAGIC_SYNC_SEED={seed}");
        let shape = Walk {
            units: Walk::units(12),
            hot: true,
            by_rule: true,
            thinned: false,
        };
        walk(seed, steps, &shape).await;
    }
}

/// The record by rule (how-it-works §20): the cohort of the
/// `all` tables is recorded and planned every pass beside the replicas,
/// and after every step [`Fleet::check`] finds it holding exactly what the
/// reference gives it, through both deployments (the notices made an `all`
/// table, then a partition's again), while every replica stays exact.
#[tokio::test]
async fn the_cohort_of_the_all_tables_is_recorded_exactly_after_every_step() {
    let steps = env("MAGIC_SYNC_STEPS").unwrap_or(40);
    for seed in seeds(3, 0xc0407) {
        println!("cohort walk: seed {seed} ({steps} steps); replay with MAGIC_SYNC_SEED={seed}");
        let shape = Walk {
            units: Walk::units(5),
            hot: false,
            by_rule: true,
            thinned: false,
        };
        walk(seed, steps, &shape).await;
    }
}

/// The same with the record of the rows a rule gives thinned: the tills
/// kept up join the cohort (their record and the cohort's compared but
/// for the rows the rule gives both alike), and every step, both
/// deployments included, leaves every till and the cohort exact.
#[tokio::test]
async fn the_cohort_with_the_rows_a_rule_gives_left_to_it_stays_exact_after_every_step() {
    let steps = env("MAGIC_SYNC_STEPS").unwrap_or(30);
    for seed in seeds(1, 0xc0408) {
        println!(
            "thinned cohort walk: seed {seed} ({steps} steps); replay with MAGIC_SYNC_SEED={seed}"
        );
        let shape = Walk {
            units: Walk::units(5),
            hot: false,
            by_rule: true,
            thinned: true,
        };
        walk(seed, steps, &shape).await;
    }
}

async fn walk(seed: u64, steps: u64, shape: &Walk) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fixture = crate::shop::ROWS.to_string();
    if shape.hot {
        // Every till holds customer 1 as the parent of an order of its own.
        fixture.push_str("INSERT INTO customers VALUES (1, 'hot');");
        for (i, unit) in shape.units.iter().enumerate() {
            fixture.push_str(&format!(
                "INSERT INTO orders (id, unit_id, customer_id) VALUES ({}, '{unit}', 1);",
                30 + i
            ));
        }
    }
    let mut fleet = Fleet::new(&fixture).await;
    fleet
        .reconfigure(|s| {
            s.record_by_rule = shape.by_rule;
            if shape.thinned {
                s.record_ruled_rows = false;
            }
        })
        .await;
    let units: Vec<&str> = shape.units.iter().map(String::as_str).collect();
    for (i, unit) in units.iter().enumerate() {
        fleet.add(unit, Some(REGIONS[i % 2]));
    }
    fleet.set_live(units[units.len() - 1], false);
    fleet.sync().await;
    fleet.check().await;
    if shape.by_rule {
        let products: i64 = fleet.count("SELECT count(*) FROM sync.held WHERE replica = E'\\001all' AND table_name = 'products'").await;
        assert!(products > 0, "the cohort of the `all` tables is recorded");
        // The shop's own rows point at no row the cohort holds but its
        // products: the tills kept up joined it.
        let members: i64 = fleet.count("SELECT count(*) FROM sync.members").await;
        assert!(members > 0, "the tills kept up joined the cohort");
    }
    let there = rng.gen_range(steps / 4..=steps / 2);
    let back = rng.gen_range(there + 1..there + 2 + steps / 3);
    for step in 0..steps {
        let mut done = Vec::new();
        if step == there {
            fleet.redeploy(crate::shop::redeclared()).await;
            done.push("deployed: notices to every till".to_string());
        } else if step == back {
            fleet.redeploy(crate::shop::engine()).await;
            done.push("deployed: notices to their region again".to_string());
        }
        let writes = rng.gen_range(1..=3);
        let together = rng.gen_bool(0.3);
        let mut batch = String::new();
        for _ in 0..writes {
            let sql = if shape.hot && rng.gen_bool(0.5) {
                hot_write(&mut rng, &units)
            } else {
                write(&mut rng, &units)
            };
            if together {
                batch.push_str(&sql);
                batch.push_str(";\n");
            } else {
                // A write the schema refuses (a foreign key) changes nothing.
                let ok = fleet.writer.batch_execute(&sql).await.is_ok();
                done.push(format!("{sql} [{}]", if ok { "ok" } else { "refused" }));
            }
        }
        if together {
            let ok = fleet
                .writer
                .batch_execute(&format!("BEGIN; {batch} COMMIT;"))
                .await
                .is_ok();
            if !ok {
                fleet.writer.batch_execute("ROLLBACK").await.ok();
            }
            done.push(format!(
                "in one transaction [{}]: {batch}",
                if ok { "ok" } else { "refused" }
            ));
        }
        if rng.gen_bool(0.15) {
            done.push(replicas(&mut rng, &mut fleet, &units));
            if rng.gen_bool(0.5) {
                // The snapshots the change asks for stream while the server
                // writes: a transaction open across a snapshot's view, a
                // write beside it, a pass in the middle.
                let open = write(&mut rng, &units);
                let during = write(&mut rng, &units);
                done.push(format!("snapshots amid [{open}] and [{during}]"));
                println!("seed {seed} step {step}: {}", done.join(" | "));
                fleet.record_amid(&open, &during).await;
                fleet.sync().await;
                fleet.check().await;
                continue;
            }
        }
        println!("seed {seed} step {step}: {}", done.join(" | "));
        // The step's notes are pending: the rows each holder holds by its
        // rule are still read right from them (decision 176).
        fleet.check_rules().await;
        if rng.gen_bool(0.2) {
            // A pass recorded and published before the next writes land:
            // replicas fall behind by a message or more.
            fleet.record().await;
            fleet.deliver().await;
            fleet.check_orphans();
            continue;
        }
        fleet.sync().await;
        fleet.check().await;
    }
    for unit in &units {
        fleet.cut(unit, false);
    }
    fleet.sync().await;
    fleet.check().await;
    for unit in units {
        let unit = fleet.unit(unit);
        if unit.info.live {
            let configuration = unit.replica.configuration().unwrap();
            assert!(
                configuration.complete,
                "seed {seed}: {} holds the build it runs whole: {configuration:?}",
                unit.info.id
            );
        }
    }
}

/// One change to the replicas; says what it was.
fn replicas(rng: &mut StdRng, fleet: &mut Fleet, units: &[&str]) -> String {
    let unit = pick(rng, units);
    match rng.gen_range(0..3) {
        0 => {
            let live = !fleet.unit(unit).info.live;
            fleet.set_live(unit, live);
            format!("{unit} live = {live}")
        }
        1 => {
            let region = pick(rng, &REGIONS);
            fleet.move_to(unit, Some(region));
            format!("{unit} moves to {region}")
        }
        _ => {
            let cut = !fleet.unit(unit).cut;
            fleet.cut(unit, cut);
            format!("{unit} cut off = {cut}")
        }
    }
}
