//! The transport end to end: a relay, its hub on a loopback socket, and
//! replicas on SQLite files of their own, each over a real WebSocket.

use crate::support::{agrees, hub_settings, raw, read, server_of, until, Server, Ws};
use futures_util::{SinkExt, StreamExt};
use magic_sync::envelope::{from_server, Ack, FromServer, ToReplica, Up};
use magic_sync_http::client::{Settings as ClientSettings, Socket};
use magic_sync_http::server::{Security, Settings};
use prost::Message as _;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// The hub's settings here: short, but long enough for a reconnection on a
/// loaded machine (a snapshot waits this long for its replica to be back).
fn settings() -> Settings {
    Settings {
        write_timeout: Duration::from_secs(10),
        ..hub_settings()
    }
}

/// A server for `tills` whose snapshots take many messages.
async fn server(tills: &[&str]) -> Server {
    server_of(20_000, tills, settings(), Security::Plain).await
}

async fn snapshot_number(server: &Server, till: &str) -> i64 {
    server
        .client
        .query_one(
            "SELECT snapshot_number FROM sync.replicas WHERE id = $1",
            &[&till],
        )
        .await
        .map(|r| r.get(0))
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_converge_though_their_connections_drop_mid_snapshot_and_mid_stream() {
    let mut server = server(&["t1", "t2"]).await;
    let (s1, r1) = server.replica("t1");
    let (s2, r2) = server.replica("t2");
    // Cut t1 off while its snapshot is being applied...
    let path = server.path("t1");
    until(
        "t1's snapshot to begin",
        Duration::from_secs(30),
        async || {
            rusqlite::Connection::open(&path)
                .ok()
                .and_then(|c| magic_sync::replica::status(&c).ok())
                .is_some_and(|s| s.snapshot_began.is_some())
        },
    )
    .await;
    server
        .hub
        .disconnect("t1", "the test cuts it off mid-snapshot");
    let conn = rusqlite::Connection::open(&path).unwrap();
    assert!(
        !magic_sync::replica::status(&conn).unwrap().ready,
        "cut off mid-snapshot"
    );
    let first = snapshot_number(&server, "t1").await;
    // ...and again and again while the server writes.
    for round in 0..20i64 {
        server.hub.disconnect("t1", "the test cuts it off");
        server
            .client
            .execute(
                "INSERT INTO orders VALUES ($1, $2, format('order %s', $1::bigint))",
                &[&round, &if round % 2 == 0 { "t1" } else { "t2" }],
            )
            .await
            .unwrap();
        server
            .client
            .execute(
                "UPDATE products SET price = price + 1 WHERE id = $1",
                &[&(round + 1)],
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    for till in ["t1", "t2"] {
        until(till, Duration::from_secs(60), async || {
            agrees(&server, till).await
        })
        .await;
    }
    // The orders agree; the price changes written after the last of them
    // may still be on their way.
    let want: Vec<String> = server
        .client
        .query(
            "SELECT price::text FROM products WHERE id <= 20 ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    until("t1's prices", Duration::from_secs(60), async || {
        read(
            &server.path("t1"),
            "SELECT price FROM products WHERE id <= 20 ORDER BY id",
        ) == want
    })
    .await;
    assert!(s1.connects() > 5, "t1 connected {} times", s1.connects());
    // Every reconnection resumed: no message was lost, so no gap and no
    // second snapshot.
    let after = snapshot_number(&server, "t1").await;
    assert!(
        first == 0 || after == first,
        "provisioned again: {first} then {after}"
    );
    assert_eq!(magic_sync::replica::status(&conn).unwrap().gap, None);
    s1.close();
    s2.close();
    r1.join().unwrap();
    r2.join().unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sales_written_on_a_till_are_filed_under_the_till_that_sent_them() {
    let mut server = server(&["t1"]).await;
    let (socket, thread) = server.replica("t1");
    until("t1 ready", Duration::from_secs(30), async || {
        agrees(&server, "t1").await
    })
    .await;
    // The host writes on a connection of its own, and claims another till.
    let conn = rusqlite::Connection::open(server.path("t1")).unwrap();
    conn.execute_batch(
        "INSERT INTO sales (id, till, total) VALUES ('s1', 't1', '9.50'), ('s2', 'someone else', '1.00')",
    )
    .unwrap();
    socket.nudger().nudge();
    until("the sales filed", Duration::from_secs(30), async || {
        server
            .client
            .query_one("SELECT count(*) FROM sales", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 2
    })
    .await;
    let tills: Vec<String> = server
        .client
        .query("SELECT till FROM sales ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(tills, ["t1", "t1"], "filed under the authenticated till");
    socket.close();
    thread.join().unwrap();
    server.stop().await;
}

/// Reads frames until the server closes, returning its close reason.
async fn closed_with(stream: &mut Ws) -> String {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => {
                return frame.map(|f| f.reason.to_string()).unwrap_or_default()
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => return format!("error: {e}"),
            Ok(None) => return "ended".into(),
            Err(_) => panic!("the server did not close the connection"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_refused_and_nothing_connects() {
    let mut server = server(&["t1"]).await;
    for (till, secret) in [
        ("t1", "not the secret of t1 at all"),
        ("nobody", server.secrets["t1"].as_str()),
    ] {
        match raw(&server.url, till, secret).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 401);
                let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                    .into_owned();
                assert_eq!(body, "wrong credentials");
            }
            other => panic!("{till} connected: {:?}", other.map(|_| ())),
        }
    }
    // No credentials at all.
    let request = format!("{}{}", server.url, magic_sync_http::PATH)
        .into_client_request()
        .unwrap();
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 401)
        }
        other => panic!("connected without credentials: {:?}", other.map(|_| ())),
    }
    // The client says why it cannot connect, and keeps trying.
    let socket = Socket::connect(ClientSettings::new(
        &server.url,
        "t1",
        "wrong secret, sixteen+",
    ))
    .unwrap();
    let started = Instant::now();
    while socket.last_error().is_none() {
        assert!(started.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        socket.last_error().unwrap().contains("401"),
        "{:?}",
        socket.last_error()
    );
    assert!(!socket.is_connected());
    assert!(server.hub.connected().is_empty());
    drop(socket);
    server.stop().await;
}

/// Reads `till`'s snapshot on a raw connection, acknowledging each
/// message as a replica does, until its end: the numbers it got, and its
/// last message. Every message is `till`'s own.
async fn snapshot_of(till: &str, stream: &mut Ws) -> (Vec<u64>, ToReplica) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut numbers = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "{till}'s snapshot did not end");
        let frame = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("a frame in time")
            .unwrap_or_else(|| panic!("{till}'s connection ended"))
            .unwrap();
        let Message::Binary(bytes) = frame else {
            continue;
        };
        let Some(from_server::Body::Message(bytes)) = FromServer::decode(bytes).unwrap().body
        else {
            continue;
        };
        let message = ToReplica::decode(bytes.as_slice()).unwrap();
        assert_eq!(message.replica, till);
        numbers.push(message.number);
        let ack = Up {
            applied: Some(Ack {
                epoch: message.epoch.clone(),
                number: message.number,
                nonce: message.nonce.clone(),
                seal: message.seal.clone(),
                ..Ack::default()
            }),
            ..Up::default()
        };
        stream
            .send(Message::Binary(ack.encode_to_vec().into()))
            .await
            .unwrap();
        if matches!(
            message.body,
            Some(magic_sync::envelope::to_replica::Body::EndSnapshot(_))
        ) {
            return (numbers, message);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_gets_only_its_own_messages_and_cannot_acknowledge_another_s() {
    let mut server = server(&["t1", "t2"]).await;
    server
        .client
        .batch_execute("INSERT INTO orders VALUES (1, 't1', 'one'), (2, 't2', 'two')")
        .await
        .unwrap();
    let mut t1 = raw(&server.url, "t1", &server.secrets["t1"]).await.unwrap();
    let mut t2 = raw(&server.url, "t2", &server.secrets["t2"]).await.unwrap();
    // Each gets its snapshot, every message of it its own.
    // Both read at once, as replicas do (one not read for long stops
    // answering the server's pings, and is closed as silent).
    let ((_, last_of_t1), (last, _)) =
        tokio::join!(snapshot_of("t1", &mut t1), snapshot_of("t2", &mut t2));
    // t2 acknowledges t1's message under its seal.
    let stolen = last_of_t1;
    let forged = Up {
        applied: Some(Ack {
            epoch: stolen.epoch,
            number: stolen.number,
            nonce: stolen.nonce,
            seal: stolen.seal,
            ..Ack::default()
        }),
        ..Up::default()
    };
    t2.send(Message::Binary(forged.encode_to_vec().into()))
        .await
        .unwrap();
    let why = closed_with(&mut t2).await;
    assert!(why.contains("seal the server did not make"), "{why}");
    // Each replica's own acknowledgements count; the forged one does not.
    let acked = async || -> Vec<i64> {
        server
            .client
            .query("SELECT number FROM sync.acks ORDER BY replica", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    until(
        "the acknowledgements recorded",
        Duration::from_secs(10),
        async || acked().await.len() == 2,
    )
    .await;
    let t1_last = stolen.number as i64;
    let t2_last = *last.last().unwrap() as i64;
    until(
        "t2's own acknowledgement",
        Duration::from_secs(10),
        async || acked().await == [t1_last, t2_last],
    )
    .await;
    let provision: bool = server
        .client
        .query_one("SELECT provision FROM sync.replicas WHERE id = 't2'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!provision, "t2 is not provisioned again by what it forged");
    drop(t1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_stalled_clients_are_closed_while_the_others_are_served() {
    let mut server = server(&["t1", "t2", "t3"]).await;
    let (socket, thread) = server.replica("t1");
    // Not an Up.
    let mut t2 = raw(&server.url, "t2", &server.secrets["t2"]).await.unwrap();
    t2.send(Message::Binary(vec![0xff, 0xff, 0xff].into()))
        .await
        .unwrap();
    assert!(closed_with(&mut t2).await.contains("not an Up"));
    // Text.
    let mut t2 = raw(&server.url, "t2", &server.secrets["t2"]).await.unwrap();
    t2.send(Message::Text("hello".into())).await.unwrap();
    assert!(closed_with(&mut t2).await.contains("text frame"));
    // Larger than a message may be.
    let mut t2 = raw(&server.url, "t2", &server.secrets["t2"]).await.unwrap();
    let _ = t2.send(Message::Binary(vec![0u8; 300 << 10].into())).await;
    let why = closed_with(&mut t2).await;
    assert!(!why.is_empty(), "closed with a reason");
    // An upload larger than a message may be, through the client: refused
    // before it leaves.
    // A connection that never finishes its request is dropped.
    let mut idle = tokio::net::TcpStream::connect(server.url.trim_start_matches("ws://"))
        .await
        .unwrap();
    // t3 connects and never reads: its frames pile up until it is closed.
    let t3 = raw(&server.url, "t3", &server.secrets["t3"]).await.unwrap();
    // Meanwhile t1 is served.
    server
        .client
        .batch_execute("INSERT INTO orders VALUES (10, 't1', 'ten')")
        .await
        .unwrap();
    until("t1 served", Duration::from_secs(30), async || {
        agrees(&server, "t1").await
    })
    .await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut idle, &mut buf),
    )
    .await
    .expect("the half-open connection is closed")
    .unwrap_or(0);
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || answer.starts_with("HTTP/1.1 408"), "{answer}");
    until("t3 closed", Duration::from_secs(10), async || {
        !server.hub.connected().contains(&"t3".to_string())
    })
    .await;
    drop(t3);
    socket.close();
    thread.join().unwrap();
    server.stop().await;
}
