//! The cohort's messages, written once (how-it-works §20): a pass that
//! changes the catalogue writes its messages once, into the cohort's
//! batches, and each member with nothing of its own in the pass is sent
//! them stamped for it as publishing sends them; nothing is written for it.
//! A member with rows of its own in the pass gets the catalogue's rows
//! beside them, in messages of its own, as before. A batch goes once every
//! member has it; a member away past the bound is provisioned again rather
//! than holding batches back for ever.

use super::cohorts::{engine, fleet, members, one, SCHEMA};
use crate::fleet::Fleet;
use magic_sync::run;
use std::time::Duration;

/// Rows in the outbox, and the cohort's batches.
async fn written(fleet: &Fleet) -> (i64, i64) {
    (
        one(fleet, "SELECT count(*) FROM sync.outbox").await,
        one(fleet, "SELECT count(*) FROM sync.batches").await,
    )
}

#[tokio::test]
async fn a_catalogue_change_is_written_once_and_a_sale_beside_it_only_for_its_till() {
    let mut fleet = fleet(SCHEMA, 5).await;
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(members(&fleet).await.len(), 5);

    // A catalogue change alone: one batch, no message per till.
    fleet
        .write("UPDATE items SET name = 'sencha' WHERE id = 1")
        .await;
    let step = fleet.record().await;
    assert_eq!(written(&fleet).await, (0, 1));
    let newest: i64 = one(&fleet, "SELECT newest FROM sync.cohorts").await;
    let batch: i64 = one(&fleet, "SELECT number FROM sync.batches").await;
    assert_eq!(newest, batch);
    // The pass says it wrote to every member, at the batch's number: what
    // the lag of each is measured from.
    let mut to: Vec<(String, i64)> = step
        .written
        .iter()
        .map(|(r, n)| (r.to_string(), *n))
        .collect();
    to.sort();
    let every: Vec<(String, i64)> = (1..=5).map(|i| (format!("u{i}"), newest)).collect();
    assert_eq!(to, every);
    fleet.deliver().await;
    fleet.check().await;
    // Every member acknowledged it: the next pass that writes forgets it.
    let acked: i64 = one(
        &fleet,
        "SELECT count(*) FROM sync.acks WHERE number = (SELECT newest FROM sync.cohorts)",
    )
    .await;
    assert_eq!(acked, 5, "each member applied the cohort's message");

    // A catalogue change and a sale: the till that sold gets both in its
    // own messages, the last at the pass's last number; the others the
    // batch.
    fleet
        .write(
            "UPDATE items SET name = 'assam' WHERE id = 2;
             INSERT INTO tabs VALUES (5, 'u2', 1);",
        )
        .await;
    fleet.record().await;
    let owed: Vec<(String, i64)> = fleet
        .writer
        .query("SELECT replica, number FROM sync.outbox ORDER BY 1, 2", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let newest: i64 = one(&fleet, "SELECT newest FROM sync.cohorts").await;
    assert_eq!(owed, [("u2".to_string(), newest)]);
    assert_eq!(
        written(&fleet).await.1,
        1,
        "the first batch forgotten, the second written"
    );
    let pass_last: i64 = one(&fleet, "SELECT pass_last FROM sync.batches").await;
    assert_eq!(pass_last, newest);
    fleet.sync().await;
    fleet.check().await;

    // A member's progress counts the catalogue it has through the batch.
    let mut client = fleet.db.connect().await;
    for till in ["u1", "u2"] {
        let progress = magic_sync::ops::progress(&mut client, till).await.unwrap();
        assert_eq!(progress.replica.cohorts, ["all"]);
        assert!(
            progress
                .tables
                .iter()
                .all(|t| t.on_its_way == 0 && t.holds == t.should),
            "{till}: {:?}",
            progress.tables
        );
    }
}

#[tokio::test]
async fn a_member_that_applied_the_first_of_a_passs_messages_gets_the_rest_after_it() {
    let mut fleet = Fleet::of_sized(SCHEMA, engine(), 1024).await;
    fleet.reconfigure(|s| s.record_by_rule = true).await;
    for i in 1..=3 {
        fleet.add(&format!("u{i}"), None);
    }
    fleet.sync().await;
    assert_eq!(members(&fleet).await.len(), 3);

    // Sixty items: more than one message can carry.
    fleet
        .write("INSERT INTO items SELECT 100 + i, 4, repeat('x', 40) FROM generate_series(1, 60) i")
        .await;
    fleet.record().await;
    let parts = written(&fleet).await;
    assert_eq!(parts.0, 0, "nothing written per till");
    assert!(
        parts.1 >= 3,
        "the pass's rows span several messages: {parts:?}"
    );

    // u1 applies the first of them and hears no more; the others all.
    fleet.publish().await;
    for (id, unit) in &mut fleet.units {
        let messages = fleet.network.take(id);
        let taken = if id == "u1" {
            &messages[..1]
        } else {
            &messages[..]
        };
        for message in taken {
            if let Some(report) = run::replica::deliver(&mut unit.replica, message).unwrap() {
                fleet.network.report(id, report);
            }
        }
    }
    fleet.heed().await;
    let acked: Vec<(String, i64)> = fleet
        .writer
        .query(
            "SELECT a.replica, (SELECT count(*) FROM sync.batches b WHERE b.number > a.number)
             FROM sync.acks a ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        acked,
        [
            ("u1".to_string(), parts.1 - 1),
            ("u2".to_string(), 0),
            ("u3".to_string(), 0)
        ]
    );

    // Not sent again while they may only be slow to be acknowledged.
    fleet.publish().await;
    assert_eq!(fleet.network.take("u1").len(), 0);
    // A relay started again remembers nothing of what went: sent again,
    // u1 follows on from the one it applied, with no gap and no snapshot,
    // and the others apply nothing twice.
    fleet.reconnect().await;
    let provisioned = fleet.provisionings;
    let delivered = fleet.deliver().await;
    assert_eq!(
        delivered as i64,
        parts.1 - 1,
        "the rest of u1's, and no one else's"
    );
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, provisioned);
    assert_eq!(members(&fleet).await.len(), 3);
}

#[tokio::test]
async fn a_member_away_holds_the_batches_until_it_passes_the_bound_and_is_provisioned_again() {
    let mut fleet = fleet(SCHEMA, 3).await;
    fleet
        .reconfigure(|s| {
            s.outbox_messages = 3;
            s.outbox_check_every = Duration::ZERO;
        })
        .await;
    fleet.sync().await;
    assert_eq!(members(&fleet).await.len(), 3);
    fleet.cut("u3", true);

    // The others have each change; u3 is owed every one.
    for i in 1..=3 {
        fleet
            .settle(&format!("UPDATE items SET name = 'v{i}' WHERE id = 3"))
            .await;
    }
    assert_eq!(
        written(&fleet).await,
        (0, 3),
        "kept for u3, who has none of them"
    );
    let bodies: i64 = one(&fleet, "SELECT count(*) FROM sync.bodies").await;
    assert!(bodies >= 3);

    // One more: past its bound, u3 is to be provisioned again, with the
    // alarm saying why, and holds nothing back any more.
    fleet
        .settle("UPDATE items SET name = 'v4' WHERE id = 3")
        .await;
    let alarm: Option<String> =
        one(&fleet, "SELECT alarm FROM sync.replicas WHERE id = 'u3'").await;
    let alarm = alarm.expect("an alarm");
    assert!(alarm.contains("outgrew its bound: 4 messages"), "{alarm}");
    fleet
        .settle("UPDATE items SET name = 'v5' WHERE id = 1")
        .await;
    assert_eq!(written(&fleet).await, (0, 0), "every batch went");
    let bodies: i64 = one(&fleet, "SELECT count(*) FROM sync.bodies").await;
    assert_eq!(bodies, 0, "and their bodies with them");

    // Back, u3 is provisioned whole and joins again.
    let provisioned = fleet.provisionings;
    fleet.cut("u3", false);
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, provisioned + 1);
    assert_eq!(members(&fleet).await.len(), 3);
}

#[tokio::test]
async fn turned_off_with_the_cohorts_messages_owed_each_member_gets_them_in_its_own() {
    let mut fleet = fleet(SCHEMA, 3).await;
    fleet.sync().await;
    assert_eq!(members(&fleet).await.len(), 3);
    fleet.cut("u2", true);
    fleet
        .settle("UPDATE items SET name = 'v1' WHERE id = 1")
        .await;
    // u1 and u3 have it and stand at the cohort's message; u2 is owed it.
    fleet
        .write("UPDATE items SET name = 'v2' WHERE id = 2")
        .await;
    fleet.record().await;
    assert_eq!(written(&fleet).await.0, 0);

    // Off: what the cohort owes each member goes to its own outbox, each
    // chain goes on from where it stood, and nobody is provisioned again.
    let provisioned = fleet.provisionings;
    fleet.reconfigure(|s| s.record_by_rule = false).await;
    fleet.cut("u2", false);
    fleet
        .settle("UPDATE items SET name = 'v3' WHERE id = 3")
        .await;
    assert!(members(&fleet).await.is_empty());
    assert_eq!(written(&fleet).await.1, 0);
    assert_eq!(
        fleet.provisionings, provisioned,
        "nobody was provisioned again"
    );
}

#[tokio::test]
async fn a_server_restored_to_before_a_members_cohort_message_begins_a_new_epoch() {
    let mut fleet = fleet(SCHEMA, 2).await;
    fleet.sync().await;
    assert_eq!(members(&fleet).await.len(), 2);
    fleet
        .settle("UPDATE items SET name = 'v1' WHERE id = 1")
        .await;
    let before: Vec<u8> = one(&fleet, "SELECT id FROM sync.epoch").await;
    // What a restore leaves: the record of what the cohort wrote is older
    // than what its members applied.
    fleet
        .write(
            "UPDATE sync.cohorts SET newest = newest - 1;
             DELETE FROM sync.batches;
             DELETE FROM sync.acks;",
        )
        .await;
    let ack = fleet.unit("u1").replica.ack().expect("it applied messages");
    fleet
        .network
        .report("u1", magic_sync::run::Report::Applied(ack));
    fleet.heed().await;
    let after: Vec<u8> = one(&fleet, "SELECT id FROM sync.epoch").await;
    assert_ne!(after, before, "a new epoch");
    let waiting: i64 = one(
        &fleet,
        "SELECT count(*) FROM sync.replicas WHERE live AND provision",
    )
    .await;
    assert_eq!(waiting, 2, "every replica is provisioned again");
    fleet.sync().await;
    fleet.check().await;
}
