//! A replica that keeps asking to be provisioned again (a gap, an
//! acknowledgement the server cannot take, a digest that differs) waits
//! longer each time: `provision_asked_every` (10 s), doubled for each such
//! snapshot since it last went an hour without asking, up to an hour. The
//! pace is the relay's, in the record: a reconnection does not reset it.

use crate::{ack_of, says, settle, shop, waiting};
use magic_sync::envelope::Gap;
use magic_sync::run::Report;
use magic_sync_testkit::fleet::Fleet;

/// u1 reports a gap: it asks to be provisioned again.
async fn u1_asks(fleet: &mut Fleet) {
    let ack = ack_of(fleet, "u1");
    let gap = Gap {
        epoch: ack.epoch,
        number: ack.number + 1,
    };
    says(fleet, "u1", vec![Report::Gap(gap)]).await;
    assert!(waiting(fleet).await.contains("u1"));
}

/// Moves u1's last asked snapshot `seconds` into the past: the time the
/// test does not wait.
async fn age(fleet: &Fleet, seconds: i64) {
    fleet
        .write(&format!(
            "UPDATE sync.replicas SET asked_at = asked_at - interval '{seconds} seconds' WHERE id = 'u1'"
        ))
        .await;
}

/// Whether u1's snapshot begins now.
async fn begins(fleet: &mut Fleet) -> bool {
    let step = fleet.record().await;
    let begun = step.provisioned.iter().any(|r| r == "u1");
    fleet.deliver().await;
    begun
}

#[tokio::test]
async fn a_replica_that_keeps_asking_waits_longer_each_time() {
    let mut fleet = shop().await;
    // The first: at once. The second: 10 s after.
    u1_asks(&mut fleet).await;
    assert!(begins(&mut fleet).await, "the first at once");
    settle(&mut fleet).await;
    u1_asks(&mut fleet).await;
    age(&fleet, 5).await;
    assert!(!begins(&mut fleet).await, "5 s after the first");
    age(&fleet, 6).await;
    assert!(begins(&mut fleet).await, "11 s after the first");
    settle(&mut fleet).await;
    // The third waits 20 s, the fourth 40 s: a reconnected relay keeps the pace.
    u1_asks(&mut fleet).await;
    age(&fleet, 15).await;
    assert!(!begins(&mut fleet).await, "15 s after the second");
    fleet.reconnect().await;
    assert!(
        !begins(&mut fleet).await,
        "a relay reconnected keeps the pace"
    );
    age(&fleet, 6).await;
    assert!(begins(&mut fleet).await, "21 s after the second");
    settle(&mut fleet).await;
    u1_asks(&mut fleet).await;
    age(&fleet, 39).await;
    assert!(!begins(&mut fleet).await, "39 s after the third");
    age(&fleet, 2).await;
    assert!(begins(&mut fleet).await, "41 s after the third");
    settle(&mut fleet).await;
    // Up to an hour at most.
    fleet
        .write("UPDATE sync.replicas SET asked_times = 30 WHERE id = 'u1'")
        .await;
    u1_asks(&mut fleet).await;
    age(&fleet, 3599).await;
    assert!(!begins(&mut fleet).await, "just under an hour");
    age(&fleet, 2).await;
    assert!(begins(&mut fleet).await, "an hour");
    settle(&mut fleet).await;
    // An hour without asking, and the pace starts again from 10 s.
    age(&fleet, 3601).await;
    u1_asks(&mut fleet).await;
    assert!(begins(&mut fleet).await, "after an hour of quiet, at once");
    settle(&mut fleet).await;
    u1_asks(&mut fleet).await;
    age(&fleet, 11).await;
    assert!(begins(&mut fleet).await, "and the next 10 s after");
    settle(&mut fleet).await;
    fleet.check().await;
}

/// The others are provisioned when they ask, whatever u1's pace.
#[tokio::test]
async fn one_replica_s_pace_holds_back_no_other() {
    let mut fleet = shop().await;
    fleet
        .write("UPDATE sync.replicas SET asked_times = 30, asked_at = now() WHERE id = 'u1'")
        .await;
    for unit in ["u1", "u2"] {
        let ack = ack_of(&mut fleet, unit);
        let gap = Gap {
            epoch: ack.epoch,
            number: ack.number + 1,
        };
        says(&mut fleet, unit, vec![Report::Gap(gap)]).await;
    }
    let step = fleet.record().await;
    assert_eq!(step.provisioned, vec!["u2".to_string()]);
    fleet.deliver().await;
    settle(&mut fleet).await;
}
