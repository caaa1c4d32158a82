//! Connection floods: idle sockets by the thousand from one address, and
//! wrong secrets for a real replica's id from many. A real replica still
//! connects, within a stated time; an address that keeps failing waits,
//! longer each time; an id with no secret takes as long to refuse as a
//! wrong secret; and after a restart a replica that proved itself recently
//! is checked on a share of the hashing kept for it.

use crate::support::*;
use magic_sync_http::credentials::{Checked, Credentials, Hashes};
use magic_sync_http::server::{Security, Settings};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Error as WsError;

/// How long a real replica may take to connect through the flood.
const CONNECTS_WITHIN: Duration = Duration::from_secs(20);

/// A TCP connection to `to` from the loopback address `from`.
async fn from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

/// The status of an upgrade at `url` (listening on `to`) as `till` with
/// `secret`, from `address`.
async fn attempt(address: Ipv4Addr, to: SocketAddr, url: &str, till: &str, secret: &str) -> u16 {
    let Ok(tcp) = from(address, to).await else {
        return 0;
    };
    match tokio_tungstenite::client_async(request(url, till, secret), tcp).await {
        Ok(_) => 101,
        Err(WsError::Http(response)) => response.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_replica_connects_through_idle_sockets_and_wrong_secrets() {
    rlimit::increase_nofile_limit(40_000).unwrap();
    let settings = Settings {
        handshake_timeout: Duration::from_secs(30),
        ..hub_settings()
    };
    let mut server = server(&["t1"], settings, Security::Plain).await;
    // Another /24 than the replica's (127.0.0.1): its network's share is
    // its own.
    let idle_from = Ipv4Addr::new(127, 0, 1, 2);
    // 10,000 sockets that never say a word, all from one address: past
    // the address's share (1,000 by default) each is closed at once.
    let mut idle = Vec::new();
    for _ in 0..10_000 {
        if let Ok(socket) = from(idle_from, server.addr).await {
            idle.push(socket);
        }
    }
    assert!(idle.len() > 9_000, "{} sockets opened", idle.len());
    until(
        "the address's share held",
        Duration::from_secs(30),
        async || server.hub.connections() <= 1_000,
    )
    .await;
    // Wrong secrets for t1's id, from four addresses at once, over and over.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let statuses = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let guessing: Vec<_> = (10..14u8)
        .map(|last| {
            let (stop, statuses) = (stop.clone(), statuses.clone());
            let (addr, url) = (server.addr, server.url.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let address = Ipv4Addr::new(127, 0, 0, last);
                    let status =
                        attempt(address, addr, &url, "t1", "not the secret, but long").await;
                    statuses.lock().unwrap().push(status);
                }
            })
        })
        .collect();
    until(
        "the guessing to begin",
        Duration::from_secs(30),
        async || statuses.lock().unwrap().len() >= 20,
    )
    .await;
    let started = Instant::now();
    let t1 = server.replica("t1");
    until("t1 connected", CONNECTS_WITHIN, async || {
        server.hub.connected() == ["t1"]
    })
    .await;
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for guess in guessing {
        guess.await.unwrap();
    }
    let statuses = statuses.lock().unwrap().clone();
    assert!(!statuses.contains(&101), "a wrong secret was let in");
    let barred = statuses.iter().filter(|s| **s == 429).count();
    assert!(
        barred > statuses.len() / 2,
        "{barred} of {} guesses were barred",
        statuses.len()
    );
    eprintln!(
        "t1 connected in {took:?} through {} guesses",
        statuses.len()
    );
    until("t1 served", Duration::from_secs(30), async || {
        agrees(&server, "t1").await
    })
    .await;
    drop(idle);
    end(t1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_with_no_secret_costs_the_slow_hash_a_wrong_secret_does() {
    let server = server(&["t1"], hub_settings(), Security::Plain).await;
    // More checks than the rate of likely guesses lets through, which has
    // tests of its own.
    let credentials = Credentials::new(server._db.config()).with_general_rate(1_000.0, 1_000);
    // Each way in turn: every check, whether the id has a secret or not,
    // is refused alike after one slow hash on the general share. A guesser
    // cannot tell the ids that exist by the answer, nor by how many hashes
    // (and so how much time) the answer took. The time itself is a
    // benchmark's to measure; it is printed here only to be seen.
    let hashed = |hashes: Hashes| hashes.general + hashes.reserved;
    let (mut known, mut unknown) = (Duration::ZERO, Duration::ZERO);
    for round in 0..6 {
        for (id, took) in [("t1", &mut known), ("nobody", &mut unknown)] {
            let before = credentials.hashes();
            let started = Instant::now();
            assert_eq!(
                credentials
                    .check_from(id, "wrong but long enough", Default::default())
                    .await
                    .unwrap(),
                Checked::No,
                "{id}, round {round}"
            );
            *took += started.elapsed();
            assert_eq!(
                hashed(credentials.hashes()),
                hashed(before) + 1,
                "{id}, round {round}: one slow hash per check"
            );
        }
    }
    eprintln!(
        "six wrong secrets took {known:?} for an id with one, {unknown:?} for an id with none"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_a_replica_proved_recently_is_checked_beside_a_flood() {
    let server = server(&["t1"], hub_settings(), Security::Plain).await;
    let secret = server.secrets["t1"].clone();
    // Proved once: the database notes when.
    assert!(Credentials::new(server._db.config())
        .check("t1", &secret)
        .await
        .unwrap());
    // A restart: nothing is known in memory. Wrong secrets for unknown ids
    // fill the general share's queue (its rate raised so that they queue
    // rather than being refused at once).
    let restarted = std::sync::Arc::new(
        Credentials::new(server._db.config()).with_general_rate(1_000.0, 1_000),
    );
    let flood: Vec<_> = (0..300)
        .map(|i| {
            let credentials = restarted.clone();
            tokio::spawn(async move {
                let _ = credentials
                    .check(&format!("stranger-{i}"), "wrong but long enough")
                    .await;
            })
        })
        .collect();
    // Give the flood time to queue up behind the general share.
    until("the flood queued", Duration::from_secs(10), async || {
        flood.iter().filter(|f| f.is_finished()).count() >= 40
    })
    .await;
    let started = Instant::now();
    assert!(restarted.check("t1", &secret).await.unwrap());
    let took = started.elapsed();
    let left = flood.iter().filter(|f| !f.is_finished()).count();
    assert!(
        left > 100,
        "t1 was checked in {took:?}, but the flood ended first ({left} left)"
    );
    for f in flood {
        f.abort();
    }
}
