//! What the transport's tests share: a shop's server (database, relay and
//! hub on loopback), replicas over sockets, and raw connections speaking
//! frames by hand.
#![allow(dead_code)]

use futures_util::StreamExt;
use magic_sync::relay::{ReplicaInfo, Settings as RelaySettings};
use magic_sync::replica::Replica;
use magic_sync_http::client::{Settings as ClientSettings, Socket};
use magic_sync_http::server::{serve, Hub, Security, Settings};
use magic_sync_http::{credentials, credentials::Credentials};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

pub use magic_sync_testkit::counter::{engine, read, SCHEMA};

pub const PRODUCTS: usize = 500;

/// The most bytes of a message, on both sides.
pub const MAX_MESSAGE: usize = 256 << 10;

pub fn hub_settings() -> Settings {
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
pub struct Server {
    pub _db: magic_sync_testdb::TestDb,
    pub client: tokio_postgres::Client,
    pub hub: Hub,
    pub addr: SocketAddr,
    pub url: String,
    pub secrets: std::collections::HashMap<String, String>,
    /// The server's key, which every till is given with its secret.
    pub key: magic_sync::sign::ServerKey,
    pub dir: tempfile::TempDir,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A server for `tills`, with `settings`, secured by `security`: its url
/// names `localhost` under TLS (as the certificate does), else the address.
pub async fn server(tills: &[&str], settings: Settings, security: Security) -> Server {
    server_of(PRODUCTS, tills, settings, security).await
}

/// [`server`] with `products` products (a snapshot of many messages).
pub async fn server_of(
    products: usize,
    tills: &[&str],
    settings: Settings,
    security: Security,
) -> Server {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(SCHEMA).await.unwrap();
    client
        .execute(
            "INSERT INTO products SELECT i, 'product ' || i, i % 100 FROM generate_series(1, $1::bigint) i",
            &[&(products as i64)],
        )
        .await
        .unwrap();
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
    let key = magic_sync::store::keys::public(&client).await.unwrap();
    // These tests send wrong secrets in bursts the default rate of the
    // general share would refuse part of; that rate has tests of its own.
    let credentials = Credentials::new(db.config()).with_general_rate(1_000.0, 1_000);
    let hub = Hub::new(settings, credentials);
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
        let tills: Vec<ReplicaInfo> = tills.iter().map(|t| ReplicaInfo::live(*t, None)).collect();
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
        key,
        dir: tempfile::tempdir().unwrap(),
        stop: Some(stop),
        tasks: vec![serving, relay],
    }
}

pub type Running = (Arc<Socket>, std::thread::JoinHandle<()>);

impl Server {
    pub fn path(&self, till: &str) -> PathBuf {
        self.dir.path().join(format!("{till}.sqlite"))
    }

    /// The client settings of `till` with `secret`.
    pub fn settings(&self, till: &str, secret: &str) -> ClientSettings {
        ClientSettings {
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_millis(200),
            max_message_bytes: MAX_MESSAGE,
            ..ClientSettings::new(&self.url, till, secret)
        }
    }

    /// Starts `till`'s replica loop on a thread over a socket made with
    /// `settings`.
    pub fn replica_with(&self, settings: ClientSettings) -> Running {
        let till = settings.replica.clone();
        let socket = Arc::new(Socket::connect(settings).unwrap());
        let (path, link, key) = (self.path(&till), socket.clone(), self.key);
        let thread = std::thread::spawn(move || {
            let mut replica = Replica::open(&path, &till, engine()).unwrap();
            replica.trust(&key).unwrap();
            magic_sync::run::replica::replica(&mut replica, &*link).unwrap();
        });
        (socket, thread)
    }

    /// Starts `till`'s replica loop with its secret.
    pub fn replica(&self, till: &str) -> Running {
        self.replica_with(self.settings(till, &self.secrets[till]))
    }

    /// Resolves `serve`'s (and the relay's) stop future, and waits for both.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        for task in self.tasks.drain(..) {
            task.await.unwrap();
        }
    }
}

/// Closes a replica's socket and waits for its loop to end.
pub fn end((socket, thread): Running) {
    socket.close();
    thread.join().unwrap();
}

/// Whether `till` holds what the server has for it: every product and its
/// own orders.
pub async fn agrees(server: &Server, till: &str) -> bool {
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
    let all: i64 = server
        .client
        .query_one("SELECT count(*) FROM products", &[])
        .await
        .unwrap()
        .get(0);
    orders == want && products == [all.to_string()]
}

pub use magic_sync_testkit::until_within as until;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub fn basic(till: &str, secret: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{till}:{secret}"))
    )
}

pub fn request(
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
pub async fn raw(
    url: &str,
    till: &str,
    secret: &str,
) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    tokio_tungstenite::connect_async(request(url, till, secret))
        .await
        .map(|(stream, _)| stream)
}

/// The status and body the server refused a connection with.
pub fn refusal<T>(connected: Result<T, tokio_tungstenite::tungstenite::Error>) -> (u16, String) {
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
pub struct Reading {
    /// Binary frames heard so far.
    pub frames: Arc<std::sync::atomic::AtomicUsize>,
    /// The close code and reason, and what came after the close, if
    /// anything did.
    pub task: tokio::task::JoinHandle<(u16, String, Option<String>)>,
}

pub fn reading(mut stream: Ws) -> Reading {
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
    pub fn frames(&self) -> usize {
        self.frames.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The close code and reason; fails unless the server closes within
    /// ten seconds, and the connection ends after.
    pub async fn closed(self) -> (u16, String) {
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
pub async fn until_closed(
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

/// A TCP connection to `to` from the loopback address `from`.
pub async fn from(
    from: std::net::Ipv4Addr,
    to: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

/// What an upgrade to `server` as `till` with `secret`, from the loopback
/// address `address`, was answered: 101 and nothing when it became a
/// replica's (and is closed at once), else the status and body.
pub async fn attempt(
    server: &Server,
    address: std::net::Ipv4Addr,
    till: &str,
    secret: &str,
) -> (u16, String) {
    let tcp = from(address, server.addr).await.expect("connected");
    match tokio_tungstenite::client_async(request(&server.url, till, secret), tcp).await {
        Ok(_) => (101, String::new()),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => (
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned(),
        ),
        Err(e) => panic!("from {address}: neither upgraded nor answered: {e}"),
    }
}

/// Moves `sync.credentials` out of the way (`away`) or back: while it is
/// away, every lookup of a secret fails.
pub async fn credentials_away(server: &Server, away: bool) {
    let sql = if away {
        "ALTER TABLE sync.credentials RENAME TO credentials_away"
    } else {
        "ALTER TABLE sync.credentials_away RENAME TO credentials"
    };
    server.client.batch_execute(sql).await.unwrap();
}
