//! What a till does with what it is sent: a forged frame costs it a
//! verification or two and no write to its file; a frame whose
//! endorsements were tampered with is refused; and its status says where
//! its chain ends and how much of what it wrote is not filed yet.

use crate::{ack_of, shop};
use magic_sync::envelope::{Endorsement, ToReplica};
use magic_sync::replica::Outcome;
use magic_sync::sign::Signer;
use magic_sync_testkit::fleet::Fleet;
use prost::Message as _;
use std::time::Duration;

/// The next message the server sends u1, as it went, not applied.
async fn next_for_u1(fleet: &mut Fleet, sql: &str) -> Vec<u8> {
    fleet.write(sql).await;
    fleet.record().await;
    fleet.publish().await;
    let mut messages = fleet.network.take("u1");
    assert_eq!(messages.len(), 1);
    messages.remove(0)
}

/// The count of refusals as the file holds it, read on a connection of
/// the host's own.
fn forged_in_file(fleet: &mut Fleet) -> u64 {
    let path = fleet.unit("u1").path.clone();
    let conn = rusqlite::Connection::open(path).unwrap();
    magic_sync::replica::status(&conn).unwrap().forged
}

/// A flood of forged frames is counted, and written to the till's file
/// once in a while, not once a frame.
#[tokio::test]
async fn a_flood_of_forged_frames_is_counted_without_a_write_each() {
    let mut fleet = shop().await;
    let genuine = next_for_u1(
        &mut fleet,
        "UPDATE products SET name = 'green tea' WHERE id = 1",
    )
    .await;
    let stranger = Signer::new(&[0x99; 32], Vec::new());
    let decoded = ToReplica::decode(genuine.as_slice()).unwrap();
    let forged = stranger.to_replica(&decoded);
    for _ in 0..500 {
        let outcome = fleet.unit("u1").replica.apply(&forged).unwrap();
        assert!(matches!(outcome, Outcome::Forged { .. }), "{outcome:?}");
    }
    assert_eq!(fleet.unit("u1").replica.status().unwrap().forged, 500);
    assert!(
        forged_in_file(&mut fleet) <= 1,
        "{} writes for 500 forged frames",
        forged_in_file(&mut fleet)
    );
    // The genuine one still applies; the replica closed writes the count.
    let outcome = fleet.unit("u1").replica.apply(&genuine).unwrap();
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
    let path = fleet.unit("u1").path.clone();
    fleet.restore("u1", path);
    assert_eq!(forged_in_file(&mut fleet), 500);
    fleet.sync().await;
    fleet.check().await;
}

/// The message's signature covers its endorsements: one added to a
/// genuine message, or a long list of junk, makes it a forgery.
#[tokio::test]
async fn a_genuine_message_with_endorsements_added_is_refused() {
    let mut fleet = shop().await;
    let genuine = next_for_u1(
        &mut fleet,
        "UPDATE products SET name = 'green tea' WHERE id = 1",
    )
    .await;
    let stranger = Signer::new(&[0x99; 32], Vec::new());
    let junk = |n: usize| {
        ToReplica {
            endorsements: vec![
                Endorsement {
                    key: stranger.public().to_bytes().to_vec(),
                    signature: vec![0; 64],
                };
                n
            ],
            ..ToReplica::default()
        }
        .encode_to_vec()
    };
    for n in [1, 64, 10_000] {
        let tampered = [genuine.as_slice(), &junk(n)].concat();
        let outcome = fleet.unit("u1").replica.apply(&tampered).unwrap();
        assert!(
            matches!(outcome, Outcome::Forged { .. }),
            "{n} endorsements added: {outcome:?}"
        );
    }
    let outcome = fleet.unit("u1").replica.apply(&genuine).unwrap();
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
    fleet.sync().await;
    fleet.check().await;
}

/// A host reads, through `Status`, the epoch and nonce its chain ends at
/// (what its acknowledgement names), and how many rows it wrote that the
/// server has not filed yet.
#[tokio::test]
async fn the_status_says_where_the_chain_ends_and_what_is_not_filed() {
    let mut fleet = shop().await;
    let ack = ack_of(&mut fleet, "u1");
    let status = fleet.unit("u1").replica.status().unwrap();
    assert_eq!(status.applied, Some(ack.number));
    assert_eq!(status.epoch, Some(ack.epoch.clone().into()));
    assert_eq!(status.nonce, Some(ack.nonce.clone()));
    assert_eq!(status.unfiled, 0);
    fleet
        .unit("u1")
        .replica
        .connection()
        .execute_batch(
            "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('s1', 'u1', 7, '1', 1), ('s2', 'u1', 7, '2', 1);
             UPDATE stock SET counted = 4 WHERE unit_id = 'u1'",
        )
        .unwrap();
    assert_eq!(fleet.unit("u1").replica.status().unwrap().unfiled, 3);
    // Sent and not answered yet: still not filed.
    fleet
        .unit("u1")
        .replica
        .upload(1 << 20, Duration::from_secs(3600))
        .unwrap()
        .expect("three rows go up");
    assert_eq!(fleet.unit("u1").replica.status().unwrap().unfiled, 3);
    fleet.upload(Duration::ZERO).await;
    let path = fleet.unit("u1").path.clone();
    let conn = rusqlite::Connection::open(path).unwrap();
    assert_eq!(magic_sync::replica::status(&conn).unwrap().unfiled, 0);
}
