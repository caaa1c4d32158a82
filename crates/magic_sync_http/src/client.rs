//! The replica's side: a [`Socket`] holds the replica's connection to the
//! server, and connects again, with backoff and jitter, whenever it is
//! lost. The replica's loop ([`magic_sync::run::replica`]) runs over it.
//!
//! Nothing needs to be carried over a reconnection: the server sends again,
//! first, what the replica had not acknowledged, and the replica's chain
//! skips what it had applied; an upload not answered goes again after a
//! while. What the replica says while disconnected is dropped, for the same
//! reasons.

use futures_util::{SinkExt, StreamExt};
use magic_sync::backoff::Backoff;
use magic_sync::envelope::Up;
use magic_sync::replica::UplinkError;
use magic_sync::run::link::{Ends, Shell, State};
use magic_sync::run::replica::Link;
pub use magic_sync::run::replica::Nudger;
use magic_sync::run::{host_of, is_loopback};
use magic_sync::run::{Delivery, Report};
use std::sync::mpsc as std_mpsc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

/// Where and as whom a replica connects.
#[derive(Clone)]
pub struct Settings {
    /// The server: `ws://host:port` or `wss://host:port` (the path is added).
    pub server: String,
    /// The replica's id.
    pub replica: String,
    /// The replica's secret. Never printed.
    pub secret: String,
    /// The most bytes one frame may have, either way: as the server's.
    pub max_message_bytes: usize,
    /// The first wait before connecting again; it doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// The longest wait before connecting again.
    pub backoff_max: Duration,
    /// How long connecting (TCP, TLS, the upgrade) may take.
    pub connect_timeout: Duration,
    /// How long the server may say nothing (it pings) before the
    /// connection counts as lost.
    pub idle_timeout: Duration,
    /// PEM certificates to trust for `wss://` in place of the usual roots
    /// (a private certificate authority, or a self-signed server).
    pub trust: Option<std::path::PathBuf>,
    /// Allow `ws://` (no TLS) to a server that is not on this machine. Off
    /// by default: the secret would cross the network in the clear. Messages
    /// are signed either way, so nobody between can change what the replica
    /// holds; but whoever reads the secret can connect as the replica. For
    /// a network where a proxy beside the replica ends TLS.
    pub allow_plain: bool,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("server", &self.server)
            .field("replica", &self.replica)
            .field("secret", &"<hidden>")
            .field("max_message_bytes", &self.max_message_bytes)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("trust", &self.trust)
            .field("allow_plain", &self.allow_plain)
            .finish()
    }
}

impl Settings {
    /// Settings for `replica` with `secret` at `server`, the rest by default.
    pub fn new(
        server: impl Into<String>,
        replica: impl Into<String>,
        secret: impl Into<String>,
    ) -> Self {
        Settings {
            server: server.into(),
            replica: replica.into(),
            secret: secret.into(),
            max_message_bytes: crate::server::Settings::default().max_message_bytes,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(45),
            trust: None,
            allow_plain: false,
        }
    }
}

/// A replica's connection to the server, kept open by a thread of its own.
#[derive(Debug)]
pub struct Socket {
    shell: Shell<Vec<u8>>,
}

impl Socket {
    /// Starts connecting: returns at once, and connects (again) in the
    /// background until closed.
    pub fn connect(settings: Settings) -> crate::Result<Socket> {
        if !(settings.server.starts_with("ws://") || settings.server.starts_with("wss://")) {
            return Err(crate::Error::Settings(format!(
                "the server `{}` is not a ws:// or wss:// address",
                settings.server
            )));
        }
        if let Some(host) = settings.server.strip_prefix("ws://").map(host_of) {
            if !settings.allow_plain && !is_loopback(host) {
                return Err(crate::Error::Settings(format!(
                    "the server `{}` is ws:// to another machine: the replica's secret would \
                     cross the network in the clear; use wss://, or allow plain ws:// \
                     (`allow_plain`, --allow-plain) where a proxy beside the replica ends TLS",
                    settings.server
                )));
            }
        }
        if settings.server.starts_with("wss://") && !cfg!(feature = "tls") {
            return Err(crate::Error::Settings(
                "wss:// needs magic_sync_http's `tls` feature".into(),
            ));
        }
        let shell = Shell::start(
            format!("magic_sync socket {}", settings.replica),
            settings.max_message_bytes,
            move |ends| run(settings, ends),
        )?;
        Ok(Socket { shell })
    }

    /// Whether it is connected now.
    pub fn is_connected(&self) -> bool {
        self.shell.state().is_connected()
    }

    /// Connections made so far.
    pub fn connects(&self) -> u64 {
        self.shell.state().connects()
    }

    /// Why the last connection ended, or the last attempt failed; `None`
    /// while it is connected.
    pub fn last_error(&self) -> Option<String> {
        self.shell.state().last_error()
    }

    /// A handle the host nudges when it wrote something.
    pub fn nudger(&self) -> Nudger {
        self.shell.nudger()
    }

    /// Closes the connection and stops connecting: the replica's loop
    /// sees the link end.
    pub fn close(&self) {
        self.shell.close();
    }
}

impl Link for Socket {
    fn max_message_bytes(&self) -> usize {
        self.shell.max_message_bytes()
    }

    fn next(&self, timeout: Duration) -> Delivery {
        self.shell.incoming().next(timeout)
    }

    fn report(&self, report: Report) {
        if self.is_connected() {
            self.shell.send(report.encode());
        }
    }

    fn upload(&self, up: &Up) -> Result<(), UplinkError> {
        let bytes = self.shell.upload_bytes(up, "the server")?;
        if self.shell.send(bytes) {
            Ok(())
        } else {
            Err(UplinkError::unreachable("the socket is closed"))
        }
    }
}

/// Connects, and connects again, until stopped; then ends the link.
async fn run(settings: Settings, ends: Ends<Vec<u8>>) {
    let Ends {
        feed,
        mut out,
        state,
    } = ends;
    // With jitter: a fleet cut off at once does not come back at once.
    let mut backoff = Backoff::new(settings.backoff_min, settings.backoff_max);
    while !state.stopping() {
        let ended = session(&settings, &feed, &mut out, &state).await;
        let why = match ended {
            Ended::Stopped => break,
            Ended::Lost { why, was_connected } => {
                if was_connected {
                    backoff.reset();
                }
                why
            }
        };
        state.lost(Some(why));
        tokio::select! {
            () = tokio::time::sleep(backoff.next_wait()) => {}
            () = state.stopped() => break,
        }
    }
    state.lost(None);
    let _ = feed.send(Delivery::Closed);
}

enum Ended {
    Stopped,
    Lost { why: String, was_connected: bool },
}

fn lost(why: impl Into<String>) -> Ended {
    Ended::Lost {
        why: why.into(),
        was_connected: false,
    }
}

async fn session(
    settings: &Settings,
    feed: &std_mpsc::Sender<Delivery>,
    out: &mut mpsc::UnboundedReceiver<Vec<u8>>,
    state: &State,
) -> Ended {
    let url = format!("{}{}", settings.server.trim_end_matches('/'), crate::PATH);
    let mut request = match url.as_str().into_client_request() {
        Ok(request) => request,
        Err(e) => return lost(format!("the server address `{url}`: {e}")),
    };
    let credentials = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("{}:{}", settings.replica, settings.secret),
    );
    let Ok(value) = format!("Basic {credentials}").parse() else {
        return lost("the replica's id or secret cannot go in a header");
    };
    request.headers_mut().insert(
        tokio_tungstenite::tungstenite::http::header::AUTHORIZATION,
        value,
    );
    let config = WebSocketConfig::default()
        .max_message_size(Some(settings.max_message_bytes))
        .max_frame_size(Some(settings.max_message_bytes));
    let connecting = connect(request, config, settings);
    let connected = tokio::select! {
        c = tokio::time::timeout(settings.connect_timeout, connecting) => c,
        () = state.stopped() => return Ended::Stopped,
    };
    let stream = match connected {
        Err(_) => {
            return lost(format!(
                "no connection to {url} in {:?}",
                settings.connect_timeout
            ))
        }
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response))) => {
            let body = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            return lost(format!(
                "the server refused replica `{}`: {} {body}",
                settings.replica,
                response.status()
            ));
        }
        Ok(Err(e)) => return lost(format!("connecting to {url}: {e}")),
        Ok(Ok(stream)) => stream,
    };
    // What was said before this connection was for the last one.
    while out.try_recv().is_ok() {}
    state.connected();
    let (mut sink, mut stream) = stream.split();
    let gone = |why: String| Ended::Lost {
        why,
        was_connected: true,
    };
    loop {
        tokio::select! {
            frame = tokio::time::timeout(settings.idle_timeout, stream.next()) => {
                let frame = match frame {
                    Err(_) => return gone(format!("the server said nothing for {:?}", settings.idle_timeout)),
                    Ok(None) => return gone("the server closed the connection".into()),
                    Ok(Some(Err(e))) => return gone(format!("the connection failed: {e}")),
                    Ok(Some(Ok(frame))) => frame,
                };
                match frame {
                    Message::Binary(bytes) => {
                        let delivery = match Delivery::decode(&bytes) {
                            Ok(Some(delivery)) => delivery,
                            Ok(None) => continue,
                            Err(e) => return gone(format!("the server sent a frame that does not decode: {e}")),
                        };
                        if feed.send(delivery).is_err() {
                            return Ended::Stopped;
                        }
                    }
                    Message::Close(frame) => {
                        let why = frame.map_or_else(
                            || "the server closed the connection".to_string(),
                            |f| format!("the server closed the connection: {}", f.reason),
                        );
                        return gone(why);
                    }
                    _ => {}
                }
            }
            bytes = out.recv() => {
                let Some(bytes) = bytes else { return Ended::Stopped };
                if let Err(e) = sink.send(Message::Binary(bytes.into())).await {
                    return gone(format!("sending failed: {e}"));
                }
            }
            () = state.stopped() => {
                let _ = sink.send(Message::Close(None)).await;
                return Ended::Stopped;
            }
        }
    }
}

type Stream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

#[cfg(not(feature = "tls"))]
async fn connect(
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
    config: WebSocketConfig,
    _settings: &Settings,
) -> Result<Stream, tokio_tungstenite::tungstenite::Error> {
    tokio_tungstenite::connect_async_with_config(request, Some(config), true)
        .await
        .map(|(stream, _)| stream)
}

#[cfg(feature = "tls")]
async fn connect(
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
    config: WebSocketConfig,
    settings: &Settings,
) -> Result<Stream, tokio_tungstenite::tungstenite::Error> {
    let connector = match &settings.trust {
        None => None,
        Some(path) => Some(tokio_tungstenite::Connector::Rustls(
            trusting(path)
                .map_err(|e| tokio_tungstenite::tungstenite::Error::Io(std::io::Error::other(e)))?,
        )),
    };
    tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, connector)
        .await
        .map(|(stream, _)| stream)
}

/// A TLS client trusting only the certificates in the PEM file at `path`.
#[cfg(feature = "tls")]
fn trusting(
    path: &std::path::Path,
) -> Result<std::sync::Arc<tokio_rustls::rustls::ClientConfig>, String> {
    use tokio_rustls::rustls;
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::{host_of, is_loopback, Settings, Socket};

    #[test]
    fn plain_ws_is_for_this_machine_unless_allowed() {
        for (address, host) in [
            ("127.0.0.1:7000", "127.0.0.1"),
            ("localhost:7000/x", "localhost"),
            ("[::1]:7000", "::1"),
            ("till:pw@server.example:7000", "server.example"),
            ("10.0.0.5", "10.0.0.5"),
        ] {
            assert_eq!(host_of(address), host, "{address}");
        }
        assert!(is_loopback("127.0.0.9") && is_loopback("::1") && is_loopback("LOCALHOST"));
        assert!(!is_loopback("10.0.0.5") && !is_loopback("localhost.example.com"));
        let remote = Settings::new("ws://10.0.0.5:7000", "till-1", "a secret of sixteen");
        let err = Socket::connect(remote.clone()).expect_err("plain to another machine");
        assert!(err.to_string().contains("wss://"), "{err}");
        let allowed = Settings {
            allow_plain: true,
            connect_timeout: std::time::Duration::from_millis(50),
            ..remote
        };
        Socket::connect(allowed).expect("allowed").close();
    }
}
