//! What a replica's refused rows can do to the server (issue 41, items 7
//! and 13): a full inbox holds back each of its replica's uploads in a
//! batch, not only the first; a reason is kept without control characters
//! and within a bound, whatever PostgreSQL quoted of the row; and the
//! operator's health lists one item per kind of refusal, however many
//! different rows were refused for it.

use crate::support::*;
use magic_sync::envelope::{RowData, Up, UpRows};
use magic_sync::file::{self, Filing};
use magic_sync::ops::{self, Concern, Scope};
use magic_sync::value::{canonical_key, Value};
use magic_sync::ReplicaId;
use magic_sync_http::server::Security;
use std::time::Duration;

/// A sale as a replica uploads it.
fn sale(id: &str, till: &str, total: &str) -> RowData {
    let codec = engine().codec("sales").expect("declared");
    RowData {
        key: canonical_key(&[Value::Text(id.into())]).into_bytes(),
        data: codec
            .encode(vec![
                Value::Text(id.into()),
                Value::Text(till.into()),
                Value::Numeric(total.into()),
            ])
            .expect("encodes"),
    }
}

fn upload(send_id: u8, rows: Vec<RowData>) -> Up {
    Up {
        send_id: vec![send_id; 16],
        sequence: u64::from(send_id),
        tables: vec![UpRows {
            table: "sales".into(),
            rows,
            ..UpRows::default()
        }],
        ..Up::default()
    }
}

/// A server whose relay knows `tills`.
async fn known(tills: &[&str]) -> Server {
    let server = server(tills, hub_settings(), Security::Plain).await;
    let want = tills.len() as i64;
    until("the replicas known", Duration::from_secs(30), async || {
        server
            .client
            .query_one("SELECT count(*) FROM sync.replicas", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == want
    })
    .await;
    server
}

async fn sales(server: &Server) -> Vec<String> {
    server
        .client
        .query("SELECT id FROM sales ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_inbox_holds_back_each_upload_of_its_replica_in_a_batch() {
    let mut server = known(&["t1", "t2"]).await;
    server
        .client
        .execute(
            "INSERT INTO sync.inbox (replica, table_name, key, data, reason)
             SELECT 't1', 'sales', format('[\"old-%s\"]', i), NULL, 'refused before'
             FROM generate_series(1, $1::int8) i",
            &[&file::INBOX_ROWS],
        )
        .await
        .unwrap();
    // t1's uploads come after t2's in one batch: a run of records, filed
    // together.
    let uploads: Vec<(ReplicaId, Up)> = vec![
        ("t2".into(), upload(1, vec![sale("s2", "t2", "2")])),
        ("t1".into(), upload(1, vec![sale("s1", "t1", "1")])),
        ("t1".into(), upload(2, vec![sale("s3", "t1", "3")])),
    ];
    let mut client = server._db.connect().await;
    let filings = file::file_all(&mut client, engine(), &uploads)
        .await
        .unwrap();
    assert!(
        matches!(filings[0], Ok(Filing::Filed { taken: 1, .. })),
        "{:?}",
        filings[0]
    );
    for filing in &filings[1..] {
        match filing {
            Ok(Filing::Waits { reason }) => {
                assert!(reason.contains("inbox of replica `t1` is full"), "{reason}")
            }
            other => panic!("filed into a full inbox: {other:?}"),
        }
    }
    assert_eq!(sales(&server).await, ["s2"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_is_kept_without_control_characters_and_within_a_bound() {
    let mut server = known(&["t1"]).await;
    server
        .client
        .batch_execute("ALTER TABLE sales ADD CONSTRAINT small CHECK (total < 1000)")
        .await
        .unwrap();
    // PostgreSQL quotes the failing row in its detail: what the replica
    // chose, an escape sequence and a long id here.
    let (escape, long) = (
        "s\u{1b}]0;owned\u{7}\u{1b}[2J",
        format!("s{}", "x".repeat(20_000)),
    );
    let up = upload(
        1,
        vec![sale(escape, "t1", "5000"), sale(&long, "t1", "5000")],
    );
    let mut client = server._db.connect().await;
    let filing = file::file(&mut client, engine(), &"t1".into(), &up)
        .await
        .unwrap();
    let Filing::Filed { refused, .. } = filing else {
        panic!("{filing:?}")
    };
    assert_eq!(refused.len(), 2, "{refused:?}");
    let kept: Vec<String> = server
        .client
        .query("SELECT reason FROM sync.inbox ORDER BY key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kept.len(), 2);
    for reason in refused.iter().map(|r| &r.reason).chain(&kept) {
        assert!(reason.starts_with("PostgreSQL refused it"), "{reason:.200}");
        assert!(!reason.chars().any(char::is_control), "{reason:.200?}");
        assert!(
            reason.chars().count() <= file::REASON_CHARS,
            "{} characters",
            reason.chars().count()
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_lists_a_kind_of_refusal_once_however_many_rows_differ() {
    let mut server = known(&["t1"]).await;
    server
        .client
        .batch_execute("ALTER TABLE sales ADD CONSTRAINT small CHECK (total < 1000)")
        .await
        .unwrap();
    // Each refused row's detail quotes the row: forty reasons, one kind.
    let rows = (0..40)
        .map(|i| sale(&format!("s{i}"), "t1", "5000"))
        .collect();
    let mut client = server._db.connect().await;
    let filing = file::file(&mut client, engine(), &"t1".into(), &upload(1, rows))
        .await
        .unwrap();
    assert!(
        matches!(&filing, Filing::Filed { refused, .. } if refused.len() == 40),
        "{filing:?}"
    );
    let health = ops::health(&mut client, &Scope::All).await.unwrap();
    let refused: Vec<&Concern> = health
        .items
        .iter()
        .map(|i| &i.concern)
        .filter(|c| matches!(c, Concern::Refused { .. }))
        .collect();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    let Concern::Refused {
        table,
        reason,
        rows,
        replicas,
        ..
    } = refused[0]
    else {
        unreachable!()
    };
    assert_eq!((table.as_str(), *rows, *replicas), ("sales", 40, 1));
    assert!(
        reason.starts_with("PostgreSQL refused it") && reason.contains("check constraint"),
        "{reason}"
    );
    server.stop().await;
}
