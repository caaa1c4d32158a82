//! The server's key, rotated while the fleet runs: what the relay sends
//! from then on is signed with the new key, each replica follows the
//! endorsement to it, and a message under the old key is refused after.

use crate::scenarios::shop;
use magic_sync::envelope::{to_replica::Body, Down, ToReplica};
use magic_sync::replica::Outcome;
use magic_sync::sign::Signer;

#[tokio::test]
async fn a_rotated_key_signs_from_then_on_and_every_replica_follows_it() {
    let mut fleet = shop().await;
    let first = fleet.key;
    let mut client = fleet.db.connect().await;
    let second = magic_sync::store::keys::rotate(&mut client).await.unwrap();
    assert_ne!(first, second);
    assert_eq!(
        magic_sync::store::keys::public(&client).await.unwrap(),
        second
    );
    fleet
        .settle("UPDATE products SET name = 'rotated once' WHERE id = 1")
        .await;
    for unit in ["u1", "u2", "u3"] {
        assert_eq!(
            fleet.unit(unit).replica.server_key(),
            Some(second),
            "{unit}"
        );
    }
    // Twice: each replica follows the chain from where it is.
    let third = magic_sync::store::keys::rotate(&mut client).await.unwrap();
    fleet
        .settle("UPDATE products SET name = 'rotated twice' WHERE id = 1")
        .await;
    assert_eq!(fleet.unit("u1").replica.server_key(), Some(third));

    // Whoever holds the first key now (a stolen backup, say) is refused.
    let seed: Vec<u8> = client
        .query_one("SELECT seed FROM sync.keys WHERE ordinal = 1", &[])
        .await
        .unwrap()
        .get(0);
    let old = Signer::new(&seed.try_into().unwrap(), Vec::new());
    let ack = fleet.unit("u1").replica.ack().unwrap();
    let forged = ToReplica {
        replica: "u1".into(),
        epoch: ack.epoch,
        number: ack.number + 1_000,
        nonce: vec![3; 16],
        previous: ack.number,
        previous_nonce: ack.nonce,
        body: Some(Body::Down(Down::default())),
        ..ToReplica::default()
    };
    let outcome = fleet
        .unit("u1")
        .replica
        .apply(&old.to_replica(&forged))
        .unwrap();
    assert!(matches!(outcome, Outcome::Forged { .. }), "{outcome:?}");
    // And given the key it was enrolled with on its next start, a replica
    // keeps following the newest.
    let replica = &mut fleet.unit("u2").replica;
    replica.trust(&first).unwrap();
    assert_eq!(replica.server_key(), Some(third));
    fleet.check().await;
}

/// The messages waiting for each of `units`, decoded, after one pass and
/// one publish; put back in their inboxes as they were.
async fn published(
    fleet: &mut crate::fleet::Fleet,
    units: &[&str],
) -> Vec<(String, Vec<u8>, ToReplica)> {
    fleet.pass().await;
    fleet.publish().await;
    let mut all = Vec::new();
    for unit in units {
        for bytes in fleet.network.take(unit) {
            fleet.network.deliver(unit, bytes.clone()).unwrap();
            let decoded = prost::Message::decode(bytes.as_slice()).unwrap();
            all.push((unit.to_string(), bytes, decoded));
        }
    }
    all
}

#[tokio::test]
async fn a_change_every_till_holds_goes_to_all_under_one_signature_and_each_applies_it() {
    let mut fleet = shop().await;
    fleet
        .write("UPDATE products SET name = 'batched' WHERE id = 1")
        .await;
    let sent = published(&mut fleet, &["u1", "u2", "u3"]).await;
    assert_eq!(sent.len(), 3, "one message each");
    for (unit, bytes, message) in &sent {
        // Each its own head and seal, its own place in the tree, and the
        // one signature over the tree's root.
        assert_eq!(&message.replica, unit);
        assert!(!message.batch_path.is_empty(), "{unit}: signed on its own");
        assert_eq!(message.signature, sent[0].2.signature, "{unit}");
        assert_eq!(
            magic_sync::sign::verify_message(&fleet.key, bytes),
            Ok(fleet.key),
            "{unit}"
        );
    }
    let places: std::collections::BTreeSet<u64> =
        sent.iter().map(|(_, _, m)| m.batch_index).collect();
    assert_eq!(places.len(), 3, "each message has a place of its own");
    fleet.sync().await;
    fleet.check().await;
    for unit in ["u1", "u2", "u3"] {
        assert_eq!(fleet.unit(unit).replica.status().unwrap().forged, 0);
    }
}

#[tokio::test]
async fn a_till_that_does_not_say_it_reads_batches_gets_its_messages_signed_on_their_own() {
    let mut fleet = shop().await;
    // u2 acknowledges as a replica of an earlier build would: it says
    // nothing of batches.
    let ack = fleet.unit("u2").replica.ack().unwrap();
    assert!(ack.reads_batches, "this build's replica reads batches");
    fleet.network.report(
        "u2",
        magic_sync::run::Report::Applied(magic_sync::envelope::Ack {
            reads_batches: false,
            ..ack
        }),
    );
    fleet.heed().await;
    fleet
        .write("UPDATE products SET name = 'batched, but not for u2' WHERE id = 1")
        .await;
    let sent = published(&mut fleet, &["u1", "u2", "u3"]).await;
    assert_eq!(sent.len(), 3, "one message each");
    for (unit, bytes, message) in &sent {
        assert_eq!(
            message.batch_path.is_empty(),
            unit == "u2",
            "{unit}: its path is {} bytes",
            message.batch_path.len()
        );
        assert_eq!(
            magic_sync::sign::verify_message(&fleet.key, bytes),
            Ok(fleet.key)
        );
    }
    // The other two share a signature; u2's is its own.
    let signature = |unit: &str| {
        sent.iter()
            .find(|(u, _, _)| u == unit)
            .map(|(_, _, m)| m.signature.clone())
            .unwrap()
    };
    assert_eq!(signature("u1"), signature("u3"));
    assert_ne!(signature("u1"), signature("u2"));
    // Its next acknowledgement, of this build, says it reads them again.
    fleet.sync().await;
    fleet.check().await;
    fleet
        .write("UPDATE products SET name = 'batched for all' WHERE id = 1")
        .await;
    let sent = published(&mut fleet, &["u1", "u2", "u3"]).await;
    assert_eq!(sent.len(), 3, "one message each");
    assert!(sent.iter().all(|(_, _, m)| !m.batch_path.is_empty()));
    fleet.sync().await;
    fleet.check().await;
}
