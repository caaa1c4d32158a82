//! Bad input, and databases a read cannot read, each with an error that
//! names the thing.

use crate::known::{operator, settled};
use magic_sync::ops::{self, Error, Scope};

#[tokio::test]
async fn unknown_and_departed_replicas_are_named() {
    let mut fleet = settled().await;
    fleet.set_live("d", false);
    fleet.pass().await;
    let mut client = operator(&fleet).await;
    let err = ops::progress(&mut client, "zz").await.unwrap_err();
    assert!(matches!(err, Error::UnknownReplica(ref r) if r == "zz"));
    assert_eq!(err.to_string(), "the server knows no replica `zz`");
    let err = ops::progress(&mut client, "d").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "replica `d` is not live: the server records nothing of it"
    );
    let scope = Scope::Replicas(vec!["a".into(), "zz".into()]);
    let err = ops::overview(&mut client, &scope, 10).await.unwrap_err();
    assert!(matches!(err, Error::UnknownReplica(ref r) if r == "zz"));
    // A replica no longer live is not counted.
    let all = ops::overview(&mut client, &Scope::All, 10).await.unwrap();
    assert_eq!(all.replicas, 3);
    let err = ops::listing(&mut client, &Scope::All, None, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid(_)));
}

#[tokio::test]
async fn a_key_is_checked_against_the_keys_recorded() {
    let fleet = settled().await;
    let mut client = operator(&fleet).await;
    let err = ops::row_progress(&mut client, "items", &["1".into(), "2".into()])
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "table `items` is keyed by 1 values (as its recorded keys show), the key given has 2"
    );
    let err = ops::row_progress(&mut client, "items", &["tea".into()])
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "table `items`: key value 1 (`tea`) is not a number, as its recorded keys are"
    );
    // Nothing records a sale yet: its key is checked against the key its
    // build declared, and no replica holds it.
    let sale = ops::row_progress(&mut client, "sales", &["s1".into()])
        .await
        .unwrap();
    assert_eq!(sale.key, r#"["s1"]"#);
    assert!(
        sale.replicas
            .iter()
            .all(|p| p.state == ops::RowState::DoesNotHold),
        "{sale:?}"
    );
    // A table no build declared cannot be checked, and says so.
    let err = ops::row_progress(&mut client, "refunds", &["r1".into()])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnrecordedTable(ref t) if t == "refunds"));
    assert!(err.to_string().contains("cannot be checked"), "{err}");
}

#[tokio::test]
async fn a_database_without_the_sync_schema_is_named_as_such() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    let err = ops::overview(&mut client, &Scope::All, 10)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoSyncSchema), "{err}");
    let err = ops::health(&mut client, &Scope::All).await.unwrap_err();
    assert!(err.to_string().contains("no sync schema"), "{err}");
}

#[tokio::test]
async fn a_schema_newer_or_older_than_the_build_is_refused() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let current = magic_sync::schema::CURRENT;
    client
        .execute(
            "UPDATE sync.schema_version SET version = $1",
            &[&(current + 1)],
        )
        .await
        .unwrap();
    let err = ops::progress(&mut client, "a").await.unwrap_err();
    assert!(
        matches!(err, Error::SchemaTooNew { found, known } if found == current + 1 && known == current),
        "{err}"
    );
    client
        .execute(
            "UPDATE sync.schema_version SET version = $1",
            &[&(current - 1)],
        )
        .await
        .unwrap();
    let err = ops::listing(&mut client, &Scope::All, None, 10)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::SchemaBehind { .. }), "{err}");
}
