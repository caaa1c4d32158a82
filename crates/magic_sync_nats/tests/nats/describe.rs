//! What the broker holds for a replica, as the server reads it: messages
//! waiting, and whether a consumer reads them and acknowledges what it was
//! handed. The line tells a replica that never reads (it did not start, or
//! cannot connect) from one that reads and is slow.

use magic_sync::relay::Transport;
use magic_sync::run::replica::Link;
use magic_sync::run::{Delivery, Report};
use magic_sync::ReplicaId;
use magic_sync_nats::broker::{self, Broker};
use magic_sync_nats::mailbox::{self, Mailbox};
use magic_sync_testkit::nats::Nats;
use std::time::{Duration, Instant};

/// `describe` once it holds `wanted`; fails after 20 s with what it said.
async fn once_it_says(broker: &Broker, wanted: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let said = broker.describe("till a").await.expect("the broker answers");
        if said.contains(wanted) {
            return said;
        }
        assert!(Instant::now() < deadline, "never said {wanted:?}: {said}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_says_whether_a_replica_reads_its_messages_and_acknowledges_them() {
    let nats = Nats::start(&["till a"]);
    let broker = Broker::connect(broker::Settings::new(nats.url()), nats.server.seed())
        .await
        .expect("the server connects");
    let missing = broker.describe("till b").await.expect("the broker answers");
    assert!(missing.starts_with("no stream"), "{missing}");

    let till = ReplicaId::from("till a".to_string());
    for (id, body) in [("e-1-n", "first"), ("e-2-n", "second")] {
        broker
            .send(&till, id, body.as_bytes().to_vec())
            .await
            .expect("the broker stores it");
    }
    let unread = broker.describe("till a").await.expect("the broker answers");
    assert!(unread.starts_with("2 messages waiting"), "{unread}");
    assert!(unread.contains("no consumer reads it"), "{unread}");

    // Handed over and not yet acknowledged: the replica has not come back
    // for the next one.
    let mailbox = Mailbox::open(mailbox::Settings::new(
        nats.url(),
        "till a",
        nats.seed("till a"),
    ))
    .expect("settings");
    let first = tokio::task::block_in_place(|| mailbox.next(Duration::from_secs(20)));
    assert!(
        matches!(&first, Delivery::Message(b) if b == b"first"),
        "{first:?}"
    );
    let reading = once_it_says(&broker, "handed up to #2").await;
    assert!(reading.contains("2 of them not acknowledged"), "{reading}");

    // Dealt with both: nothing waits.
    let second = tokio::task::block_in_place(|| mailbox.next(Duration::from_secs(20)));
    assert!(
        matches!(&second, Delivery::Message(b) if b == b"second"),
        "{second:?}"
    );
    let quiet = tokio::task::block_in_place(|| mailbox.next(Duration::from_millis(50)));
    assert!(matches!(quiet, Delivery::Quiet), "{quiet:?}");
    let done = once_it_says(&broker, "0 of them not acknowledged").await;
    assert!(done.starts_with("0 messages waiting"), "{done}");

    // The other way: a report the server was handed and has not drained.
    mailbox.report(Report::Applied(magic_sync::envelope::Ack {
        number: 2,
        ..Default::default()
    }));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let said = broker.describe_uploads().await.expect("the broker answers");
        if said.contains("1 of them not yet drained") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the report was never handed: {said}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(crate::heard(&broker).await.len(), 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let said = broker.describe_uploads().await.expect("the broker answers");
        if said.starts_with("0 reports waiting") && said.contains("0 of them not yet drained") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a drained report still waits: {said}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
