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
//! - `/api/history`: the runner's figures of the last hour
//!   ([`ops::history`]), which the page draws as charts (SVG, built by its
//!   script). The page also keeps, per replica, its rows behind at each
//!   refresh since it opened (at most an hour of them, for at most 2,000
//!   replicas) and draws them beside it: history that costs the server
//!   nothing.
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

/// Replicas the page lists at most (the first page of the listing), and
/// the most `/api/replicas?limit=` gives.
const PAGE_LIMIT: usize = 500;

/// The most `/api/overview?worst=` lists.
const WORST_LIMIT: usize = 100;

/// What a handler asks the reading loop for.
#[derive(Debug)]
enum Ask {
    Overview { worst: usize },
    Replicas { after: Option<String>, limit: usize },
    Health,
    History,
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
/// `scope` through `client`, until `shutdown` resolves; answers requests
/// for this machine's names only (see [`serve_for`]).
pub async fn serve(
    listener: TcpListener,
    client: &mut Client,
    scope: Scope,
    access: Access,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_for(listener, client, scope, access, Vec::new(), shutdown).await
}

/// [`serve`], answering requests whose `Host` is a loopback name
/// (`localhost`, `127.0.0.1`, `[::1]`) or one of `hosts`. A page another
/// site's name points at this machine (DNS rebinding) cannot read it. With a
/// token and no `hosts`, any name is answered: the token is what protects.
pub async fn serve_for(
    listener: TcpListener,
    client: &mut Client,
    scope: Scope,
    access: Access,
    hosts: Vec<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let hosts = Hosts {
        any: hosts.is_empty() && matches!(access, Access::Token(_)),
        names: Arc::new(hosts.iter().map(|h| h.to_ascii_lowercase()).collect()),
    };
    let (tx, rx) = mpsc::channel(16);
    let mut app = Router::new()
        .route("/", get(page))
        .route("/api/overview", get(overview))
        .route("/api/replicas", get(replicas))
        .route("/api/health", get(health))
        .route("/api/history", get(history))
        .route("/metrics", get(metrics))
        .with_state(Reader(tx));
    if let Access::Token(token) = access {
        app = app.layer(axum::middleware::from_fn_with_state(token, admit));
    }
    // Outermost: a request for another name learns nothing, not even
    // whether a token is wanted.
    app = app.layer(axum::middleware::from_fn_with_state(hosts, named));
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    // The loop ends when every handle to it is gone: after the server.
    let (served, ()) = tokio::join!(async { server.await }, answer(rx, client, &scope));
    served
}

/// The names the dashboard answers to.
#[derive(Debug, Clone)]
struct Hosts {
    /// Any name (a token protects it).
    any: bool,
    /// Names besides the loopback ones, lowercase.
    names: Arc<Vec<String>>,
}

impl Hosts {
    fn admit(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        self.any
            || name == "localhost"
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
            || self.names.contains(&name)
    }
}

/// The name of a `Host` header: without its port, an IPv6 address without
/// its brackets.
fn host_name(host: &str) -> &str {
    if let Some(v6) = host.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
        .map_or(host, |(name, _)| name)
}

/// Lets a request through when its `Host` is one the dashboard answers to;
/// otherwise 421.
async fn named(State(hosts): State<Hosts>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if hosts.admit(host) {
        return next.run(request).await;
    }
    (
        StatusCode::MISDIRECTED_REQUEST,
        "magic-sync: this dashboard answers to localhost and the names given with --allow-host\n",
    )
        .into_response()
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
        Ask::History => json(&ops::history(client).await?),
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
            (header::X_FRAME_OPTIONS, "DENY"),
            // Nothing but this page's own script and style, and its reads;
            // and no page may frame it.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; frame-ancestors 'none'",
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
    let worst = q.worst.unwrap_or(10).min(WORST_LIMIT);
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
        limit: q.limit.unwrap_or(PAGE_LIMIT).min(PAGE_LIMIT),
    };
    Ok(json_of(reader.ask(ask).await.map_err(ApiFailure)?))
}

async fn health(State(reader): State<Reader>) -> Result<Response, ApiFailure> {
    Ok(json_of(reader.ask(Ask::Health).await.map_err(ApiFailure)?))
}

async fn history(State(reader): State<Reader>) -> Result<Response, ApiFailure> {
    Ok(json_of(reader.ask(Ask::History).await.map_err(ApiFailure)?))
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
