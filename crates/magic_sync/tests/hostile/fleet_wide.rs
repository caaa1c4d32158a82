//! The one thing done for the whole fleet, a new epoch with every replica
//! provisioned again, follows only from what the server can check was its
//! own: a receipt it made, a seal it made. A claim alone moves nobody but
//! the replica that makes it.

use crate::{ack_of, epoch_of, ids, says, settle, shop, the_others, waiting};
use magic_sync::envelope::{Receipt, Up};
use magic_sync::run::Report;
use std::time::Duration;

/// u1 writes a sale and uploads it; the server files and answers it, and u1
/// keeps the receipt its answer carried.
async fn u1_sells(fleet: &mut magic_sync_testkit::fleet::Fleet, id: &str) {
    fleet
        .unit("u1")
        .replica
        .connection()
        .execute_batch(&format!(
            "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('{id}', 'u1', 7, '9.50', 1)"
        ))
        .unwrap();
    assert_eq!(fleet.upload(Duration::ZERO).await, 1);
}

/// An acknowledgement claiming the server answered uploads it has no
/// record of answering, with no receipt to show for it (what a till of an
/// earlier build sends, or one that lies): it is provisioned again, and
/// nobody else. Before, every replica was, under a new epoch, as often as
/// the till cared to say it.
#[tokio::test]
async fn a_claim_of_answers_without_the_server_s_receipt_moves_no_other_replica() {
    let mut fleet = shop().await;
    let before = the_others(&fleet, "u1").await;
    let epoch = epoch_of(&fleet).await;
    let mut ack = ack_of(&mut fleet, "u1");
    for answered in [u64::MAX, i64::MAX as u64 + 1, 1] {
        ack.answered = answered;
        says(&mut fleet, "u1", vec![Report::Applied(ack.clone())]).await;
        assert_eq!(epoch_of(&fleet).await, epoch, "no new epoch");
        assert_eq!(
            the_others(&fleet, "u1").await,
            before,
            "answered {answered}"
        );
        assert_eq!(waiting(&fleet).await, ["u1".to_string()].into());
    }
    assert_eq!(settle(&mut fleet).await, ids(&["u1"]));
    fleet.check().await;
}

/// A server restored from a copy older than an upload it answered forgot
/// the filing; the till's next acknowledgement gives back the receipt the
/// server made for it: a new epoch begins and every replica is provisioned
/// again (and sends up what it wrote).
#[tokio::test]
async fn a_receipt_the_server_made_shows_it_forgot_a_filing() {
    let mut fleet = shop().await;
    u1_sells(&mut fleet, "s1").await;
    let ack = ack_of(&mut fleet, "u1");
    let receipt = ack.receipt.clone().expect("the answer carried a receipt");
    assert_eq!(receipt.epoch, epoch_of(&fleet).await);
    assert!(receipt.sequence > 0 && receipt.sequence == ack.answered);
    let epoch = epoch_of(&fleet).await;
    // Nothing forgotten yet: the receipt is within the record.
    says(&mut fleet, "u1", vec![Report::Applied(ack.clone())]).await;
    assert_eq!(epoch_of(&fleet).await, epoch);
    assert!(waiting(&fleet).await.is_empty());
    // What restoring a copy taken before the sale leaves.
    fleet
        .write(
            "BEGIN; SET LOCAL session_replication_role = replica;
             DELETE FROM sales WHERE id = 's1'; DELETE FROM sync.uploads_answered; COMMIT;",
        )
        .await;
    says(&mut fleet, "u1", vec![Report::Applied(ack)]).await;
    assert_ne!(epoch_of(&fleet).await, epoch, "a new epoch");
    assert_eq!(waiting(&fleet).await.len(), 3, "every replica");
    assert_eq!(settle(&mut fleet).await, ids(&["u1", "u2", "u3"]));
    while fleet.upload(Duration::ZERO).await > 0 {
        settle(&mut fleet).await;
    }
    fleet.check().await;
    let sale: i64 = fleet
        .count("SELECT count(*) FROM sales WHERE id = 's1'")
        .await;
    assert_eq!(sale, 1, "the sale is filed again");
}

/// A receipt that is not the server's for this replica, in this epoch, for
/// that sequence (another till's, one altered, one of another epoch) shows
/// nothing, even when the record holds less: nobody is provisioned for it.
#[tokio::test]
async fn a_receipt_not_made_for_the_replica_that_gives_it_back_shows_nothing() {
    let mut fleet = shop().await;
    u1_sells(&mut fleet, "s1").await;
    let u2_receipt = {
        fleet
            .unit("u2")
            .replica
            .connection()
            .execute_batch(
                "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('s2', 'u2', 8, '1', 1)",
            )
            .unwrap();
        assert_eq!(fleet.upload(Duration::ZERO).await, 1);
        ack_of(&mut fleet, "u2").receipt.expect("u2's receipt")
    };
    // The record holds nothing of u1's answers any more: only a receipt
    // the server made for u1 would show a restore.
    fleet
        .write("DELETE FROM sync.uploads_answered WHERE replica = 'u1'")
        .await;
    let epoch = epoch_of(&fleet).await;
    let before = the_others(&fleet, "u1").await;
    let own = ack_of(&mut fleet, "u1").receipt.expect("u1's receipt");
    let altered = [
        u2_receipt.clone(),
        Receipt {
            sequence: own.sequence + 1,
            ..own.clone()
        },
        Receipt {
            epoch: vec![0xEE; 24],
            ..own.clone()
        },
        Receipt {
            seal: u2_receipt.seal.clone(),
            ..own.clone()
        },
        Receipt {
            seal: Vec::new(),
            ..own.clone()
        },
    ];
    for receipt in altered {
        let mut ack = ack_of(&mut fleet, "u1");
        ack.receipt = Some(receipt.clone());
        ack.answered = u64::MAX;
        says(&mut fleet, "u1", vec![Report::Applied(ack)]).await;
        assert_eq!(epoch_of(&fleet).await, epoch, "{receipt:?}");
        assert_eq!(the_others(&fleet, "u1").await, before, "{receipt:?}");
    }
    assert!(waiting(&fleet).await.is_empty(), "not even u1");
}

/// An upload numbered past what the server's record holds (`int8`) is
/// answered with a receipt for the sequence as recorded: given back, it is
/// within the record, and shows nothing.
#[tokio::test]
async fn an_upload_numbered_past_the_record_earns_no_receipt_beyond_it() {
    let mut fleet = shop().await;
    let epoch = epoch_of(&fleet).await;
    for sequence in [u64::MAX, i64::MAX as u64 + 1] {
        let mut up = fleet
            .unit("u1")
            .replica
            .upload(1 << 20, Duration::ZERO)
            .unwrap()
            .unwrap_or_else(|| Up {
                send_id: vec![7; 16],
                takes_receipts: true,
                ..Up::default()
            });
        up.sequence = sequence;
        up.send_id = vec![sequence as u8; 16];
        says(&mut fleet, "u1", vec![Report::Upload(up)]).await;
        let answers = fleet.network.take_answers("u1");
        let receipt = answers
            .last()
            .and_then(|a| a.receipt.clone())
            .expect("answered with a receipt");
        assert_eq!(receipt.sequence, i64::MAX as u64);
        let mut ack = ack_of(&mut fleet, "u1");
        ack.receipt = Some(receipt);
        ack.answered = u64::MAX;
        says(&mut fleet, "u1", vec![Report::Applied(ack)]).await;
        assert_eq!(epoch_of(&fleet).await, epoch);
        assert!(waiting(&fleet).await.is_empty());
    }
}

/// A server restored from a copy older than an epoch it began since: the
/// replicas follow that newer epoch and refuse the older one's snapshots,
/// so the server must learn it went back. A till's acknowledgement of the
/// newer epoch, under a seal drawn from the installation's master secret,
/// shows it: the server begins an epoch after the one it forgot, and the
/// fleet follows it.
#[tokio::test]
async fn a_seal_of_an_epoch_the_server_forgot_it_began_has_it_begin_a_newer_one() {
    let mut fleet = shop().await;
    let copy = fleet
        .writer
        .query_one("SELECT id, secret FROM sync.epoch", &[])
        .await
        .unwrap();
    let (old_id, old_secret): (Vec<u8>, Vec<u8>) = (copy.get(0), copy.get(1));
    // A restore found, as any: a new epoch, which the fleet follows.
    fleet
        .write("UPDATE sync.replicas SET last_number = last_number - 1 WHERE id = 'u1'; DELETE FROM sync.acks")
        .await;
    let ack = ack_of(&mut fleet, "u1");
    says(&mut fleet, "u1", vec![Report::Applied(ack)]).await;
    settle(&mut fleet).await;
    fleet.check().await;
    let followed = epoch_of(&fleet).await;
    assert_ne!(followed, old_id);
    // Restored again, to the copy from before that epoch began.
    fleet
        .writer
        .execute(
            "UPDATE sync.epoch SET id = $1, secret = $2",
            &[&old_id, &old_secret],
        )
        .await
        .unwrap();
    let ack = ack_of(&mut fleet, "u2");
    assert_eq!(ack.epoch, followed);
    says(&mut fleet, "u2", vec![Report::Applied(ack)]).await;
    let began = epoch_of(&fleet).await;
    assert!(
        magic_sync::EpochId::from(followed).precedes(&began.clone().into()),
        "an epoch after the one forgotten"
    );
    assert_eq!(waiting(&fleet).await.len(), 3, "every replica");
    settle(&mut fleet).await;
    fleet.check().await;
    for unit in ["u1", "u2", "u3"] {
        assert_eq!(ack_of(&mut fleet, unit).epoch, began, "{unit} follows it");
    }
}
