//! The sync schema: installed, upgraded, and refused when newer than the build.

use magic_sync::schema::{self, CURRENT};
use magic_sync::Error;

#[tokio::test]
async fn a_fresh_database_ends_at_the_current_version() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    assert_eq!(schema::version(&client).await.unwrap(), 0);
    assert_eq!(schema::migrate(&mut client).await.unwrap(), CURRENT);
    assert_eq!(schema::version(&client).await.unwrap(), CURRENT);
    // Running it again changes nothing.
    assert_eq!(schema::migrate(&mut client).await.unwrap(), CURRENT);
    let epochs: i64 = client
        .query_one("SELECT count(*) FROM sync.epoch", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(epochs, 1);
}

#[tokio::test]
async fn a_database_at_an_older_version_is_brought_to_the_current_one() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    assert_eq!(schema::migrate_to(&mut client, 1).await.unwrap(), 1);
    assert!(matches!(
        schema::require_current(&client).await,
        Err(Error::SchemaBehind { found: 1, .. })
    ));
    assert!(client
        .query_one("SELECT to_regclass('sync.epoch') IS NULL", &[])
        .await
        .unwrap()
        .get::<_, bool>(0));
    // A note written at version 1 survives the upgrade.
    client
        .batch_execute(
            "INSERT INTO sync.notes (table_name, source, key) VALUES ('t', 'public.t', '[1]')",
        )
        .await
        .unwrap();
    assert_eq!(schema::migrate(&mut client).await.unwrap(), CURRENT);
    schema::require_current(&client).await.unwrap();
    let notes: i64 = client
        .query_one("SELECT count(*) FROM sync.notes", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(notes, 1);
}

#[tokio::test]
async fn held_keys_recorded_as_jsonb_are_kept_as_their_text() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    assert_eq!(schema::migrate_to(&mut client, 8).await.unwrap(), 8);
    client
        .batch_execute(
            "INSERT INTO sync.held (replica, table_name, key, version, message)
             VALUES ('r1', 'lines', jsonb_build_array(5, 2), 1, 1),
                    ('r1', 'customers', jsonb_build_array('ann', 1.50), 1, 1)",
        )
        .await
        .unwrap();
    assert_eq!(schema::migrate(&mut client).await.unwrap(), CURRENT);
    // The text the relay compares with: its own jsonb keys, printed.
    let found: i64 = client
        .query_one(
            "SELECT count(*) FROM sync.held
             WHERE key IN (jsonb_build_array(5, 2)::text, jsonb_build_array('ann', 1.50)::text)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(found, 2);
    let keys: Vec<String> = client
        .query("SELECT key FROM sync.held ORDER BY key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keys, ["[\"ann\", 1.50]", "[5, 2]"]);
}

#[tokio::test]
async fn a_database_newer_than_the_build_is_refused() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    schema::migrate(&mut client).await.unwrap();
    client
        .execute(
            "UPDATE sync.schema_version SET version = $1",
            &[&(CURRENT + 1)],
        )
        .await
        .unwrap();
    let err = schema::migrate(&mut client).await.expect_err("refused");
    assert!(
        matches!(err, Error::SchemaTooNew { found, known } if found == CURRENT + 1 && known == CURRENT)
    );
    let message = err.to_string();
    assert!(
        message.contains(&format!("version {}", CURRENT + 1)),
        "{message}"
    );
    assert!(message.contains("newer build"), "{message}");
    assert!(schema::require_current(&client).await.is_err());
}

#[tokio::test]
async fn concurrent_migrations_both_succeed() {
    let db = magic_sync_testdb::database().await;
    let mut a = db.connect().await;
    let mut b = db.connect().await;
    let (x, y) = tokio::join!(schema::migrate(&mut a), schema::migrate(&mut b));
    assert_eq!(x.unwrap(), CURRENT);
    assert_eq!(y.unwrap(), CURRENT);
}

#[tokio::test]
async fn acknowledgements_recorded_before_version_5_move_to_their_own_table() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    assert_eq!(schema::migrate_to(&mut client, 4).await.unwrap(), 4);
    client
        .batch_execute(
            "INSERT INTO sync.replicas (id, live, last_number, acked_number, acked_at)
             VALUES ('heard', true, 9, 7, '2026-11-30 10:00:00+00'), ('silent', true, 3, 0, NULL)",
        )
        .await
        .unwrap();
    assert_eq!(schema::migrate(&mut client).await.unwrap(), CURRENT);
    let acks: Vec<(String, i64, bool)> = client
        .query(
            "SELECT replica, number, at = timestamptz '2026-11-30 10:00:00+00' FROM sync.acks ORDER BY replica",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    // Only what a replica said; the time it said it kept.
    assert_eq!(acks, [("heard".to_string(), 7, true)]);
    let nonce: Option<Vec<u8>> = client
        .query_one("SELECT nonce FROM sync.acks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        nonce, None,
        "the nonce of an acknowledgement before 36 is not known"
    );
    let gone: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.columns
             WHERE table_schema = 'sync' AND table_name = 'replicas' AND column_name LIKE 'acked%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(gone, 0, "sync.replicas no longer carries acknowledgements");
}
