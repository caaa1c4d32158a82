//! The random walk's moves: seeded server writes over the whole shop
//! (inserts, updates, deletes, key changes, foreign keys re-pointed, group
//! members joining and leaving, groups given and taken), shared by the walk
//! and the storm.

use rand::rngs::StdRng;
use rand::Rng;

/// The shop's regions: replicas' partitions, and the rows they group.
pub const REGIONS: [&str; 3] = ["north", "south", "east"];

/// A number from the environment variable `name`, if set.
pub fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The seeds to walk: one to replay, or `default` of them from a base
/// (`MAGIC_SYNC_SEEDS` scales every walk's count alike: it is the count of
/// the walk whose default is 6).
pub fn seeds(default: u64, base: u64) -> Vec<u64> {
    match env("MAGIC_SYNC_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = env("MAGIC_SYNC_SEED_BASE").unwrap_or(base);
            let count = env("MAGIC_SYNC_SEEDS").map_or(default, |n| (n * default / 6).max(1));
            (0..count).map(|i| base + i).collect()
        }
    }
}

/// One of `items`, at random.
pub fn pick<'a>(rng: &mut StdRng, items: &[&'a str]) -> &'a str {
    items[rng.gen_range(0..items.len())]
}

/// One write around customer 1: its own row changed, or an order coming to
/// it or leaving it.
pub fn hot_write(rng: &mut StdRng, units: &[&str]) -> String {
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

/// One random server write over the shop: the schema may refuse it (a
/// foreign key), which changes nothing.
pub fn write(rng: &mut StdRng, units: &[&str]) -> String {
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
