//! A connection's upgrade to a replica's: refused while the server stops;
//! else its HTTP Basic credentials are checked (the id's form first, then
//! the secret, within the handshake's time, with its party's failures
//! counted), and the socket is handed to the replica they proved.

use super::hub::Inner;
use super::listener::{Counted, Stopped};
use super::session::replica_connection;
use crate::credentials::{self, Checked};
use crate::guard;
use crate::logbook::Kind;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use std::net::SocketAddr;
use std::sync::Arc;

/// Bytes read from a replica's connection at a time.
const READ_BUFFER: usize = 8 << 10;

/// The id and secret of HTTP Basic credentials.
fn basic(headers: &HeaderMap) -> Result<(String, String), &'static str> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or("no credentials: send the replica's id and secret as HTTP Basic credentials")?;
    let encoded = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .ok_or("credentials that are not HTTP Basic")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|d| String::from_utf8(d).ok())
        .ok_or("HTTP Basic credentials that do not decode")?;
    let (id, secret) = decoded
        .split_once(':')
        .ok_or("HTTP Basic credentials without a `:`")?;
    Ok((id.to_string(), secret.to_string()))
}

pub(super) async fn upgrade(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    Extension(counted): Extension<Arc<Counted>>,
    Extension(stopped): Extension<Stopped>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if stopped.now() {
        return (StatusCode::SERVICE_UNAVAILABLE, "the server stops").into_response();
    }
    let (replica, secret) = match basic(&headers) {
        Ok(credentials) => credentials,
        Err(why) => {
            inner.log(
                Kind::NoCredentials,
                |more| tracing::warn!(%addr, "{why}{more}"),
            );
            return (StatusCode::UNAUTHORIZED, why).into_response();
        }
    };
    // Before anything is looked up, or kept, of it.
    if let Err(why) = credentials::check_id(&replica) {
        return inner.not_an_id(addr, &replica, &why.to_string());
    }
    let standing = inner.guard.standing(addr.ip(), &replica);
    let checked = tokio::time::timeout(
        inner.settings.handshake_timeout,
        inner.credentials.check_from(&replica, &secret, standing),
    )
    .await;
    if let Some(refused) = inner.refusal(addr, &replica, checked) {
        return refused;
    }
    let max = inner.settings.max_message_bytes;
    // A replica mostly acknowledges: a small read buffer (tungstenite
    // fills the whole buffer on its first read, 128 KiB by default, which
    // was most of an idle connection's cost).
    ws.max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(READ_BUFFER)
        .on_upgrade(move |socket| async move {
            let _counted = counted;
            replica_connection(inner, replica, addr, stopped, socket).await;
        })
}

/// What checking a secret came to, or that it took too long.
type CheckedInTime = Result<crate::Result<Checked>, tokio::time::error::Elapsed>;

impl Inner {
    /// The answer to `replica`'s upgrade from `addr` when its secret did
    /// not prove it, counting a failure where it is one; `None` when it
    /// did (what its party failed is then forgotten).
    fn refusal(&self, addr: SocketAddr, replica: &str, checked: CheckedInTime) -> Option<Response> {
        Some(match checked {
            Ok(Ok(Checked::Yes)) => {
                self.guard.proved(addr.ip(), replica);
                return None;
            }
            Ok(Ok(Checked::Barred(wait))) => {
                let seconds = wait.as_secs().max(1);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, seconds.to_string())],
                    format!("too many wrong secrets from this address: try again in {seconds} s"),
                )
                    .into_response()
            }
            Ok(Ok(Checked::No)) => {
                self.guard.failed(addr.ip(), Some(replica));
                self.log(Kind::WrongSecret, |more| {
                    tracing::warn!(
                        %addr,
                        replica = %guard::logged(replica),
                        "wrong credentials{more}"
                    )
                });
                (StatusCode::UNAUTHORIZED, "wrong credentials").into_response()
            }
            Ok(Ok(Checked::NotAnId)) => {
                self.not_an_id(addr, replica, "PostgreSQL cannot look it up")
            }
            Ok(Err(e)) => {
                self.log(
                    Kind::CannotCheck,
                    |more| tracing::warn!(%addr, error = %e, "cannot check credentials{more}"),
                );
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "cannot check credentials now",
                )
                    .into_response()
            }
            Err(_) => {
                self.log(
                    Kind::CannotCheck,
                    |more| tracing::warn!(%addr, "checking credentials took too long{more}"),
                );
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "checking credentials took too long",
                )
                    .into_response()
            }
        })
    }

    /// Refuses `replica`, which cannot be a replica's id (`why`), counting
    /// a failure against the party that sent it.
    fn not_an_id(&self, addr: SocketAddr, replica: &str, why: &str) -> Response {
        self.guard.failed(addr.ip(), None);
        self.log(Kind::NotAnId, |more| {
            tracing::warn!(
                %addr,
                replica = %guard::logged(replica),
                "an id that cannot be a replica's: {why}{more}"
            )
        });
        (
            StatusCode::UNAUTHORIZED,
            format!("an id that cannot be a replica's: {why}"),
        )
            .into_response()
    }
}
