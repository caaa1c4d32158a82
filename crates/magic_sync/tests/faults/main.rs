//! The crash-sensitive boundaries, each through a named fault point
//! (`fail`, compiled in for the tests only): the process "dies" there, and
//! whatever runs next goes on with nothing lost and nothing applied twice.
//! Each test ends with the fleet's invariant check. A fault point is armed
//! for the whole process, so every test holds a `FailScenario`, which runs
//! them one at a time, and this binary holds no test that does not.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test says what it saw, for whoever reads its output"
)]

mod deploying;
mod storm;

use fail::FailScenario;
use magic_sync::envelope::Up;
use magic_sync::relay::ReplicaInfo;
use magic_sync::run;
use magic_sync_testkit::fleet::Fleet;
use std::time::Duration;

const SHOP: &str = "
    INSERT INTO products VALUES (1, 'tea', 2.5, 'B1'), (2, 'milk', 1, 'B2');
    INSERT INTO customers VALUES (7, 'Ada'), (8, 'Bob');
    INSERT INTO orders (id, unit_id, customer_id) VALUES (1, 'u1', 7), (2, 'u2', 8);
    INSERT INTO order_lines VALUES (1, 1, 1, 2), (2, 1, 2, 1);
    INSERT INTO stock VALUES ('u1', 1, 5, NULL), ('u2', 2, 3, NULL);
";

async fn shop() -> Fleet {
    let mut fleet = Fleet::new(SHOP).await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("north"));
    fleet.sync().await;
    fleet.check().await;
    fleet
}

fn infos(fleet: &Fleet) -> Vec<ReplicaInfo> {
    fleet.units.values().map(|u| u.info.clone()).collect()
}

/// One pass of the relay as it stands, which the caller expects to fail.
async fn failing_pass(fleet: &mut Fleet) -> magic_sync::Error {
    let infos = infos(fleet);
    fleet
        .relay
        .record(&mut fleet.client, &infos, fleet.network.max_message_bytes())
        .await
        .unwrap_err()
}

fn injected(e: &magic_sync::Error, at: &str) -> bool {
    matches!(e, magic_sync::Error::Injected(name) if *name == at)
}

/// A relay that dies after its pass committed, before publishing: the
/// relay that runs next publishes what it recorded.
#[tokio::test]
async fn a_relay_dying_after_its_pass_committed_loses_nothing() {
    let scenario = FailScenario::setup();
    let mut fleet = shop().await;
    fleet
        .write("UPDATE products SET price = 3 WHERE id = 1")
        .await;
    fail::cfg("relay-after-commit", "1*return").unwrap();
    let died = failing_pass(&mut fleet).await;
    assert!(injected(&died, "relay-after-commit"), "{died}");
    let pending: i64 = fleet.count("SELECT count(*) FROM sync.notes").await;
    assert_eq!(pending, 0, "the pass committed");
    // The next relay (the same build, started again) publishes it.
    fleet.deploy(fleet.engine.clone()).await;
    fleet.sync().await;
    fleet.check().await;
    scenario.teardown();
}

/// A pass whose session ends just before it commits (as an operator or a
/// network partition ends it): it fails as a connection lost, and commits
/// nothing. The fleet's client is gone with it (`Fleet::reconnect`).
async fn cut_before_commit(fleet: &mut Fleet) {
    let pid: i32 = fleet
        .client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let config = fleet.db.config();
    fail::cfg_callback("relay-before-commit", move || {
        end_session(config.clone(), pid)
    })
    .unwrap();
    let lost = failing_pass(fleet).await;
    fail::remove("relay-before-commit");
    assert!(lost.is_transient(), "the session went: {lost}");
}

/// Ends the session `pid` from a session of its own, and waits until it
/// ended: what a fault point's callback, which cannot wait on the runtime
/// it interrupts, does on a thread of its own.
fn end_session(config: tokio_postgres::Config, pid: i32) {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let ended: bool = client
                .query_one("SELECT pg_terminate_backend($1, 10000)", &[&pid])
                .await
                .unwrap()
                .get(0);
            assert!(ended, "the relay's session ended");
        });
    })
    .join()
    .unwrap();
}

/// A relay whose lock is taken away mid-pass (its session ended, as an
/// operator or a network partition does) commits nothing of that pass; the
/// relay that takes the lock next records the same notes, and every till
/// applies them once.
#[tokio::test]
async fn a_relay_losing_its_lock_mid_pass_commits_nothing_over_the_next() {
    let scenario = FailScenario::setup();
    let mut fleet = shop().await;
    fleet
        .write("UPDATE products SET price = 7 WHERE id = 1; UPDATE customers SET name = 'Ada L' WHERE id = 7")
        .await;
    cut_before_commit(&mut fleet).await;
    let (pending, outbox): (i64, i64) = {
        let row = fleet
            .writer
            .query_one(
                "SELECT (SELECT count(*) FROM sync.notes), (SELECT count(*) FROM sync.outbox)",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(pending > 0, "the notes wait for the next relay");
    assert_eq!(outbox, 0, "nothing the lost pass planned was kept");
    // The next relay takes the lock and records them.
    fleet.reconnect().await;
    fleet.sync().await;
    fleet.check().await;
    scenario.teardown();
}

/// A relay starting notes again every row set aside and every row blocked
/// behind one, each as the row is now: the columns its table's notes keep
/// (its foreign keys and its rule's column), read from the row, as a
/// trigger's note keeps what the row was. The relay's first pass is cut
/// short here (its session ended before it commits), so the notes it wrote
/// first are seen before any pass plans them.
#[tokio::test]
async fn rows_set_aside_are_noted_again_as_they_are_now() {
    let scenario = FailScenario::setup();
    let mut fleet = Fleet::with_relay_engine(SHOP, magic_sync_testkit::shop::buggy_engine()).await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("north"));
    fleet.sync().await;
    fleet
        .settle("UPDATE products SET name = 'milk (bug)' WHERE id = 2")
        .await;
    assert_eq!(fleet.quarantined().await.len(), 1, "milk is set aside");

    // The same build starts again.
    fleet.deploy(magic_sync_testkit::shop::buggy_engine()).await;
    cut_before_commit(&mut fleet).await;
    let noted: Vec<(String, serde_json::Value, Option<serde_json::Value>)> = fleet
        .writer
        .query(
            "SELECT table_name, key, parents FROM sync.notes WHERE op = 'a'
             ORDER BY table_name, key::text",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let notes: i64 = fleet.count("SELECT count(*) FROM sync.notes").await;
    assert_eq!(notes, 3, "every note pending is one noted again ('a')");
    assert_eq!(
        noted,
        vec![
            // u2's line of milk and its stock of it, blocked behind it.
            (
                "order_lines".to_string(),
                serde_json::json!([2, 1]),
                Some(serde_json::json!({"order_id": 2, "product_id": 2}))
            ),
            // A product points at nothing, and `all` reads no column.
            (
                "products".to_string(),
                serde_json::json!([2]),
                Some(serde_json::json!({}))
            ),
            (
                "stock".to_string(),
                serde_json::json!(["u2", 2]),
                Some(serde_json::json!({"product_id": 2, "unit_id": "u2"}))
            ),
        ]
    );
    // The next relay plans them, finds milk still set aside, and every
    // replica is as the reference says.
    fleet.reconnect().await;
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(
        fleet.quarantined().await.len(),
        1,
        "milk is still set aside"
    );
    scenario.teardown();
}

/// A publisher dying after the transport took a message, before the
/// outbox let go of it: the message goes again, and is applied once.
#[tokio::test]
async fn a_message_sent_and_still_in_the_outbox_goes_again_and_applies_once() {
    let scenario = FailScenario::setup();
    let mut fleet = shop().await;
    fleet.per_replica().await;
    fleet
        .write("UPDATE products SET price = 4 WHERE id = 2")
        .await;
    fleet.pass().await;
    fail::cfg("publish-after-send", "1*return").unwrap();
    let died = magic_sync::relay::publish(
        &fleet.client,
        &fleet.network,
        16,
        magic_sync_testkit::fleet::BATCHED_FROM,
    )
    .await
    .unwrap_err();
    assert!(injected(&died, "publish-after-send"), "{died}");
    let outbox: i64 = fleet.count("SELECT count(*) FROM sync.outbox").await;
    assert!(outbox > 0, "still in the outbox");
    // Delivered once from the first send, once more from the second.
    let applied = fleet.deliver().await;
    assert!(applied >= 2 * outbox as usize, "sent twice: {applied}");
    fleet.sync().await;
    fleet.check().await;
    scenario.teardown();
}

/// A replica dying after it applied a message, before it acknowledged it:
/// it holds the message once, and the next acknowledgement covers it.
#[tokio::test]
async fn a_replica_dying_before_it_acknowledges_is_covered_by_its_next_acknowledgement() {
    let scenario = FailScenario::setup();
    let mut fleet = shop().await;
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    fleet.pass().await;
    fleet.publish().await;
    fail::cfg("replica-after-apply", "1*return").unwrap();
    let messages = fleet.network.take("u1");
    assert_eq!(messages.len(), 1);
    let died = run::replica::deliver(&mut fleet.unit("u1").replica, &messages[0]).unwrap_err();
    assert!(
        matches!(
            died,
            magic_sync::replica::Error::Injected("replica-after-apply")
        ),
        "{died}"
    );
    // Applied, though nothing said so.
    assert!(
        fleet
            .unit("u1")
            .replica
            .connection()
            .query_row(
                "SELECT count(*) FROM products WHERE name = 'green tea'",
                [],
                |r| r.get::<_, i64>(0)
            )
            .unwrap()
            == 1
    );
    fleet.sync().await;
    fleet
        .write("UPDATE products SET price = 5 WHERE id = 1")
        .await;
    fleet.sync().await;
    fleet.check().await;
    let mut client = fleet.db.connect().await;
    let settled = magic_sync::ops::settled(&mut client, &magic_sync::ops::Scope::All)
        .await
        .unwrap();
    assert!(settled.settled, "{}", settled.says);
    scenario.teardown();
}

/// A snapshot dying after part of it was sent: begun again from the start,
/// it provisions the replica whole.
#[tokio::test]
async fn a_snapshot_dying_midway_is_begun_again() {
    let scenario = FailScenario::setup();
    let mut fleet = shop().await;
    fleet.add("u3", Some("north"));
    let step = fleet.pass().await;
    assert_eq!(step.waiting, vec!["u3".to_string()]);
    fail::cfg("snapshot-mid-stream", "1*return").unwrap();
    let snapshot = fleet.begin_snapshot("u3").await.expect("it waits");
    let failed = snapshot
        .stream(&mut fleet.snapshots, &fleet.network)
        .await
        .unwrap_err();
    assert!(injected(&failed.source, "snapshot-mid-stream"), "{failed}");
    // The part sent arrives; the next attempt sends it all again.
    fleet.deliver().await;
    fleet.sync().await;
    fleet.check().await;
    scenario.teardown();
}

/// A server dying after it filed an upload, before it answered: the
/// replica sends it again, and filing it again changes nothing.
#[tokio::test]
async fn an_upload_filed_and_not_answered_is_sent_again_and_filed_once() {
    let scenario = FailScenario::setup();
    let mut fleet = shop().await;
    fleet
        .unit("u1")
        .replica
        .connection()
        .execute_batch(
            "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('s1', 'u1', 7, '9.50', 1)",
        )
        .unwrap();
    let up: Up = fleet
        .unit("u1")
        .replica
        .upload(1 << 20, Duration::from_secs(3600))
        .unwrap()
        .expect("the sale goes up");
    fail::cfg("file-after-filing", "1*return").unwrap();
    let died = run::server::heed(
        &mut fleet.client,
        &fleet.engine,
        &fleet.network,
        vec![("u1".into(), run::Report::Upload(up))],
    )
    .await
    .unwrap_err();
    assert!(injected(&died, "file-after-filing"), "{died}");
    assert!(
        fleet.network.take_answers("u1").is_empty(),
        "no answer went"
    );
    // Unanswered, it is due again at once with no patience left.
    let sent = fleet.upload(Duration::ZERO).await;
    assert_eq!(sent, 1);
    let sales: Vec<(String, String)> = fleet
        .writer
        .query("SELECT id, total::text FROM sales", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(sales, vec![("s1".to_string(), "9.50".to_string())]);
    assert!(
        fleet
            .unit("u1")
            .replica
            .progress()
            .unwrap()
            .tables
            .is_empty(),
        "filed and let go of"
    );
    fleet.sync().await;
    fleet.check().await;
    scenario.teardown();
}

/// With the record of the rows a rule gives thinned
/// (`Settings::record_ruled_rows` off): a pass that began while a till's
/// snapshot streamed, and keeps for it a change the snapshot's view did not
/// see, commits only after the snapshot recorded what it sent. The
/// snapshot sees the change's note still pending and records the row, so
/// the next pass plans the kept change against it: the order moved away
/// is taken back from the till, not left there with no record row saying
/// it holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_kept_for_a_till_while_its_snapshot_recorded_is_planned_against_what_it_sent() {
    let scenario = FailScenario::setup();
    let mut fleet = shop().await;
    fleet.reconfigure(|s| s.record_ruled_rows = false).await;
    // An order of u3's that nothing points at: left to its rule.
    fleet
        .write("INSERT INTO orders (id, unit_id, customer_id) VALUES (3, 'u3', 7)")
        .await;
    fleet.add("u3", Some("south"));
    assert_eq!(fleet.pass().await.waiting, ["u3"]);
    let snapshot = fleet.begin_snapshot("u3").await.expect("u3 waits");
    let gate = std::sync::Arc::new(magic_sync_testkit::gate::Gate::new(&fleet.network, "u3", 0));
    let (ended, has_ended) = std::sync::mpsc::channel();
    let streaming = {
        let gate = gate.clone();
        let mut worker = fleet.db.connect().await;
        tokio::spawn(async move {
            let streamed = snapshot.stream(&mut worker, &*gate).await;
            ended.send(()).expect("the pass waits for the snapshot");
            streamed
        })
    };
    // The snapshot's view is taken; then the order moves to u1.
    gate.reached().await;
    fleet
        .write("UPDATE orders SET unit_id = 'u1' WHERE id = 3")
        .await;
    // The pass keeps the move for u3, and before it commits the snapshot
    // streams the rest and records what it sent.
    let has_ended = std::sync::Mutex::new(has_ended);
    let opener = gate.clone();
    fail::cfg_callback("relay-before-commit", move || {
        opener.open();
        has_ended
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(120))
            .expect("the snapshot records while the pass has not committed");
    })
    .unwrap();
    let pass = fleet.pass().await;
    fail::remove("relay-before-commit");
    assert_eq!(pass.streaming, ["u3"]);
    let streamed = streaming.await.unwrap().expect("the snapshot streams");
    assert!(streamed.recorded, "{streamed:?}");
    assert_eq!(
        fleet
            .count("SELECT count(*) FROM sync.held WHERE replica = 'u3' AND table_name = 'orders'")
            .await,
        1,
        "the order whose change was kept is recorded"
    );
    fleet.sync().await;
    fleet.check().await;
    scenario.teardown();
}
