//! The down-path scenarios of SCENARIOS.md, each as a user would see it.

use crate::fleet::{replica_rows, Fleet};
use crate::shop::{Customer, Notice, Order, OrderLine, Product, Promotion};
use magic_sync::Row;
use std::collections::BTreeSet;

/// A shop with two tills in the north and one in the south.
pub use crate::shop::ROWS as SHOP;

pub async fn shop() -> Fleet {
    let mut fleet = Fleet::new(SHOP).await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("north"));
    fleet.add("u3", Some("south"));
    fleet.sync().await;
    fleet.check().await;
    fleet
}

fn keys(fleet: &mut Fleet, unit: &str, table: &magic_sync::Table) -> BTreeSet<String> {
    replica_rows(&fleet.unit(unit).replica, table)
        .into_keys()
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// 1. A till made live receives its rules' rows, exactly the parents they
/// point at, and nothing else.
#[tokio::test]
async fn provisioning_sends_a_till_its_rows_and_exactly_their_parents() {
    let mut fleet = shop().await;
    assert_eq!(
        keys(&mut fleet, "u1", &Product::TABLE),
        set(&["[1]", "[2]", "[3]"])
    );
    assert_eq!(keys(&mut fleet, "u1", &Customer::TABLE), set(&["[7]"]));
    assert_eq!(keys(&mut fleet, "u1", &Order::TABLE), set(&["[1]", "[3]"]));
    assert_eq!(
        keys(&mut fleet, "u1", &OrderLine::TABLE),
        set(&["[1,1]", "[1,2]"])
    );
    assert_eq!(keys(&mut fleet, "u1", &Promotion::TABLE), set(&["[10]"]));
    assert_eq!(keys(&mut fleet, "u3", &Customer::TABLE), set(&[]));
}

/// 2. A new order arrives with the customer it points at, in one message.
#[tokio::test]
async fn a_parent_travels_with_its_child() {
    let mut fleet = shop().await;
    fleet
        .write("INSERT INTO orders (id, unit_id, customer_id) VALUES (4, 'u1', 9)")
        .await;
    let recorded = fleet.record().await;
    assert_eq!(recorded.messages, 1, "one message for u1: {recorded:?}");
    fleet.deliver().await;
    assert!(keys(&mut fleet, "u1", &Customer::TABLE).contains("[9]"));
    fleet.check().await;
}

/// 3. Re-pointing: the new customer comes, the old one goes unless still needed.
#[tokio::test]
async fn a_repointed_order_brings_its_new_customer_and_lets_go_of_the_old() {
    let mut fleet = shop().await;
    fleet
        .settle("UPDATE orders SET customer_id = 8 WHERE id = 1")
        .await;
    assert_eq!(keys(&mut fleet, "u1", &Customer::TABLE), set(&["[8]"]));
    // Another order of u1 keeps customer 8 when order 1 moves on.
    fleet
        .write("UPDATE orders SET customer_id = 8 WHERE id = 3")
        .await;
    fleet
        .settle("UPDATE orders SET customer_id = 9 WHERE id = 1")
        .await;
    assert_eq!(
        keys(&mut fleet, "u1", &Customer::TABLE),
        set(&["[8]", "[9]"])
    );
}

/// 4. An order moving between tills takes its lines and customer along.
#[tokio::test]
async fn an_order_moving_between_tills_moves_with_its_lines_and_customer() {
    let mut fleet = shop().await;
    fleet
        .settle("UPDATE orders SET unit_id = 'u3' WHERE id = 1")
        .await;
    assert_eq!(keys(&mut fleet, "u1", &OrderLine::TABLE), set(&[]));
    assert_eq!(keys(&mut fleet, "u1", &Customer::TABLE), set(&[]));
    assert_eq!(
        keys(&mut fleet, "u3", &OrderLine::TABLE),
        set(&["[1,1]", "[1,2]"])
    );
    assert_eq!(keys(&mut fleet, "u3", &Customer::TABLE), set(&["[7]"]));
}

/// 5. A line goes only where its order is.
#[tokio::test]
async fn a_follower_comes_and_goes_with_its_parent() {
    let mut fleet = shop().await;
    fleet
        .settle("INSERT INTO order_lines VALUES (1, 3, 3, 1)")
        .await;
    assert!(keys(&mut fleet, "u1", &OrderLine::TABLE).contains("[1,3]"));
    assert!(!keys(&mut fleet, "u2", &OrderLine::TABLE).contains("[1,3]"));
    fleet
        .settle("DELETE FROM order_lines WHERE order_id = 1 AND line_no = 3")
        .await;
}

/// 6. A key change reaches every till whole.
#[tokio::test]
async fn a_key_change_leaves_no_line_pointing_at_the_old_key() {
    let mut fleet = shop().await;
    fleet
        .settle("UPDATE products SET id = 100 WHERE id = 1")
        .await;
    for u in ["u1", "u2", "u3"] {
        let products = keys(&mut fleet, u, &Product::TABLE);
        assert!(products.contains("[100]") && !products.contains("[1]"));
    }
}

/// 7. Groups given and taken, members joining.
#[tokio::test]
async fn groups_bring_their_members_and_take_them_back() {
    let mut fleet = shop().await;
    fleet.settle("INSERT INTO promotions VALUES (12, 1, 10); INSERT INTO promotion_members VALUES (100, 12)").await;
    assert_eq!(
        keys(&mut fleet, "u1", &Promotion::TABLE),
        set(&["[10]", "[12]"])
    );
    fleet
        .settle("INSERT INTO unit_groups VALUES ('u3', 100)")
        .await;
    assert_eq!(
        keys(&mut fleet, "u3", &Promotion::TABLE),
        set(&["[10]", "[12]"])
    );
    fleet
        .settle("DELETE FROM unit_groups WHERE unit_id = 'u1'")
        .await;
    assert_eq!(keys(&mut fleet, "u1", &Promotion::TABLE), set(&[]));
}

/// 8. A till moving partition is provisioned again, with the new region's rows.
#[tokio::test]
async fn a_till_moving_partition_is_provisioned_again() {
    let mut fleet = shop().await;
    fleet.move_to("u1", Some("south"));
    fleet.provisions("u1").await;
    assert_eq!(
        keys(&mut fleet, "u1", &Notice::TABLE),
        set(&["[2]"]),
        "the south's notice only"
    );
    assert_eq!(
        keys(&mut fleet, "u1", &Order::TABLE),
        set(&["[1]", "[3]"]),
        "its orders as before"
    );
}

/// 9. A till that leaves is forgotten; back, it is provisioned from scratch.
#[tokio::test]
async fn a_till_that_leaves_is_forgotten_and_provisioned_when_back() {
    let mut fleet = shop().await;
    fleet.set_live("u1", false);
    let recorded = fleet.record().await;
    assert_eq!(recorded.forgotten, vec!["u1".to_string()]);
    let held: i64 = fleet
        .client
        .query_one("SELECT count(*) FROM sync.held WHERE replica = 'u1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 0);
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    fleet.sync().await;
    fleet.set_live("u1", true);
    fleet.provisions("u1").await;
}

/// 10. A transaction that took its note's number before a plan read past it,
/// and committed after, is still planned.
#[tokio::test]
async fn a_late_commit_is_never_missed() {
    let mut fleet = shop().await;
    let late = fleet.db.connect().await;
    late.batch_execute("BEGIN; INSERT INTO orders (id, unit_id, customer_id) VALUES (50, 'u1', 9)")
        .await
        .unwrap();
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    fleet.sync().await;
    assert!(!keys(&mut fleet, "u1", &Order::TABLE).contains("[50]"));
    late.batch_execute("COMMIT").await.unwrap();
    fleet.sync().await;
    fleet.check().await;
    assert!(keys(&mut fleet, "u1", &Order::TABLE).contains("[50]"));
    assert!(keys(&mut fleet, "u1", &Customer::TABLE).contains("[9]"));
}

/// 11. Whatever message a till applied last, the version of an order it
/// holds has its customer, while the order is re-pointed twice.
#[tokio::test]
async fn a_held_version_keeps_its_parents_until_the_next_one_lands() {
    let mut fleet = shop().await;
    fleet.cut("u1", true);
    fleet
        .write("UPDATE orders SET customer_id = 8 WHERE id = 1")
        .await;
    fleet.record().await;
    fleet.deliver().await;
    fleet
        .write("UPDATE orders SET customer_id = 9 WHERE id = 1")
        .await;
    fleet.record().await;
    fleet.deliver().await;
    fleet.cut("u1", false);
    fleet.publish().await;
    let waiting = fleet.network.take("u1");
    assert!(waiting.len() >= 2, "both passes wrote u1 a message");
    for message in waiting {
        magic_sync::run::replica::deliver(&mut fleet.unit("u1").replica, &message).unwrap();
        fleet.check_orphans();
    }
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(keys(&mut fleet, "u1", &Customer::TABLE), set(&["[9]"]));
}

/// 12. A message delivered twice changes nothing; one that skips a number
/// opens a gap, and the till is provisioned again.
#[tokio::test]
async fn twice_is_once_and_a_gap_brings_a_snapshot() {
    let mut fleet = shop().await;
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    fleet.record().await;
    fleet.publish().await;
    let message = fleet.network.take("u1").pop().unwrap();
    let replica = &mut fleet.unit("u1").replica;
    let first = replica.apply(&message).unwrap();
    assert!(matches!(
        first,
        magic_sync::replica::Outcome::Applied { .. }
    ));
    let before = replica_rows(replica, &Product::TABLE);
    let second = replica.apply(&message).unwrap();
    assert!(matches!(
        second,
        magic_sync::replica::Outcome::Duplicate { .. }
    ));
    assert_eq!(replica_rows(replica, &Product::TABLE), before);
    fleet.deliver().await;

    // Two changes; the first message to u1 is lost on the way.
    fleet
        .write("UPDATE products SET name = 'black tea' WHERE id = 1")
        .await;
    fleet.record().await;
    fleet.publish().await;
    let lost = fleet.network.take("u1");
    assert_eq!(lost.len(), 1);
    fleet
        .write("UPDATE products SET name = 'white tea' WHERE id = 1")
        .await;
    fleet.record().await;
    fleet.publish().await;
    let next = fleet.network.take("u1").pop().unwrap();
    let outcome = magic_sync::run::replica::deliver(&mut fleet.unit("u1").replica, &next).unwrap();
    let Some(magic_sync::run::Report::Gap(gap)) = outcome else {
        panic!("expected a gap, got {outcome:?}");
    };
    fleet
        .network
        .report("u1", magic_sync::run::Report::Gap(gap));
    fleet.heed().await;
    fleet.provisions("u1").await;
}

/// The last message to a till lost on the way opens no gap the till could
/// see: it stays in the outbox until acknowledged, and goes again once it
/// went unacknowledged for a while. Applied then, it costs no snapshot.
#[tokio::test]
async fn a_last_message_lost_on_the_way_is_sent_again() {
    let mut fleet = shop().await;
    fleet.per_replica().await;
    fleet
        .write("UPDATE products SET name = 'black tea' WHERE id = 1")
        .await;
    fleet.record().await;
    fleet.publish().await;
    assert_eq!(fleet.network.take("u1").len(), 1, "lost on the way");
    let before = fleet.provisionings;
    // Not yet: it may only be slow to be acknowledged.
    fleet.sync().await;
    assert_eq!(product_name(&fleet, "u1"), "tea");
    fleet
        .write("UPDATE sync.outbox SET sent_at = now() - interval '1 minute'")
        .await;
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(product_name(&fleet, "u1"), "black tea");
    assert_eq!(fleet.provisionings, before, "no snapshot");
    let outbox: i64 = fleet.count("SELECT count(*) FROM sync.outbox").await;
    assert_eq!(outbox, 0, "acknowledged, let go of");
}

/// A snapshot streams past the outbox, so one lost on the way shows no
/// gap. A till's first, lost whole, leaves it with nothing acknowledged at
/// all; one lost at its end leaves it acknowledging less than was sent.
/// Either way, once it has said nothing for a while after the snapshot
/// ended, it is provisioned again, and holds what it should.
#[tokio::test]
async fn a_snapshot_lost_on_the_way_whole_or_at_its_end_is_begun_again() {
    for whole in [true, false] {
        let mut fleet = shop().await;
        fleet.add("u9", Some("north"));
        assert_eq!(fleet.record().await.provisioned, vec!["u9".to_string()]);
        let mut sent = fleet.network.take("u9");
        assert!(sent.len() > 1, "{} messages", sent.len());
        if !whole {
            // All but its last message arrive.
            sent.pop();
            for message in sent {
                if let Some(report) =
                    magic_sync::run::replica::deliver(&mut fleet.unit("u9").replica, &message)
                        .unwrap()
                {
                    fleet.network.report("u9", report);
                }
            }
            fleet.heed().await;
        }
        let before = fleet.provisionings;
        // Not yet: it may only be slow to apply and say so.
        fleet.sync().await;
        assert_eq!(fleet.provisionings, before, "whole: {whole}");
        fleet
            .write(
                "UPDATE sync.replicas SET snapshot_ended_at = now() - interval '1 minute';
                 UPDATE sync.acks SET at = now() - interval '1 minute'",
            )
            .await;
        fleet.sync().await;
        assert_eq!(fleet.provisionings, before + 1, "whole: {whole}");
        fleet.check().await;
        let why: Option<String> = fleet
            .writer
            .query_one("SELECT last_error FROM sync.replicas WHERE id = 'u9'", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(why, None, "cleared once it was provisioned again");
    }
}

fn product_name(fleet: &Fleet, unit: &str) -> String {
    fleet.units[unit]
        .replica
        .connection()
        .query_row("SELECT name FROM products WHERE id = 1", [], |r| r.get(0))
        .unwrap()
}

/// A replica provisioned again at its own request is so at most once a
/// `provision_asked_every`: a gap reported again at once waits, and is
/// honoured once the interval has passed.
#[tokio::test]
async fn a_replica_asking_again_and_again_is_provisioned_once_an_interval() {
    let mut fleet = shop().await;
    let gap = |epoch: Vec<u8>| {
        magic_sync::run::Report::Gap(magic_sync::envelope::Gap {
            epoch,
            number: u64::MAX >> 2,
        })
    };
    let epoch: Vec<u8> = fleet
        .writer
        .query_one("SELECT id FROM sync.epoch", &[])
        .await
        .unwrap()
        .get(0);
    fleet.network.report("u1", gap(epoch.clone()));
    fleet.heed().await;
    fleet.provisions("u1").await;
    // At once again: it waits, and the others are served meanwhile.
    fleet.network.report("u1", gap(epoch.clone()));
    fleet.heed().await;
    let step = fleet.record().await;
    assert!(step.provisioned.is_empty(), "{:?}", step.provisioned);
    fleet
        .write("UPDATE products SET name = 'oolong' WHERE id = 1")
        .await;
    fleet.sync().await;
    let name: String = fleet
        .unit("u2")
        .replica
        .connection()
        .query_row("SELECT name FROM products WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    assert_eq!(name, "oolong");
    // The interval passes (the last snapshot it asked for began long ago).
    fleet
        .writer
        .execute(
            "UPDATE sync.replicas SET asked_at = now() - interval '1 hour' WHERE id = 'u1'",
            &[],
        )
        .await
        .unwrap();
    fleet.provisions("u1").await;
}

/// 13. A barcode moving from one product to another applies on a till that
/// keeps barcodes unique.
#[tokio::test]
async fn a_unique_value_moving_between_rows_applies_in_one_message() {
    let mut fleet = shop().await;
    // Every till of the fleet keeps barcodes unique, as the server does.
    fleet.settle("BEGIN; UPDATE products SET barcode = NULL WHERE id = 1; UPDATE products SET barcode = 'B1' WHERE id = 2; COMMIT;").await;
    for u in ["u1", "u2", "u3"] {
        assert!(
            fleet.unit(u).replica.refused().unwrap().is_empty(),
            "{u} refused nothing"
        );
    }
    // Product 2 goes, and a new product takes its barcode, in one transaction.
    fleet.settle("BEGIN; DELETE FROM promotions WHERE product_id = 2; DELETE FROM order_lines WHERE product_id = 2; DELETE FROM stock WHERE product_id = 2; DELETE FROM products WHERE id = 2; INSERT INTO products VALUES (4, 'oat milk', 2, 'B1'); COMMIT;").await;
    for u in ["u1", "u2", "u3"] {
        assert!(
            fleet.unit(u).replica.refused().unwrap().is_empty(),
            "{u} refused nothing"
        );
    }
}

/// 14. A till's own sale keeps the customer the server takes back: retired,
/// then purged once the sale is gone.
#[tokio::test]
async fn a_sale_keeps_its_customer_until_it_goes() {
    let mut fleet = shop().await;
    fleet
        .unit("u1")
        .replica
        .connection()
        .execute_batch("INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('s1', 'u1', 7, '9.50', 1)")
        .unwrap();
    fleet
        .settle("UPDATE orders SET customer_id = NULL WHERE id = 1")
        .await;
    let conn = fleet.unit("u1").replica.connection();
    let retired: Option<i64> = conn
        .query_row("SELECT retired FROM customers WHERE id = 7", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(retired.is_some(), "customer 7 is retired, not deleted");
    conn.execute_batch("DELETE FROM sales WHERE id = 's1'")
        .unwrap();
    assert_eq!(fleet.unit("u1").replica.purge().unwrap(), 1);
    let left: i64 = fleet
        .unit("u1")
        .replica
        .connection()
        .query_row("SELECT count(*) FROM customers", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0);
}

/// 15. A change every till gets is one stored body, under each till's head.
#[tokio::test]
async fn the_same_rows_for_many_tills_are_stored_once() {
    let mut fleet = shop().await;
    fleet.per_replica().await;
    fleet
        .write("UPDATE products SET price = 3 WHERE id = 1")
        .await;
    fleet.record().await;
    let row = fleet
        .client
        .query_one(
            "SELECT count(*), count(DISTINCT body), (SELECT count(*) FROM sync.bodies) FROM sync.outbox",
            &[],
        )
        .await
        .unwrap();
    let (messages, bodies, stored): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((messages, bodies, stored), (3, 1, 1));
    let first: i64 = fleet
        .client
        .query_one("SELECT id FROM sync.bodies", &[])
        .await
        .unwrap()
        .get(0);
    fleet.deliver().await;
    // The next pass that records clears the bodies no message carries.
    fleet
        .write("UPDATE products SET price = 4 WHERE id = 1")
        .await;
    fleet.record().await;
    let ids: Vec<i64> = fleet
        .client
        .query("SELECT id FROM sync.bodies", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids.len(), 1, "one body for the new change");
    assert_ne!(ids[0], first, "the delivered body is gone");
    fleet.deliver().await;
    fleet.check().await;
}

/// A till back after a while is provisioned over what it still holds: a
/// barcode that moved to another row meanwhile does not hold back the
/// snapshot (the stale row goes early instead of at the snapshot's end).
#[tokio::test]
async fn a_snapshot_over_stale_rows_moves_their_unique_values() {
    let mut fleet = shop().await;
    fleet.set_live("u1", false);
    fleet.sync().await;
    fleet
        .write("UPDATE products SET id = 100 WHERE id = 1")
        .await;
    fleet.write("BEGIN; UPDATE products SET barcode = NULL WHERE id = 2; UPDATE products SET barcode = 'B2' WHERE id = 3; COMMIT;").await;
    fleet.sync().await;
    fleet.set_live("u1", true);
    fleet.sync().await;
    fleet.check().await;
}
