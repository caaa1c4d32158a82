//! Nothing one replica says can end the relay's attempt or touch another
//! replica's work: whatever a replica reports (an acknowledgement under a
//! number no message has, a seal of nobody's, a gap in an epoch that never
//! was, an upload to a table nobody declared), the runner's sessions stay
//! as they were and every other replica keeps being served.

use crate::relay::{for_the_runner, product_name, start_server, start_server_until, till, until};
use magic_sync::envelope::{Ack, Gap, RowData, Up, UpRows};
use magic_sync::relay::ReplicaInfo;
use magic_sync::run::Report;
use std::time::{Duration, Instant};

/// The backends of the runner's two sessions (the lock's, and the
/// publisher's): an attempt that ends closes both, and the next opens new ones.
async fn runner_sessions(fleet: &crate::fleet::Fleet) -> Vec<(String, i32)> {
    fleet
        .writer
        .query(
            // This test's database only: tests beside it run runners of
            // their own on the same cluster.
            "SELECT application_name, pid FROM pg_stat_activity
             WHERE datname = current_database()
               AND application_name IN ('magic_sync relay: record', 'magic_sync relay: publish')
             ORDER BY application_name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Everything a misbehaving replica might say, none of it anything the
/// server sent or knows.
fn nonsense(epoch: &[u8]) -> Vec<Report> {
    vec![
        // The server's epoch, a number past any it draws, no real seal.
        Report::Applied(Ack {
            epoch: epoch.to_vec(),
            number: u64::MAX,
            nonce: vec![7; 16],
            seal: vec![0; 32],
            ..Ack::default()
        }),
        // Nothing at all.
        Report::Applied(Ack::default()),
        // A number that fits, under a seal of nobody's.
        Report::Applied(Ack {
            epoch: epoch.to_vec(),
            number: 3,
            nonce: vec![1; 16],
            seal: vec![9; 32],
            ..Ack::default()
        }),
        Report::Gap(Gap {
            epoch: vec![1, 2, 3],
            number: u64::MAX,
        }),
        Report::Upload(Up {
            send_id: vec![5; 16],
            tables: vec![UpRows {
                table: "no_such_table".into(),
                rows: vec![RowData {
                    key: b"[1]".to_vec(),
                    data: b"\xff\xfe not a row".to_vec(),
                }],
                ..UpRows::default()
            }],
            ..Up::default()
        }),
    ]
}

#[tokio::test]
async fn a_replica_saying_nonsense_holds_back_no_other_and_ends_no_attempt() {
    let (fleet, network) = for_the_runner().await;
    let (near, near_till) = till(&fleet, &network, "u1");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = start_server(
        &fleet,
        &network,
        vec![
            ReplicaInfo::live("u1", Some("north")),
            ReplicaInfo::live("u2", Some("north")),
        ],
        stopped,
    );
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    until("the write did not reach the near till", || async {
        product_name(&near).as_deref() == Some("green tea")
    })
    .await;
    let sessions = runner_sessions(&fleet).await;
    assert_eq!(sessions.len(), 2, "the runner's sessions: {sessions:?}");
    let epoch: Vec<u8> = fleet
        .writer
        .query_one("SELECT id FROM sync.epoch", &[])
        .await
        .unwrap()
        .get(0);

    for (i, name) in ["black tea", "white tea", "oolong"].iter().enumerate() {
        for report in nonsense(&epoch) {
            network.report("u2", report);
        }
        fleet
            .write(&format!("UPDATE products SET name = '{name}' WHERE id = 1"))
            .await;
        until(
            &format!("write {i} did not reach the near till"),
            || async { product_name(&near).as_deref() == Some(*name) },
        )
        .await;
    }
    // What u2 said before each write was heeded by the time a later write
    // reached u1 (the publisher heeds whenever a report comes, and before
    // each publish), and the attempt went on through all of it.
    assert_eq!(
        runner_sessions(&fleet).await,
        sessions,
        "the runner's attempt was ended and begun again"
    );
    let acknowledged: i64 = fleet
        .count("SELECT count(*) FROM sync.acks WHERE replica = 'u2'")
        .await;
    assert_eq!(acknowledged, 0, "nothing u2 said counted as applied");
    // The table it made up is named in no read: the operator sees rows of an
    // undeclared table, not a name a replica chose.
    let health =
        magic_sync::ops::health(&mut fleet.db.connect().await, &magic_sync::ops::Scope::All)
            .await
            .unwrap();
    let refused: Vec<String> = health
        .items
        .iter()
        .filter_map(|i| match &i.concern {
            magic_sync::ops::Concern::Refused { table, reason, .. } => {
                Some(format!("{table}: {reason}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        refused,
        ["(undeclared): the server declares no such table"],
        "{health:?}"
    );

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    near_till.join().unwrap().unwrap();
}

#[tokio::test]
async fn a_relay_whose_sessions_are_killed_between_steps_goes_on_and_loses_nothing() {
    let (fleet, network) = for_the_runner().await;
    let (near, near_till) = till(&fleet, &network, "u1");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = start_server(
        &fleet,
        &network,
        vec![ReplicaInfo::live("u1", Some("north"))],
        stopped,
    );
    fleet
        .write("UPDATE products SET name = 'first' WHERE id = 1")
        .await;
    until("the first write", || async {
        product_name(&near).as_deref() == Some("first")
    })
    .await;
    // The kills below come once u1's snapshot ended.
    kept_up(&fleet, "u1").await;
    let provisioned = snapshot_number(&fleet, "u1").await;
    for (i, name) in ["second", "third", "fourth"].iter().enumerate() {
        // A write the relay may be recording, publishing or neither, when
        // both its sessions are killed.
        fleet
            .write(&format!("UPDATE products SET name = '{name}' WHERE id = 1"))
            .await;
        // The write before may have gone out just as the last kill was
        // noticed, with the relay now between attempts and holding no
        // session: kill once it holds one again.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let killed: i64 = fleet
                .writer
                .query_one(
                    // This test's relay only: the tests beside it have their
                    // own on other databases of the same cluster.
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name LIKE 'magic_sync relay: %'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if killed >= 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {i}: the relay held no session for 60 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        until(&format!("write {i} after the kill"), || async {
            product_name(&near).as_deref() == Some(*name)
        })
        .await;
    }
    // Nothing was lost on the way: no gap, so no second snapshot.
    let after = snapshot_number(&fleet, "u1").await;
    assert_eq!(after, provisioned, "u1 was provisioned again");
    let status = magic_sync::replica::status(&rusqlite::Connection::open(&near).unwrap()).unwrap();
    assert_eq!(status.gap, None);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    near_till.join().unwrap().unwrap();
}

/// Waits until `replica`'s snapshot ended and the till acknowledged all it
/// was sent. A snapshot's rows reach the till before it ends, so seeing
/// them is not enough: stopping the relay while it still streams would
/// rightly begin it again.
async fn kept_up(fleet: &crate::fleet::Fleet, replica: &str) {
    until(
        &format!("{replica}'s snapshot ended and was acknowledged"),
        || async {
            fleet
                .writer
                .query_one(
                    "SELECT NOT r.provision AND r.snapshot_attempt IS NULL
                        AND coalesce(a.number, 0) >= r.last_number
                 FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
                 WHERE r.id = $1",
                    &[&replica],
                )
                .await
                .unwrap()
                .get(0)
        },
    )
    .await;
}

/// The number of the snapshot `replica` was last provisioned with.
async fn snapshot_number(fleet: &crate::fleet::Fleet, replica: &str) -> i64 {
    fleet
        .writer
        .query_one(
            "SELECT snapshot_number FROM sync.replicas WHERE id = $1",
            &[&replica],
        )
        .await
        .unwrap()
        .get(0)
}

/// The relay's sessions on this test's database.
async fn relay_sessions(fleet: &crate::fleet::Fleet) -> i64 {
    fleet
        .count(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name LIKE 'magic_sync relay: %'",
        )
        .await
}

/// SIGTERM, as a service manager sends it, stops the runner where it is:
/// it returns `Ok`, its sessions end, and a relay started again
/// carries what was written before the signal without provisioning anyone.
#[tokio::test]
async fn sigterm_stops_the_relay_between_steps_and_the_next_one_loses_nothing() {
    let (fleet, network) = for_the_runner().await;
    let (near, near_till) = till(&fleet, &network, "u1");
    let replicas = vec![ReplicaInfo::live("u1", Some("north"))];
    // Listening from here on: the signal below is this one's, and does
    // not end the test process.
    let terminated = magic_sync::run::server::stop_signal();
    let server = start_server_until(&fleet, &network, replicas.clone(), terminated);
    fleet
        .write("UPDATE products SET name = 'first' WHERE id = 1")
        .await;
    until("the first write", || async {
        product_name(&near).as_deref() == Some("first")
    })
    .await;
    kept_up(&fleet, "u1").await;
    let provisioned = snapshot_number(&fleet, "u1").await;
    // A write the relay may be planning, publishing or not yet have seen.
    fleet
        .write("UPDATE products SET name = 'second' WHERE id = 1")
        .await;
    let killed = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("kill -TERM {}", std::process::id()))
        .status()
        .unwrap();
    assert!(killed.success());
    server.await.unwrap().expect("stopped, not failed");
    // Closed before it returned; the server's backends end just after.
    until(
        "the stopped relay's sessions stayed on the server",
        || async { relay_sessions(&fleet).await == 0 },
    )
    .await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = start_server(&fleet, &network, replicas, stopped);
    until("the write made before the signal", || async {
        product_name(&near).as_deref() == Some("second")
    })
    .await;
    let after = snapshot_number(&fleet, "u1").await;
    assert_eq!(after, provisioned, "no one provisioned again");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    near_till.join().unwrap().unwrap();
}
