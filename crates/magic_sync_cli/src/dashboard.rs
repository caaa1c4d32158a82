//! `magic-sync dashboard`: a page that refreshes itself, the JSON it
//! reads, and a Prometheus text endpoint, all from `magic_sync::ops`.
//!
//! - `/`: the page (`page.html`, embedded in the binary): plain HTML, CSS
//!   and a small inline script that reads the endpoints below every two
//!   seconds and builds the page with `textContent` only, so nothing read
//!   from the database (replica ids, table names, reasons) is ever parsed
//!   as HTML.
//! - `/api/overview`, `/api/replicas?after=ID&limit=N`, `/api/health`: the
//!   reads, as `magic-sync ... --json` prints them; each health item also
//!   `says` what it is in plain words.
//! - `/metrics`: the figures of [`ops::gauges`] in Prometheus' text format
//!   ([`crate::scrape`]).
//!
//! Given a token, every path wants it: HTTP Basic with the token as the
//! password (any user name; a browser asks for it once and sends it with
//! the page's reads), or `Authorization: Bearer` (a Prometheus scrape).
//! Without one it answers anyone who reaches it, which `magic-sync
//! dashboard` allows only on a loopback address.
//!
//! The reads share one connection: the handlers ask, and one loop that
//! holds the connection answers, one read at a time. A read that fails
//! answers 503 (the database cannot be read as the engine's: unreachable,
//! no `sync` schema, another version), 404 (an unknown replica) or 400
//! (bad input), with the message.

use crate::show;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use magic_sync::ops::{self, Scope};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Client;

/// The page, served as it is.
const PAGE: &str = include_str!("page.html");

/// Replicas the page lists at most (the first page of the listing).
const PAGE_LIMIT: usize = 500;

/// What a handler asks the reading loop for.
#[derive(Debug)]
enum Ask {
    Overview { worst: usize },
    Replicas { after: Option<String>, limit: usize },
    Health,
    Metrics,
}

/// What the reading loop answers.
#[derive(Debug)]
enum Answer {
    Json(Value),
    Text(String),
}

type Asked = (Ask, oneshot::Sender<Result<Answer, ops::Error>>);

#[derive(Debug, Clone)]
struct Reader(mpsc::Sender<Asked>);

impl Reader {
    async fn ask(&self, ask: Ask) -> Result<Answer, Failure> {
        let (tx, rx) = oneshot::channel();
        self.0.send((ask, tx)).await.map_err(|_| Failure::Gone)?;
        rx.await.map_err(|_| Failure::Gone)?.map_err(Failure::Read)
    }
}

/// Who may read the dashboard.
#[derive(Debug, Clone)]
pub enum Access {
    /// Anyone who reaches it.
    Open,
    /// Whoever presents this token.
    Token(Token),
}

/// A token the dashboard asks for, kept as its SHA-256 so that comparing
/// what a request presents takes the same time however much of it matches.
#[derive(Clone)]
pub struct Token(Arc<[u8; 32]>);

impl Token {
    /// The token `secret`.
    pub fn new(secret: &str) -> Token {
        Token(Arc::new(Sha256::digest(secret.as_bytes()).into()))
    }

    fn admits(&self, presented: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        presented == *self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Serves the dashboard on `listener` to whom `access` admits, reading
/// `scope` through `client`, until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    client: &mut Client,
    scope: Scope,
    access: Access,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel(16);
    let mut app = Router::new()
        .route("/", get(page))
        .route("/api/overview", get(overview))
        .route("/api/replicas", get(replicas))
        .route("/api/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(Reader(tx));
    if let Access::Token(token) = access {
        app = app.layer(axum::middleware::from_fn_with_state(token, admit));
    }
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    // The loop ends when every handle to it is gone: after the server.
    let (served, ()) = tokio::join!(async { server.await }, answer(rx, client, &scope));
    served
}

/// Lets a request through when it presents the token; otherwise 401,
/// asking a browser for it.
async fn admit(State(token): State<Token>, request: Request, next: Next) -> Response {
    if presented(request.headers()).is_some_and(|p| token.admits(&p)) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            "Basic realm=\"magic-sync dashboard\", charset=\"UTF-8\"",
        )],
        "magic-sync: this dashboard wants its token (HTTP Basic, as the password; or Bearer)\n",
    )
        .into_response()
}

/// The token a request presents: the password of HTTP Basic, or a
/// bearer token.
fn presented(headers: &HeaderMap) -> Option<String> {
    use base64::Engine as _;
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.trim().to_string());
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let pair = String::from_utf8(decoded).ok()?;
    let (_user, password) = pair.split_once(':')?;
    Some(password.to_string())
}

/// Answers what is asked, one read at a time, on the one connection.
async fn answer(mut asks: mpsc::Receiver<Asked>, client: &mut Client, scope: &Scope) {
    while let Some((ask, reply)) = asks.recv().await {
        let _ = reply.send(read(client, scope, ask).await);
    }
}

async fn read(client: &mut Client, scope: &Scope, ask: Ask) -> Result<Answer, ops::Error> {
    Ok(match ask {
        Ask::Overview { worst } => json(&ops::overview(client, scope, worst).await?),
        Ask::Replicas { after, limit } => {
            json(&ops::listing(client, scope, after.as_deref(), limit).await?)
        }
        Ask::Health => Answer::Json(said(&ops::health(client, scope).await?)),
        Ask::Metrics => Answer::Text(crate::scrape::render(&ops::gauges(client, scope).await?)),
    })
}

/// A read as JSON. The reads are plain data: serialising one cannot fail.
fn json<T: serde::Serialize>(read: &T) -> Answer {
    Answer::Json(serde_json::to_value(read).unwrap_or(Value::Null))
}

/// The health read as `--json` prints it, each item with what it `says`
/// in plain words, as `magic-sync health` words it.
fn said(health: &ops::Health) -> Value {
    let mut value = serde_json::to_value(health).unwrap_or(Value::Null);
    if let Some(items) = value.get_mut("items").and_then(Value::as_array_mut) {
        for (item, read) in items.iter_mut().zip(&health.items) {
            if let Some(item) = item.as_object_mut() {
                let says = format!(
                    "{}: {}",
                    show::action(read.action),
                    show::describe(&read.concern)
                );
                item.insert("says".into(), Value::String(says));
            }
        }
    }
    value
}

/// Why a handler could not answer.
#[derive(Debug)]
enum Failure {
    Read(ops::Error),
    /// The reading loop is gone: the server is shutting down.
    Gone,
}

impl Failure {
    fn status(&self) -> StatusCode {
        match self {
            Failure::Read(ops::Error::UnknownReplica(_) | ops::Error::NotLive(_)) => {
                StatusCode::NOT_FOUND
            }
            Failure::Read(
                ops::Error::KeyArity { .. }
                | ops::Error::KeyValue { .. }
                | ops::Error::UnrecordedTable(_)
                | ops::Error::Invalid(_),
            ) => StatusCode::BAD_REQUEST,
            Failure::Read(_) | Failure::Gone => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn message(&self) -> String {
        match self {
            Failure::Read(e) => e.to_string(),
            Failure::Gone => "the dashboard is shutting down".into(),
        }
    }
}

/// The API's failures are JSON: `{"error": "..."}`.
struct ApiFailure(Failure);

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.0.message() });
        (self.0.status(), Json(body)).into_response()
    }
}

fn json_of(answer: Answer) -> Response {
    match answer {
        Answer::Json(v) => Json(v).into_response(),
        Answer::Text(t) => t.into_response(),
    }
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // Nothing but this page's own script and style, and its reads.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'",
            ),
        ],
        PAGE,
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct OverviewQuery {
    worst: Option<usize>,
}

async fn overview(
    State(reader): State<Reader>,
    Query(q): Query<OverviewQuery>,
) -> Result<Response, ApiFailure> {
    let worst = q.worst.unwrap_or(10);
    let answer = reader
        .ask(Ask::Overview { worst })
        .await
        .map_err(ApiFailure)?;
    Ok(json_of(answer))
}

#[derive(Debug, Deserialize)]
struct ReplicasQuery {
    after: Option<String>,
    limit: Option<usize>,
}

async fn replicas(
    State(reader): State<Reader>,
    Query(q): Query<ReplicasQuery>,
) -> Result<Response, ApiFailure> {
    let ask = Ask::Replicas {
        after: q.after,
        limit: q.limit.unwrap_or(PAGE_LIMIT),
    };
    Ok(json_of(reader.ask(ask).await.map_err(ApiFailure)?))
}

async fn health(State(reader): State<Reader>) -> Result<Response, ApiFailure> {
    Ok(json_of(reader.ask(Ask::Health).await.map_err(ApiFailure)?))
}

/// Prometheus' text format; a failure is plain text too.
async fn metrics(State(reader): State<Reader>) -> Response {
    match reader.ask(Ask::Metrics).await {
        Ok(Answer::Text(text)) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Ok(answer) => json_of(answer),
        Err(f) => (f.status(), format!("magic-sync: {}\n", f.message())).into_response(),
    }
}
