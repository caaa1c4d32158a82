//! Snapshots beside the passes: a till provisioned on a connection of its
//! own while the passes keep every other till up; what its snapshot does
//! not see reaches it after, and what it sees is not sent twice; a snapshot
//! that fails, or whose till moves, is begun again and ends exact.
//!
//! Each test holds the snapshot still at a chosen message ([`Gate`]) to do
//! something in the middle of it: conditions, never timings.

use crate::fleet::{replica_rows, Fleet};
use crate::gate::Gate;
use crate::scenarios::{shop, SHOP};
use crate::shop::{Customer, Order, Product};
use magic_sync::relay::{SnapshotPace, Streamed};
use magic_sync::Row;
use std::future::Future;

/// The shop with u4, a till new in the north, waiting for its snapshot.
async fn u4_waiting() -> Fleet {
    let mut fleet = shop().await;
    fleet.add("u4", Some("north"));
    let pass = fleet.pass().await;
    assert_eq!(pass.waiting, ["u4"]);
    fleet
}

/// Runs `streaming` until its gate holds a send, then `meanwhile`, then
/// opens the gate and finishes it.
async fn in_the_middle<S, M>(gate: &Gate, streaming: S, meanwhile: M) -> S::Output
where
    S: Future,
    M: Future<Output = ()>,
{
    tokio::pin!(streaming);
    tokio::select! {
        () = gate.reached() => {}
        _ = &mut streaming => panic!("the snapshot ended before its gate"),
    }
    meanwhile.await;
    gate.open();
    streaming.await
}

/// Adds `id` (of `partition`) to the fleet and streams its snapshot by its
/// queries in closed form, on a connection of its own: its rows those of
/// its plan, recorded. Then the fleet is synced and checked.
async fn streams_in_closed_form(fleet: &mut Fleet, id: &str, partition: Option<&str>) -> Streamed {
    fleet.add(id, partition);
    let pass = fleet.pass().await;
    assert_eq!(pass.waiting, [id]);
    let snapshot = fleet.begin_snapshot(id).await.expect("it waits");
    let mut worker = fleet.db.connect().await;
    let streamed = snapshot
        .stream(&mut worker, &fleet.network)
        .await
        .expect("the snapshot streams, its rows those of its plan");
    assert!(!streamed.planned_first, "{streamed:?}");
    assert!(streamed.recorded, "{streamed:?}");
    fleet.sync().await;
    fleet.check().await;
    streamed
}

fn keys(fleet: &mut Fleet, unit: &str, table: &magic_sync::Table) -> Vec<String> {
    replica_rows(&fleet.unit(unit).replica, table)
        .into_keys()
        .collect()
}

#[tokio::test]
async fn the_other_tills_are_kept_up_while_a_snapshot_streams() {
    let mut fleet = u4_waiting().await;
    let snapshot = fleet.begin_snapshot("u4").await.expect("u4 waits");
    let gate = Gate::new(&fleet.network, "u4", 0);
    let mut worker = fleet.db.connect().await;
    let network = fleet.network.clone();
    let streamed = {
        let streaming = snapshot.stream(&mut worker, &gate);
        tokio::pin!(streaming);
        tokio::select! {
            () = gate.reached() => {}
            _ = &mut streaming => panic!("the snapshot ended before its gate"),
        }
        // The snapshot stands still, its view taken; a pass completes for
        // every other till, and they apply what it sent.
        fleet
            .write("UPDATE products SET name = 'green tea' WHERE id = 1")
            .await;
        let pass = fleet.pass().await;
        assert_eq!(pass.streaming, ["u4"]);
        assert_eq!(
            written(&pass),
            ["u1", "u2", "u3"],
            "u1, u2 and u3 hold product 1"
        );
        fleet.deliver().await;
        for unit in ["u1", "u2", "u3"] {
            let name = replica_rows(&fleet.unit(unit).replica, &Product::TABLE)["[1]"].clone();
            assert!(name.contains("green tea"), "{unit}: {name}");
        }
        assert!(network.take("u4").is_empty(), "nothing of the pass for u4");
        gate.open();
        streaming.await.expect("the snapshot streams")
    };
    assert!(streamed.recorded, "{streamed:?}");
    // The change the snapshot did not see follows it.
    fleet.sync().await;
    fleet.check().await;
    let name = replica_rows(&fleet.unit("u4").replica, &Product::TABLE)["[1]"].clone();
    assert!(name.contains("green tea"), "{name}");
}

#[tokio::test]
async fn a_transaction_open_when_a_snapshot_began_and_committed_during_it_follows_it() {
    let mut fleet = u4_waiting().await;
    // Opened before the snapshot takes its view, committed while it streams.
    let other = fleet.db.connect().await;
    other
        .batch_execute(
            "BEGIN;
             INSERT INTO orders (id, unit_id, customer_id, placed_at)
                 VALUES (50, 'u4', 9, '2026-11-30 11:00:00+00');
             UPDATE customers SET name = 'Cy Young' WHERE id = 9;",
        )
        .await
        .unwrap();
    let snapshot = fleet.begin_snapshot("u4").await.expect("u4 waits");
    let gate = Gate::new(&fleet.network, "u4", 0);
    let mut worker = fleet.db.connect().await;
    let streamed: Streamed = in_the_middle(&gate, snapshot.stream(&mut worker, &gate), async {
        other.batch_execute("COMMIT").await.unwrap();
        // A pass plans the transaction's notes, for the others, while u4's
        // snapshot streams.
        let pass = fleet.pass().await;
        assert!(pass.planned.notes > 0, "{:?}", pass.planned);
    })
    .await
    .expect("the snapshot streams");
    assert!(streamed.recorded);
    // The snapshot alone: it did not see the order.
    for message in fleet.network.take("u4") {
        magic_sync::run::replica::deliver(&mut fleet.unit("u4").replica, &message).unwrap();
    }
    assert!(!keys(&mut fleet, "u4", &Order::TABLE).contains(&"[50]".to_string()));
    fleet.check_orphans();
    // The next pass brings it, with its customer as it is now.
    fleet.sync().await;
    fleet.check().await;
    assert!(keys(&mut fleet, "u4", &Order::TABLE).contains(&"[50]".to_string()));
    let cy = replica_rows(&fleet.unit("u4").replica, &Customer::TABLE)["[9]"].clone();
    assert!(cy.contains("Cy Young"), "{cy}");
}

#[tokio::test]
async fn what_a_snapshot_saw_is_not_sent_again() {
    let mut fleet = u4_waiting().await;
    let snapshot = fleet.begin_snapshot("u4").await.expect("u4 waits");
    // Committed after the snapshot began, and planned for the others by a
    // pass before the snapshot takes its view: the pass keeps the change for
    // u4, and the snapshot sees it.
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    let pass = fleet.pass().await;
    assert_eq!(
        written(&pass),
        ["u1", "u2", "u3"],
        "the others get it: {:?}",
        pass.planned
    );
    let mut worker = fleet.db.connect().await;
    let streamed = snapshot
        .stream(&mut worker, &fleet.network)
        .await
        .expect("the snapshot streams");
    assert!(streamed.recorded);
    fleet.deliver().await;
    // The change kept for u4 is one its snapshot saw: the next pass sends
    // it nothing, and lets the kept change go.
    let after = fleet.pass().await;
    assert_eq!(after.planned.sends, 0, "{:?}", after.planned);
    let kept: i64 = fleet
        .client
        .query_one("SELECT count(*) FROM sync.deferred", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 0);
    fleet.sync().await;
    fleet.check().await;
}

/// The shop with many products, so a snapshot spans many messages; u4
/// waiting for its snapshot.
async fn many_products() -> Fleet {
    let mut fleet = Fleet::new(&format!(
        "{SHOP}
         INSERT INTO products SELECT i, 'product ' || i, 1, NULL FROM generate_series(100, 400) i;"
    ))
    .await;
    fleet.add("u1", Some("north"));
    fleet.sync().await;
    fleet.add("u4", Some("north"));
    assert_eq!(fleet.pass().await.waiting, ["u4"]);
    fleet
}

#[tokio::test]
async fn a_relay_gone_in_the_middle_of_a_snapshot_begins_it_again_and_the_till_ends_exact() {
    let mut fleet = many_products().await;
    let snapshot = fleet.begin_snapshot("u4").await.expect("u4 waits");
    let gate = Gate::new(&fleet.network, "u4", 3);
    let mut worker = fleet.db.connect().await;
    {
        let streaming = snapshot.stream(&mut worker, &gate);
        tokio::pin!(streaming);
        tokio::select! {
            () = gate.reached() => {}
            _ = &mut streaming => panic!("the snapshot ended before its gate"),
        }
        // The worker dies here, three messages sent.
    }
    drop(worker);
    for message in fleet.network.take("u4") {
        magic_sync::run::replica::deliver(&mut fleet.unit("u4").replica, &message).unwrap();
    }
    assert!(
        !keys(&mut fleet, "u4", &Product::TABLE).is_empty(),
        "a part arrived"
    );
    // Rows the first attempt sent go meanwhile: the second does not name them.
    fleet
        .write("DELETE FROM products WHERE id BETWEEN 100 AND 150")
        .await;
    // A relay starts: its first pass ends the attempt nobody streams, and
    // the snapshot begins again, whole.
    fleet.reconfigure(|_| {}).await;
    let step = fleet.record().await;
    assert_eq!(step.provisioned, ["u4"]);
    fleet.deliver().await;
    fleet.sync().await;
    fleet.check().await;
}

#[tokio::test]
async fn a_send_that_fails_in_the_middle_of_a_snapshot_begins_it_again_once_the_till_is_back() {
    let mut fleet = many_products().await;
    let snapshot = fleet.begin_snapshot("u4").await.expect("u4 waits");
    let gate = Gate::new(&fleet.network, "u4", 2);
    let mut worker = fleet.db.connect().await;
    let network = fleet.network.clone();
    let failed = in_the_middle(&gate, snapshot.stream(&mut worker, &gate), async {
        network.cut("u4", true);
    })
    .await
    .expect_err("the send fails");
    assert!(failed.is_transient(), "{failed}");
    let (waiting, why): (bool, Option<String>) = {
        let row = fleet
            .client
            .query_one(
                "SELECT provision AND snapshot_attempt IS NULL, last_error FROM sync.replicas WHERE id = 'u4'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(waiting, "u4 waits for another snapshot");
    assert!(why.unwrap_or_default().contains("out of reach"));
    fleet.cut("u4", true);
    fleet
        .write("UPDATE products SET name = 'tea' WHERE id = 200")
        .await;
    fleet.sync().await;
    fleet.check().await;
    fleet.cut("u4", false);
    fleet.sync().await;
    fleet.check().await;
}

#[tokio::test]
async fn two_snapshots_stream_at_once() {
    let mut fleet = shop().await;
    fleet.add("u4", Some("north"));
    fleet.add("u5", Some("south"));
    let pass = fleet.pass().await;
    assert_eq!(pass.waiting, ["u4", "u5"]);
    let north = fleet.begin_snapshot("u4").await.expect("u4 waits");
    let south = fleet.begin_snapshot("u5").await.expect("u5 waits");
    let (gate4, gate5) = (
        Gate::new(&fleet.network, "u4", 0),
        Gate::new(&fleet.network, "u5", 0),
    );
    let (mut w4, mut w5) = (fleet.db.connect().await, fleet.db.connect().await);
    let s4 = north.stream(&mut w4, &gate4);
    let s5 = south.stream(&mut w5, &gate5);
    tokio::pin!(s4, s5);
    tokio::select! {
        () = async { tokio::join!(gate4.reached(), gate5.reached()); } => {}
        _ = &mut s4 => panic!("u4's snapshot ended before its gate"),
        _ = &mut s5 => panic!("u5's snapshot ended before its gate"),
    }
    fleet
        .write(
            "INSERT INTO notices VALUES (9, 'south', 'market moved');
             INSERT INTO orders (id, unit_id, customer_id) VALUES (60, 'u4', 8);",
        )
        .await;
    let pass = fleet.pass().await;
    assert_eq!(pass.streaming, ["u4", "u5"]);
    gate4.open();
    gate5.open();
    let (r4, r5) = tokio::join!(s4, s5);
    assert!(r4.expect("u4's snapshot").recorded && r5.expect("u5's snapshot").recorded);
    fleet.sync().await;
    fleet.check().await;
}

#[tokio::test]
async fn a_till_that_moves_while_its_snapshot_streams_gets_the_snapshot_of_where_it_went() {
    let mut fleet = u4_waiting().await;
    let snapshot = fleet.begin_snapshot("u4").await.expect("u4 waits");
    let gate = Gate::new(&fleet.network, "u4", 0);
    let mut worker = fleet.db.connect().await;
    let streaming = snapshot.stream(&mut worker, &gate);
    tokio::pin!(streaming);
    tokio::select! {
        () = gate.reached() => {}
        _ = &mut streaming => panic!("the snapshot ended before its gate"),
    }
    fleet.move_to("u4", Some("south"));
    let pass = fleet.pass().await;
    assert_eq!(pass.waiting, ["u4"], "observed moving: it waits again");
    gate.open();
    let streamed = streaming.await.expect("the stream itself goes through");
    assert!(
        !streamed.recorded,
        "its attempt was ended: nothing recorded"
    );
    fleet.sync().await;
    fleet.check().await;
    let notices = keys(&mut fleet, "u4", &crate::shop::Notice::TABLE);
    assert_eq!(notices, ["[2]"], "the south's notice, not the north's");
}

#[tokio::test]
async fn a_snapshot_held_to_a_budget_of_rows_takes_as_long_as_it_says_and_ends_exact() {
    let mut fleet = many_products().await;
    // 1,000 rows a second: the record goes in chunks of 100 rows, so the
    // shop's products span several.
    let budget = 1_000;
    fleet
        .reconfigure(|s| {
            s.snapshot_pace = SnapshotPace::Rows(budget.try_into().unwrap());
        })
        .await;
    let snapshot = fleet.begin_snapshot("u4").await.expect("u4 waits");
    let mut worker = fleet.db.connect().await;
    let began = std::time::Instant::now();
    let streamed = snapshot
        .stream(&mut worker, &fleet.network)
        .await
        .expect("the snapshot streams");
    let took = began.elapsed();
    assert!(streamed.recorded, "{streamed:?}");
    assert!(streamed.rows > 300, "{streamed:?}");
    // Each row counted against the budget once read, and once recorded
    // where the record keeps the rows a rule gives (thinned, a row its
    // rule gives has no record row to write).
    let counted = match fleet.relay.settings().record_ruled_rows {
        true => 2.0,
        false => 1.0,
    };
    let least = std::time::Duration::from_secs_f64(counted * streamed.rows as f64 / budget as f64);
    assert!(
        took >= least.mul_f64(0.9),
        "{} rows at {budget} a second took {took:?}",
        streamed.rows
    );
    // What it recorded, chunk by chunk, is the record the audit works out
    // afresh: every row, its reasons and what points at it.
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(
        keys(&mut fleet, "u4", &Product::TABLE).len(),
        keys(&mut fleet, "u1", &Product::TABLE).len()
    );
}

/// A snapshot streams its rows as it reads them, nothing planned first,
/// even where tables lean on one another in a cycle: a north shipment
/// whose parent ships in the south brings that shipment and its southern
/// event (a follower's parent), and the event brings every shipment that
/// follows it. What it recorded is what it sent.
#[tokio::test]
async fn a_snapshot_streams_before_anything_is_planned_even_through_a_cycle() {
    let mut fleet = shop().await;
    fleet
        .write("INSERT INTO logistics.shipments VALUES (4, 'north', 1, 3), (5, 'south', 2, NULL)")
        .await;
    fleet.sync().await;
    streams_in_closed_form(&mut fleet, "u4", Some("north")).await;
    assert_eq!(
        keys(&mut fleet, "u4", &crate::shop::Shipment::TABLE),
        ["[1]", "[2]", "[3]", "[4]", "[5]"]
    );
    assert_eq!(
        keys(&mut fleet, "u4", &crate::shop::Event::TABLE),
        [r#"["north",1]"#, r#"["south",2]"#]
    );
}

/// A snapshot that meets a row it cannot send while it streams sets it
/// aside; the next one plans first, around it, and ends exact.
#[tokio::test]
async fn a_snapshot_that_meets_a_row_it_cannot_send_is_begun_again_planned_around_it() {
    let mut fleet = Fleet::with_relay_engine(SHOP, crate::shop::buggy_engine()).await;
    fleet.add("u1", Some("north"));
    fleet.sync().await;
    fleet.check().await;
    fleet.add("u4", Some("north"));
    let pass = fleet.pass().await;
    assert_eq!(pass.waiting, ["u4"]);
    fleet
        .write("INSERT INTO products VALUES (4, 'jam (bug)', 4, NULL)")
        .await;
    let snapshot = fleet.begin_snapshot("u4").await.expect("u4 waits");
    let mut worker = fleet.db.connect().await;
    let failed = snapshot
        .stream(&mut worker, &fleet.network)
        .await
        .expect_err("it meets the row");
    assert!(
        matches!(failed.source, magic_sync::Error::Unsendable(_)),
        "{failed}"
    );
    assert!(fleet
        .quarantined()
        .await
        .contains(&("products".to_string(), "[4]".to_string())));
    let pass = fleet.pass().await;
    assert_eq!(pass.waiting, ["u4"], "it waits for another");
    let snapshot = fleet.begin_snapshot("u4").await.expect("u4 waits");
    let streamed = snapshot
        .stream(&mut worker, &fleet.network)
        .await
        .expect("the snapshot streams");
    assert!(streamed.planned_first, "a row is set aside: {streamed:?}");
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(
        keys(&mut fleet, "u4", &Product::TABLE),
        keys(&mut fleet, "u1", &Product::TABLE)
    );
    assert!(!keys(&mut fleet, "u4", &Product::TABLE).contains(&"[4]".to_string()));
}

/// A deep graph of referenced tables over members who point at one
/// another (each unit's members, and whoever referred them, wherever they
/// are), their loans, the fines on those, and a unit's reviews of any
/// loan: countries ← cities ← addresses ← members ⇄ loans ← fines, items ←
/// loans ← reviews.
mod deep {
    use magic_sync::{Engine, Row};

    #[derive(Row, Debug, Clone)]
    #[row(table = "countries", down, referenced, key(id))]
    pub struct Country {
        id: i64,
        name: String,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "cities", down, referenced, key(id))]
    pub struct City {
        id: i64,
        name: String,
        country_id: i64,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "addresses", down, referenced, key(id))]
    pub struct Address {
        id: i64,
        street: String,
        city_id: i64,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "members", down, replica = "unit", key(id))]
    pub struct Member {
        id: i64,
        unit: String,
        address_id: i64,
        referrer_id: Option<i64>,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "items", down, referenced, key(id))]
    pub struct Item {
        id: i64,
        title: String,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "loans", down, follows = "member_id", key(id))]
    pub struct Loan {
        id: i64,
        member_id: i64,
        item_id: i64,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "fines", down, follows = "loan_id", key(id))]
    pub struct Fine {
        id: i64,
        loan_id: i64,
        amount: i32,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "reviews", down, replica = "unit", key(id))]
    pub struct Review {
        id: i64,
        unit: String,
        loan_id: i64,
        stars: i32,
    }

    pub fn engine() -> Engine {
        Engine::builder()
            .table::<Country>()
            .table::<City>()
            .table::<Address>()
            .table::<Member>()
            .table::<Item>()
            .table::<Loan>()
            .table::<Fine>()
            .table::<Review>()
            .build()
            .unwrap()
    }

    /// u1's members 1 to 3 share addresses, which share a city; member 3
    /// was referred by u2's member 4, referred in turn by u3's member 5,
    /// each elsewhere. u1 reviewed loan 53, of u2's member 6. Member 7, loan
    /// 54, its item, city 14 and country 4 are no business of u1's.
    pub const SCHEMA: &str = "
        CREATE TABLE countries (id bigint PRIMARY KEY, name text NOT NULL);
        CREATE TABLE cities (id bigint PRIMARY KEY, name text NOT NULL,
                             country_id bigint NOT NULL REFERENCES countries);
        CREATE TABLE addresses (id bigint PRIMARY KEY, street text NOT NULL,
                                city_id bigint NOT NULL REFERENCES cities);
        CREATE TABLE members (id bigint PRIMARY KEY, unit text NOT NULL,
                              address_id bigint NOT NULL REFERENCES addresses,
                              referrer_id bigint REFERENCES members);
        CREATE TABLE items (id bigint PRIMARY KEY, title text NOT NULL);
        CREATE TABLE loans (id bigint PRIMARY KEY, member_id bigint NOT NULL REFERENCES members,
                            item_id bigint NOT NULL REFERENCES items);
        CREATE TABLE fines (id bigint PRIMARY KEY, loan_id bigint NOT NULL REFERENCES loans,
                            amount integer NOT NULL);
        CREATE TABLE reviews (id bigint PRIMARY KEY, unit text NOT NULL,
                              loan_id bigint NOT NULL REFERENCES loans, stars integer NOT NULL);
        CREATE INDEX ON loans (member_id);
        CREATE INDEX ON fines (loan_id);
        INSERT INTO countries VALUES (1, 'north'), (2, 'south'), (3, 'east'), (4, 'west');
        INSERT INTO cities VALUES (10, 'ayr', 1), (11, 'brae', 1), (12, 'cove', 2),
                                  (13, 'dale', 3), (14, 'ely', 4);
        INSERT INTO addresses VALUES (100, '1 high st', 10), (101, '2 high st', 10),
                                     (102, '3 low rd', 11), (103, '4 quay', 12),
                                     (104, '5 moor', 13), (105, '6 fen', 14);
        INSERT INTO members VALUES (5, 'u3', 104, NULL), (4, 'u2', 103, 5), (1, 'u1', 100, NULL),
                                   (2, 'u1', 100, 1), (3, 'u1', 101, 4), (6, 'u2', 102, NULL),
                                   (7, 'u3', 105, NULL);
        INSERT INTO items VALUES (1000, 'atlas'), (1001, 'bible'), (1002, 'canon'), (1003, 'diary');
        INSERT INTO loans VALUES (50, 1, 1000), (51, 2, 1000), (52, 4, 1001), (53, 6, 1002),
                                 (54, 7, 1003);
        INSERT INTO fines VALUES (500, 50, 2), (501, 52, 3), (502, 53, 4);
        INSERT INTO reviews VALUES (900, 'u1', 53, 5), (901, 'u2', 54, 1);";
}

/// A fresh replica's snapshot over a deep graph, its referenced tables
/// shared by several children and its members pointing at one another,
/// streams exactly the rows its plan holds: what the tables above read of
/// those below is worked out once, and nothing is lost or doubled by it.
#[tokio::test]
async fn a_snapshot_over_a_deep_graph_of_referenced_tables_holds_exactly_its_plan() {
    let mut fleet = Fleet::of(deep::SCHEMA, deep::engine()).await;
    fleet.add("u2", None);
    fleet.add("u3", None);
    fleet.sync().await;
    let streamed = streams_in_closed_form(&mut fleet, "u1", None).await;
    let held = |fleet: &mut Fleet, table: &magic_sync::Table| keys(fleet, "u1", table);
    assert_eq!(
        held(&mut fleet, &deep::Country::TABLE),
        ["[1]", "[2]", "[3]"]
    );
    assert_eq!(
        held(&mut fleet, &deep::City::TABLE),
        ["[10]", "[11]", "[12]", "[13]"]
    );
    assert_eq!(
        held(&mut fleet, &deep::Address::TABLE),
        ["[100]", "[101]", "[102]", "[103]", "[104]"]
    );
    assert_eq!(
        held(&mut fleet, &deep::Member::TABLE),
        ["[1]", "[2]", "[3]", "[4]", "[5]", "[6]"]
    );
    assert_eq!(
        held(&mut fleet, &deep::Loan::TABLE),
        ["[50]", "[51]", "[52]", "[53]"]
    );
    assert_eq!(
        held(&mut fleet, &deep::Item::TABLE),
        ["[1000]", "[1001]", "[1002]"]
    );
    assert_eq!(
        held(&mut fleet, &deep::Fine::TABLE),
        ["[500]", "[501]", "[502]"]
    );
    assert_eq!(held(&mut fleet, &deep::Review::TABLE), ["[900]"]);
    let engine = fleet.engine.clone();
    let total: usize = engine
        .down_tables()
        .map(|t| keys(&mut fleet, "u1", t).len())
        .sum();
    assert_eq!(streamed.rows, total as u64, "{streamed:?}");
}

/// The replicas a pass wrote to, in order.
fn written(pass: &magic_sync::relay::Recorded) -> Vec<String> {
    let mut written: Vec<String> = pass.written.iter().map(|(r, _)| r.to_string()).collect();
    written.sort();
    written
}

/// A bank by branch, as pgbench has it: branches, tellers, accounts and
/// their history, each by the partition its branch is; history points at
/// accounts and tellers of other branches too. Accounts and tellers hold
/// their branch's number, so every account a branch has by its rule
/// points at that branch; only the others' accounts a branch's history
/// touches bring their branches.
mod bank {
    use magic_sync::{Engine, Row};

    #[derive(Row, Debug, Clone)]
    #[row(table = "branches", down, partition = "bid", key(bid))]
    pub struct Branch {
        bid: i32,
        name: String,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "tellers", down, partition = "bid", key(tid))]
    pub struct Teller {
        tid: i32,
        bid: i32,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "accounts", down, partition = "bid", key(aid))]
    pub struct Account {
        aid: i64,
        bid: i32,
        balance: i64,
    }

    /// An account's statements go wherever it does.
    #[derive(Row, Debug, Clone)]
    #[row(table = "statements", down, follows = "aid", key(sid))]
    pub struct Statement {
        sid: i64,
        aid: i64,
    }

    /// A card may replace a card of another branch: the cards are found
    /// by a recursion over them.
    #[derive(Row, Debug, Clone)]
    #[row(table = "cards", down, partition = "bid", key(cid))]
    pub struct Card {
        cid: i64,
        bid: i32,
        replaces: Option<i64>,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "history", down, partition = "bid", key(hid))]
    pub struct History {
        hid: i64,
        bid: i32,
        tid: i32,
        aid: i64,
        delta: i64,
    }

    pub fn engine() -> Engine {
        Engine::builder()
            .table::<Branch>()
            .table::<Teller>()
            .table::<Account>()
            .table::<Statement>()
            .table::<Card>()
            .table::<History>()
            .build()
            .unwrap()
    }

    /// Branch 1's history touches account 21 and teller 22 of branch 2.
    /// Branch 3's history touches account 11 of branch 1. Branch 2's card
    /// replaces one of branch 3's. No foreign key has an index, as in
    /// pgbench, but the one statements follow.
    pub const SCHEMA: &str = "
        CREATE TABLE branches (bid integer PRIMARY KEY, name text NOT NULL);
        CREATE TABLE tellers (tid integer PRIMARY KEY, bid integer NOT NULL REFERENCES branches);
        CREATE TABLE accounts (aid bigint PRIMARY KEY, bid integer NOT NULL REFERENCES branches,
                               balance bigint NOT NULL);
        CREATE TABLE statements (sid bigint PRIMARY KEY, aid bigint NOT NULL REFERENCES accounts);
        CREATE INDEX ON statements (aid);
        CREATE TABLE cards (cid bigint PRIMARY KEY, bid integer NOT NULL REFERENCES branches,
                            replaces bigint REFERENCES cards);
        CREATE TABLE history (hid bigint PRIMARY KEY, bid integer NOT NULL REFERENCES branches,
                              tid integer NOT NULL REFERENCES tellers,
                              aid bigint NOT NULL REFERENCES accounts, delta bigint NOT NULL);
        INSERT INTO branches VALUES (1, 'one'), (2, 'two'), (3, 'three');
        INSERT INTO tellers VALUES (11, 1), (12, 1), (21, 2), (22, 2), (31, 3);
        INSERT INTO accounts VALUES (11, 1, 0), (12, 1, 0), (21, 2, 0), (22, 2, 0), (31, 3, 0);
        INSERT INTO statements VALUES (110, 11), (210, 21), (220, 22);
        INSERT INTO cards VALUES (30, 3, NULL), (20, 2, 30);
        INSERT INTO history VALUES (1, 1, 11, 12, 5), (2, 1, 22, 21, 7), (3, 3, 31, 11, 1);";
}

/// A branch's snapshot by queries in closed form, where the partition of
/// accounts, tellers and cards implies their branch's: its own rows are
/// not read again for their branch, and it still holds exactly its set,
/// the other branches its history and its cards reach included, whether
/// the child's query is named in place (tellers), kept (accounts) or a
/// recursion (cards). The passes after it keep it exact as accounts move
/// between branches and history reaches further.
#[tokio::test]
async fn a_branch_holds_the_branches_its_history_reaches_and_no_more() {
    let mut fleet = Fleet::of(bank::SCHEMA, bank::engine()).await;
    fleet.add("b3", Some("3"));
    fleet.sync().await;
    // Branch 2's cards (a cycle of their own) bring branch 3's card, and
    // that card its branch.
    streams_in_closed_form(&mut fleet, "b2", Some("2")).await;
    assert_eq!(keys(&mut fleet, "b2", &bank::Branch::TABLE), ["[2]", "[3]"]);
    assert_eq!(keys(&mut fleet, "b2", &bank::Card::TABLE), ["[20]", "[30]"]);
    let streamed = streams_in_closed_form(&mut fleet, "b1", Some("1")).await;
    let held = |fleet: &mut Fleet, table: &magic_sync::Table| keys(fleet, "b1", table);
    assert_eq!(held(&mut fleet, &bank::Branch::TABLE), ["[1]", "[2]"]);
    assert_eq!(
        held(&mut fleet, &bank::Teller::TABLE),
        ["[11]", "[12]", "[22]"]
    );
    assert_eq!(
        held(&mut fleet, &bank::Account::TABLE),
        ["[11]", "[12]", "[21]"]
    );
    assert_eq!(
        held(&mut fleet, &bank::Statement::TABLE),
        ["[110]", "[210]"]
    );
    assert_eq!(held(&mut fleet, &bank::History::TABLE), ["[1]", "[2]"]);
    assert_eq!(streamed.rows, 12, "{streamed:?}");

    // Account 22 moves to branch 1, 21 to branch 3, and branch 1's
    // history reaches teller 31: each branch holds what it now should.
    fleet
        .settle(
            "UPDATE accounts SET bid = 1 WHERE aid = 22;
             UPDATE accounts SET bid = 3 WHERE aid = 21;
             INSERT INTO history VALUES (4, 1, 31, 22, 2);",
        )
        .await;
    fleet.check().await;
    assert_eq!(
        held(&mut fleet, &bank::Branch::TABLE),
        ["[1]", "[2]", "[3]"]
    );
    assert_eq!(
        held(&mut fleet, &bank::Account::TABLE),
        ["[11]", "[12]", "[21]", "[22]"]
    );
    // A branch new to the fleet, snapshot after the moves, holds the same.
    fleet.add("b1bis", Some("1"));
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(
        keys(&mut fleet, "b1bis", &bank::Account::TABLE),
        held(&mut fleet, &bank::Account::TABLE)
    );
}
