//! Accepting connections: [`serve`] takes each from the listener (through
//! TLS, when it is secured), closes at once one past the bounds on
//! connections in all, per address and per network, and serves its HTTP,
//! within the handshake's time, until it upgrades to a replica's.

use super::hub::{Hub, Inner, Out};
use super::session::CLOSE_AWAY;
use super::upgrade::upgrade;
use crate::guard::Crowded;
use crate::logbook::Kind;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Extension;
use axum::Router;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The most bytes of an HTTP head the hub reads before it answers 431 and
/// closes. A replica's upgrade is a few hundred bytes: its Basic
/// credentials (an id of at most [`credentials::MAX_ID_BYTES`] and a
/// secret), the WebSocket headers, perhaps a proxy's. hyper's default is
/// about 400 KiB, and a stranger could make the hub parse that much per
/// connection from every new address it has.
///
/// [`credentials::MAX_ID_BYTES`]: crate::credentials::MAX_ID_BYTES
const HEAD_BYTES: usize = 16 << 10;
/// The most header fields in a head (hyper's default is 100).
const HEAD_FIELDS: usize = 64;

/// A TLS acceptor for [`serve`].
#[cfg(feature = "tls")]
pub type TlsAcceptor = tokio_rustls::TlsAcceptor;

/// A TLS acceptor from a PEM certificate chain and its PEM private key.
#[cfg(feature = "tls")]
pub fn tls_acceptor(
    certificates: &std::path::Path,
    key: &std::path::Path,
) -> crate::Result<TlsAcceptor> {
    use tokio_rustls::rustls;
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| crate::Error::Tls(format!("cannot read {}: {e}", p.display())))
    };
    let chain = rustls_pemfile::certs(&mut read(certificates)?.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| crate::Error::Tls(format!("{}: {e}", certificates.display())))?;
    let key = rustls_pemfile::private_key(&mut read(key)?.as_slice())
        .map_err(|e| crate::Error::Tls(format!("{}: {e}", key.display())))?
        .ok_or_else(|| crate::Error::Tls(format!("{}: no private key in it", key.display())))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| crate::Error::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| crate::Error::Tls(e.to_string()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// How [`serve`] secures its connections.
#[derive(Clone, Default)]
pub enum Security {
    /// Plain TCP: for loopback, or behind a proxy that ends TLS.
    #[default]
    Plain,
    /// TLS with this acceptor.
    #[cfg(feature = "tls")]
    Tls(TlsAcceptor),
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Security::Plain => f.write_str("Plain"),
            #[cfg(feature = "tls")]
            Security::Tls(_) => f.write_str("Tls"),
        }
    }
}

/// Accepts replicas' connections on `listener` for `hub` until `stop`
/// resolves; then closes every replica's connection, saying the server
/// stops.
pub async fn serve(
    hub: Hub,
    listener: TcpListener,
    security: Security,
    stop: impl Future<Output = ()>,
) -> crate::Result<()> {
    // Whether this `serve` stopped: a connection it accepted that asks to
    // become a replica's after is refused, and one that becomes a
    // replica's as it stops is closed.
    let (stopping, stopped) = watch::channel(false);
    let app = Router::new()
        .route(crate::PATH, get(upgrade))
        .layer(Extension(Stopped(stopped)))
        .with_state(hub.inner.clone());
    tokio::pin!(stop);
    loop {
        let (tcp, addr) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors, a connection reset before it was
                // taken: the next one may do.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Some(counted) = admit(&hub.inner, addr) {
            let _ = tcp.set_nodelay(true);
            tokio::spawn(handshake(
                tcp,
                addr,
                app.clone(),
                security.clone(),
                counted,
                hub.inner.settings.handshake_timeout,
            ));
        }
    }
    stopping.send_replace(true);
    let peers = hub.inner.peers();
    for conn in peers.values().filter_map(|p| p.conn.as_ref()) {
        let _ = conn
            .tx
            .send(Out::Close(CLOSE_AWAY, "the server stops".into()));
    }
    Ok(())
}

/// Counts the connection from `addr` open, or refuses it (`None`: it is
/// closed at once) when the server, its address or its network has as many
/// open as they may.
fn admit(inner: &Arc<Inner>, addr: SocketAddr) -> Option<Arc<Counted>> {
    let open = inner.connections.fetch_add(1, Ordering::Relaxed);
    // Held by the connection until it ends, a replica's or not.
    let mut counted = Counted(inner.clone(), None);
    if open >= inner.settings.max_connections {
        inner.log(Kind::Crowded, |more| {
            tracing::warn!(
                %addr,
                "closed at once, {open} connections are open (at most {}){more}",
                inner.settings.max_connections
            )
        });
        return None;
    }
    match inner.guard.open(addr.ip()) {
        Ok(from) => counted.1 = Some(from),
        Err(crowded) => {
            let (whose, most) = match crowded {
                Crowded::Address => ("address", inner.settings.max_connections_per_address),
                Crowded::Network => ("network", inner.settings.max_connections_per_network),
            };
            tracing::debug!(%addr, "closed at once, its {whose} has {most} connections open");
            return None;
        }
    }
    Some(Arc::new(counted))
}

/// TLS (when `security` asks for it), requests, and checking a secret, all
/// within `timeout`; then the connection is the app's.
async fn handshake(
    tcp: TcpStream,
    addr: SocketAddr,
    app: Router,
    security: Security,
    counted: Arc<Counted>,
    timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    match security {
        Security::Plain => connection(tcp, addr, app, counted, timeout, deadline).await,
        #[cfg(feature = "tls")]
        Security::Tls(acceptor) => {
            match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => connection(tls, addr, app, counted, timeout, deadline).await,
                Ok(Err(e)) => counted.0.log(
                    Kind::Handshake,
                    |more| tracing::warn!(%addr, error = %e, "TLS{more}"),
                ),
                Err(_) => counted.0.log(
                    Kind::Handshake,
                    |more| tracing::warn!(%addr, "no TLS handshake in {timeout:?}{more}"),
                ),
            }
        }
    }
}

/// Counts a connection open while it lives, in all and against its address:
/// from its acceptance to the end of the replica's connection it became, if
/// it did.
pub(super) struct Counted(Arc<Inner>, Option<crate::guard::Open>);

/// Whether the [`serve`] that accepted a connection stopped.
#[derive(Clone)]
pub(super) struct Stopped(watch::Receiver<bool>);

impl Stopped {
    pub(super) fn now(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves when the `serve` stops (never if it was dropped instead).
    pub(super) async fn wait(&mut self) {
        if self.0.wait_for(|stopped| *stopped).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one connection's HTTP until it becomes a replica's (the
/// upgrade hands it over) or ends: by `deadline`, else it is closed, however
/// many requests it made meanwhile.
async fn connection<I>(
    io: I,
    addr: SocketAddr,
    app: Router,
    counted: Arc<Counted>,
    handshake: Duration,
    deadline: tokio::time::Instant,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let inner = counted.0.clone();
    let service = hyper_util::service::TowerToHyperService::new(
        app.layer(Extension(ConnectInfo(addr)))
            .layer(Extension(counted)),
    );
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(handshake)
        .max_buf_size(HEAD_BYTES)
        .max_headers(HEAD_FIELDS);
    let served = http
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .with_upgrades();
    match tokio::time::timeout_at(deadline, served).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => inner.log(
            Kind::Handshake,
            |more| tracing::warn!(%addr, error = %e, "serving a connection{more}"),
        ),
        Err(_) => inner.log(Kind::Handshake, |more| {
            tracing::warn!(
                %addr,
                "not a replica's connection after {handshake:?}; closed{more}"
            )
        }),
    }
}
