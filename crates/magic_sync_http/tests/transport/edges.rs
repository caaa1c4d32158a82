//! The transport at its edges, against a real PostgreSQL and real sockets:
//! TLS, the connection limit, the handshake timeout, secrets taken away, an
//! upload too large, a replica's newer connection, and the server stopping.

use crate::support::*;
use magic_sync::envelope::{RowData, Up, UpRows};
use magic_sync::replica::UplinkError;
use magic_sync::run::replica::Link;
use magic_sync_http::client::{Settings as ClientSettings, Socket};
use magic_sync_http::credentials;
use magic_sync_http::server::{Security, Settings};

use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---------------------------------------------------------------- TLS

/// A self-signed certificate for `localhost`, as PEM files in `dir`.
#[cfg(feature = "tls")]
fn self_signed(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_path, key_path) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key_pair.serialize_pem()).unwrap();
    (cert_path, key_path)
}

#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_replica_trusting_the_certificate_converges_and_others_cannot_connect() {
    let pems = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(pems.path(), "server");
    let (other, _) = self_signed(pems.path(), "other");
    let acceptor = magic_sync_http::server::tls_acceptor(&cert, &key).unwrap();
    let mut server = server(&["t1", "t2"], hub_settings(), Security::Tls(acceptor)).await;
    assert!(server.url.starts_with("wss://localhost:"), "{}", server.url);
    server
        .client
        .batch_execute("INSERT INTO orders VALUES (1, 't1', 'one')")
        .await
        .unwrap();
    let t1 = server.replica_with(ClientSettings {
        trust: Some(cert.clone()),
        ..server.settings("t1", &server.secrets["t1"])
    });
    until(
        "t1's snapshot over TLS",
        Duration::from_secs(60),
        async || agrees(&server, "t1").await,
    )
    .await;
    // And what the server writes after.
    server
        .client
        .batch_execute("INSERT INTO orders VALUES (2, 't1', 'two')")
        .await
        .unwrap();
    until("t1's order over TLS", Duration::from_secs(30), async || {
        agrees(&server, "t1").await
    })
    .await;
    assert_eq!(t1.0.connects(), 1, "{:?}", t1.0.last_error());
    assert!(t1.0.is_connected());
    // A client trusting the usual roots, or another certificate, does not
    // trust the server: no TLS session, so no request, whatever its secret.
    for trust in [None, Some(other)] {
        let socket = Socket::connect(ClientSettings {
            trust: trust.clone(),
            ..server.settings("t2", &server.secrets["t2"])
        })
        .unwrap();
        until("t2's failure", Duration::from_secs(10), async || {
            socket.last_error().is_some()
        })
        .await;
        let error = socket.last_error().unwrap();
        assert!(
            error.starts_with(&format!("connecting to {}/v1/replica: ", server.url))
                && error.contains("invalid peer certificate"),
            "trusting {trust:?}: {error}"
        );
        assert!(!socket.is_connected());
        assert_eq!(socket.connects(), 0);
    }
    assert_eq!(server.hub.connected(), ["t1"]);
    end(t1);
    server.stop().await;
}

// ---------------------------------------------------------------- limits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_a_connection_is_closed_at_once_and_the_others_stay_served() {
    let settings = Settings {
        max_connections: 2,
        // Far longer than the test waits for the third to be closed.
        handshake_timeout: Duration::from_secs(60),
        ..hub_settings()
    };
    let mut server = server(&["t1", "t2", "t3"], settings, Security::Plain).await;
    let t1 = server.replica("t1");
    let t2 = server.replica("t2");
    until("t1 and t2 served", Duration::from_secs(60), async || {
        agrees(&server, "t1").await && agrees(&server, "t2").await
    })
    .await;
    assert_eq!(server.hub.connected(), ["t1", "t2"]);
    assert_eq!(
        server.hub.connections(),
        2,
        "the replicas' connections count"
    );
    // A third TCP connection is closed as soon as it is accepted.
    let mut third = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (said, _) = until_closed(&mut third, Instant::now(), Duration::from_secs(5)).await;
    assert_eq!(said, "", "closed without a word");
    assert_eq!(server.hub.connections(), 2);
    // So is a third replica, as long as the two are there.
    let s3 = Socket::connect(server.settings("t3", &server.secrets["t3"])).unwrap();
    until("t3's failure", Duration::from_secs(10), async || {
        s3.last_error().is_some()
    })
    .await;
    assert!(!s3.is_connected());
    assert_eq!(s3.connects(), 0, "{:?}", s3.last_error());
    // The two are still served, on the connections they had.
    server
        .client
        .batch_execute("INSERT INTO orders VALUES (1, 't1', 'one'), (2, 't2', 'two')")
        .await
        .unwrap();
    until(
        "t1 and t2 served after",
        Duration::from_secs(30),
        async || agrees(&server, "t1").await && agrees(&server, "t2").await,
    )
    .await;
    assert_eq!((t1.0.connects(), t2.0.connects()), (1, 1));
    assert_eq!(server.hub.connected(), ["t1", "t2"]);
    assert_eq!(s3.connects(), 0);
    // t2 leaves: its place is free, and t3 takes it.
    end(t2);
    until("t3 connected", Duration::from_secs(10), async || {
        s3.is_connected()
    })
    .await;
    assert_eq!(server.hub.connected(), ["t1", "t3"]);
    assert_eq!(server.hub.connections(), 2);
    drop(s3);
    end(t1);
    until("no connection left", Duration::from_secs(10), async || {
        server.hub.connections() == 0
    })
    .await;
    server.stop().await;
}

// ---------------------------------------------------------------- handshake

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_says_nothing_is_closed_after_the_handshake_timeout() {
    let handshake = Duration::from_millis(1500);
    let settings = Settings {
        handshake_timeout: handshake,
        ..hub_settings()
    };
    let mut server = server(&[], settings, Security::Plain).await;
    // Nothing at all; half a request.
    for sent in ["", "GET /v1/replica HTTP/1.1\r\nHost: localhost\r\n"] {
        let started = Instant::now();
        let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        tcp.write_all(sent.as_bytes()).await.unwrap();
        until(
            "the connection counted",
            Duration::from_secs(5),
            async || server.hub.connections() == 1,
        )
        .await;
        let (said, after) = until_closed(&mut tcp, started, handshake * 4).await;
        assert!(
            said.is_empty() || said.starts_with("HTTP/1.1 408"),
            "{sent:?}: {said}"
        );
        // The server's clock started after ours (a timer may fire a
        // millisecond early).
        assert!(
            after >= handshake - Duration::from_millis(5),
            "{sent:?}: closed after {after:?}, before the handshake timeout"
        );
        assert!(
            after < handshake + Duration::from_secs(2),
            "{sent:?}: closed after {after:?}"
        );
        until(
            "the connection uncounted",
            Duration::from_secs(5),
            async || server.hub.connections() == 0,
        )
        .await;
    }
    server.stop().await;
}

/// A client that keeps its connection busy with requests that are not a
/// replica's (here, for another path; wrong credentials would do as well)
/// never becomes a replica's: it is closed after the handshake timeout all
/// the same, rather than holding one of `max_connections` for as long as
/// it likes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_becomes_a_replica_s_is_closed_after_the_handshake_timeout() {
    let handshake = Duration::from_millis(1500);
    let settings = Settings {
        handshake_timeout: handshake,
        ..hub_settings()
    };
    let mut server = server(&[], settings, Security::Plain).await;
    let started = Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut answers = 0;
    let mut buf = vec![0u8; 4096];
    let closed = loop {
        assert!(
            started.elapsed() < handshake * 4,
            "still open after {:?}, {answers} requests answered",
            started.elapsed()
        );
        let sent = tcp
            .write_all(b"GET /not-a-replica HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await;
        if sent.is_err() {
            break started.elapsed();
        }
        // One answer per request (a 404 with an empty body).
        match tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break started.elapsed(),
            Ok(Ok(n)) => {
                let answer = String::from_utf8_lossy(&buf[..n]);
                assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
                answers += 1;
            }
            Err(_) => panic!("no answer"),
        }
    };
    assert!(answers > 0, "answered before it was closed");
    assert!(
        closed >= handshake - Duration::from_millis(5)
            && closed < handshake + Duration::from_secs(2),
        "closed after {closed:?}, {answers} requests answered"
    );
    until(
        "the connection uncounted",
        Duration::from_secs(5),
        async || server.hub.connections() == 0,
    )
    .await;
    server.stop().await;
}

#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_starts_tls_is_closed_after_the_handshake_timeout() {
    let pems = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(pems.path(), "server");
    let acceptor = magic_sync_http::server::tls_acceptor(&cert, &key).unwrap();
    let handshake = Duration::from_millis(1500);
    let settings = Settings {
        handshake_timeout: handshake,
        ..hub_settings()
    };
    let mut server = server(&[], settings, Security::Tls(acceptor)).await;
    let started = Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (said, after) = until_closed(&mut tcp, started, handshake * 4).await;
    assert_eq!(said, "");
    assert!(
        after >= handshake - Duration::from_millis(5) && after < handshake + Duration::from_secs(2),
        "closed after {after:?}"
    );
    until(
        "the connection uncounted",
        Duration::from_secs(5),
        async || server.hub.connections() == 0,
    )
    .await;
    server.stop().await;
}

// ---------------------------------------------------------------- secrets

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_replica_cannot_connect_and_a_reissued_one_only_with_its_new_secret() {
    let mut server = server(&["t1"], hub_settings(), Security::Plain).await;
    let old = server.secrets["t1"].clone();
    let t1 = server.replica("t1");
    until("t1 served", Duration::from_secs(60), async || {
        agrees(&server, "t1").await
    })
    .await;
    assert!(credentials::revoke(&server.client, "t1").await.unwrap());
    assert!(!credentials::revoke(&server.client, "t1").await.unwrap());
    // The connection it made stays until it ends...
    assert_eq!(server.hub.connected(), ["t1"]);
    assert!(t1.0.is_connected());
    // ...and then it cannot make another.
    server.hub.disconnect("t1", "the test cuts it off");
    let refused = "the server refused replica `t1`: 401 Unauthorized wrong credentials";
    until("t1 refused", Duration::from_secs(10), async || {
        t1.0.last_error().as_deref() == Some(refused)
    })
    .await;
    assert!(!t1.0.is_connected());
    assert_eq!(t1.0.connects(), 1);
    assert_eq!(
        refusal(raw(&server.url, "t1", &old).await),
        (401, "wrong credentials".into())
    );
    // A new secret: the old one still cannot connect, the new one can.
    let new = credentials::issue(&server.client, "t1").await.unwrap();
    assert_ne!(new, old);
    assert_eq!(
        refusal(raw(&server.url, "t1", &old).await),
        (401, "wrong credentials".into())
    );
    assert!(!t1.0.is_connected());
    assert_eq!(t1.0.connects(), 1);
    assert!(server.hub.connected().is_empty());
    end(t1);
    let t1 = server.replica_with(server.settings("t1", &new));
    server
        .client
        .batch_execute("INSERT INTO orders VALUES (1, 't1', 'one')")
        .await
        .unwrap();
    until(
        "t1 served with its new secret",
        Duration::from_secs(30),
        async || agrees(&server, "t1").await,
    )
    .await;
    assert_eq!(t1.0.connects(), 1);
    assert_eq!(server.hub.connected(), ["t1"]);
    // Proved and remembered, the new secret does not let the old one in.
    assert_eq!(
        refusal(raw(&server.url, "t1", &old).await),
        (401, "wrong credentials".into())
    );
    assert_eq!(t1.0.connects(), 1);
    end(t1);
    server.stop().await;
}

// ---------------------------------------------------------------- uploads

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_larger_than_a_message_is_refused_before_it_leaves_and_nothing_of_it_is_filed() {
    let mut server = server(&["t1"], hub_settings(), Security::Plain).await;
    let t1 = server.replica("t1");
    until("t1 served", Duration::from_secs(60), async || {
        agrees(&server, "t1").await
    })
    .await;
    // Handed to the link as it is.
    let big = Up {
        send_id: vec![7; 16],
        tables: vec![UpRows {
            table: "sales".into(),
            rows: vec![RowData {
                key: vec![1; MAX_MESSAGE],
                data: vec![],
            }],
            ..UpRows::default()
        }],
        ..Up::default()
    };
    let size = prost::Message::encoded_len(&big);
    assert!(size > MAX_MESSAGE);
    assert_eq!(
        t1.0.upload(&big),
        Err(UplinkError::refused(format!(
            "an upload of {size} bytes, more than a message may have ({MAX_MESSAGE})"
        ))),
        "refused for good: this upload, not the link"
    );
    // Written by the host, beside a sale of an ordinary size: that one
    // goes, the large one never does.
    let conn = rusqlite::Connection::open(server.path("t1")).unwrap();
    let large_id = "x".repeat(MAX_MESSAGE + 1);
    conn.execute(
        "INSERT INTO sales (id, till, total) VALUES (?1, 't1', '1.00'), ('small', 't1', '2.00')",
        [&large_id],
    )
    .unwrap();
    t1.0.nudger().nudge();
    let filed = async || -> Vec<String> {
        server
            .client
            .query("SELECT left(id, 10) FROM sales ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    until(
        "the small sale filed",
        Duration::from_secs(30),
        async || !filed().await.is_empty(),
    )
    .await;
    assert_eq!(filed().await, ["small"]);
    // The server never saw a frame too large (it closes the connection of
    // a replica that sends one): the connection is the first.
    assert!(t1.0.is_connected());
    assert_eq!(t1.0.connects(), 1, "{:?}", t1.0.last_error());
    assert_eq!(server.hub.connected(), ["t1"]);
    // The large sale is still the replica's, not the server's.
    assert_eq!(
        read(&server.path("t1"), "SELECT count(*) || '' FROM sales"),
        ["2"]
    );
    assert_eq!(filed().await, ["small"]);
    end(t1);
    server.stop().await;
}

// ---------------------------------------------------------------- takeover

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_connection_of_a_replica_takes_over_and_the_older_is_told_so() {
    let mut server = server(&["t1"], hub_settings(), Security::Plain).await;
    server
        .client
        .batch_execute("INSERT INTO orders VALUES (1, 't1', 'one')")
        .await
        .unwrap();
    // The older connection gets t1's messages (and acknowledges none)...
    let older = reading(raw(&server.url, "t1", &server.secrets["t1"]).await.unwrap());
    until(
        "a message for the older connection",
        Duration::from_secs(30),
        async || older.frames() > 0,
    )
    .await;
    // ...until a newer one connects: it is told, and hears nothing more.
    let t1 = server.replica("t1");
    assert_eq!(
        older.closed().await,
        (1008, "a newer connection of this replica took over".into())
    );
    // The messages go to the newer: the snapshot, and what comes after.
    until(
        "t1 served on its newer connection",
        Duration::from_secs(60),
        async || agrees(&server, "t1").await,
    )
    .await;
    server
        .client
        .batch_execute("INSERT INTO orders VALUES (2, 't1', 'two')")
        .await
        .unwrap();
    until("t1's new order", Duration::from_secs(30), async || {
        agrees(&server, "t1").await
    })
    .await;
    assert_eq!(t1.0.connects(), 1, "{:?}", t1.0.last_error());
    assert_eq!(server.hub.connected(), ["t1"]);
    end(t1);
    server.stop().await;
}

// ---------------------------------------------------------------- stopping

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_server_stops_its_replicas_are_closed_saying_so() {
    let mut server = server(&["t1", "t2"], hub_settings(), Security::Plain).await;
    // t1 waits long before it tries again: its last error stays.
    let t1 = server.replica_with(ClientSettings {
        backoff_min: Duration::from_secs(120),
        backoff_max: Duration::from_secs(120),
        ..server.settings("t1", &server.secrets["t1"])
    });
    let t2 = reading(raw(&server.url, "t2", &server.secrets["t2"]).await.unwrap());
    until("t1 served", Duration::from_secs(60), async || {
        agrees(&server, "t1").await
    })
    .await;
    assert_eq!(server.hub.connected(), ["t1", "t2"]);
    server.stop().await;
    assert_eq!(t2.closed().await, (1001, "the server stops".into()));
    until("t1 told", Duration::from_secs(10), async || {
        t1.0.last_error().as_deref() == Some("the server closed the connection: the server stops")
    })
    .await;
    assert!(!t1.0.is_connected());
    until(
        "no replica connected",
        Duration::from_secs(10),
        async || server.hub.connected().is_empty(),
    )
    .await;
    end(t1);
}

/// A connection accepted before the server stopped, that asks to become a
/// replica's after, is not let in: the server stops for it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_accepted_before_the_server_stops_is_not_let_in_after() {
    let mut server = server(&["t1"], hub_settings(), Security::Plain).await;
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    until(
        "the connection counted",
        Duration::from_secs(5),
        async || server.hub.connections() == 1,
    )
    .await;
    server.stop().await;
    let upgraded =
        tokio_tungstenite::client_async(request(&server.url, "t1", &server.secrets["t1"]), tcp)
            .await;
    assert_eq!(refusal(upgraded), (503, "the server stops".into()));
    assert!(server.hub.connected().is_empty());
}
