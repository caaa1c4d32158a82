//! Installing or repairing the triggers (`trigger::ensure`) as a deploy
//! step: it touches only what is wrong, gives way to the application, and
//! says when writes went unnoted.

use crate::shop;
use magic_sync::trigger::{ensure, InstallSettings};
use magic_sync::{check, Error};
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

/// Drops, disables or rewrites a trigger on several tables, each in another
/// way.
const TAMPER: &str = "
    DROP TRIGGER magic_sync_note ON orders;
    DROP TRIGGER magic_sync_note ON order_lines;
    ALTER TABLE notices DISABLE TRIGGER magic_sync_note;
    DROP TRIGGER magic_sync_no_truncate ON events_north;
    CREATE OR REPLACE FUNCTION sync.note_public_products() RETURNS trigger
        LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;";

/// `(table, unnoted, triggers created again)` for each table repaired.
fn repaired(ensured: &magic_sync::trigger::Ensured) -> Vec<(String, bool, bool)> {
    ensured
        .installed
        .iter()
        .map(|i| (format!("{}.{}", i.schema, i.table), i.unnoted, i.triggers))
        .collect()
}

fn owned(list: &[(&str, bool, bool)]) -> Vec<(String, bool, bool)> {
    list.iter()
        .map(|&(t, u, c)| (t.to_string(), u, c))
        .collect()
}

#[tokio::test]
async fn ensure_repairs_only_what_is_wrong_and_says_when_writes_went_unnoted() {
    let (db, mut client) = shop::installed().await;
    client.batch_execute(TAMPER).await.unwrap();
    // A reader in a long transaction: the installation locks no table
    // against reading, so neither waits for the other.
    let reader = db.connect().await;
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM orders; SELECT count(*) FROM products")
        .await
        .unwrap();
    let ensured = ensure(&shop::engine(), &mut client, &InstallSettings::default())
        .await
        .expect("repaired");
    assert_eq!(
        repaired(&ensured),
        owned(&[
            // A TRUNCATE trigger missing on one partition.
            ("public.events", true, true),
            ("public.notices", true, true),
            ("public.order_lines", true, true),
            ("public.orders", true, true),
            // Only the function differs: replaced, the table not locked.
            ("public.products", false, false),
        ])
    );
    assert_eq!(ensured.retries, 0, "nothing held a conflicting lock");
    assert!(!ensured.refuse_truncate);
    assert!(ensured.provisioned.is_empty(), "no replica yet");
    let events = &ensured.installed[0].problems;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0].to_string(),
        "trigger `magic_sync_no_truncate` on `public.events_north`: is missing: install the triggers (magic_sync::trigger::ensure)"
    );
    reader.batch_execute("COMMIT").await.unwrap();
    check::startup(&shop::engine(), &client)
        .await
        .expect("starts after the repair");
    let again = ensure(&shop::engine(), &mut client, &InstallSettings::default())
        .await
        .unwrap();
    assert!(again.is_empty(), "{again:?}");
}

/// Every relation the shop's triggers are on.
const EVERY_NOTED_RELATION: &str = "products, customers, orders, order_lines, notices, promotions,
    promotion_members, unit_groups, stock, events, events_north, events_south, logistics.shipments";

#[tokio::test]
async fn an_installation_as_the_engine_writes_it_takes_no_lock() {
    let (db, mut client) = shop::installed().await;
    let holder = db.connect().await;
    holder
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {EVERY_NOTED_RELATION} IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .unwrap();
    // One attempt only: any lock asked for would time out and fail it.
    let settings = InstallSettings {
        attempts: 1,
        ..InstallSettings::default()
    };
    let ensured = ensure(&shop::engine(), &mut client, &settings)
        .await
        .expect("nothing to lock");
    assert!(ensured.is_empty(), "{ensured:?}");
    holder.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_table_the_application_keeps_locked_is_given_way_to_and_named() {
    let (db, mut client) = shop::installed().await;
    client
        .batch_execute(
            "INSERT INTO customers VALUES (1, 'Ada'); DROP TRIGGER magic_sync_note ON customers",
        )
        .await
        .unwrap();
    let writer = db.connect().await;
    writer
        .batch_execute("BEGIN; UPDATE customers SET name = 'Ada L.' WHERE id = 1")
        .await
        .unwrap();
    let settings = InstallSettings {
        attempts: 3,
        lock_timeout: Duration::from_millis(20),
        ..InstallSettings::default()
    };
    let err = ensure(&shop::engine(), &mut client, &settings)
        .await
        .expect_err("the writer's transaction never ends");
    assert!(
        matches!(err, Error::InstallGaveWay { ref relation, attempts: 3, .. } if relation == "public.customers"),
        "{err}"
    );
    assert!(err.is_transient(), "worth trying again later: {err}");
    // The writer never noticed.
    writer
        .batch_execute("COMMIT")
        .await
        .expect("the writer commits");
    let ensured = ensure(&shop::engine(), &mut client, &settings)
        .await
        .expect("repaired once the writer is done");
    assert_eq!(
        repaired(&ensured),
        owned(&[("public.customers", true, true)])
    );
}

/// A writer on connection `client`, with its own rows (ids `100 + n`): a
/// transaction at a time over several tables, in an order of its own that
/// turns with each transaction, until told to stop. Counts what it commits
/// in `committed`; returns every error it met.
async fn write(
    mut client: Client,
    n: i64,
    committed: tokio::sync::watch::Sender<u64>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio_postgres::Error> {
    let id = 100 + n;
    let statements = [
        "UPDATE products SET price = price + 1 WHERE id = $1",
        "UPDATE customers SET name = 'writer ' || $1::text || ' ' || txid_current() WHERE id = $1",
        "UPDATE orders SET placed_at = now() WHERE id = $1",
        "UPDATE order_lines SET qty = qty + 1 WHERE order_id = $1",
        "UPDATE notices SET body = txid_current()::text WHERE id = $1",
        "UPDATE events SET body = txid_current()::text WHERE region = 'north' AND id = $1",
        "UPDATE stock SET on_hand = on_hand + 1 WHERE product_id = $1",
    ];
    let mut errors = Vec::new();
    let mut turn = n as usize;
    while !*stop.borrow_and_update() {
        turn += 1;
        let outcome = async {
            let tx = client.transaction().await?;
            for i in 0..statements.len() {
                let sql = statements[(turn + i * (1 + n as usize)) % statements.len()];
                tx.execute(sql, &[&id]).await?;
            }
            tx.commit().await
        }
        .await;
        match outcome {
            Ok(()) => committed.send_modify(|c| *c += 1),
            Err(e) => errors.push(e),
        }
    }
    errors
}

/// Waits until every writer has committed more than `after` says (a minute
/// at most: a writer left stuck fails the test).
async fn commit_again(counts: &mut [tokio::sync::watch::Receiver<u64>], after: &[u64]) {
    for (count, &after) in counts.iter_mut().zip(after) {
        tokio::time::timeout(Duration::from_secs(60), count.wait_for(|&c| c > after))
            .await
            .expect("a writer was left stuck")
            .unwrap();
    }
}

const WRITERS: i64 = 4;

#[tokio::test]
async fn installing_triggers_while_writers_run_neither_deadlocks_nor_blocks_them() {
    let (db, mut client) = shop::installed().await;
    for n in 0..WRITERS {
        let id = 100 + n;
        client
            .batch_execute(&format!(
                "INSERT INTO products VALUES ({id}, 'p{id}', 1, NULL);
                 INSERT INTO customers VALUES ({id}, 'c{id}');
                 INSERT INTO orders VALUES ({id}, 'u1', {id});
                 INSERT INTO order_lines VALUES ({id}, 1, {id}, 1);
                 INSERT INTO notices VALUES ({id}, 'north', '');
                 INSERT INTO events VALUES ('north', {id}, '');
                 INSERT INTO stock VALUES ('u1', {id}, 0, NULL);"
            ))
            .await
            .unwrap();
    }
    client.batch_execute(TAMPER).await.unwrap();
    let settings = InstallSettings::default();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (mut writers, mut counts) = (Vec::new(), Vec::new());
    for n in 0..WRITERS {
        let writer = db.connect().await;
        // Willing to wait a few times longer than the installer is.
        writer
            .batch_execute(&format!(
                "SET lock_timeout = '{}ms'",
                4 * settings.lock_timeout.as_millis()
            ))
            .await
            .unwrap();
        let (committed, count) = tokio::sync::watch::channel(0);
        counts.push(count);
        writers.push(tokio::spawn(write(writer, n, committed, stopped.clone())));
    }
    // Every writer is under way before the installation begins, and commits
    // again after it.
    commit_again(&mut counts, &[0; WRITERS as usize]).await;
    let ensured = ensure(&shop::engine(), &mut client, &settings).await;
    let done: Vec<u64> = counts.iter().map(|c| *c.borrow()).collect();
    commit_again(&mut counts, &done).await;
    stop.send(true).unwrap();
    let mut failures = Vec::new();
    for writer in writers {
        failures.extend(writer.await.unwrap());
    }
    let ensured = ensured.expect("the installation succeeds");
    println!(
        "installed {:?} with {} retries",
        repaired(&ensured),
        ensured.retries
    );
    let said = |e: &tokio_postgres::Error| match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    };
    let gave_way: Vec<String> = failures
        .iter()
        .filter(|e| {
            matches!(e.code(), Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::T_R_DEADLOCK_DETECTED)
        })
        .map(said)
        .collect();
    assert!(
        gave_way.is_empty(),
        "writers timed out or deadlocked: {gave_way:?}"
    );
    let failures: Vec<String> = failures.iter().map(said).collect();
    assert!(failures.is_empty(), "writers failed: {failures:?}");
    assert_eq!(ensured.installed.len(), 5, "{ensured:?}");
    check::startup(&shop::engine(), &client)
        .await
        .expect("every trigger as the engine writes it");
    let again = ensure(&shop::engine(), &mut client, &settings)
        .await
        .unwrap();
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(again.retries, 0);
}
