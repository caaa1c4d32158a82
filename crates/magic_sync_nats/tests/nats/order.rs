//! A replica's messages reach its loop in the order the broker stored
//! them, though the replica may only fetch from the consumer the server
//! made: what a reader was handed and did not deal with comes first, before
//! anything sent after it.

use async_nats::jetstream;
use magic_sync::relay::Transport;
use magic_sync::run::replica::Link;
use magic_sync::run::Delivery;
use magic_sync::ReplicaId;
use magic_sync_nats::broker::{Broker, Settings};
use magic_sync_nats::mailbox::{self, Mailbox};
use magic_sync_testkit::nats::Nats;
use std::time::Duration;

/// The next `n` messages the mailbox hands its loop, as text.
fn next_messages(mailbox: &Mailbox, n: usize) -> Vec<String> {
    (0..n)
        .map(
            |_| match tokio::task::block_in_place(|| mailbox.next(Duration::from_secs(20))) {
                Delivery::Message(bytes) => String::from_utf8(bytes).unwrap(),
                other => panic!(
                    "expected a message, got {other:?}; last error {:?}",
                    mailbox.last_error()
                ),
            },
        )
        .collect()
}

async fn send(broker: &Broker, bodies: &[&str]) {
    let till = ReplicaId::from("till a".to_string());
    for body in bodies {
        broker
            .send(&till, &format!("id-{body}"), body.as_bytes().to_vec())
            .await
            .expect("the broker stores it");
    }
}

/// Till a's mailbox, whose requests for more lapse after two seconds.
fn open(nats: &Nats) -> Mailbox {
    Mailbox::open(mailbox::Settings {
        heartbeat: Duration::from_secs(1),
        ..mailbox::Settings::new(nats.url(), "till a", nats.seed("till a"))
    })
    .expect("settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_reader_that_died_was_handed_comes_first_and_in_order() {
    let nats = Nats::start(&["till a"]);
    let settings = Settings {
        replica_ack_wait: Duration::from_secs(2),
        ..Settings::new(nats.url())
    };
    let broker = Broker::connect(settings, nats.server.seed())
        .await
        .expect("the server connects");
    send(&broker, &["m1", "m2", "m3"]).await;

    // A reader with the replica's own credentials takes two and dies
    // without acknowledging them: they are the consumer's to hand again,
    // once its wait for their acknowledgement ends.
    {
        let client = async_nats::ConnectOptions::with_nkey(nats.seed("till a").to_string())
            .custom_inbox_prefix(magic_sync_nats::inbox_of("till a"))
            .connect(nats.url())
            .await
            .unwrap();
        let consumer: jetstream::consumer::PullConsumer = jetstream::new(client.clone())
            .get_consumer_from_stream(
                magic_sync_nats::CONSUMER,
                magic_sync_nats::stream_of("till a"),
            )
            .await
            .expect("the replica finds the consumer the server made");
        let mut taken = consumer.fetch().max_messages(2).messages().await.unwrap();
        for _ in 0..2 {
            futures_util::StreamExt::next(&mut taken)
                .await
                .expect("handed")
                .expect("a message");
        }
    }
    send(&broker, &["m4"]).await;

    // m3 and m4 are handed to the next reader before m1 and m2 come again;
    // its loop gets all four in the order they were sent.
    let mailbox = open(&nats);
    assert_eq!(next_messages(&mailbox, 4), ["m1", "m2", "m3", "m4"]);
    let quiet = tokio::task::block_in_place(|| mailbox.next(Duration::from_millis(50)));
    assert!(matches!(quiet, Delivery::Quiet), "{quiet:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailbox_that_closes_hands_back_what_its_loop_did_not_deal_with() {
    let nats = Nats::start(&["till a"]);
    let settings = Settings {
        // Only handing back brings them to the next reader in this test.
        replica_ack_wait: Duration::from_secs(600),
        ..Settings::new(nats.url())
    };
    let broker = Broker::connect(settings, nats.server.seed())
        .await
        .expect("the server connects");
    send(&broker, &["m1", "m2", "m3"]).await;
    let first = open(&nats);
    // Its loop took all three, and dealt with the first two (it came back
    // for the next one): those are acknowledged; m3 is not, when it closes.
    assert_eq!(next_messages(&first, 3), ["m1", "m2", "m3"]);
    drop(first);
    // Handed back, m3 reaches the next reader once the first one's request
    // for more lapsed, long before the broker would hand it again by
    // itself; m1 and m2 are gone from the stream.
    let second = open(&nats);
    assert_eq!(next_messages(&second, 1), ["m3"]);
    let quiet = tokio::task::block_in_place(|| second.next(Duration::from_millis(50)));
    assert!(matches!(quiet, Delivery::Quiet), "{quiet:?}");
}
