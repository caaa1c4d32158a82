//! What a replica sends is read only as fast as the relay takes it: a
//! replica that floods fills its own share of the hub's queue, and then the
//! hub stops reading it, while the others are still heard.

use crate::support::{hub_settings, raw, until, SCHEMA};
use futures_util::SinkExt;
use magic_sync::envelope::{Backlog, TableBacklog, Up};
use magic_sync::run::server::Reports;
use magic_sync_http::credentials::{self, Credentials};
use magic_sync_http::server::{serve, Hub, Security, Settings};
use prost::Message as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// An upload of about `bytes` bytes (a backlog naming a long table).
fn up_of(bytes: usize) -> Vec<u8> {
    Up {
        backlog: Some(Backlog {
            tables: vec![TableBacklog {
                table: "x".repeat(bytes),
                unsent: 1,
                unfiled: 0,
            }],
        }),
        ..Up::default()
    }
    .encode_to_vec()
}

/// A hub alone, without a relay (nothing takes what is queued until the
/// test does), with `settings`, and a secret for each of `tills`.
struct Alone {
    _db: magic_sync_testdb::TestDb,
    hub: Hub,
    url: String,
    secrets: Vec<String>,
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<magic_sync_http::Result<()>>,
}

async fn alone(settings: Settings, tills: &[&str]) -> Alone {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(SCHEMA).await.unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let mut secrets = Vec::new();
    for till in tills {
        secrets.push(credentials::issue(&client, till).await.unwrap());
    }
    let hub = Hub::new(settings, Credentials::new(db.config()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(serve(hub.clone(), listener, Security::Plain, async {
        let _ = stopped.await;
    }));
    Alone {
        _db: db,
        hub,
        url,
        secrets,
        stop,
        serving,
    }
}

impl Alone {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.serving.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_floods_is_read_only_as_fast_as_the_relay_takes_it() {
    const SHARE: usize = 256 << 10;
    let server = alone(
        Settings {
            max_queued_bytes: SHARE,
            max_queued_total: 4 * SHARE,
            // Not paced: this is about the queue.
            max_bytes_per_second: 1 << 30,
            idle_timeout: Duration::from_secs(30),
            ..hub_settings()
        },
        &["t1", "t2"],
    )
    .await;
    let (hub, url) = (server.hub.clone(), server.url.clone());
    let (flooder, other) = (server.secrets[0].clone(), server.secrets[1].clone());

    let frame = up_of(100 << 10);
    let sent = Arc::new(AtomicUsize::new(0));
    let mut t1 = raw(&url, "t1", &flooder).await.unwrap();
    let flood = {
        let (frame, sent) = (frame.clone(), sent.clone());
        tokio::spawn(async move {
            // 64 MiB, far past what the hub and the sockets between hold.
            for _ in 0..640 {
                if t1
                    .send(Message::Binary(frame.clone().into()))
                    .await
                    .is_err()
                {
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
            t1
        })
    };
    until("t1's share to fill", Duration::from_secs(30), async || {
        hub.queued("t1").1 + frame.len() > SHARE
    })
    .await;
    // The flood stalls: what t1 got off is what the hub holds plus what
    // the sockets' buffers hold, a small part of the flood.
    let stalled = async || {
        let before = sent.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        sent.load(Ordering::Relaxed) == before
    };
    until("the flood to stall", Duration::from_secs(30), stalled).await;
    assert!(
        sent.load(Ordering::Relaxed) < 200,
        "{} frames got off",
        sent.load(Ordering::Relaxed)
    );
    assert!(hub.queued("t1").1 <= SHARE, "{:?}", hub.queued("t1"));

    // Another replica is heard meanwhile.
    let mut t2 = raw(&url, "t2", &other).await.unwrap();
    t2.send(Message::Binary(up_of(10).into())).await.unwrap();
    until("t2 heard", Duration::from_secs(10), async || {
        hub.queued("t2").1 > 0
    })
    .await;
    let taken = hub.drain();
    assert!(taken.iter().any(|(r, _)| r == "t2"));
    assert!(taken.iter().filter(|(r, _)| r == "t1").count() * frame.len() <= SHARE + frame.len());

    // Once the relay takes what waits, t1 is read again, as far as its
    // share allows each time.
    let before = sent.load(Ordering::Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !flood.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the flood never got through"
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), hub.wait()).await;
        let taken = hub.drain();
        let of_t1 = taken.iter().filter(|(r, _)| r == "t1").count();
        assert!(
            of_t1 * frame.len() <= SHARE + frame.len(),
            "{of_t1} frames queued"
        );
    }
    assert_eq!(
        sent.load(Ordering::Relaxed),
        640,
        "from {before}, every frame went"
    );
    drop(t2);
    drop(flood.await.unwrap());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_read_no_faster_than_its_pace_after_a_burst() {
    const PACE: usize = 1 << 20;
    let server = alone(
        Settings {
            max_bytes_per_second: PACE,
            max_message_bytes: 256 << 10,
            idle_timeout: Duration::from_secs(30),
            ..hub_settings()
        },
        &["t1"],
    )
    .await;
    let (hub, url, secret) = (
        server.hub.clone(),
        server.url.clone(),
        server.secrets[0].clone(),
    );
    let taker = {
        let hub = hub.clone();
        tokio::spawn(async move {
            let mut frames = 0usize;
            while frames < 30 {
                hub.wait().await;
                frames += hub.drain().len();
            }
        })
    };
    let mut t1 = raw(&url, "t1", &secret).await.unwrap();
    let started = std::time::Instant::now();
    // 3 MB: a burst of 256 KiB, then a MiB a second.
    for _ in 0..30 {
        t1.send(Message::Binary(up_of(100 << 10).into()))
            .await
            .unwrap();
    }
    taker.await.unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(2), "3 MB read in {took:?}");
    drop(t1);
    server.stop().await;
}

#[tokio::test]
async fn a_frame_of_empty_entries_is_refused_before_it_is_decoded_and_the_others_are_heard() {
    let settings = Settings {
        max_message_bytes: 1 << 20,
        ..hub_settings()
    };
    let server = alone(settings, &["t1", "t2"]).await;
    let (hub, url) = (server.hub.clone(), server.url.clone());
    // 50,000 refusals of nothing: two bytes each sent, tens held decoded,
    // past what one report may carry.
    let forged = Up {
        refused: vec![magic_sync::envelope::Refused::default(); 50_000],
        ..Up::default()
    }
    .encode_to_vec();
    assert!(forged.len() < 1 << 20);
    let mut t1 = raw(&url, "t1", &server.secrets[0]).await.unwrap();
    t1.send(Message::Binary(forged.into())).await.unwrap();
    let (code, reason) = crate::support::reading(t1).closed().await;
    assert_eq!(code, 1008, "{reason}");
    assert!(reason.contains("refused before decoding"), "{reason}");
    assert_eq!(hub.queued("t1"), (0, 0), "nothing of it was queued");
    // Another replica is heard as ever.
    let mut t2 = raw(&url, "t2", &server.secrets[1]).await.unwrap();
    t2.send(Message::Binary(up_of(100).into())).await.unwrap();
    until(
        "t2's report to be heard",
        Duration::from_secs(30),
        async || hub.queued("t2").1 > 0,
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn a_replica_that_connects_again_is_read_at_the_pace_it_left_off_at() {
    // 16 KiB a second: one frame of 64 KiB is four seconds of reading.
    let server = alone(
        Settings {
            max_bytes_per_second: 16 << 10,
            max_message_bytes: 64 << 10,
            idle_timeout: Duration::from_secs(60),
            ..hub_settings()
        },
        &["t1"],
    )
    .await;
    let (hub, url, secret) = (
        server.hub.clone(),
        server.url.clone(),
        server.secrets[0].clone(),
    );
    let mut first = raw(&url, "t1", &secret).await.unwrap();
    first
        .send(Message::Binary(up_of(60 << 10).into()))
        .await
        .unwrap();
    until(
        "the first frame to be read",
        Duration::from_secs(30),
        async || hub.queued("t1").1 > 0,
    )
    .await;
    let paid = hub.paid_until("t1").expect("what it read is counted");
    let heard_first = hub.queued("t1").1;
    // Gone and back at once: the new connection owes what the old one read.
    drop(first);
    let mut again = raw(&url, "t1", &secret).await.unwrap();
    for _ in 0..2 {
        again
            .send(Message::Binary(up_of(100).into()))
            .await
            .unwrap();
    }
    until(
        "the second frame to be read",
        Duration::from_secs(30),
        async || hub.queued("t1").1 > heard_first,
    )
    .await;
    let each = hub.queued("t1").1 - heard_first;
    until(
        "the third frame to be read",
        Duration::from_secs(30),
        async || hub.queued("t1").1 >= heard_first + 2 * each,
    )
    .await;
    assert!(
        std::time::Instant::now() >= paid,
        "a frame after the first two was read before what the first connection read was paid for"
    );
    server.stop().await;
}

/// How long a hub reading `t1` at `pace` bytes a second, after a burst of
/// as much, takes to hear `frame` sent `times` over.
async fn read_at_pace(pace: usize, frame: &[u8], times: usize) -> Duration {
    let server = alone(
        Settings {
            max_bytes_per_second: pace,
            max_message_bytes: pace,
            idle_timeout: Duration::from_secs(30),
            ..hub_settings()
        },
        &["t1"],
    )
    .await;
    let hub = server.hub.clone();
    let mut t1 = raw(&server.url, "t1", &server.secrets[0]).await.unwrap();
    let started = std::time::Instant::now();
    for _ in 0..times {
        t1.send(Message::Binary(frame.to_vec().into()))
            .await
            .unwrap();
    }
    let mut heard = 0;
    while heard < times {
        hub.wait().await;
        heard += hub.drain().len();
    }
    let took = started.elapsed();
    drop(t1);
    server.stop().await;
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_frames_count_against_the_pace_as_frames_of_four_kib() {
    let tiny = up_of(10);
    assert!(tiny.len() < 100, "{} bytes", tiny.len());
    // 64 KiB a second and a burst of 64 KiB: sixteen frames at once, then
    // sixteen a second, however small they are. 48 frames of under 100
    // bytes: at their bytes, read at once; as frames of 4 KiB, 32 of them
    // past the burst, two seconds.
    let took = read_at_pace(64 << 10, &tiny, 48).await;
    assert!(
        took >= Duration::from_secs(2),
        "48 tiny frames read in {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_row_of_an_upload_counts_against_the_pace_as_a_kib() {
    use magic_sync::envelope::{RowData, UpRows};
    let empty = Up {
        send_id: vec![1; 16],
        tables: vec![UpRows {
            table: "sales".into(),
            rows: vec![RowData::default(); 512],
            gone: Vec::new(),
        }],
        ..Up::default()
    }
    .encode_to_vec();
    assert!(empty.len() < 4 << 10, "{} bytes", empty.len());
    // 256 KiB a second and a burst of 256 KiB: an upload of 512 empty rows
    // is a few KiB sent, and two seconds of reading. The third is read
    // three seconds after the first (at their bytes, at once).
    let took = read_at_pace(256 << 10, &empty, 3).await;
    assert!(
        took >= Duration::from_secs(2),
        "1,536 empty rows read in {took:?}"
    );
}
