//! The transport at its edges, against a real PostgreSQL and real sockets:
//! TLS, the connection limit, the handshake timeout, secrets taken away, an
//! upload too large, a replica's newer connection, and the server stopping.

use futures_util::StreamExt;
use magic_sync::envelope::{RowData, Up, UpRows};
use magic_sync::relay::{ReplicaInfo, Replicas, Settings as RelaySettings};
use magic_sync::replica::{Replica, UplinkError};
use magic_sync::run::replica::Link;
use magic_sync::{Engine, Numeric, Row};
use magic_sync_http::client::{Settings as ClientSettings, Socket};
use magic_sync_http::server::{serve, Hub, Security, Settings};
use magic_sync_http::{credentials, credentials::Credentials};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
struct Product {
    id: i64,
    name: String,
    price: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "till", key(id))]
struct Order {
    id: i64,
    till: String,
    note: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "sales", up, key(id))]
struct Sale {
    id: String,
    #[row(origin)]
    till: String,
    total: Numeric,
}

const PRODUCTS: usize = 500;

const SCHEMA: &str = "
CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL);
CREATE TABLE orders (id bigint PRIMARY KEY, till text NOT NULL, note text NOT NULL);
CREATE TABLE sales (id text PRIMARY KEY, till text NOT NULL, total numeric(10, 2) NOT NULL);
INSERT INTO products SELECT i, 'product ' || i, i % 100 FROM generate_series(1, 500) i;
";

fn engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::builder()
            .table::<Product>()
            .table::<Order>()
            .table::<Sale>()
            .build()
            .expect("declarations")
    })
}

struct Tills(Vec<String>);

impl Replicas for Tills {
    async fn replicas(&self) -> magic_sync::Result<Vec<ReplicaInfo>> {
        Ok(self
            .0
            .iter()
            .map(|id| ReplicaInfo::live(id.clone(), None))
            .collect())
    }
}

/// The most bytes of a message, on both sides.
const MAX_MESSAGE: usize = 256 << 10;

fn hub_settings() -> Settings {
    Settings {
        max_message_bytes: MAX_MESSAGE,
        max_unacked_bytes: MAX_MESSAGE,
        handshake_timeout: Duration::from_secs(2),
        ping_every: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(2),
        write_timeout: Duration::from_secs(1),
        ..Settings::default()
    }
}

/// A server: database, relay and hub, listening on loopback.
struct Server {
    _db: magic_sync_testdb::TestDb,
    client: tokio_postgres::Client,
    hub: Hub,
    addr: SocketAddr,
    url: String,
    secrets: std::collections::HashMap<String, String>,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A server for `tills`, with `settings`, secured by `security`: its url
/// names `localhost` under TLS (as the certificate does), else the address.
async fn server(tills: &[&str], settings: Settings, security: Security) -> Server {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(SCHEMA).await.unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    magic_sync::trigger::ensure(engine(), &mut client, &Default::default())
        .await
        .unwrap();
    let mut secrets = std::collections::HashMap::new();
    for till in tills {
        secrets.insert(
            till.to_string(),
            credentials::issue(&client, till).await.unwrap(),
        );
    }
    let hub = Hub::new(settings, Credentials::new(db.config()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let url = match security {
        Security::Plain => format!("ws://{addr}"),
        #[cfg(feature = "tls")]
        Security::Tls(_) => format!("wss://localhost:{}", addr.port()),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = futures_util::FutureExt::shared(async {
        let _ = stopped.await;
    });
    let serving = {
        let (hub, stopped) = (hub.clone(), stopped.clone());
        tokio::spawn(async move {
            serve(hub, listener, security, stopped).await.unwrap();
        })
    };
    let relay = {
        let (hub, config) = (hub.clone(), db.config());
        let tills = Tills(tills.iter().map(|t| t.to_string()).collect());
        let settings = RelaySettings {
            chunk_rows: 100,
            ..RelaySettings::default()
        };
        tokio::spawn(async move {
            magic_sync::run::server::server(
                config,
                engine().clone(),
                settings,
                &tills,
                &hub,
                &hub,
                stopped,
            )
            .await
            .unwrap();
        })
    };
    Server {
        _db: db,
        client,
        hub,
        addr,
        url,
        secrets,
        dir: tempfile::tempdir().unwrap(),
        stop: Some(stop),
        tasks: vec![serving, relay],
    }
}

type Running = (Arc<Socket>, std::thread::JoinHandle<()>);

impl Server {
    fn path(&self, till: &str) -> PathBuf {
        self.dir.path().join(format!("{till}.sqlite"))
    }

    /// The client settings of `till` with `secret`.
    fn settings(&self, till: &str, secret: &str) -> ClientSettings {
        ClientSettings {
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_millis(200),
            max_message_bytes: MAX_MESSAGE,
            ..ClientSettings::new(&self.url, till, secret)
        }
    }

    /// Starts `till`'s replica loop on a thread over a socket made with
    /// `settings`.
    fn replica_with(&self, settings: ClientSettings) -> Running {
        let till = settings.replica.clone();
        let socket = Arc::new(Socket::connect(settings).unwrap());
        let (path, link) = (self.path(&till), socket.clone());
        let thread = std::thread::spawn(move || {
            let mut replica = Replica::open(&path, &till, engine(), vec![]).unwrap();
            magic_sync::run::replica::replica(&mut replica, &*link).unwrap();
        });
        (socket, thread)
    }

    /// Starts `till`'s replica loop with its secret.
    fn replica(&self, till: &str) -> Running {
        self.replica_with(self.settings(till, &self.secrets[till]))
    }

    /// Resolves `serve`'s (and the relay's) stop future, and waits for both.
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        for task in self.tasks.drain(..) {
            task.await.unwrap();
        }
    }
}

/// Closes a replica's socket and waits for its loop to end.
fn end((socket, thread): Running) {
    socket.close();
    thread.join().unwrap();
}

fn read(path: &Path, sql: &str) -> Vec<String> {
    let Ok(conn) = rusqlite::Connection::open(path) else {
        return Vec::new();
    };
    let Ok(mut stmt) = conn.prepare(sql) else {
        return Vec::new();
    };
    stmt.query_map([], |r| r.get::<_, String>(0))
        .map(|rows| rows.map(Result::unwrap).collect())
        .unwrap_or_default()
}

/// Whether `till` holds what the server has for it: every product and its
/// own orders.
async fn agrees(server: &Server, till: &str) -> bool {
    let want: Vec<String> = server
        .client
        .query(
            "SELECT id || ':' || note FROM orders WHERE till = $1 ORDER BY id",
            &[&till],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let path = server.path(till);
    let orders = read(&path, "SELECT id || ':' || note FROM orders ORDER BY id");
    let products = read(&path, "SELECT count(*) || '' FROM products");
    orders == want && products == [PRODUCTS.to_string()]
}

/// Polls `check` until it holds; fails the test after `deadline`.
async fn until(what: &str, deadline: Duration, mut check: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !check().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn basic(till: &str, secret: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{till}:{secret}"))
    )
}

fn request(
    url: &str,
    till: &str,
    secret: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut request = format!("{url}{}", magic_sync_http::PATH)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", basic(till, secret).parse().unwrap());
    request
}

/// A raw connection speaking frames by hand, as `till` with `secret`.
async fn raw(
    url: &str,
    till: &str,
    secret: &str,
) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    tokio_tungstenite::connect_async(request(url, till, secret))
        .await
        .map(|(stream, _)| stream)
}

/// The status and body the server refused a connection with.
fn refusal<T>(connected: Result<T, tokio_tungstenite::tungstenite::Error>) -> (u16, String) {
    match connected {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => (
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned(),
        ),
        Err(e) => panic!("not refused by the server but failed: {e}"),
        Ok(_) => panic!("connected"),
    }
}

/// A raw connection read as a live replica reads it (every frame at once,
/// pings answered), until the server closes it.
struct Reading {
    /// Binary frames heard so far.
    frames: Arc<std::sync::atomic::AtomicUsize>,
    /// The close code and reason, and what came after the close, if
    /// anything did.
    task: tokio::task::JoinHandle<(u16, String, Option<String>)>,
}

fn reading(mut stream: Ws) -> Reading {
    let frames = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let heard = frames.clone();
    let task = tokio::spawn(async move {
        loop {
            match tokio::time::timeout(Duration::from_secs(120), stream.next()).await {
                Ok(Some(Ok(Message::Close(Some(frame))))) => {
                    let after =
                        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
                            Ok(None | Some(Err(_))) => None,
                            Ok(Some(Ok(frame))) => Some(format!("{frame:?}")),
                            Err(_) => Some("nothing, and it stayed open".into()),
                        };
                    return (frame.code.into(), frame.reason.to_string(), after);
                }
                Ok(Some(Ok(Message::Close(None)))) => panic!("closed without a reason"),
                Ok(Some(Ok(Message::Binary(_)))) => {
                    heard.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(e))) => panic!("the connection failed: {e}"),
                Ok(None) => panic!("ended without a close frame"),
                Err(_) => panic!("nothing heard, not even a ping"),
            }
        }
    });
    Reading { frames, task }
}

impl Reading {
    fn frames(&self) -> usize {
        self.frames.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The close code and reason; fails unless the server closes within
    /// ten seconds, and the connection ends after.
    async fn closed(self) -> (u16, String) {
        let (code, reason, after) = tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server did not close the connection")
            .unwrap();
        assert_eq!(after, None, "heard after the close");
        (code, reason)
    }
}

/// Reads from `tcp` until the server closes it; returns what it said and
/// how long after `started` that was. Fails `deadline` after `started`.
async fn until_closed(
    tcp: &mut tokio::net::TcpStream,
    started: Instant,
    deadline: Duration,
) -> (String, Duration) {
    let mut said = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let read = tokio::time::timeout_at(
            tokio::time::Instant::from_std(started + deadline),
            tcp.read(&mut buf),
        )
        .await
        .unwrap_or_else(|_| panic!("not closed in {deadline:?}"));
        match read {
            Ok(0) => break,
            Ok(n) => said.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading: {e}"),
        }
    }
    (
        String::from_utf8_lossy(&said).into_owned(),
        started.elapsed(),
    )
}

// ---------------------------------------------------------------- TLS

/// A self-signed certificate for `localhost`, as PEM files in `dir`.
#[cfg(feature = "tls")]
fn self_signed(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
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
    match t1.0.upload(&big) {
        Err(UplinkError::Refused(why)) => assert_eq!(
            why,
            format!("an upload of {size} bytes, more than a message may have ({MAX_MESSAGE})")
        ),
        other => panic!("not refused: {other:?}"),
    }
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
