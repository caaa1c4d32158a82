//! Every write of a mirrored table notes itself, atomically with it.

use crate::shop;
use serde_json::{json, Value as Json};
use std::time::{Duration, Instant};
use tokio_postgres::Client;

#[derive(Debug, PartialEq)]
struct Note {
    seq: i64,
    table: String,
    source: String,
    key: Json,
    parents: Option<Json>,
}

async fn notes(client: &Client) -> Vec<Note> {
    client
        .query(
            "SELECT seq, table_name, source, key, parents FROM sync.notes ORDER BY seq",
            &[],
        )
        .await
        .expect("read notes")
        .iter()
        .map(|r| Note {
            seq: r.get(0),
            table: r.get(1),
            source: r.get(2),
            key: r.get(3),
            parents: r.get(4),
        })
        .collect()
}

/// (table, source, key, parents) of every note, in order.
async fn summary(client: &Client) -> Vec<(String, String, Json, Option<Json>)> {
    notes(client)
        .await
        .into_iter()
        .map(|n| (n.table, n.source, n.key, n.parents))
        .collect()
}

/// What each note says happened to its row (`sync.notes.op`), in order.
async fn ops(client: &Client) -> String {
    client
        .query_one(
            "SELECT string_agg(op::text, '' ORDER BY seq) FROM sync.notes",
            &[],
        )
        .await
        .expect("read notes")
        .get(0)
}

async fn clear(client: &Client) {
    client
        .execute("DELETE FROM sync.notes", &[])
        .await
        .expect("clear notes");
}

fn s(x: &str) -> String {
    x.to_string()
}

/// A note keeps what the row was before its change: the columns pointing
/// at other tables and the column its rule reads, by name; NULL for a row
/// that was not there.
#[tokio::test]
async fn insert_update_delete_each_write_one_note() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute(
            "INSERT INTO customers VALUES (7, 'Ada'), (8, 'Bob');
             INSERT INTO orders (id, unit_id, customer_id) VALUES (1, 'u1', 7);",
        )
        .await
        .unwrap();
    clear(&client).await;

    client
        .batch_execute("UPDATE orders SET customer_id = 8 WHERE id = 1")
        .await
        .unwrap();
    client
        .batch_execute("DELETE FROM orders WHERE id = 1")
        .await
        .unwrap();
    client
        .batch_execute("INSERT INTO orders (id, unit_id) VALUES (2, 'u2')")
        .await
        .unwrap();

    assert_eq!(
        summary(&client).await,
        vec![
            (
                s("orders"),
                s("public.orders"),
                json!([1]),
                Some(json!({"customer_id": 7, "unit_id": "u1"}))
            ),
            (
                s("orders"),
                s("public.orders"),
                json!([1]),
                Some(json!({"customer_id": 8, "unit_id": "u1"}))
            ),
            (s("orders"), s("public.orders"), json!([2]), None),
        ]
    );
    assert_eq!(ops(&client).await, "udi");

    // In one transaction, a key inserted and then updated: the update's
    // pre-image is the row just inserted, and only the kinds say the key
    // was not there before.
    clear(&client).await;
    client
        .batch_execute(
            "BEGIN; INSERT INTO orders (id, unit_id) VALUES (3, 'u1');
             UPDATE orders SET customer_id = 7 WHERE id = 3; COMMIT;",
        )
        .await
        .unwrap();
    assert_eq!(ops(&client).await, "iu");
    let notes = summary(&client).await;
    assert_eq!(
        notes.iter().map(|n| n.3.clone()).collect::<Vec<_>>(),
        vec![None, Some(json!({"customer_id": null, "unit_id": "u1"}))]
    );
}

#[tokio::test]
async fn a_note_carries_the_writing_transaction() {
    let (_db, mut client) = shop::installed().await;
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("INSERT INTO customers VALUES (1, 'Ada')")
        .await
        .unwrap();
    let xid: String = tx
        .query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    let noted: String = client
        .query_one("SELECT xid::text FROM sync.notes", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(noted, xid);
}

#[tokio::test]
async fn a_rolled_back_write_leaves_no_note() {
    let (_db, mut client) = shop::installed().await;
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("INSERT INTO products VALUES (1, 'tea', 2.50, NULL)")
        .await
        .unwrap();
    tx.batch_execute("UPDATE products SET name = 'green tea'")
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(notes(&client).await, vec![]);
}

#[tokio::test]
async fn a_write_that_changes_nothing_the_replicas_see_is_not_noted() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute(
            "INSERT INTO products VALUES (1, 'tea', 2.50, NULL);
             INSERT INTO stock VALUES ('u1', 1, 10, NULL);",
        )
        .await
        .unwrap();
    clear(&client).await;
    // `counted` is the replica's own column; setting a value to itself changes nothing.
    client
        .batch_execute(
            "UPDATE stock SET counted = 9;
             UPDATE products SET name = name;",
        )
        .await
        .unwrap();
    assert_eq!(notes(&client).await, vec![]);
    client
        .batch_execute("UPDATE stock SET on_hand = 11")
        .await
        .unwrap();
    assert_eq!(
        summary(&client).await,
        vec![(
            s("stock"),
            s("public.stock"),
            json!(["u1", 1]),
            Some(json!({"product_id": 1, "unit_id": "u1"}))
        )]
    );
}

#[tokio::test]
async fn a_key_change_notes_the_old_key_too() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute(
            "INSERT INTO products VALUES (1, 'tea', 2.50, NULL);
             INSERT INTO orders (id, unit_id) VALUES (5, 'u1');
             INSERT INTO order_lines VALUES (5, 1, 1, 3);",
        )
        .await
        .unwrap();
    clear(&client).await;
    client
        .batch_execute("UPDATE products SET id = 100 WHERE id = 1")
        .await
        .unwrap();
    // The product's old and new key, and the line the cascade re-pointed.
    assert_eq!(
        summary(&client).await,
        vec![
            (
                s("products"),
                s("public.products"),
                json!([1]),
                Some(json!({}))
            ),
            (s("products"), s("public.products"), json!([100]), None),
            (
                s("order_lines"),
                s("public.order_lines"),
                json!([5, 1]),
                Some(json!({"order_id": 5, "product_id": 1}))
            ),
        ]
    );
    assert_eq!(ops(&client).await, "diu");
}

#[tokio::test]
async fn a_row_moving_partition_is_noted_in_both() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute("INSERT INTO events VALUES ('north', 1, 'storm')")
        .await
        .unwrap();
    assert_eq!(
        summary(&client).await,
        vec![(
            s("events"),
            s("public.events_north"),
            json!(["north", 1]),
            None
        )]
    );
    clear(&client).await;
    client
        .batch_execute("UPDATE events SET region = 'south' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(
        summary(&client).await,
        vec![
            (
                s("events"),
                s("public.events_north"),
                json!(["north", 1]),
                Some(json!({"region": "north"}))
            ),
            (
                s("events"),
                s("public.events_south"),
                json!(["south", 1]),
                None
            ),
        ]
    );
}

#[tokio::test]
async fn composite_self_referencing_and_other_schema_parents_are_noted() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute(
            "INSERT INTO events VALUES ('north', 1, 'storm');
             INSERT INTO logistics.shipments VALUES (1, 'north', 1, NULL), (2, 'north', 1, 1);",
        )
        .await
        .unwrap();
    clear(&client).await;
    client
        .batch_execute("DELETE FROM logistics.shipments WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(
        summary(&client).await,
        vec![(
            s("shipments"),
            s("logistics.shipments"),
            json!([2]),
            Some(json!({"region": "north", "event_id": 1, "parent_id": 1}))
        )]
    );
}

#[tokio::test]
async fn group_tables_are_noted() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute(
            "INSERT INTO products VALUES (1, 'tea', 2.50, NULL);
             INSERT INTO promotions VALUES (3, 1, 10);",
        )
        .await
        .unwrap();
    clear(&client).await;
    client
        .batch_execute(
            "INSERT INTO promotion_members VALUES (9, 3);
             INSERT INTO unit_groups VALUES ('u1', 9);
             DELETE FROM unit_groups;",
        )
        .await
        .unwrap();
    assert_eq!(
        summary(&client).await,
        vec![
            (
                s("promotion_members"),
                s("public.promotion_members"),
                json!([9, 3]),
                None
            ),
            (
                s("unit_groups"),
                s("public.unit_groups"),
                json!(["u1", 9]),
                None
            ),
            (
                s("unit_groups"),
                s("public.unit_groups"),
                json!(["u1", 9]),
                Some(json!({}))
            ),
        ]
    );
}

#[tokio::test]
async fn up_tables_are_not_noted() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute("INSERT INTO sales VALUES ('s1', 'u1', NULL, 3.50, 1)")
        .await
        .unwrap();
    assert_eq!(notes(&client).await, vec![]);
}

#[tokio::test]
async fn truncate_of_a_mirrored_table_is_refused() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute("INSERT INTO notices VALUES (1, 'r1', 'open late')")
        .await
        .unwrap();
    // Events are pointed at by shipments, so they can only be truncated together.
    for (statement, tables) in [
        ("TRUNCATE notices", &["notices"][..]),
        ("TRUNCATE logistics.shipments", &["shipments"]),
        (
            "TRUNCATE events, logistics.shipments",
            &["events", "shipments"],
        ),
        (
            "TRUNCATE events_south, logistics.shipments",
            &["events", "shipments"],
        ),
    ] {
        let err = client
            .batch_execute(statement)
            .await
            .expect_err("TRUNCATE must be refused");
        let message = err
            .as_db_error()
            .expect("a database error")
            .message()
            .to_string();
        assert!(
            tables.iter().any(|table| message.contains(&format!(
                "TRUNCATE of mirrored table \"{table}\" is refused"
            ))),
            "{statement}: {message}"
        );
    }
    let left: i64 = client
        .query_one("SELECT count(*) FROM notices", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 1);
}

#[tokio::test]
async fn writes_under_replica_replication_role_are_still_noted() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute(
            "SET session_replication_role = replica;
             INSERT INTO customers VALUES (1, 'Ada');
             RESET session_replication_role;",
        )
        .await
        .unwrap();
    assert_eq!(notes(&client).await.len(), 1);
}

async fn backend_pid(client: &Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

async fn current_xid(tx: &tokio_postgres::Transaction<'_>) -> String {
    tx.query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .unwrap()
        .get(0)
}

/// Waits until `waiter`'s backend is blocked by `holder`'s (a condition, not a delay).
async fn wait_blocked(observer: &Client, waiter: i32, holder: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let blocked: bool = observer
            .query_one("SELECT $2 = ANY(pg_blocking_pids($1))", &[&waiter, &holder])
            .await
            .unwrap()
            .get(0);
        if blocked {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "backend {waiter} never blocked on {holder}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn concurrent_writers_of_one_row_get_numbers_in_commit_order() {
    let (db, observer) = shop::installed().await;
    observer
        .batch_execute(
            "INSERT INTO products VALUES (1, 'tea', 2.50, NULL), (2, 'milk', 1.00, NULL)",
        )
        .await
        .unwrap();
    clear(&observer).await;
    let mut early = db.connect().await;
    let mut late = db.connect().await;
    let early_pid = backend_pid(&early).await;
    let late_pid = backend_pid(&late).await;

    // `early` starts first and draws a note number first, on another row.
    let early_tx = early.transaction().await.unwrap();
    early_tx
        .batch_execute("UPDATE products SET name = 'skimmed' WHERE id = 2")
        .await
        .unwrap();
    let early_xid = current_xid(&early_tx).await;
    // `late` takes row 1 and holds it.
    let late_tx = late.transaction().await.unwrap();
    late_tx
        .batch_execute("UPDATE products SET name = 'black tea' WHERE id = 1")
        .await
        .unwrap();
    let late_xid = current_xid(&late_tx).await;
    // `early` now waits for row 1 behind `late`.
    let early_write = async {
        early_tx
            .batch_execute("UPDATE products SET name = 'green tea' WHERE id = 1")
            .await
            .unwrap();
        early_tx.commit().await.unwrap();
    };
    let late_commit = async {
        wait_blocked(&observer, early_pid, late_pid).await;
        late_tx.commit().await.unwrap();
    };
    tokio::join!(early_write, late_commit);

    let seq_of = |xid: String| {
        let observer = &observer;
        async move {
            observer
                .query_one(
                    "SELECT seq FROM sync.notes WHERE key = '[1]' AND xid::text = $1",
                    &[&xid],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    let early_other: i64 = observer
        .query_one("SELECT seq FROM sync.notes WHERE key = '[2]'", &[])
        .await
        .unwrap()
        .get(0);
    let late_seq = seq_of(late_xid).await;
    let early_seq = seq_of(early_xid).await;
    assert!(
        early_other < late_seq,
        "the early transaction drew a number first"
    );
    assert!(
        late_seq < early_seq,
        "the write that committed first is numbered first"
    );
    let name: String = observer
        .query_one("SELECT name FROM products WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        name, "green tea",
        "the last committed write is the newest note"
    );
}
