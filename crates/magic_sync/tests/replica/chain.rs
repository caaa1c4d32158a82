//! Which messages apply: the chain, duplicates, gaps, epochs, the wrong
//! replica, and messages that are not messages at all.

use crate::support::*;
use magic_sync::chain::Break;
use magic_sync::envelope::{Ack, Gap, ToReplica};
use magic_sync::replica::Error;
use magic_sync::replica::{Forgery, Outcome};

#[test]
fn a_message_applies_and_is_acknowledged_as_it_came() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    assert_eq!(replica.ack(), None, "nothing applied yet");

    let first = server.snapshot(vec![upserts(&[product(1, "tea"), product(2, "jam")])]);
    let outcome = replica.apply(&bytes(&first)).expect("applies");
    assert_eq!(
        outcome,
        Outcome::Applied {
            number: first.number,
            refused: 0,
            purged: 0
        }
    );
    assert_eq!(live_products(&replica), vec![1, 2]);

    let second = server.down(vec![upserts(&[product(1, "green tea")])]);
    replica.apply(&bytes(&second)).expect("applies");
    assert_eq!(products(&replica)[0].1, "green tea");
    let expected = Ack {
        reads_batches: true,
        epoch: second.epoch.clone(),
        number: second.number,
        nonce: second.nonce.clone(),
        seal: second.seal.clone(),
        answered: 0,
        receipt: None,
    };
    assert_eq!(replica.ack(), Some(expected.clone()));
    assert!(
        magic_sync::seal::verify(
            SECRET,
            UNIT,
            &expected.epoch,
            magic_sync::MessageNo::from_wire(expected.number).unwrap(),
            &expected.nonce,
            &expected.seal
        ),
        "the seal given back is the server's own"
    );

    drop(replica);
    let reopened = site.open();
    assert_eq!(reopened.ack(), Some(expected), "the ack survives a restart");
}

#[test]
fn a_message_delivered_twice_changes_nothing() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    let first = server.snapshot(vec![upserts(&[product(1, "tea")])]);
    let second = server.down(vec![upserts(&[product(1, "green tea")])]);
    let third = server.down(vec![upserts(&[product(1, "black tea")])]);
    apply_all(&mut replica, &[first.clone(), second.clone(), third]);
    let ack = replica.ack();

    for again in [&second, &first] {
        let outcome = replica.apply(&bytes(again)).expect("is no error");
        assert_eq!(
            outcome,
            Outcome::Duplicate {
                number: again.number
            }
        );
    }
    assert_eq!(products(&replica), vec![(1, "black tea".into(), None)]);
    assert_eq!(replica.ack(), ack, "the last applied is still the newest");
}

#[test]
fn a_skipped_message_opens_a_gap_that_only_a_snapshot_closes() {
    let (site, mut replica, mut server) = provisioned_with_tea();
    let ack = replica.ack();

    let lost = server.down(vec![upserts(&[product(2, "jam")])]);
    let after_lost = server.down(vec![upserts(&[product(3, "honey")])]);
    let outcome = replica.apply(&bytes(&after_lost)).expect("is no error");
    assert_eq!(
        outcome,
        Outcome::Gap {
            newest: after_lost.number,
            why: Break::NotNext
        }
    );
    assert_eq!(
        replica.gap(),
        Some(Gap {
            epoch: server.epoch.clone(),
            number: after_lost.number
        })
    );

    // The lost message arriving late applies nothing either: the replica waits
    // for the snapshot it asked for.
    let outcome = replica.apply(&bytes(&lost)).expect("is no error");
    assert_eq!(
        outcome,
        Outcome::Gap {
            newest: after_lost.number,
            why: Break::InGap
        }
    );
    assert_eq!(live_products(&replica), vec![1]);
    assert_eq!(replica.ack(), ack);
    drop(replica);
    let mut replica = site.open();
    assert!(replica.gap().is_some(), "the gap survives a restart");

    let snapshot = server.whole_snapshot(
        vec![upserts(&[
            product(1, "tea"),
            product(2, "jam"),
            product(3, "honey"),
        ])],
        &["products"],
    );
    apply_all(&mut replica, &snapshot);
    assert_eq!(replica.gap(), None);
    assert_eq!(live_products(&replica), vec![1, 2, 3]);
    let next = server.down(vec![upserts(&[product(4, "bread")])]);
    apply_all(&mut replica, &[next]);
}

#[test]
fn a_wrong_previous_nonce_is_a_gap() {
    let (_site, mut replica, mut server) = provisioned_with_tea();

    // What a server restored from an older copy sends: the right number, but
    // a nonce the replica never saw before it.
    let mut forged = server.down(vec![upserts(&[product(1, "coffee")])]);
    forged.previous_nonce = vec![0; 16];
    let outcome = replica.apply(&bytes(&forged)).expect("is no error");
    assert!(matches!(
        outcome,
        Outcome::Gap {
            why: Break::NotNext,
            ..
        }
    ));
    assert_eq!(products(&replica), vec![(1, "tea".into(), None)]);
}

#[test]
fn another_epoch_begins_with_a_snapshot_or_is_a_gap() {
    let (_site, mut replica, mut server) = provisioned_with_tea();

    server.new_epoch();
    let plain = server.down(vec![upserts(&[product(2, "jam")])]);
    let outcome = replica.apply(&bytes(&plain)).expect("is no error");
    assert!(matches!(
        outcome,
        Outcome::Gap {
            why: Break::OtherEpoch,
            ..
        }
    ));
    assert_eq!(live_products(&replica), vec![1]);

    let snapshot = server.whole_snapshot(vec![upserts(&[product(2, "jam")])], &["products"]);
    apply_all(&mut replica, &snapshot);
    assert_eq!(live_products(&replica), vec![2]);
    assert_eq!(replica.ack().map(|a| a.epoch), Some(server.epoch.clone()));
}

#[test]
fn a_fresh_replica_waits_for_a_snapshot() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    let plain = server.down(vec![upserts(&[product(1, "tea")])]);
    let outcome = replica.apply(&bytes(&plain)).expect("is no error");
    assert!(matches!(
        outcome,
        Outcome::Gap {
            why: Break::NothingApplied,
            ..
        }
    ));
    assert_eq!(live_products(&replica), Vec::<i64>::new());
}

#[test]
fn a_message_for_another_replica_is_refused() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    server.replica = "unit-2".into();
    let message = server.snapshot(vec![upserts(&[product(1, "tea")])]);
    let outcome = replica.apply(&bytes(&message)).expect("is no error");
    assert_eq!(
        outcome,
        Outcome::WrongReplica {
            replica: "unit-2".into()
        }
    );
    assert_eq!(live_products(&replica), Vec::<i64>::new());
    assert_eq!(replica.ack(), None);
    assert_eq!(
        replica.gap(),
        None,
        "another replica's message opens no gap"
    );
}

#[test]
fn a_malformed_message_applies_nothing_and_says_what_is_wrong() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    let ack = replica.ack();

    // Bytes that are no message cannot be the server's: judged by their
    // signature before anything else, they are refused as forged.
    let garbage = [0xFF, 0xFF, 0xFF, 0xFF];
    let outcome = replica.apply(&garbage).expect("judged");
    assert!(
        matches!(
            &outcome,
            Outcome::Forged {
                why: Forgery::Layout { .. }
            }
        ),
        "{outcome:?}"
    );

    let good = server.down(vec![upserts(&[product(1, "coffee")])]);
    let whole = bytes(&good);
    let outcome = replica.apply(&whole[..whole.len() - 5]).expect("judged");
    assert!(matches!(outcome, Outcome::Forged { .. }), "{outcome:?}");
    assert_eq!(replica.status().unwrap().forged, 2);

    // Signed by the server but not applicable as it is: what is wrong is said.

    let bodiless = ToReplica {
        body: None,
        ..good.clone()
    };
    let err = replica.apply(&bytes(&bodiless)).expect_err("has no body");
    let text = err.to_string();
    assert!(
        matches!(&err, Error::Malformed { number, .. } if *number == good.number),
        "{err}"
    );
    assert!(text.contains("no body") && text.contains(UNIT), "{text}");

    let no_epoch = ToReplica {
        epoch: Vec::new(),
        ..good.clone()
    };
    let err = replica.apply(&bytes(&no_epoch)).expect_err("has no epoch");
    assert!(err.to_string().contains("no epoch"), "{err}");

    assert_eq!(products(&replica), vec![(1, "tea".into(), None)]);
    assert_eq!(replica.ack(), ack);
    assert_eq!(replica.gap(), None);
    // The real message still applies: nothing malformed moved the chain.
    apply_all(&mut replica, &[good]);
    assert_eq!(products(&replica), vec![(1, "coffee".into(), None)]);
}
