//! A replica believes only its server: what is not signed by the key it
//! pins (or a newer key that key endorsed) applies nothing, moves no chain,
//! lets go of no row, and is counted.

use crate::support::*;
use magic_sync::envelope::ToReplica;
use magic_sync::replica::{Error, Forgery, Outcome};
use magic_sync::sign::Signer;

/// A key the replica was never given.
fn stranger() -> Signer {
    Signer::new(&[0x99; 32], Vec::new())
}

#[test]
fn an_unsigned_message_or_one_signed_by_another_key_applies_nothing() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    let ack = replica.ack();
    let wipe = server.down(vec![deletes("products", &[1])]);

    let unsigned = prost::Message::encode_to_vec(&wipe);
    assert_eq!(
        replica.apply(&unsigned).unwrap(),
        Outcome::Forged {
            why: Forgery::Unsigned
        }
    );
    let outcome = replica.apply(&stranger().to_replica(&wipe)).unwrap();
    assert!(
        matches!(
            outcome,
            Outcome::Forged {
                why: Forgery::BadSignature { .. }
            }
        ),
        "{outcome:?}"
    );

    assert_eq!(products(&replica), vec![(1, "tea".into(), None)]);
    assert_eq!(replica.ack(), ack);
    let status = replica.status().unwrap();
    assert_eq!(status.forged, 2);
    assert!(
        status
            .last_forgery
            .as_deref()
            .unwrap()
            .contains("does not verify"),
        "{status:?}"
    );
    // The real message, signed, applies as the next one.
    apply_all(&mut replica, &[wipe]);
    assert!(products(&replica).is_empty());
}

#[test]
fn a_forged_snapshot_neither_writes_nor_wipes() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    let before = replica.status().unwrap();
    // An attacker who knows the replica's chain makes a whole snapshot: a
    // row of its own, and an end that wipes what it did not name.
    let mut forger = Server::new();
    forger.new_epoch();
    for message in forger.whole_snapshot(vec![upserts(&[product(66, "forged")])], &["products"]) {
        let outcome = replica.apply(&stranger().to_replica(&message)).unwrap();
        assert!(matches!(outcome, Outcome::Forged { .. }), "{outcome:?}");
    }
    assert_eq!(products(&replica), vec![(1, "tea".into(), None)]);
    let after = replica.status().unwrap();
    assert_eq!(
        (after.applied, after.snapshot_began),
        (before.applied, before.snapshot_began)
    );
    assert_eq!(after.forged, 2);
    apply_all(
        &mut replica,
        &[server.down(vec![upserts(&[product(2, "coffee")])])],
    );
    assert_eq!(live_products(&replica), vec![1, 2]);
}

#[test]
fn a_forged_high_number_does_not_make_real_messages_duplicates() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    let real = server.down(vec![upserts(&[product(2, "coffee")])]);
    let high = ToReplica {
        number: u64::MAX >> 1,
        ..real.clone()
    };
    // Unsigned, signed by another key, or the real signature over another
    // number: each is judged before its number is.
    let mut resigned = bytes(&real);
    let tampered = stranger().to_replica(&high);
    for forged in [prost::Message::encode_to_vec(&high), tampered] {
        assert!(matches!(
            replica.apply(&forged).unwrap(),
            Outcome::Forged { .. }
        ));
    }
    // The real signature moved onto the high number's head.
    let high_head = bytes(&high);
    let cut = |b: &[u8]| b.len() - 64 - 2;
    resigned.splice(
        ..cut(&resigned),
        high_head[..cut(&high_head)].iter().copied(),
    );
    assert!(matches!(
        replica.apply(&resigned).unwrap(),
        Outcome::Forged { .. }
    ));
    assert_eq!(
        replica.apply(&bytes(&real)).unwrap(),
        Outcome::Applied {
            number: real.number,
            refused: 0,
            purged: 0
        }
    );
    assert_eq!(live_products(&replica), vec![1, 2]);
}

#[test]
fn a_forged_answer_lets_go_of_nothing() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    apply_all(
        &mut replica,
        &server.whole_snapshot(vec![upserts(&[product(1, "tea")])], &["products"]),
    );
    record_sale(&replica, "s1", 1);
    let up = replica
        .upload(1 << 20, std::time::Duration::from_secs(3600))
        .unwrap()
        .expect("the sale goes up");
    let send_id = up.send_id.clone();

    let forged = stranger().filed(UNIT, send_id.clone());
    let err = replica.filed(&forged).expect_err("not the server's");
    assert!(matches!(err, Error::Forged { .. }), "{err}");
    let unsigned = magic_sync::envelope::Filed {
        send_id: send_id.clone(),
        ..Default::default()
    };
    assert!(matches!(
        replica.filed(&unsigned),
        Err(Error::Forged {
            why: Forgery::Unsigned,
            ..
        })
    ));
    // The server's answer to another replica's send of the same id.
    let elsewhere = signer().filed("unit-2", send_id.clone());
    assert!(replica.filed(&elsewhere).is_err());
    assert_eq!(replica.status().unwrap().forged, 3);

    // Nothing was let go of before the server's own answer.
    assert_eq!(replica.filed(&answer(&send_id)).unwrap(), 1);
}

#[test]
fn a_replica_follows_a_rotated_key_and_then_refuses_the_old_one() {
    let (site, mut replica, mut server) = provisioned_with_tea();
    let old = signer();
    let seed = [0x52; 32];
    let new_public = Signer::new(&seed, Vec::new()).public();
    let new = Signer::new(&seed, vec![old.endorse(&new_public)]);

    let first = server.down(vec![upserts(&[product(2, "coffee")])]);
    let outcome = replica.apply(&new.to_replica(&first)).unwrap();
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
    assert_eq!(replica.server_key(), Some(new_public));

    // An old key's message now is a replay, or a stolen key: refused.
    let second = server.down(vec![upserts(&[product(3, "cake")])]);
    assert!(matches!(
        replica.apply(&old.to_replica(&second)).unwrap(),
        Outcome::Forged { .. }
    ));
    assert_eq!(replica.apply(&new.to_replica(&second)).unwrap(), {
        Outcome::Applied {
            number: second.number,
            refused: 0,
            purged: 0,
        }
    });

    // Opened again, and given the key it was enrolled with, it still
    // follows the new one; a key of another server is refused.
    drop(replica);
    let mut replica = site.open();
    assert_eq!(replica.server_key(), Some(new_public));
    let err = replica
        .trust(&stranger().public())
        .expect_err("another server's key");
    assert!(matches!(err, Error::OtherServer { .. }), "{err}");
    assert_eq!(live_products(&replica), vec![1, 2, 3]);
}

#[test]
fn a_replica_that_pins_no_key_believes_nothing() {
    let site = Site::new();
    let mut replica = site.bare();
    let mut server = Server::new();
    let snapshot = server.snapshot(vec![upserts(&[product(1, "tea")])]);
    let err = replica.apply(&bytes(&snapshot)).expect_err("no key pinned");
    assert!(matches!(err, Error::NoServerKey), "{err}");
    assert!(err.to_string().contains("Replica::trust"), "{err}");
    assert_eq!(
        err.handling(),
        magic_sync::replica::Handling::Stop,
        "a setup mistake stops the replica's loop"
    );
    assert!(products(&replica).is_empty());
}
