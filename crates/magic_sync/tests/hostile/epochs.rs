//! Epochs a replica can order: a snapshot the server sent before it began a
//! new epoch, replayed to a replica that follows the new one, changes
//! nothing, and the replica still follows the server.

use crate::{ack_of, epoch_of, settle, shop};
use magic_sync::envelope::Gap;
use magic_sync::replica::Outcome;
use magic_sync::run::Report;
use magic_sync_testkit::fleet::{replica_rows, Fleet};

/// u1 provisioned again, its snapshot's messages kept as they went.
async fn u1_snapshot(fleet: &mut Fleet) -> Vec<Vec<u8>> {
    let ack = ack_of(fleet, "u1");
    let gap = Gap {
        epoch: ack.epoch,
        number: ack.number + 1,
    };
    fleet.network.report("u1", Report::Gap(gap));
    fleet.heed().await;
    let step = fleet.record().await;
    assert_eq!(step.provisioned, vec!["u1".to_string()]);
    let messages = fleet.network.take("u1");
    assert!(!messages.is_empty());
    for message in &messages {
        fleet.network.deliver("u1", message.clone()).unwrap();
    }
    settle(fleet).await;
    fleet.check().await;
    messages
}

/// What u1 holds, table by table.
fn holds(fleet: &mut Fleet) -> Vec<std::collections::BTreeMap<String, String>> {
    let tables: Vec<_> = fleet.engine.down_tables().collect();
    tables
        .into_iter()
        .map(|t| replica_rows(&fleet.unit("u1").replica, t))
        .collect()
}

#[tokio::test]
async fn a_snapshot_of_an_epoch_before_the_one_a_replica_follows_changes_nothing() {
    let mut fleet = shop().await;
    let old = u1_snapshot(&mut fleet).await;
    let first = epoch_of(&fleet).await;
    // The server changes since, and begins a new epoch (a restore found).
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    fleet
        .write("UPDATE sync.replicas SET last_number = last_number - 1 WHERE id = 'u2'; DELETE FROM sync.acks")
        .await;
    let ack = ack_of(&mut fleet, "u2");
    fleet.network.report("u2", Report::Applied(ack));
    fleet.heed().await;
    settle(&mut fleet).await;
    fleet.check().await;
    assert_ne!(epoch_of(&fleet).await, first);
    let ack = ack_of(&mut fleet, "u1");
    let held = holds(&mut fleet);
    // The old snapshot, whole, replayed.
    for message in &old {
        let outcome = fleet.unit("u1").replica.apply(message).unwrap();
        assert!(
            !matches!(outcome, Outcome::Applied { .. }),
            "a message of the epoch before applied: {outcome:?}"
        );
    }
    assert_eq!(ack_of(&mut fleet, "u1"), ack, "its chain did not move");
    assert_eq!(holds(&mut fleet), held, "nor what it holds");
    assert_eq!(fleet.unit("u1").replica.gap(), None, "and no gap opened");
    fleet
        .write("UPDATE products SET name = 'black tea' WHERE id = 1")
        .await;
    settle(&mut fleet).await;
    fleet.check().await;
}
