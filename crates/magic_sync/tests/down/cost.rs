//! A change costs the rows around it, whatever indexes the host made: the
//! relay never searches a host table for what points at a row. Counted in
//! rows read, through PostgreSQL's statistics views, never in time.
//!
//! The shop has no index on `orders.customer_id`: finding the orders that
//! point at a customer would mean reading the whole table.

use crate::fleet::Fleet;
use std::collections::BTreeMap;
use tokio_postgres::Client;

const UNITS: usize = 50;

/// Fifty tills, each with an order for customer 7, who is held by all of
/// them as the parent of their orders, and by none for a rule of its own.
async fn fifty_tills_holding_one_customer() -> Fleet {
    let mut fleet = Fleet::new(&format!(
        "INSERT INTO customers VALUES (7, 'Ada'), (8, 'Bob');
         INSERT INTO orders (id, unit_id, customer_id)
             SELECT i, 'u' || i, 7 FROM generate_series(1, {UNITS}) i;
         INSERT INTO orders (id, unit_id, customer_id)
             SELECT 100 + i, 'u' || i, 7 FROM generate_series(1, {UNITS}) i;
         INSERT INTO products VALUES (1, 'tea', 2.5, NULL);
         INSERT INTO order_lines SELECT i, 1, 1, 1 FROM generate_series(1, {UNITS}) i;"
    ))
    .await;
    for i in 1..=UNITS {
        fleet.add(&format!("u{i}"), Some("north"));
    }
    fleet.sync().await;
    fleet.check().await;
    fleet
}

/// Rows read from each host table so far, by sequential and index scans, and
/// the number of sequential scans, as PostgreSQL counts them. `client`
/// must be the relay's: its counts are sent to the shared statistics first.
/// Of the host's tables (`public`), or of `schema`'s.
pub(crate) async fn reads_in(client: &Client, schema: &str) -> BTreeMap<String, (i64, i64)> {
    // The backend sends its counts on its way to idle after this statement.
    client
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .unwrap();
    client
        .query(
            "SELECT relname::text, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0), coalesce(seq_scan, 0)
             FROM pg_stat_user_tables WHERE schemaname = $1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect()
}

async fn reads(client: &Client) -> BTreeMap<String, (i64, i64)> {
    reads_in(client, "public").await
}

/// What one pass read of each table: rows, and sequential scans.
async fn pass_reads(
    fleet: &mut Fleet,
) -> (magic_sync::relay::Recorded, BTreeMap<String, (i64, i64)>) {
    let before = reads(&fleet.client).await;
    let recorded = fleet.pass().await;
    let after = reads(&fleet.client).await;
    let read = after
        .into_iter()
        .map(|(t, (rows, scans))| {
            let (r0, s0) = before.get(&t).copied().unwrap_or_default();
            (t, (rows - r0, scans - s0))
        })
        .collect();
    (recorded, read)
}

#[tokio::test]
async fn an_update_of_a_parent_held_by_fifty_tills_reads_none_of_its_children() {
    let mut fleet = fifty_tills_holding_one_customer().await;
    fleet
        .write("UPDATE customers SET name = 'Ada Lovelace' WHERE id = 7")
        .await;
    let (recorded, read) = pass_reads(&mut fleet).await;
    // The new name goes to every till holding her, and nothing else moves.
    assert_eq!(recorded.planned.sends, UNITS as u64, "{recorded:?}");
    assert_eq!(recorded.planned.deletes, 0, "{recorded:?}");
    // Her row is read (by its key); the orders pointing at her, and their
    // lines, are not read at all.
    for child in ["orders", "order_lines"] {
        assert_eq!(
            read[child],
            (0, 0),
            "rows read and scans of {child}: {read:?}"
        );
    }
    assert!(read["customers"].0 >= 1, "{read:?}");
    assert_eq!(read["customers"].1, 0, "no scan of customers: {read:?}");
    fleet.deliver().await;
    fleet.sync().await;
    fleet.check().await;
}

#[tokio::test]
async fn a_parent_losing_one_of_its_children_is_weighed_without_reading_the_others() {
    let mut fleet = fifty_tills_holding_one_customer().await;
    // u1's first order leaves customer 7 (its other order still points at
    // her); u2's orders both leave her, so u2 lets her go.
    fleet
        .write(
            "UPDATE orders SET customer_id = 8 WHERE id = 1;
             UPDATE orders SET customer_id = NULL WHERE id IN (2, 102);",
        )
        .await;
    let (recorded, read) = pass_reads(&mut fleet).await;
    // u1 gets Bob and its order's new version; u2 gets its two orders'
    // new versions and lets Ada go.
    assert_eq!(recorded.planned.sends, 4, "{recorded:?}");
    assert_eq!(recorded.planned.deletes, 1, "{recorded:?}");
    // The three changed orders are read by their keys (when questioned,
    // when weighed against their rule, and when loaded to be sent), and
    // nothing else of the table: no scan for what else points at Ada.
    // With the rows a rule gives left to it, each is read by its key twice
    // more, by the reading's statements (what its rule gave, and whose
    // sums it moves): still those three rows alone.
    let reads_each = match fleet.relay.settings().record_ruled_rows {
        true => 3,
        false => 5,
    };
    assert_eq!(read["orders"].1, 0, "no scan of orders: {read:?}");
    assert!(
        read["orders"].0 <= 3 * reads_each,
        "rows of orders read: {read:?}"
    );
    assert_eq!(read["order_lines"], (0, 0), "{read:?}");
    fleet.deliver().await;
    fleet.sync().await;
    fleet.check().await;
}
