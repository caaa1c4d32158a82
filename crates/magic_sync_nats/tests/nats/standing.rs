//! Where a replica stands on the broker, as the server asks it: messages
//! waiting, and whether anything reads them through the replica's consumer
//! and acknowledges what it was handed. It tells a replica that does not
//! read (it did not start, or cannot connect) from one that reads and is
//! slow.

use magic_sync::relay::Transport;
use magic_sync::run::replica::Link;
use magic_sync::run::{Delivery, Report};
use magic_sync::ReplicaId;
use magic_sync_nats::broker::{self, Broker, Inspector, Standing};
use magic_sync_nats::mailbox::{self, Mailbox};
use magic_sync_testkit::nats::Nats;
use std::future::Future;
use std::time::{Duration, Instant};

/// What `read` gives once `holds` it; fails after 20 s with the last.
async fn once<F: Future<Output = Standing>>(
    mut read: impl FnMut() -> F,
    holds: impl Fn(&Standing) -> bool,
) -> Standing {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let standing = read().await;
        if holds(&standing) {
            return standing;
        }
        assert!(
            Instant::now() < deadline,
            "never came to pass: {standing:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_says_whether_a_replica_reads_its_messages_and_acknowledges_them() {
    let nats = Nats::start(&["till a"]);
    let settings = broker::Settings::new(nats.url());
    let broker = Broker::connect(settings.clone(), nats.server.seed())
        .await
        .expect("the server connects");
    let till = || async {
        broker
            .inspector()
            .standing("till a")
            .await
            .expect("the broker answers")
    };

    let missing = broker
        .inspector()
        .standing("till b")
        .await
        .expect("the broker answers");
    assert_eq!((missing.waiting, &missing.consumer), (None, &None));
    assert!(missing.to_string().starts_with("no stream"), "{missing}");

    let id = ReplicaId::from("till a".to_string());
    for (message, body) in [("e-1-n", "first"), ("e-2-n", "second")] {
        broker
            .send(&id, message, body.as_bytes().to_vec())
            .await
            .expect("the broker stores it");
    }
    // The server made the replica's consumer with its stream; nothing
    // asks it for messages yet.
    let unread = till().await;
    assert_eq!(unread.waiting, Some(2), "{unread}");
    let r = unread.consumer.as_ref().expect("the server's consumer");
    assert_eq!(
        (r.asking, r.handed_up_to, r.yet_to_hand),
        (0, 0, 2),
        "{unread}"
    );
    assert!(
        unread.to_string().contains("nothing reads it now"),
        "{unread}"
    );
    // A connection that only asks sees the same, and takes nothing.
    let inspector = Inspector::connect(&settings, nats.server.seed())
        .await
        .expect("the inspector connects");
    assert_eq!(inspector.standing("till a").await.unwrap(), unread);

    // Handed over, and not acknowledged until the replica comes back for
    // the next one.
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
    let reading = once(till, |s| {
        s.consumer.as_ref().is_some_and(|r| r.handed_up_to == 2)
    })
    .await;
    let r = reading.consumer.as_ref().expect("read");
    assert_eq!((r.not_acknowledged, r.yet_to_hand), (2, 0), "{reading}");
    assert!(r.asking > 0, "{reading}");
    assert!(!reading.to_string().contains("nothing reads"), "{reading}");

    // Dealt with both: nothing waits.
    let second = tokio::task::block_in_place(|| mailbox.next(Duration::from_secs(20)));
    assert!(
        matches!(&second, Delivery::Message(b) if b == b"second"),
        "{second:?}"
    );
    let quiet = tokio::task::block_in_place(|| mailbox.next(Duration::from_millis(50)));
    assert!(matches!(quiet, Delivery::Quiet), "{quiet:?}");
    // The broker counts the acknowledgement on the consumer and lets go of
    // the message in the stream one after the other: both, in time.
    once(till, |s| {
        s.consumer.as_ref().is_some_and(|r| r.not_acknowledged == 0) && s.waiting == Some(0)
    })
    .await;

    // The other way: a report the server was handed and has not drained
    // stays the server's until it is.
    mailbox.report(Report::Applied(magic_sync::envelope::Ack {
        number: 2,
        ..Default::default()
    }));
    let uploads = || async {
        broker
            .inspector()
            .uploads_standing()
            .await
            .expect("the broker answers")
    };
    once(uploads, |s| {
        s.consumer.as_ref().is_some_and(|r| r.not_acknowledged == 1)
    })
    .await;
    assert_eq!(crate::heard(&broker).await.len(), 1);
    // Drained and let go of, in time: it never comes to pass otherwise.
    once(uploads, |s| {
        s.consumer.as_ref().is_some_and(|r| r.not_acknowledged == 0) && s.waiting == Some(0)
    })
    .await;
}
