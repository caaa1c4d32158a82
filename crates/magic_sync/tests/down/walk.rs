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
//! `MAGIC_SYNC_SEED=n` replays one seed; `MAGIC_SYNC_SEEDS` and
//! `MAGIC_SYNC_STEPS` change the budget (default 6 seeds of 40 steps; the
//! hot walk runs half as many seeds).

use crate::fleet::Fleet;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const REGIONS: [&str; 3] = ["north", "south", "east"];

/// What a walk runs over.
struct Walk {
    units: Vec<String>,
    /// Whether writes crowd around customer 1.
    hot: bool,
}

impl Walk {
    fn units(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("u{i}")).collect()
    }
}

pub(crate) fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The seeds to walk: one to replay, or `default` of them from a base
/// (`MAGIC_SYNC_SEEDS` scales every walk's count alike: it is the count of
/// the walk whose default is 6).
pub(crate) fn seeds(default: u64, base: u64) -> Vec<u64> {
    match env("MAGIC_SYNC_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = env("MAGIC_SYNC_SEED_BASE").unwrap_or(base);
            let count = env("MAGIC_SYNC_SEEDS").map_or(default, |n| (n * default / 6).max(1));
            (0..count).map(|i| base + i).collect()
        }
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
        };
        walk(seed, steps, &shape).await;
    }
}

async fn walk(seed: u64, steps: u64, shape: &Walk) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fixture = crate::scenarios::SHOP.to_string();
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
    let units: Vec<&str> = shape.units.iter().map(String::as_str).collect();
    for (i, unit) in units.iter().enumerate() {
        fleet.add(unit, Some(REGIONS[i % 2]));
    }
    fleet.set_live(units[units.len() - 1], false);
    fleet.sync().await;
    fleet.check().await;
    for step in 0..steps {
        let mut done = Vec::new();
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
        if rng.gen_bool(0.2) {
            // A pass recorded and published before the next writes land:
            // replicas fall behind by a message or more.
            fleet.record().await;
            fleet.deliver().await;
            continue;
        }
        fleet.sync().await;
        fleet.check().await;
    }
    for unit in units {
        fleet.cut(unit, false);
    }
    fleet.sync().await;
    fleet.check().await;
}

fn pick<'a>(rng: &mut StdRng, items: &[&'a str]) -> &'a str {
    items[rng.gen_range(0..items.len())]
}

/// One write around customer 1: its own row changed, or an order coming to
/// it or leaving it.
fn hot_write(rng: &mut StdRng, units: &[&str]) -> String {
    let o = 30 + rng.gen_range(0..units.len() + 4);
    let unit = pick(rng, units);
    match rng.gen_range(0..8) {
        0..=3 => "UPDATE customers SET name = name || '+' WHERE id = 1".to_string(),
        4 => format!("UPDATE orders SET customer_id = 1 WHERE id = {o}"),
        5 => format!(
            "UPDATE orders SET customer_id = {} WHERE id = {o}",
            rng.gen_range(7..=9)
        ),
        6 => format!(
            "INSERT INTO orders (id, unit_id, customer_id) VALUES ({o}, '{unit}', 1) ON CONFLICT (id) DO UPDATE SET unit_id = EXCLUDED.unit_id"
        ),
        _ => format!("DELETE FROM orders WHERE id = {o}"),
    }
}

/// One random server write.
fn write(rng: &mut StdRng, units: &[&str]) -> String {
    let p = rng.gen_range(1..=12);
    let c = rng.gen_range(1..=10);
    let o = rng.gen_range(1..=20);
    let unit = pick(rng, units);
    let region = pick(rng, &["north", "south"]);
    match rng.gen_range(0..30) {
        0 => format!("INSERT INTO products VALUES ({p}, 'p{p}', {c}, NULL) ON CONFLICT DO NOTHING"),
        1 => format!("UPDATE products SET price = price + 1, name = name || '+' WHERE id = {p}"),
        2 => format!(
            "UPDATE products SET barcode = NULL WHERE barcode = 'B{c}'; UPDATE products SET barcode = 'B{c}' WHERE id = {p}"
        ),
        3 => format!("DELETE FROM products WHERE id = {p}"),
        4 => format!("UPDATE products SET id = {} WHERE id = {p}", rng.gen_range(1..=12)),
        5 => format!("INSERT INTO customers VALUES ({c}, 'c{c}') ON CONFLICT DO NOTHING"),
        6 => format!("UPDATE customers SET name = name || '+' WHERE id = {c}"),
        7 => format!("DELETE FROM customers WHERE id = {c}"),
        8 | 9 => format!(
            "INSERT INTO orders (id, unit_id, customer_id) VALUES ({o}, '{unit}', {}) ON CONFLICT DO NOTHING",
            if rng.gen_bool(0.8) { c.to_string() } else { "NULL".into() }
        ),
        10 => format!("UPDATE orders SET unit_id = '{unit}' WHERE id = {o}"),
        11 => format!("UPDATE orders SET customer_id = {c} WHERE id = {o}"),
        12 => format!("DELETE FROM orders WHERE id = {o}"),
        13 => format!("UPDATE orders SET id = {} WHERE id = {o}", rng.gen_range(1..=20)),
        14 | 15 => format!(
            "INSERT INTO order_lines VALUES ({o}, {}, {p}, 1) ON CONFLICT DO NOTHING",
            rng.gen_range(1..=3)
        ),
        16 => format!("UPDATE order_lines SET product_id = {p}, qty = qty + 1 WHERE order_id = {o}"),
        17 => format!("DELETE FROM order_lines WHERE order_id = {o} AND line_no = {}", rng.gen_range(1..=3)),
        18 => format!(
            "INSERT INTO notices VALUES ({c}, '{}', 'n') ON CONFLICT (id) DO UPDATE SET region_id = EXCLUDED.region_id",
            pick(rng, &REGIONS)
        ),
        19 => format!("DELETE FROM notices WHERE id = {c}"),
        20 => format!("INSERT INTO promotions VALUES ({c}, {p}, 5) ON CONFLICT (id) DO UPDATE SET product_id = {p}"),
        21 => format!("DELETE FROM promotions WHERE id = {c}"),
        22 => format!(
            "INSERT INTO promotion_members VALUES ({}, {c}) ON CONFLICT DO NOTHING",
            100 * rng.gen_range(1..=3)
        ),
        23 => format!("DELETE FROM promotion_members WHERE promotion_id = {c}"),
        24 => format!(
            "INSERT INTO unit_groups VALUES ('{unit}', {}) ON CONFLICT DO NOTHING",
            100 * rng.gen_range(1..=3)
        ),
        25 => format!("DELETE FROM unit_groups WHERE unit_id = '{unit}' AND group_id = {}", 100 * rng.gen_range(1..=3)),
        26 => format!(
            "INSERT INTO stock VALUES ('{unit}', {p}, {c}, NULL) ON CONFLICT (unit_id, product_id) DO UPDATE SET on_hand = stock.on_hand + 1"
        ),
        27 => format!(
            "INSERT INTO events VALUES ('{region}', {}, 'e') ON CONFLICT DO NOTHING",
            rng.gen_range(1..=4)
        ),
        28 => format!(
            "INSERT INTO logistics.shipments VALUES ({c}, '{region}', {}, {}) ON CONFLICT (id) DO UPDATE SET parent_id = EXCLUDED.parent_id",
            rng.gen_range(1..=4),
            if rng.gen_bool(0.5) { rng.gen_range(1..=10).to_string() } else { "NULL".into() }
        ),
        _ => match rng.gen_range(0..3) {
            0 => format!("DELETE FROM logistics.shipments WHERE id = {c}"),
            1 => format!("DELETE FROM events WHERE id = {}", rng.gen_range(1..=4)),
            _ => format!("DELETE FROM stock WHERE unit_id = '{unit}'"),
        },
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
