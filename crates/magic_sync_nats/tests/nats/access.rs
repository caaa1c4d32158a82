//! A replica holding its own credentials on the broker cannot read another
//! replica's messages, nor speak as it: the broker refuses, and the server
//! hears only what each said on its own subject.

use crate::heard;
use async_nats::jetstream;
use magic_sync::relay::Transport;
use magic_sync::run::Report;
use magic_sync::ReplicaId;
use magic_sync_nats::broker::{Broker, Settings};
use magic_sync_testkit::nats::Nats;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Connects as `replica` with `seed`, its inbox under `inbox`, noting every
/// error the broker sends back.
async fn connect_as(
    nats: &Nats,
    seed: &str,
    inbox: &str,
) -> (async_nats::Client, Arc<Mutex<Vec<String>>>) {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let noted = errors.clone();
    let client = async_nats::ConnectOptions::with_nkey(seed.to_string())
        .custom_inbox_prefix(inbox)
        .request_timeout(Some(Duration::from_secs(2)))
        .event_callback(move |event| {
            let noted = noted.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    noted.lock().unwrap().push(e.to_string());
                }
            }
        })
        .connect(nats.url())
        .await
        .expect("a replica connects with its own credentials");
    (client, errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_its_own_credentials_cannot_read_another_s_messages_nor_speak_as_it() {
    let nats = Nats::start(&["till a", "till b"]);
    let broker = Broker::connect(Settings::new(nats.url()), nats.server.seed())
        .await
        .expect("the server connects");
    let b = ReplicaId::from("till b".to_string());
    broker
        .send(&b, "e-1-n", b"for till b only".to_vec())
        .await
        .expect("the broker keeps b's message");

    // a, as itself, reaching for b's subject and b's stream.
    let (a, errors) = connect_as(
        &nats,
        nats.seed("till a"),
        &magic_sync_nats::inbox_of("till a"),
    )
    .await;
    let mut snooping = a
        .subscribe(magic_sync_nats::down_subject("till b"))
        .await
        .expect("the client sends the subscription");
    let js = jetstream::new(a.clone());
    let stream = magic_sync_nats::stream_of("till b");
    let consumer = js
        .create_consumer_on_stream(
            jetstream::consumer::pull::Config {
                durable_name: Some(magic_sync_nats::CONSUMER.to_string()),
                ..Default::default()
            },
            &stream,
        )
        .await;
    assert!(consumer.is_err(), "a made a consumer of b's stream");
    let info = js.get_stream(&stream).await;
    assert!(info.is_err(), "a read b's stream's state");
    // Speaking as b: refused by the broker, never stored.
    a.publish(
        magic_sync_nats::up_subject("till b"),
        report_bytes(1).into(),
    )
    .await
    .unwrap();
    // Then as itself: what it says on its own subject is heard, as its own.
    a.publish(
        magic_sync_nats::up_subject("till a"),
        report_bytes(2).into(),
    )
    .await
    .unwrap();
    a.flush().await.unwrap();
    let reports = heard(&broker).await;
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].0.as_str(), "till a");
    assert!(
        matches!(&reports[0].1, Report::Applied(ack) if ack.number == 2),
        "{reports:?}"
    );
    // The broker said no to the subscription and to the publish, and the
    // subscription never saw b's message (sent again now that it is open).
    broker
        .send(&b, "e-2-n", b"for till b only, again".to_vec())
        .await
        .unwrap();
    let seen = tokio::time::timeout(
        Duration::from_millis(500),
        futures_util::StreamExt::next(&mut snooping),
    )
    .await;
    assert!(
        !matches!(seen, Ok(Some(_))),
        "a read a message of b's subject"
    );
    let errors = errors.lock().unwrap().clone();
    let violations = |what: &str| {
        errors
            .iter()
            .filter(|e| e.contains("ermissions") && e.contains(what))
            .count()
    };
    assert!(violations("Subscription") >= 1, "{errors:?}");
    assert!(violations("Publish") >= 1, "{errors:?}");

    // With its own inbox prefix set to b's, a cannot even ask: the broker
    // refuses it the inbox.
    let (borrowed, errors) = connect_as(
        &nats,
        nats.seed("till a"),
        &magic_sync_nats::inbox_of("till b"),
    )
    .await;
    let asked = jetstream::new(borrowed)
        .create_consumer_on_stream(
            jetstream::consumer::pull::Config {
                durable_name: Some(magic_sync_nats::CONSUMER.to_string()),
                ..Default::default()
            },
            &magic_sync_nats::stream_of("till a"),
        )
        .await;
    assert!(asked.is_err(), "answered in another's inbox");
    assert!(
        errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains("ermissions")),
        "{:?}",
        errors.lock().unwrap()
    );

    // And b's message waits for b, whole.
    let stored = jetstream::new(broker.client().clone())
        .get_stream(&stream)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap();
    assert_eq!(stored.state.messages, 2);
}

/// An acknowledgement of message `number`, as a replica says it.
fn report_bytes(number: u64) -> Vec<u8> {
    Report::Applied(magic_sync::envelope::Ack {
        number,
        ..Default::default()
    })
    .encode()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_lets_in_the_replicas_enrolled_and_not_those_revoked() {
    use magic_sync_nats::access::{self, Access, Credentials};
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let server = Credentials::issue();
    let first = access::enrol(&client, "till 1").await.unwrap();
    let kept = access::enrol(&client, "till 2").await.unwrap();
    // Enrolled again: the new key replaces the old.
    let second = access::enrol(&client, "till 1").await.unwrap();
    assert!(access::revoke(&client, "till 2").await.unwrap());
    assert!(!access::revoke(&client, "till 2").await.unwrap());
    let block = Access::read(&client, server.public_key())
        .await
        .unwrap()
        .authorization();
    assert!(block.contains(second.public_key()), "{block}");
    assert!(
        !block.contains(first.public_key()),
        "replaced, and still let in"
    );
    assert!(
        !block.contains(kept.public_key()),
        "revoked, and still let in"
    );
    for secret in [first.seed(), second.seed(), kept.seed()] {
        assert!(!block.contains(secret));
    }
    let stored: String = client
        .query_one(
            "SELECT string_agg(public_key, ' ') FROM sync.broker_keys",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // A user's public key begins with `U`, its seed with `SU`; either may
    // hold `SU` further on, by chance of its base32.
    for key in stored.split(' ') {
        assert!(key.starts_with('U'), "not a public key: {key}");
    }
    for secret in [first.seed(), second.seed(), kept.seed()] {
        assert!(!stored.contains(secret), "a seed was kept: {stored}");
    }
    // And the broker started with that block lets in exactly those.
    let nats = Nats::start_with(&block);
    let connect = |seed: &str| {
        async_nats::ConnectOptions::with_nkey(seed.to_string())
            .custom_inbox_prefix(magic_sync_nats::inbox_of("till 1"))
            .connect(nats.url())
    };
    assert!(connect(second.seed()).await.is_ok());
    assert!(connect(first.seed()).await.is_err(), "an old key connected");
    assert!(
        connect(kept.seed()).await.is_err(),
        "a revoked key connected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailbox_given_another_replica_s_seed_says_so() {
    use magic_sync_nats::mailbox::{Mailbox, Settings as MailboxSettings};
    let nats = Nats::start(&["till a", "till b"]);
    let broker = Broker::connect(Settings::new(nats.url()), nats.server.seed())
        .await
        .unwrap();
    broker.prepare("till a").await.unwrap();
    // Till a's id with till b's seed: the broker lets the connection in
    // (the seed is b's) and refuses it a's subjects.
    let mailbox = Mailbox::open(MailboxSettings::new(
        nats.url(),
        "till a",
        nats.seed("till b"),
    ))
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let why = loop {
        if let Some(why) = mailbox.last_error() {
            if why.contains("enrolled") {
                break why;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never said why: {:?}",
            mailbox.last_error()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        why.contains("is this seed the one enrolled for `till a`?"),
        "{why}"
    );
    assert!(why.contains("ermissions"), "{why}");
    assert!(
        !why.contains(nats.seed("till b")),
        "the seed printed: {why}"
    );
}

/// Whether `errors` holds the broker's refusal to publish to a subject
/// beginning with `subject`.
fn refused_publish(errors: &Arc<Mutex<Vec<String>>>, subject: &str) -> bool {
    errors
        .lock()
        .unwrap()
        .iter()
        .any(|e| e.contains("ermissions") && e.contains("Publish") && e.contains(subject))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cannot_make_a_consumer_so_none_delivers_onto_another_s_subject() {
    use jetstream::consumer::{push, AckPolicy};
    let nats = Nats::start(&["till a", "till b"]);
    let broker = Broker::connect(Settings::new(nats.url()), nats.server.seed())
        .await
        .expect("the server connects");
    let a = ReplicaId::from("till a".to_string());
    broker
        .send(&a, "e-1-n", b"for till a".to_vec())
        .await
        .expect("the broker keeps a's message");
    let stream = magic_sync_nats::stream_of("till a");

    // a, as itself, on its own stream: a push consumer whose deliver
    // subject is b's upload subject would have a's messages heard as b's
    // reports, and fill b's share of the upload stream. The broker checks
    // a deliver subject against nobody's permissions, so the replica may
    // not make a consumer at all, of any kind, by any of the API's names.
    let (client, errors) = connect_as(
        &nats,
        nats.seed("till a"),
        &magic_sync_nats::inbox_of("till a"),
    )
    .await;
    let js = jetstream::new(client.clone());
    let pushed = js
        .create_consumer_on_stream(
            push::Config {
                durable_name: Some("onto-b".to_string()),
                deliver_subject: magic_sync_nats::up_subject("till b"),
                ack_policy: AckPolicy::Explicit,
                ..Default::default()
            },
            &stream,
        )
        .await;
    assert!(
        pushed.is_err(),
        "a made a consumer delivering onto b's subject"
    );
    assert!(
        refused_publish(&errors, "$JS.API.CONSUMER.CREATE"),
        "{:?}",
        errors.lock().unwrap()
    );
    // Under the name of its own consumer, too.
    let named = js
        .create_consumer_on_stream(
            push::Config {
                durable_name: Some(magic_sync_nats::CONSUMER.to_string()),
                deliver_subject: magic_sync_nats::up_subject("till b"),
                ack_policy: AckPolicy::Explicit,
                ..Default::default()
            },
            &stream,
        )
        .await;
    assert!(named.is_err(), "a made its own consumer a push consumer");
    assert!(
        refused_publish(
            &errors,
            &format!(
                "$JS.API.CONSUMER.CREATE.{stream}.{}",
                magic_sync_nats::CONSUMER
            )
        ),
        "{:?}",
        errors.lock().unwrap()
    );
    // Through the older API names: durable, and without a name.
    let body = format!(
        r#"{{"stream_name":"{stream}","config":{{"durable_name":"x","deliver_subject":"{}","ack_policy":"explicit"}}}}"#,
        magic_sync_nats::up_subject("till b")
    );
    for subject in [
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.x"),
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
    ] {
        let asked = client.request(subject.clone(), body.clone().into()).await;
        assert!(asked.is_err(), "{subject} answered: {asked:?}");
        assert!(
            refused_publish(&errors, &subject),
            "{subject}: {:?}",
            errors.lock().unwrap()
        );
    }
    // Nor may it take away the consumer the server made for it.
    let removed = js
        .delete_consumer_from_stream(magic_sync_nats::CONSUMER, &stream)
        .await;
    assert!(removed.is_err(), "a removed its consumer");
    assert!(
        refused_publish(&errors, "$JS.API.CONSUMER.DELETE"),
        "{:?}",
        errors.lock().unwrap()
    );

    // The one consumer of a's stream is the server's: it delivers only to
    // whoever asks (a pull consumer), and holds a's message for a.
    let server = jetstream::new(broker.client().clone());
    let mut kept = server.get_stream(&stream).await.unwrap();
    assert_eq!(kept.info().await.unwrap().state.consumer_count, 1);
    let info = kept
        .consumer_info(magic_sync_nats::CONSUMER)
        .await
        .expect("the server made a's consumer");
    assert_eq!(info.config.deliver_subject, None, "{info:?}");
    assert_eq!(info.num_pending, 1, "{info:?}");
}
