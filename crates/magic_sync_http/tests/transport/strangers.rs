//! What a connection that is no replica's yet can cost (issue 41, items 3
//! and 8): an id that cannot be a replica's is refused before anything is
//! looked up and counts against its party; a party barred costs no lookup;
//! connections are bounded per network as well as per address; and a party
//! that failed lately is checked on the general share of the hashing, not
//! on the one kept for replicas proved lately.

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
    let long = "x".repeat(64 << 10);
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
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let secret = credentials::issue(&client, "t1").await.unwrap();
    // Proved once: the database notes when.
    assert!(Credentials::new(db.config())
        .check("t1", &secret)
        .await
        .unwrap());
    // After a restart, nothing in memory.
    let restarted = Credentials::new(db.config());
    let suspect = Standing {
        barred: None,
        suspect: true,
    };
    let checked = restarted
        .check_from("t1", "not the secret, but long", suspect)
        .await
        .unwrap();
    assert_eq!(checked, credentials::Checked::No);
    let hashes = restarted.hashes();
    assert_eq!((hashes.general, hashes.reserved), (1, 0), "{hashes:?}");
    // The replica itself, from a party with nothing against it, is checked
    // on the share kept for it.
    let checked = restarted
        .check_from("t1", &secret, Standing::default())
        .await
        .unwrap();
    assert_eq!(checked, credentials::Checked::Yes);
    let hashes = restarted.hashes();
    assert_eq!((hashes.general, hashes.reserved), (1, 1), "{hashes:?}");
}
