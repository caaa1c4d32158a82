//! The replica's loop acts on each failure's kind (`Error::handling`):
//! what it is about is held back (a message, a digest, an answer), and
//! what keeps going goes on; a failure only the host can end stops the
//! loop, and the replica's status says why.

use crate::support::*;
use magic_sync::envelope::{to_replica::Body, Down, ToReplica, Up};
use magic_sync::replica::{LinkErrorKind, UplinkError};
use magic_sync::run::replica::{Incoming, Link, Uploads};
use magic_sync::run::{Delivery, Report};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Quiet turns after which a link closes by itself: a loop that never
/// says what the test waits for fails it rather than hang it.
const QUIET_TURNS: usize = 500;

/// What the test waits for: of what the loop said, and of the uploads it
/// tried.
type Done = dyn Fn(&[Report], usize) -> bool + Send + Sync;

/// A link the test feeds: what it is given, in order, then quiet until
/// what the loop said and tried to send up holds what the test waits for
/// (`done`); then it closes. It keeps what the loop said and sent up.
struct Scripted {
    incoming: Incoming,
    done: Box<Done>,
    said: Mutex<Vec<Report>>,
    sent_up: Mutex<Vec<Up>>,
    quiet: AtomicUsize,
    /// Uploads the loop tried.
    tried: AtomicUsize,
    /// What the link says to every upload, when it takes none.
    uplink: Option<UplinkError>,
}

impl Scripted {
    fn new(
        deliveries: Vec<Delivery>,
        done: impl Fn(&[Report], usize) -> bool + Send + Sync + 'static,
    ) -> Self {
        let incoming = Incoming::default();
        let feed = incoming.feed();
        for d in deliveries {
            feed.send(d).unwrap();
        }
        Scripted {
            incoming,
            done: Box::new(done),
            said: Mutex::default(),
            sent_up: Mutex::default(),
            quiet: AtomicUsize::new(0),
            tried: AtomicUsize::new(0),
            uplink: None,
        }
    }

    /// The numbers of the messages the loop said it applied, in order.
    fn applied(&self) -> Vec<u64> {
        applied(&self.said.lock().unwrap())
    }

    fn close_when_done(&self) {
        let said = self.said.lock().unwrap();
        if (self.done)(&said, self.tried.load(Ordering::Relaxed)) {
            let _ = self.incoming.feed().send(Delivery::Closed);
        }
    }

    /// What the loop has not taken of what it was given.
    fn left(&self) -> Vec<Delivery> {
        let mut left = Vec::new();
        loop {
            match self.incoming.next(Duration::ZERO) {
                Delivery::Quiet | Delivery::Closed => return left,
                other => left.push(other),
            }
        }
    }
}

impl Link for Scripted {
    fn max_message_bytes(&self) -> usize {
        1 << 20
    }

    fn next(&self, timeout: Duration) -> Delivery {
        match self.incoming.next(timeout) {
            Delivery::Quiet if self.quiet.fetch_add(1, Ordering::Relaxed) >= QUIET_TURNS => {
                Delivery::Closed
            }
            delivery => delivery,
        }
    }

    fn report(&self, report: Report) {
        self.said.lock().unwrap().push(report);
        self.close_when_done();
    }

    fn upload(&self, up: &Up) -> Result<(), UplinkError> {
        self.tried.fetch_add(1, Ordering::Relaxed);
        self.close_when_done();
        if let Some(e) = &self.uplink {
            return Err(e.clone());
        }
        self.sent_up.lock().unwrap().push(up.clone());
        Ok(())
    }
}

fn applied(said: &[Report]) -> Vec<u64> {
    said.iter()
        .filter_map(|r| match r {
            Report::Applied(ack) => Some(ack.number),
            _ => None,
        })
        .collect()
}

/// Quick to try again, and quick to look: the tests wait on what the loop
/// says, never on the clock.
fn uploads() -> Uploads {
    Uploads {
        every: Duration::from_millis(10),
        backoff_min: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
        ..Uploads::default()
    }
}

fn message(m: &ToReplica) -> Delivery {
    Delivery::Message(bytes(m))
}

#[test]
fn what_cannot_be_applied_as_it_is_is_skipped_and_what_comes_after_it_applies() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    // The server's, and numbered 0: it cannot be applied as it is.
    let malformed = ToReplica {
        replica: UNIT.into(),
        epoch: server.epoch.clone(),
        number: 0,
        nonce: vec![0x5A; 4],
        body: Some(Body::Down(Down::default())),
        ..ToReplica::default()
    };
    let coffee = server.down(vec![upserts(&[product(2, "coffee")])]);
    // Not the server's: signed by a key the replica does not trust.
    let stranger = magic_sync::sign::Signer::new(&[0x77; 32], Vec::new());
    let last = coffee.number;
    let link = Scripted::new(
        vec![
            message(&malformed),
            Delivery::Filed(stranger.filed(UNIT, b"a send".to_vec())),
            message(&coffee),
        ],
        move |said, _| applied(said).contains(&last),
    );
    magic_sync::run::replica::replica_with(&mut replica, &link, &uploads())
        .expect("nothing here stops the loop");
    assert_eq!(link.applied(), [coffee.number]);
    assert_eq!(live_products(&replica), [1, 2]);
    let status = replica.status().unwrap();
    assert_eq!(status.forged, 1, "the answer was refused, and counted");
    assert_eq!(status.stopped, None);
}

#[test]
fn a_digest_that_cannot_be_read_is_not_told_and_holds_back_no_message() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    // The host wrote a stock row whose unit is no UTF-8 text: the digest
    // cannot read its key.
    replica
        .connection()
        .execute(
            "INSERT INTO stock (unit_id, product_id, on_hand) VALUES (CAST(x'FF' AS TEXT), 1, 0)",
            [],
        )
        .unwrap();
    let coffee = server.down(vec![upserts(&[product(2, "coffee")])]);
    let milk = server.down(vec![upserts(&[product(3, "milk")])]);
    let last = milk.number;
    let link = Scripted::new(vec![message(&coffee), message(&milk)], move |said, _| {
        applied(said).contains(&last)
    });
    let every_turn = Uploads {
        digest_every: Duration::ZERO,
        ..uploads()
    };
    magic_sync::run::replica::replica_with(&mut replica, &link, &every_turn)
        .expect("a digest that cannot be read is set aside, not the loop");
    assert_eq!(link.applied(), [coffee.number, milk.number]);
    assert_eq!(live_products(&replica), [1, 2, 3]);
    let digests = link
        .said
        .lock()
        .unwrap()
        .iter()
        .filter(|r| matches!(r, Report::Upload(up) if up.digest.is_some()))
        .count();
    assert_eq!(digests, 0, "no digest of what it cannot read");
}

#[test]
fn a_message_that_failed_on_what_may_pass_is_applied_again_before_what_came_after_it() {
    let scenario = fail::FailScenario::setup();
    let (_site, mut replica, mut server) = provisioned_with_tea();
    let coffee = server.down(vec![upserts(&[product(2, "coffee")])]);
    let milk = server.down(vec![upserts(&[product(3, "milk")])]);
    let last = milk.number;
    let link = Scripted::new(vec![message(&coffee), message(&milk)], move |said, _| {
        applied(said).contains(&last)
    });
    // Applied, then the process "dies" before it says so: a failure that
    // may pass (Handling::Retry), once.
    fail::cfg("replica-after-apply", "1*return").unwrap();
    magic_sync::run::replica::replica_with(&mut replica, &link, &uploads())
        .expect("what may pass is tried again, not the loop's end");
    assert_eq!(
        link.applied(),
        [coffee.number, milk.number],
        "the message held back is said before the one behind it"
    );
    assert_eq!(live_products(&replica), [1, 2, 3]);
    assert_eq!(replica.status().unwrap().gap, None, "nothing was dropped");
    scenario.teardown();
}

#[test]
fn a_replica_that_pins_no_key_stops_its_loop_takes_nothing_more_and_says_why() {
    let site = Site::new();
    let mut replica = site.bare();
    let mut server = Server::new();
    let snapshot = server.whole_snapshot(vec![upserts(&[product(1, "tea")])], &["products"]);
    let link = Scripted::new(snapshot.iter().map(message).collect(), |_, _| false);
    let err = magic_sync::run::replica::replica_with(&mut replica, &link, &uploads())
        .expect_err("only its host can pin the key");
    assert!(
        matches!(err, magic_sync::replica::Error::NoServerKey),
        "{err}"
    );
    assert!(products(&replica).is_empty());
    assert!(link.applied().is_empty());
    assert_eq!(
        link.left(),
        [message(&snapshot[1])],
        "what came after is left to the link"
    );
    let stopped = replica
        .status()
        .unwrap()
        .stopped
        .expect("the status says why");
    assert!(stopped.contains("Replica::trust"), "{stopped}");

    // Once its host gives it the key, the loop runs again, and its status
    // no longer says it stopped.
    replica.trust(&signer().public()).unwrap();
    let end = snapshot[1].number;
    let link = Scripted::new(snapshot.iter().map(message).collect(), move |said, _| {
        applied(said).contains(&end)
    });
    magic_sync::run::replica::replica_with(&mut replica, &link, &uploads()).unwrap();
    assert_eq!(live_products(&replica), [1]);
    assert_eq!(replica.status().unwrap().stopped, None);
}

#[test]
fn a_database_that_fails_stops_the_loop_and_skips_no_message() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    let coffee = server.down(vec![upserts(&[product(2, "coffee")])]);
    let milk = server.down(vec![upserts(&[product(3, "milk")])]);
    let link = Scripted::new(vec![message(&coffee), message(&milk)], |_, _| false);
    // The file takes no writes: not the message's fault, nor one that
    // passes by waiting.
    replica
        .connection()
        .pragma_update(None, "query_only", true)
        .unwrap();
    let err = magic_sync::run::replica::replica_with(&mut replica, &link, &uploads())
        .expect_err("the replica's own database is its host's to mend");
    assert!(
        matches!(err, magic_sync::replica::Error::Sqlite(_)),
        "{err}"
    );
    assert_eq!(err.handling(), magic_sync::replica::Handling::Stop);
    assert_eq!(link.left(), [message(&milk)], "nothing after it was taken");
    assert!(replica.status().unwrap().stopped.is_some());

    // Mended, the message it stopped on applies, and no gap opened.
    replica
        .connection()
        .pragma_update(None, "query_only", false)
        .unwrap();
    let last = milk.number;
    let link = Scripted::new(vec![message(&coffee), message(&milk)], move |said, _| {
        applied(said).contains(&last)
    });
    magic_sync::run::replica::replica_with(&mut replica, &link, &uploads()).unwrap();
    assert_eq!(live_products(&replica), [1, 2, 3]);
    assert_eq!(replica.status().unwrap().gap, None);
}

#[test]
fn a_transport_that_refuses_the_replica_stops_its_loop_and_its_writes_wait() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    record_sale(&replica, "s1", 1);
    let coffee = server.down(vec![upserts(&[product(2, "coffee")])]);
    let link = Scripted {
        uplink: Some(UplinkError::misconfigured(
            "the broker refused this replica a subject: is its seed the one enrolled?",
        )),
        ..Scripted::new(vec![message(&coffee)], |_, _| false)
    };
    let err = magic_sync::run::replica::replica_with(&mut replica, &link, &uploads())
        .expect_err("only the transport's operator can end it");
    assert!(
        matches!(err, magic_sync::replica::Error::Transport(ref e) if e.kind == LinkErrorKind::Misconfigured),
        "{err}"
    );
    assert_eq!(err.handling(), magic_sync::replica::Handling::Stop);
    assert_eq!(link.applied(), [coffee.number], "what came first applied");
    assert!(link.sent_up.lock().unwrap().is_empty());
    let status = replica.status().unwrap();
    assert_eq!(status.unfiled, 1, "the sale waits, noted");
    assert!(
        status
            .stopped
            .unwrap()
            .contains("is its seed the one enrolled?"),
        "the transport's words, where the host looks"
    );

    // Out of reach instead, the sale waits and the loop goes on.
    let sandwich = server.down(vec![upserts(&[product(3, "sandwich")])]);
    let last = sandwich.number;
    let link = Scripted {
        uplink: Some(UplinkError::unreachable("no signal")),
        // It has applied the message, and tried to send the sale since.
        ..Scripted::new(vec![message(&sandwich)], move |said, tried| {
            applied(said).contains(&last) && tried > 0
        })
    };
    magic_sync::run::replica::replica_with(&mut replica, &link, &uploads()).unwrap();
    assert_eq!(live_products(&replica), [1, 2, 3]);
    assert_eq!(replica.status().unwrap().unfiled, 1);
}
