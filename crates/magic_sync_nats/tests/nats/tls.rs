//! TLS to the broker: both sides reach a broker that requires it when they
//! trust its certificate, and a side that trusts another certificate never
//! connects, so nothing it would read or say crosses the network to the
//! wrong party.

use magic_sync::relay::Transport;
use magic_sync::run::replica::Link;
use magic_sync::run::{Delivery, Report};
use magic_sync::ReplicaId;
use magic_sync_nats::broker::{self, Broker};
use magic_sync_nats::mailbox::{self, Mailbox};
use magic_sync_testkit::nats::Nats;
use std::time::{Duration, Instant};

/// Mailbox settings for `replica` of `nats`, trusting `certificate`.
fn reading(nats: &Nats, replica: &str, certificate: &std::path::Path) -> mailbox::Settings {
    mailbox::Settings {
        trust: Some(certificate.to_path_buf()),
        ..mailbox::Settings::new(nats.url(), replica, nats.seed(replica))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_reach_a_broker_that_requires_tls_through_the_certificate_they_trust() {
    let nats = Nats::start_tls(&["till a"]);
    let certificate = nats.certificate.clone().expect("a TLS broker");
    assert!(nats.url().starts_with("tls://"), "{}", nats.url());

    let broker = Broker::connect(
        broker::Settings {
            trust: Some(certificate.clone()),
            ..broker::Settings::new(nats.url())
        },
        nats.server.seed(),
    )
    .await
    .expect("the server connects over TLS");
    let till = ReplicaId::from("till a".to_string());
    broker
        .send(&till, "e-1-n", b"a message over TLS".to_vec())
        .await
        .expect("the broker stores it");

    let mailbox = Mailbox::open(reading(&nats, "till a", &certificate)).expect("settings");
    let delivery = tokio::task::block_in_place(|| mailbox.next(Duration::from_secs(20)));
    match delivery {
        Delivery::Message(bytes) => assert_eq!(bytes, b"a message over TLS"),
        other => panic!(
            "expected the message, got {other:?}; last error {:?}",
            mailbox.last_error()
        ),
    }
    // And back up, over the same encrypted link.
    mailbox.report(Report::Applied(magic_sync::envelope::Ack {
        number: 1,
        ..Default::default()
    }));
    let heard = crate::heard(&broker).await;
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert_eq!(heard[0].0, till);
    assert!(matches!(&heard[0].1, Report::Applied(ack) if ack.number == 1));
    assert_eq!(mailbox.last_error(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_that_trusts_another_certificate_never_connects_and_says_why() {
    let nats = Nats::start_tls(&["till a"]);
    // A certificate of another broker, trusted by mistake (or a broker
    // impersonated): neither side may talk to this one.
    let other = Nats::start_tls(&[]);
    let wrong = other.certificate.clone().expect("a TLS broker");

    let refused = Broker::connect(
        broker::Settings {
            trust: Some(wrong.clone()),
            ..broker::Settings::new(nats.url())
        },
        nats.server.seed(),
    )
    .await
    .expect_err("the server refuses a broker it does not trust");
    assert!(
        refused.to_string().to_lowercase().contains("certificate"),
        "{refused}"
    );
    assert!(refused.to_string().contains("`trust`"), "{refused}");

    let mailbox = Mailbox::open(reading(&nats, "till a", &wrong)).expect("settings");
    // It keeps trying; wait for it to have said why it cannot read.
    let deadline = Instant::now() + Duration::from_secs(20);
    let why = loop {
        if let Some(why) = mailbox.last_error() {
            break why;
        }
        assert!(Instant::now() < deadline, "no error said in 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(why.to_lowercase().contains("certificate"), "{why}");
    assert!(why.contains("`trust`"), "says where to look: {why}");
    assert!(!mailbox.is_reading());
    assert!(
        matches!(
            tokio::task::block_in_place(|| mailbox.next(Duration::from_millis(200))),
            Delivery::Quiet
        ),
        "nothing arrives from a broker not trusted"
    );

    // A side with no trust file of its own checks the broker against the
    // system's roots, which do not know a self-signed broker either.
    let system = Broker::connect(broker::Settings::new(nats.url()), nats.server.seed()).await;
    assert!(
        system.is_err(),
        "a self-signed broker passed the system's roots"
    );
}

#[test]
fn a_trust_file_that_cannot_serve_is_refused_up_front_with_its_path() {
    let seed = magic_sync_nats::access::Credentials::issue()
        .seed()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate").unwrap();
    for (path, says) in [(&missing, "cannot be read"), (&empty, "no PEM certificate")] {
        let settings = mailbox::Settings {
            trust: Some(path.clone()),
            ..mailbox::Settings::new("tls://127.0.0.1:4222", "till a", &seed)
        };
        let err = Mailbox::open(settings).expect_err("refused");
        let err = err.to_string();
        assert!(err.contains(says), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
}

#[tokio::test]
async fn the_server_too_refuses_plain_nats_to_another_machine_unless_told() {
    let seed = magic_sync_nats::access::Credentials::issue()
        .seed()
        .to_string();
    // Refused before any connection is tried: 192.0.2.1 is an address for
    // documentation, which nothing answers.
    let err = Broker::connect(broker::Settings::new("nats://192.0.2.1:4222"), &seed)
        .await
        .expect_err("plain to another machine");
    let err = err.to_string();
    assert!(
        err.contains("in the clear") && err.contains("tls://"),
        "{err}"
    );
    let err = Broker::connect(broker::Settings::new("https://192.0.2.1"), &seed)
        .await
        .expect_err("not NATS");
    assert!(err.to_string().contains("not a nats:// or tls://"), "{err}");
}
