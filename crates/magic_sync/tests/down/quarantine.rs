//! A row that cannot go down holds back only itself: it is set aside (in
//! quarantine), nothing that points at it is sent, a replica holding an
//! older version has it taken back with what points at it there, and every
//! other row goes on. It comes back by itself when it changes, or when a
//! build with a fixed codec starts. Each test ends with the fleet's check,
//! whose reference leaves out exactly the rows set aside and what leans on
//! them.

use crate::fleet::{replica_rows, Fleet};
use crate::scenarios::SHOP;
use crate::shop::{self, Customer, Order, OrderLine, Product, Promotion, Stock};
use magic_sync::ops::{self, Action, Concern, RowState, Scope};
use magic_sync::Row;
use std::collections::BTreeSet;

async fn buggy_shop() -> Fleet {
    buggy_shop_thinned(false).await
}

/// [`buggy_shop`], with the record of the rows a rule gives thinned when
/// `thinned` (`Settings::record_ruled_rows` off).
async fn buggy_shop_thinned(thinned: bool) -> Fleet {
    let mut fleet = Fleet::with_relay_engine(SHOP, shop::buggy_engine()).await;
    if thinned {
        // Each till holds the products itself, by their rule.
        fleet
            .reconfigure(|s| {
                s.record_ruled_rows = false;
                s.record_by_rule = false;
            })
            .await;
        // Reconfigured, the relay runs the fleet's engine: the buggy one
        // again.
        fleet.deploy(shop::buggy_engine()).await;
    }
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

/// What health says is set aside: (table, key, reason), each to be fixed.
async fn quarantined_in_health(fleet: &Fleet) -> Vec<(String, String, String, i64)> {
    let mut client = fleet.db.connect().await;
    let health = ops::health(&mut client, &Scope::All)
        .await
        .expect("health reads");
    health
        .items
        .iter()
        .filter_map(|item| match &item.concern {
            Concern::Quarantined {
                table,
                key,
                reason,
                blocked,
                ..
            } => {
                assert_eq!(item.action, Action::DeployFix);
                assert!(!health.healthy, "a row set aside waits for a fix");
                Some((table.clone(), key.clone(), reason.clone(), *blocked))
            }
            _ => None,
        })
        .collect()
}

/// A referenced row whose new version does not encode: every replica that
/// held it lets it go with the rows that point at it, the rest of the fleet
/// (and of those replicas) goes on, and it comes back once it changes.
#[tokio::test]
async fn a_row_that_does_not_encode_is_set_aside_with_what_points_at_it() {
    does_not_encode(false).await;
}

/// The same, every till holding its orders and the products by their rule
/// with no record row of them: what each holds by its rule alone, as the
/// record sums it, follows the rows held back and let go again (the
/// fleet's check compares the sums with the rule's rows).
#[tokio::test]
async fn a_row_that_does_not_encode_is_set_aside_from_holders_by_their_rule_too() {
    does_not_encode(true).await;
}

async fn does_not_encode(thinned: bool) {
    let mut fleet = buggy_shop_thinned(thinned).await;
    assert_eq!(keys(&mut fleet, "u2", &Customer::TABLE), set(&["[8]"]));
    fleet
        .settle(
            "UPDATE customers SET name = 'Bob (bug)' WHERE id = 8;
             INSERT INTO orders (id, unit_id, customer_id) VALUES (4, 'u2', 9), (5, 'u1', 8);
             INSERT INTO order_lines VALUES (4, 1, 1, 1), (5, 1, 1, 1);
             UPDATE products SET price = 3 WHERE id = 1;",
        )
        .await;
    assert_eq!(
        fleet.quarantined().await,
        BTreeSet::from([("customers".to_string(), "[8]".to_string())])
    );
    // Taken back from u2 with the order and line that point at it; what
    // else changed arrived.
    assert_eq!(keys(&mut fleet, "u2", &Customer::TABLE), set(&["[9]"]));
    assert_eq!(keys(&mut fleet, "u2", &Order::TABLE), set(&["[4]"]));
    assert_eq!(keys(&mut fleet, "u2", &OrderLine::TABLE), set(&["[4,1]"]));
    // u1's new order points at it: not sent, nor its line; the rest is.
    assert_eq!(keys(&mut fleet, "u1", &Order::TABLE), set(&["[1]", "[3]"]));
    let price = replica_rows(&fleet.unit("u3").replica, &Product::TABLE)["[1]"].clone();
    assert!(price.contains("3"), "{price}");
    let items = quarantined_in_health(&fleet).await;
    assert_eq!(items.len(), 1, "{items:?}");
    let (table, key, reason, blocked) = &items[0];
    assert_eq!((table.as_str(), key.as_str()), ("customers", "[8]"));
    assert!(reason.contains("a bug in this build's codec"), "{reason}");
    // Orders 2 and 5 and u2's line of order 2. (Order 5's line follows
    // an order u1 is not sent: no replica wants it, so nothing holds it
    // back.)
    assert_eq!(*blocked, 3);
    // Where the rows are, as an operator asks.
    let mut client = fleet.db.connect().await;
    let row = ops::row_progress(&mut client, "customers", &["8".into()])
        .await
        .unwrap();
    assert!(row.quarantined.as_deref().unwrap().contains("a bug"));
    assert!(row.waits_for_fix());
    let u2 = row.replicas.iter().find(|p| p.replica == "u2").unwrap();
    assert_eq!(u2.state, RowState::Quarantined);
    let order = ops::row_progress(&mut client, "orders", &["5".into()])
        .await
        .unwrap();
    let u1 = order.replicas.iter().find(|p| p.replica == "u1").unwrap();
    assert_eq!(
        (u1.state, u1.state.words()),
        (RowState::HeldBack, "held back")
    );
    let settled = ops::settled(&mut client, &Scope::All).await.unwrap();
    assert!(!settled.settled && settled.caught_up, "{settled:?}");
    assert_eq!(settled.quarantined, 1);
    let gauges = ops::gauges(&mut client, &Scope::All).await.unwrap();
    assert_eq!(gauges.quarantined, vec![("customers".to_string(), 1)]);
    assert_eq!(gauges.held_back, 3);

    // Changed again, it encodes: it and everything that leaned on it go.
    fleet
        .settle("UPDATE customers SET name = 'Bob' WHERE id = 8")
        .await;
    assert!(fleet.quarantined().await.is_empty());
    assert!(quarantined_in_health(&fleet).await.is_empty());
    assert!(
        ops::settled(&mut client, &Scope::All)
            .await
            .unwrap()
            .settled
    );
    assert_eq!(keys(&mut fleet, "u2", &Order::TABLE), set(&["[2]", "[4]"]));
    assert_eq!(
        keys(&mut fleet, "u1", &Order::TABLE),
        set(&["[1]", "[3]", "[5]"])
    );
    assert_eq!(
        keys(&mut fleet, "u1", &Customer::TABLE),
        set(&["[7]", "[8]"])
    );
}

/// A row held back through another (a line following an order that points
/// at a customer set aside) goes as soon as the row between them lets go of
/// the one set aside: the order re-pointed goes, and its line with it,
/// while the customer stays aside.
#[tokio::test]
async fn a_row_held_back_through_another_goes_once_that_one_lets_go() {
    let mut fleet = buggy_shop().await;
    fleet
        .settle("UPDATE customers SET name = 'Bob (bug)' WHERE id = 8")
        .await;
    assert!(keys(&mut fleet, "u2", &Order::TABLE).is_empty());
    assert!(keys(&mut fleet, "u2", &OrderLine::TABLE).is_empty());
    fleet
        .settle("UPDATE orders SET customer_id = 9 WHERE id = 2")
        .await;
    assert_eq!(
        fleet.quarantined().await,
        BTreeSet::from([("customers".to_string(), "[8]".to_string())])
    );
    assert_eq!(keys(&mut fleet, "u2", &Order::TABLE), set(&["[2]"]));
    assert_eq!(
        keys(&mut fleet, "u2", &OrderLine::TABLE),
        set(&["[2,1]"]),
        "the line goes with its order"
    );
    fleet.check().await;
    let items = quarantined_in_health(&fleet).await;
    assert_eq!(
        items[0].3, 0,
        "nothing leans on the customer now: {items:?}"
    );
}

/// A row of a table every replica holds, refused by a codec bug: taken back
/// everywhere with what points at it (through links the record does not
/// track), planned around by snapshots too, found by a snapshot first, and
/// let through by the next build once its codec is fixed.
#[tokio::test]
async fn a_codec_bug_sets_rows_aside_until_a_fixed_build_starts() {
    codec_bug(false).await;
}

/// The same with the record of the rows a rule gives thinned (and no
/// cohort): a product every till holds by the `all` rule, with no record
/// row, is taken back from every holder its rule gives it to, and a
/// till's stock of it, held by its rule alone, is found from its table and
/// held back with it.
#[tokio::test]
async fn a_codec_bug_sets_rows_aside_from_holders_by_their_rule_until_a_fixed_build_starts() {
    codec_bug(true).await;
}

async fn codec_bug(thinned: bool) {
    let mut fleet = buggy_shop_thinned(thinned).await;
    if thinned {
        let recorded = "SELECT count(*) FROM sync.held
                        WHERE table_name IN ('products', 'stock') AND ruled";
        assert_eq!(fleet.count(recorded).await, 0, "left to their rule");
    }
    fleet
        .settle("UPDATE products SET name = 'milk (bug)' WHERE id = 2")
        .await;
    assert_eq!(
        fleet.quarantined().await,
        BTreeSet::from([("products".to_string(), "[2]".to_string())])
    );
    for unit in ["u1", "u2", "u3"] {
        assert_eq!(
            keys(&mut fleet, unit, &Product::TABLE),
            set(&["[1]", "[3]"]),
            "{unit}"
        );
    }
    // What points at it went with it: u1's line of milk, u2's promotion
    // and stock of it.
    assert_eq!(keys(&mut fleet, "u1", &OrderLine::TABLE), set(&["[1,1]"]));
    assert!(keys(&mut fleet, "u2", &Promotion::TABLE).is_empty());
    assert!(keys(&mut fleet, "u2", &Stock::TABLE).is_empty());

    // A replica provisioned meanwhile is planned around it.
    fleet.add("u4", Some("north"));
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(
        keys(&mut fleet, "u4", &Product::TABLE),
        set(&["[1]", "[3]"])
    );

    // A snapshot that meets such a row before any pass does sets it aside
    // and is begun again around it.
    fleet.add("u5", Some("south"));
    let step = fleet.pass().await;
    assert_eq!(step.waiting, vec!["u5".to_string()]);
    fleet
        .write("INSERT INTO products VALUES (4, 'jam (bug)', 4, NULL)")
        .await;
    assert_eq!(fleet.snapshot("u5").await, None, "it met the row");
    assert!(fleet
        .quarantined()
        .await
        .contains(&("products".to_string(), "[4]".to_string())));
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(
        keys(&mut fleet, "u5", &Product::TABLE),
        set(&["[1]", "[3]"])
    );
    assert_eq!(quarantined_in_health(&fleet).await.len(), 2);

    // The same build started again (it crashed, or was restarted) tries
    // them again, meets the bug again and keeps them aside; nothing else
    // waits for them.
    fleet.deploy(shop::buggy_engine()).await;
    fleet
        .settle("UPDATE products SET price = 9 WHERE id = 1")
        .await;
    assert_eq!(quarantined_in_health(&fleet).await.len(), 2);

    // The fix is deployed: a build whose codec sends them starts.
    fleet.deploy(shop::engine()).await;
    fleet.sync().await;
    fleet.check().await;
    assert!(fleet.quarantined().await.is_empty());
    for unit in ["u1", "u2", "u3", "u4", "u5"] {
        assert_eq!(
            keys(&mut fleet, unit, &Product::TABLE),
            set(&["[1]", "[2]", "[3]", "[4]"]),
            "{unit}"
        );
    }
    assert_eq!(
        keys(&mut fleet, "u1", &OrderLine::TABLE),
        set(&["[1,1]", "[1,2]"])
    );
    assert_eq!(keys(&mut fleet, "u2", &Promotion::TABLE), set(&["[11]"]));
}

/// A row grown larger than any message is set aside like one that does not
/// encode, and goes again once it shrinks.
#[tokio::test]
async fn a_row_too_large_for_any_message_waits_until_it_shrinks() {
    let mut fleet = buggy_shop().await;
    let long = "x".repeat(crate::fleet::MAX_MESSAGE * 2);
    fleet
        .settle(&format!(
            "UPDATE customers SET name = '{long}' WHERE id = 7;
             UPDATE customers SET name = 'Bo' WHERE id = 8;"
        ))
        .await;
    let items = quarantined_in_health(&fleet).await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert!(
        items[0].2.contains("more than a message may carry"),
        "{}",
        items[0].2
    );
    assert!(keys(&mut fleet, "u1", &Customer::TABLE).is_empty());
    assert_eq!(keys(&mut fleet, "u1", &Order::TABLE), set(&["[3]"]));
    let bo = replica_rows(&fleet.unit("u2").replica, &Customer::TABLE)["[8]"].clone();
    assert!(bo.contains("Bo"), "the other change went: {bo}");
    fleet
        .settle("UPDATE customers SET name = 'Ada' WHERE id = 7")
        .await;
    assert!(fleet.quarantined().await.is_empty());
    assert_eq!(keys(&mut fleet, "u1", &Order::TABLE), set(&["[1]", "[3]"]));
}

/// A note the planner cannot plan (its key no longer fits the table, as
/// one a trigger wrote before the key's type changed would not, or the
/// parents it names do not) is parked: every other change goes on, health
/// and `settled` say so, and a relay starting tries it again.
#[tokio::test]
async fn a_note_the_planner_cannot_plan_is_parked_and_holds_back_nothing_else() {
    let mut fleet = crate::scenarios::shop().await;
    fleet
        .settle(
            "INSERT INTO sync.notes (table_name, source, key)
                 VALUES ('products', 'products', '[\"P-1\"]');
             INSERT INTO sync.notes (table_name, source, key, parents)
                 VALUES ('orders', 'orders', '[1]', '{\"customer_id\": \"seven\"}');
             UPDATE products SET name = 'green tea' WHERE id = 1;",
        )
        .await;
    let count = parked_notes(&fleet).await;
    assert_eq!(count, 2);
    let mut client = fleet.db.connect().await;
    let health = ops::health(&mut client, &Scope::All).await.unwrap();
    let items: Vec<(String, i64)> = health
        .items
        .iter()
        .filter_map(|item| match &item.concern {
            Concern::Parked { table, notes, .. } => {
                assert_eq!(item.action, Action::DeployFix);
                Some((table.clone(), *notes))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        items,
        [("orders".to_string(), 1), ("products".to_string(), 1)]
    );
    let settled = ops::settled(&mut client, &Scope::All).await.unwrap();
    assert!(!settled.settled);
    assert_eq!(settled.parked, 2);
    assert!(
        settled.says.contains("cannot be planned"),
        "{}",
        settled.says
    );
    // A relay starting tries them again; still unplannable, they are
    // parked again, and nothing else waits for them.
    fleet.deploy(shop::engine()).await;
    fleet
        .settle("UPDATE products SET price = 9 WHERE id = 1")
        .await;
    assert_eq!(parked_notes(&fleet).await, 2);
}

async fn parked_notes(fleet: &Fleet) -> i64 {
    fleet.count("SELECT count(*) FROM sync.parked").await
}
