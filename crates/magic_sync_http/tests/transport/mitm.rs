//! A man in the middle: a WebSocket proxy between the hub and two tills,
//! over real sockets, that lets every real frame through and, while it
//! attacks, slips forgeries in ahead of them: a forged snapshot that would
//! wipe the till, a forged high number that would make every real message
//! after it a duplicate, forged answers to the till's uploads, replays of
//! old messages to the same till and to the other, and copies with a byte
//! flipped. The tills apply none of it, lose no write, and once the proxy
//! only relays they converge without being provisioned again.

use crate::support::{agrees, hub_settings, read, server_of, until, Server};
use futures_util::{SinkExt, StreamExt};
use magic_sync::envelope::{
    from_server, to_replica, Down, EndSnapshot, Filed, FromServer, RowData, TableRows, ToReplica,
    Up,
};
use magic_sync::sign::Signer;
use magic_sync_http::server::Security;
use prost::Message as _;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

/// What the proxy has seen and does.
struct Attack {
    on: AtomicBool,
    /// Signs the forgeries: a key no till was given.
    forger: Signer,
    /// Per till, the real messages it was sent, as they came.
    seen: Mutex<HashMap<String, Vec<Vec<u8>>>>,
    injected: AtomicU64,
}

impl Attack {
    fn frame(message: Vec<u8>) -> Message {
        Message::Binary(
            FromServer {
                body: Some(from_server::Body::Message(message)),
            }
            .encode_to_vec()
            .into(),
        )
    }

    fn answer(filed: Filed) -> Message {
        Message::Binary(
            FromServer {
                body: Some(from_server::Body::Filed(filed)),
            }
            .encode_to_vec()
            .into(),
        )
    }

    /// Forgeries to slip in ahead of `real`, a message to `till`.
    fn before_message(&self, till: &str, real: &[u8]) -> Vec<Message> {
        let Ok(message) = ToReplica::decode(real) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        // A snapshot of the forger's own: a row, then an end that would let
        // go of everything it did not name.
        let begin = ToReplica {
            replica: till.into(),
            epoch: message.epoch.clone(),
            number: message.number + 1_000,
            nonce: vec![0xF0; 16],
            begins_snapshot: true,
            body: Some(to_replica::Body::Down(Down {
                tables: vec![TableRows {
                    table: "products".into(),
                    upserts: vec![RowData {
                        key: b"[999999]".to_vec(),
                        data: br#"{"id":999999,"name":"forged","price":"0.01"}"#.to_vec(),
                    }],
                    ..TableRows::default()
                }],
            })),
            ..ToReplica::default()
        };
        let end = ToReplica {
            number: begin.number + 1,
            nonce: vec![0xF1; 16],
            previous: begin.number,
            previous_nonce: begin.nonce.clone(),
            begins_snapshot: false,
            body: Some(to_replica::Body::EndSnapshot(EndSnapshot {
                tables: vec!["products".into(), "orders".into()],
                schema: Vec::new(),
                described: None,
            })),
            ..begin.clone()
        };
        out.push(Self::frame(self.forger.to_replica(&begin)));
        out.push(Self::frame(self.forger.to_replica(&end)));
        // The real message under a number far ahead: signed by the forger,
        // unsigned, and with the real tail moved onto the new head.
        let high = ToReplica {
            number: message.number + 1_000_000_000,
            ..message.clone()
        };
        out.push(Self::frame(self.forger.to_replica(&high)));
        let mut unsigned = high.clone();
        unsigned.signature.clear();
        unsigned.endorsements.clear();
        out.push(Self::frame(unsigned.encode_to_vec()));
        let moved = ToReplica {
            number: high.number,
            ..ToReplica::decode(real).expect("decoded above")
        };
        out.push(Self::frame(moved.encode_to_vec()));
        // The real bytes with one byte flipped, here and there.
        for at in [real.len() / 3, real.len() / 2, real.len() - 1] {
            let mut flipped = real.to_vec();
            flipped[at] ^= 0x20;
            out.push(Self::frame(flipped));
        }
        // Replays: this till's own first message, and the other till's.
        let seen = self.seen.lock().unwrap();
        for (other, messages) in seen.iter() {
            if let Some(first) = messages.first() {
                out.push(Self::frame(first.clone()));
            }
            if other == till {
                if let Some(last) = messages.last() {
                    out.push(Self::frame(last.clone()));
                }
            }
        }
        out
    }

    /// Forged answers to the upload `up` of `till`: ahead of the real one.
    fn answers_to(&self, till: &str, up: &Up) -> Vec<Message> {
        if up.send_id.is_empty() {
            return Vec::new();
        }
        vec![
            Self::answer(self.forger.filed(till, up.send_id.clone())),
            Self::answer(Filed {
                send_id: up.send_id.clone(),
                ..Filed::default()
            }),
        ]
    }
}

/// The till a connection's Basic credentials name.
fn till_of(authorization: &str) -> Option<String> {
    use base64::Engine as _;
    let encoded = authorization.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    Some(text.split_once(':')?.0.to_string())
}

/// Accepts the till's connection, noting its credentials.
#[allow(clippy::result_large_err)] // the handshake callback's signature is tungstenite's
fn noting(
    authorization: Arc<Mutex<Option<String>>>,
) -> impl FnOnce(
    &Request,
    Response,
) -> Result<Response, tokio_tungstenite::tungstenite::handshake::server::ErrorResponse> {
    move |request: &Request, response: Response| {
        *authorization.lock().unwrap() = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Ok(response)
    }
}

/// Relays one till's connection to the hub at `upstream`, attacking while
/// `attack.on`.
async fn relay(tcp: tokio::net::TcpStream, upstream: String, attack: Arc<Attack>) {
    let authorization = Arc::new(Mutex::new(None));
    let callback = noting(authorization.clone());
    let Ok(down) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else {
        return;
    };
    let Some(authorization) = authorization.lock().unwrap().clone() else {
        return;
    };
    let Some(till) = till_of(&authorization) else {
        return;
    };
    let mut request = format!("{upstream}{}", magic_sync_http::PATH)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", authorization.parse().unwrap());
    let Ok((hub, _)) = tokio_tungstenite::connect_async(request).await else {
        return;
    };
    let (mut to_hub, mut from_hub) = hub.split();
    let (mut to_till, mut from_till) = down.split();
    // One writer to the till, fed in order by both directions.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Message>();
    let writer = async move {
        while let Some(message) = rx.recv().await {
            if to_till.send(message).await.is_err() {
                break;
            }
        }
    };
    let upward = {
        let (tx, attack, till) = (tx.clone(), attack.clone(), till.clone());
        async move {
            while let Some(Ok(message)) = from_till.next().await {
                if let Message::Binary(bytes) = &message {
                    if attack.on.load(Ordering::Acquire) {
                        if let Ok(up) = Up::decode(bytes.as_ref()) {
                            for forged in attack.answers_to(&till, &up) {
                                attack.injected.fetch_add(1, Ordering::Relaxed);
                                let _ = tx.send(forged);
                            }
                        }
                    }
                }
                let closing = matches!(message, Message::Close(_));
                if to_hub.send(message).await.is_err() || closing {
                    break;
                }
            }
        }
    };
    let downward = async move {
        while let Some(Ok(message)) = from_hub.next().await {
            if let Message::Binary(bytes) = &message {
                let real = match FromServer::decode(bytes.as_ref()) {
                    Ok(FromServer {
                        body: Some(from_server::Body::Message(real)),
                    }) => Some(real),
                    _ => None,
                };
                if let Some(real) = real {
                    if attack.on.load(Ordering::Acquire) {
                        for forged in attack.before_message(&till, &real) {
                            attack.injected.fetch_add(1, Ordering::Relaxed);
                            let _ = tx.send(forged);
                        }
                    }
                    let mut seen = attack.seen.lock().unwrap();
                    seen.entry(till.clone()).or_default().push(real);
                }
            }
            let closing = matches!(message, Message::Close(_));
            if tx.send(message).is_err() || closing {
                break;
            }
        }
    };
    tokio::select! {
        _ = writer => {}
        _ = upward => {}
        _ = downward => {}
    }
}

/// The proxy: every connection accepted on `listener` relayed to `upstream`.
async fn proxy(listener: TcpListener, upstream: String, attack: Arc<Attack>) {
    while let Ok((tcp, _)) = listener.accept().await {
        tokio::spawn(relay(tcp, upstream.clone(), attack.clone()));
    }
}

async fn snapshot_number(server: &Server, till: &str) -> i64 {
    server
        .client
        .query_one(
            "SELECT coalesce(snapshot_number, 0) FROM sync.replicas WHERE id = $1",
            &[&till],
        )
        .await
        .unwrap()
        .get(0)
}

async fn count(server: &Server, sql: &str) -> i64 {
    server.client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_man_in_the_middle_can_neither_write_wipe_nor_wedge_a_replica() {
    let mut server = server_of(200, &["t1", "t2"], hub_settings(), Security::Plain).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxied = format!("ws://{}", listener.local_addr().unwrap());
    let attack = Arc::new(Attack {
        on: AtomicBool::new(false),
        forger: Signer::new(&[0x66; 32], Vec::new()),
        seen: Mutex::default(),
        injected: AtomicU64::new(0),
    });
    tokio::spawn(proxy(listener, server.url.clone(), attack.clone()));
    let running: Vec<_> = ["t1", "t2"]
        .iter()
        .map(|till| {
            let settings = magic_sync_http::client::Settings {
                server: proxied.clone(),
                ..server.settings(till, &server.secrets[*till])
            };
            server.replica_with(settings)
        })
        .collect();
    for till in ["t1", "t2"] {
        until(till, Duration::from_secs(60), async || {
            agrees(&server, till).await
        })
        .await;
    }
    let provisioned = [
        snapshot_number(&server, "t1").await,
        snapshot_number(&server, "t2").await,
    ];

    // The attack: the server writes, the tills sell, the proxy forges.
    attack.on.store(true, Ordering::Release);
    let t1 = rusqlite::Connection::open(server.path("t1")).unwrap();
    for round in 0..12i64 {
        let till = if round % 2 == 0 { "t1" } else { "t2" };
        server
            .client
            .execute(
                "INSERT INTO orders VALUES ($1, $2, format('order %s', $1::bigint))",
                &[&round, &till],
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
        t1.execute(
            "INSERT INTO sales (id, till, total) VALUES (?1, 't1', '1.00')",
            [format!("sale-{round}")],
        )
        .unwrap();
        running[0].0.nudger().nudge();
        // Each round's writes reach t1 (and the forgeries slipped in ahead
        // of them) before the next round's.
        until("the round's order", Duration::from_secs(30), async || {
            agrees(&server, "t1").await && agrees(&server, "t2").await
        })
        .await;
    }
    until(
        "t1's sales filed, every one",
        Duration::from_secs(60),
        async || count(&server, "SELECT count(*) FROM sales WHERE till = 't1'").await == 12,
    )
    .await;
    attack.on.store(false, Ordering::Release);
    assert!(attack.injected.load(Ordering::Relaxed) > 100);

    // Only relaying now: one more change reaches both, as any would.
    server
        .client
        .execute("UPDATE products SET name = 'after' WHERE id = 1", &[])
        .await
        .unwrap();
    for till in ["t1", "t2"] {
        until(till, Duration::from_secs(60), async || {
            agrees(&server, till).await
                && read(&server.path(till), "SELECT name FROM products WHERE id = 1") == ["after"]
        })
        .await;
        let conn = rusqlite::Connection::open(server.path(till)).unwrap();
        let status = magic_sync::replica::status(&conn).unwrap();
        assert_eq!(status.gap, None, "{till}: a forgery opened a gap");
        assert!(
            read(
                &server.path(till),
                "SELECT name FROM products WHERE id = 999999"
            )
            .is_empty(),
            "{till} took the forger's row"
        );
    }
    assert_eq!(
        [
            snapshot_number(&server, "t1").await,
            snapshot_number(&server, "t2").await,
        ],
        provisioned,
        "the attack had a till provisioned again"
    );
    // Every sale was filed once, and the till let go of them only then.
    assert_eq!(count(&server, "SELECT count(*) FROM sales").await, 12);
    until(
        "t1's notes let go of",
        Duration::from_secs(30),
        async || {
            read(
                &server.path("t1"),
                "SELECT count(*) || '' FROM _magic_sync_up",
            ) == ["0"]
        },
    )
    .await;
    for running in running {
        crate::support::end(running);
    }
    // Counted as they came, written to the file at the latest as the
    // replica closed.
    for till in ["t1", "t2"] {
        let conn = rusqlite::Connection::open(server.path(till)).unwrap();
        let status = magic_sync::replica::status(&conn).unwrap();
        assert!(status.forged > 20, "{till}: {status:?}");
    }
    server.stop().await;
}
