//! What a connection that is no replica's yet can cost (issue 41, items 3
//! and 8): an id that cannot be a replica's is refused before anything is
//! looked up and counts against its party; a party barred costs no lookup;
//! connections are bounded per network as well as per address; and a party
//! that failed lately is checked on the general share of the hashing, not
//! on the one kept for replicas proved lately. A head larger than any
//! replica's is refused before it is parsed whole.

use crate::support::*;
use magic_sync_http::credentials::{self, Credentials, Standing};
use magic_sync_http::server::{Security, Settings};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Attempts from `address` as `till` with a wrong secret until one is
/// barred: the statuses before it were all 401.
async fn until_barred(server: &Server, address: Ipv4Addr, till: &str) {
    for _ in 0..12 {
        match attempt(server, address, till, "not the secret, but long").await {
            (429, _) => return,
            (401, _) => {}
            other => panic!("from {address} as {till}: {other:?}"),
        }
    }
    panic!("{address} was never barred");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_that_cannot_be_a_replica_s_is_refused_before_any_lookup_and_counts_against_its_party(
) {
    let mut server = server(&["t1"], hub_settings(), Security::Plain).await;
    let stranger = Ipv4Addr::new(127, 0, 3, 1);
    // While no secret can be looked up, an id that cannot be one is still
    // answered: nothing was looked up for it.
    credentials_away(&server, true).await;
    // Longer than an id may be, within the head the hub reads.
    let long = "x".repeat(4 << 10);
    for id in [
        "t\0x",
        "t\u{1b}]0;owned\u{7}",
        "t\nx",
        long.as_str(),
        "\u{85}",
    ] {
        let (status, body) = attempt(&server, stranger, id, "whatever it is, long").await;
        assert_eq!(status, 401, "{id:.20?}: {body}");
        assert!(
            body.starts_with("an id that cannot be a replica's"),
            "{id:.20?}: {body}"
        );
    }
    credentials_away(&server, false).await;
    // Five of them bar the party, as five wrong secrets would: a real id
    // from it waits, and costs no hash.
    let (status, body) = attempt(&server, stranger, "t1", "not the secret, but long").await;
    assert_eq!(status, 429, "{body}");
    // A replica elsewhere is let in as ever, on the same connection to the
    // database.
    let t1 = server.replica("t1");
    until("t1 served", Duration::from_secs(60), async || {
        agrees(&server, "t1").await
    })
    .await;
    assert_eq!(t1.0.connects(), 1, "{:?}", t1.0.last_error());
    end(t1);
    server.stop().await;
}

/// The backends a client connected with `name` holds on the database.
async fn backends(client: &tokio_postgres::Client, name: &str) -> Vec<i32> {
    client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY pid",
            &[&name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_postgresql_refuses_for_its_data_fails_that_check_alone_and_keeps_the_connection()
{
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let secret = credentials::issue(&client, "t1").await.unwrap();
    let name = "magic_sync credentials under test";
    let mut config = db.config();
    config.application_name(name);
    let checker = Credentials::new(config);
    assert!(checker.check("t1", &secret).await.unwrap());
    let before = backends(&client, name).await;
    assert_eq!(before.len(), 1, "{before:?}");
    // PostgreSQL's text holds no NUL: the lookup is refused (22021), which
    // says nothing of the connection.
    assert!(!checker
        .check("t\0x", "whatever it is, long")
        .await
        .expect("refused, not failed"));
    assert!(checker.check("t1", &secret).await.unwrap());
    assert_eq!(backends(&client, name).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barred_party_costs_no_lookup_and_a_secret_proved_before_still_gets_in() {
    let mut server = server(&["t1"], hub_settings(), Security::Plain).await;
    let secret = server.secrets["t1"].clone();
    let (guesser, neighbour) = (Ipv4Addr::new(127, 0, 4, 1), Ipv4Addr::new(127, 0, 4, 2));
    assert_eq!(attempt(&server, guesser, "t1", &secret).await.0, 101);
    until_barred(&server, guesser, "t1").await;
    // No secret can be looked up now: a barred party is answered all the
    // same, having cost nothing; a party that is not barred is looked up,
    // and told the check cannot be made.
    credentials_away(&server, true).await;
    let (status, body) = attempt(&server, guesser, "t1", "not the secret, but long").await;
    assert_eq!(status, 429, "{body}");
    let (status, body) = attempt(&server, guesser, "t9", "not the secret, but long").await;
    assert_eq!(status, 429, "{body}");
    let (status, body) = attempt(&server, neighbour, "t1", "not the secret, but long").await;
    assert_eq!(
        (status, body.as_str()),
        (503, "cannot check credentials now")
    );
    credentials_away(&server, false).await;
    // The secret the hub proved before is let in, barred or not: a replica
    // is not locked out by whoever shares its address.
    assert_eq!(attempt(&server, guesser, "t1", &secret).await.0, 101);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_bounded_per_network_as_well_as_per_address() {
    let settings = Settings {
        max_connections_per_address: 2,
        max_connections_per_network: 3,
        // Far longer than the test waits for a connection to be closed.
        handshake_timeout: Duration::from_secs(60),
        ..hub_settings()
    };
    let mut server = server(&[], settings, Security::Plain).await;
    let mut held = Vec::new();
    for last in [1, 1, 2] {
        held.push(
            from(Ipv4Addr::new(127, 0, 7, last), server.addr)
                .await
                .unwrap(),
        );
    }
    until("three counted", Duration::from_secs(10), async || {
        server.hub.connections() == 3
    })
    .await;
    // The /24 has its three: another of its addresses is closed at once.
    let mut fourth = from(Ipv4Addr::new(127, 0, 7, 3), server.addr)
        .await
        .unwrap();
    let (said, _) = until_closed(&mut fourth, Instant::now(), Duration::from_secs(10)).await;
    assert_eq!(said, "");
    // Another /24 is not.
    held.push(
        from(Ipv4Addr::new(127, 0, 8, 1), server.addr)
            .await
            .unwrap(),
    );
    until("four counted", Duration::from_secs(10), async || {
        server.hub.connections() == 4
    })
    .await;
    drop(held);
    until("none left", Duration::from_secs(10), async || {
        server.hub.connections() == 0
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_party_that_failed_lately_is_checked_on_the_general_share_even_for_a_real_id() {
    // Proved once: the database notes when.
    let (db, secret) = proved_once().await;
    // After a restart, nothing in memory.
    let restarted = Credentials::new(db.config());
    let suspect = Standing {
        barred: None,
        suspect: true,
    };
    assert_eq!(
        check(&restarted, "t1", "not the secret, but long", suspect).await,
        (credentials::Checked::No, (1, 0))
    );
    // The replica itself, from a party with nothing against it, is checked
    // on the share kept for it.
    assert_eq!(
        check(&restarted, "t1", &secret, Standing::default()).await,
        (credentials::Checked::Yes, (1, 1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_larger_than_any_replica_s_is_refused_before_it_is_read_whole() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut server = server(&["t1"], hub_settings(), Security::Plain).await;
    let stranger = Ipv4Addr::new(127, 0, 4, 1);
    // 300 KB of credentials: hyper's default head would take them whole.
    let credentials = "x".repeat(300_000);
    let mut tcp = from(stranger, server.addr).await.unwrap();
    let head = format!(
        "GET {} HTTP/1.1\r\nHost: hub\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Authorization: Basic {credentials}\r\n\r\n",
        magic_sync_http::PATH
    );
    // The hub may close before all of it is written.
    let _ = tcp.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431"),
        "answered {:.200}",
        answer
    );
    // A replica is let in as ever.
    let t1 = server.replica("t1");
    until("t1 served", Duration::from_secs(60), async || {
        agrees(&server, "t1").await
    })
    .await;
    end(t1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_general_share_begins_so_many_hashes_a_second_and_the_reserved_one_still_checks() {
    let (db, secret) = proved_once().await;
    // Two hashes, then none for a long while.
    let restarted = Credentials::new(db.config()).with_general_rate(0.001, 2);
    for _ in 0..2 {
        let checked = restarted
            .check_from("nobody", "not the secret, but long", Standing::default())
            .await
            .unwrap();
        assert_eq!(checked, credentials::Checked::No);
    }
    let refused = restarted
        .check_from("nobody", "not the secret, but long", Standing::default())
        .await;
    assert!(
        matches!(&refused, Err(magic_sync_http::Error::Hash(why)) if why.contains("a second")),
        "{refused:?}"
    );
    let hashes = restarted.hashes();
    assert_eq!((hashes.general, hashes.reserved), (2, 0), "{hashes:?}");
    // A replica proved lately is checked on its own share all the same.
    assert_eq!(
        check(&restarted, "t1", &secret, Standing::default()).await,
        (credentials::Checked::Yes, (2, 1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_id_guessed_wrong_on_the_reserved_share_is_checked_on_the_general_one_after() {
    let (db, secret) = proved_once().await;
    let restarted = Credentials::new(db.config());
    // A guess from a party with nothing against it: on the reserved share,
    // once.
    assert_eq!(
        check(
            &restarted,
            "t1",
            "not the secret, but long",
            Standing::default()
        )
        .await,
        (credentials::Checked::No, (0, 1))
    );
    // Every check of that id after it, the right secret included, is on
    // the general share.
    for secret in ["another guess, just as long", secret.as_str()] {
        restarted
            .check_from("t1", secret, Standing::default())
            .await
            .unwrap();
    }
    let hashes = restarted.hashes();
    assert_eq!((hashes.general, hashes.reserved), (2, 1), "{hashes:?}");
}

/// A database with `t1` given a secret, proved once (the database notes
/// when), and the secret.
async fn proved_once() -> (magic_sync_testdb::TestDb, String) {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let secret = credentials::issue(&client, "t1").await.unwrap();
    assert!(Credentials::new(db.config())
        .check("t1", &secret)
        .await
        .unwrap());
    (db, secret)
}

/// What checking `secret` for `id` from a party of `standing` came to, and
/// the hashes run so far on the general and the reserved share.
async fn check(
    credentials: &Credentials,
    id: &str,
    secret: &str,
    standing: Standing,
) -> (credentials::Checked, (u64, u64)) {
    let checked = credentials.check_from(id, secret, standing).await.unwrap();
    let hashes = credentials.hashes();
    (checked, (hashes.general, hashes.reserved))
}
