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
