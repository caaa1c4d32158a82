//! The random walk: seeded server writes over the whole shop — inserts,
//! updates, deletes, key changes, foreign keys re-pointed, group members
//! joining and leaving, groups given and taken — and replicas becoming live,
//! leaving, moving partition and dropping off the network. After every step
//! every replica holds exactly what the reference says, and never a row
//! without the rows it points at ([`Fleet::check`]).
//!
//! `MAGIC_SYNC_SEED=n` replays one seed; `MAGIC_SYNC_SEEDS` and
//! `MAGIC_SYNC_STEPS` change the budget (default 6 seeds of 40 steps).

use crate::fleet::Fleet;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const UNITS: [&str; 5] = ["u1", "u2", "u3", "u4", "u5"];
const REGIONS: [&str; 3] = ["north", "south", "east"];

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn every_replica_holds_exactly_what_its_rules_say_after_every_step() {
    let steps = env("MAGIC_SYNC_STEPS").unwrap_or(40);
    let seeds: Vec<u64> = match env("MAGIC_SYNC_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = env("MAGIC_SYNC_SEED_BASE").unwrap_or(0x5eed);
            (0..env("MAGIC_SYNC_SEEDS").unwrap_or(6))
                .map(|i| base + i)
                .collect()
        }
    };
    for seed in seeds {
        println!("random walk: seed {seed} ({steps} steps); replay with MAGIC_SYNC_SEED={seed}");
        walk(seed, steps).await;
    }
}

async fn walk(seed: u64, steps: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fleet = Fleet::new(crate::scenarios::SHOP).await;
    for (i, unit) in UNITS.iter().enumerate() {
        fleet.add(unit, Some(REGIONS[i % 2]));
    }
    fleet.set_live("u5", false);
    fleet.sync().await;
    fleet.check().await;
    for step in 0..steps {
        let mut done = Vec::new();
        let writes = rng.gen_range(1..=3);
        let together = rng.gen_bool(0.3);
        let mut batch = String::new();
        for _ in 0..writes {
            let sql = write(&mut rng);
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
            done.push(replicas(&mut rng, &mut fleet));
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
    for unit in UNITS {
        fleet.cut(unit, false);
    }
    fleet.sync().await;
    fleet.check().await;
}

fn pick<'a>(rng: &mut StdRng, items: &[&'a str]) -> &'a str {
    items[rng.gen_range(0..items.len())]
}

/// One random server write.
fn write(rng: &mut StdRng) -> String {
    let p = rng.gen_range(1..=12);
    let c = rng.gen_range(1..=10);
    let o = rng.gen_range(1..=20);
    let unit = pick(rng, &UNITS);
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
fn replicas(rng: &mut StdRng, fleet: &mut Fleet) -> String {
    let unit = pick(rng, &UNITS);
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
