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
//!   (`crate::scrape`).
//!
//! Given a token, every path wants it: HTTP Basic with the token as the
//! password (any user name; a browser asks for it once and sends it with
//! the page's reads), or `Authorization: Bearer` (a Prometheus scrape).
//! A token is [`MIN_TOKEN_BYTES`] bytes at least, and an address that
//! presents wrong ones waits, longer each time. Without a token
//! it answers anyone who reaches it, which it allows only on a loopback
//! address. It speaks plain HTTP, so beyond loopback the token and every
//! read would cross the network in the clear: it serves there only when
//! told the operator accepts that ([`Options::plain_http`]); the usual way
//! is to listen on loopback behind a proxy that ends TLS ([`exposure`]).
//!
//! The reads share one connection: the handlers ask, and one loop that
//! holds the connection answers, one read at a time. A read that fails
//! answers 503 (the database cannot be read as the engine's: unreachable,
//! no `sync` schema, another version), 404 (an unknown replica) or 400
//! (bad input), with the message.

use crate::show;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use magic_sync::ops::{self, Scope};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

/// The fewest bytes a token has: guessing one is then out of reach.
pub const MIN_TOKEN_BYTES: usize = 32;

/// A token the dashboard asks for, kept as its SHA-256 so that comparing
/// what a request presents takes the same time however much of it matches.
#[derive(Clone)]
pub struct Token {
    digest: Arc<[u8; 32]>,
    /// Its length, in bytes: the dashboard refuses to serve a short one.
    bytes: usize,
}

impl Token {
    /// The token `secret`. One shorter than [`MIN_TOKEN_BYTES`] is refused
    /// when serving begins.
    pub fn new(secret: &str) -> Token {
        Token {
            digest: Arc::new(Sha256::digest(secret.as_bytes()).into()),
            bytes: secret.len(),
        }
    }

    fn admits(&self, presented: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        presented == *self.digest
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// How the dashboard is served.
#[derive(Debug, Clone)]
pub struct Options {
    /// Who may read it.
    pub access: Access,
    /// Names it answers to besides the loopback ones (see [`serve_for`]).
    pub hosts: Vec<String>,
    /// Whether the operator accepts plain HTTP on an address beyond this
    /// machine's loopback, where the token and every read cross the
    /// network in the clear. Refused unless set; [`exposure`] gives the
    /// warning to show when it is.
    pub plain_http: bool,
}

impl Default for Options {
    /// Anyone on loopback, nothing else.
    fn default() -> Self {
        Options {
            access: Access::Open,
            hosts: Vec::new(),
            plain_http: false,
        }
    }
}

/// Whether the dashboard may serve on `addr` with `options`: `Err` says
/// why not (a token too short; beyond loopback, no token, or plain HTTP
/// not accepted); `Ok(Some(warning))` when it may, but the operator should
/// be told what it costs.
pub fn exposure(addr: SocketAddr, options: &Options) -> Result<Option<String>, String> {
    if let Access::Token(token) = &options.access {
        if token.bytes < MIN_TOKEN_BYTES {
            return Err(format!(
                "the dashboard's token is {} bytes long; at least {MIN_TOKEN_BYTES} are needed \
                 (`head -c 32 /dev/urandom | base64` makes one)",
                token.bytes
            ));
        }
    }
    if addr.ip().is_loopback() {
        return Ok(None);
    }
    if matches!(options.access, Access::Open) {
        return Err(format!(
            "listening on {addr}, beyond this machine, needs a token: the dashboard shows \
             every replica's state"
        ));
    }
    if !options.plain_http {
        return Err(format!(
            "the dashboard speaks plain HTTP: on {addr}, beyond this machine, its token and \
             every read would cross the network in the clear. Listen on loopback behind a \
             proxy that ends TLS, or accept plain HTTP in so many words (--allow-plain-http)"
        ));
    }
    Ok(Some(format!(
        "the dashboard serves plain HTTP on {addr}: its token and every read cross the \
         network in the clear"
    )))
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
    let options = Options {
        access,
        hosts,
        plain_http: false,
    };
    serve_with(listener, client, scope, options, shutdown).await
}

/// [`serve_for`] with every option. Refuses (`InvalidInput`, saying why)
/// what [`exposure`] refuses, before anything is served.
pub async fn serve_with(
    listener: TcpListener,
    client: &mut Client,
    scope: Scope,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    exposure(listener.local_addr()?, &options)
        .map_err(|why| std::io::Error::new(std::io::ErrorKind::InvalidInput, why))?;
    let Options { access, hosts, .. } = options;
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
        let gate = Gate {
            token,
            failures: Arc::default(),
        };
        app = app.layer(axum::middleware::from_fn_with_state(gate, admit));
    }
    // Outermost: a request for another name learns nothing, not even
    // whether a token is wanted.
    app = app.layer(axum::middleware::from_fn_with_state(hosts, named));
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown);
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

/// Wrong tokens presented from an address, let through before it waits.
const FREE_FAILURES: u32 = 5;
/// The first wait; it doubles with each wrong token after.
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait.
const LONGEST_WAIT: Duration = Duration::from_secs(300);
/// Wrong tokens are forgotten this long after the last one.
const FORGET_AFTER: Duration = Duration::from_secs(900);
/// Addresses with wrong tokens remembered at most: past it, the forgotten
/// ones go, then any one.
const MOST_REMEMBERED: usize = 10_000;

/// The token, and the wrong ones each address presented: how many, and
/// the last when. An address is an IPv4 address or an IPv6 /64 (changing
/// addresses within one's own /64 is free).
#[derive(Debug, Clone)]
struct Gate {
    token: Token,
    failures: Arc<Mutex<HashMap<IpAddr, (u32, Instant)>>>,
}

impl Gate {
    fn party(address: IpAddr) -> IpAddr {
        match address.to_canonical() {
            IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
            v4 => v4,
        }
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, (u32, Instant)>> {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long `address` must wait before presenting a token again.
    fn barred(&self, address: IpAddr) -> Option<Duration> {
        let (failures, last) = *self.failures().get(&Gate::party(address))?;
        let over = failures.checked_sub(FREE_FAILURES)?;
        let wait = FIRST_WAIT
            .saturating_mul(1u32 << over.min(16))
            .min(LONGEST_WAIT);
        (last + wait).checked_duration_since(Instant::now())
    }

    fn failed(&self, address: IpAddr) {
        let party = Gate::party(address);
        let now = Instant::now();
        let mut failures = self.failures();
        if failures.len() >= MOST_REMEMBERED && !failures.contains_key(&party) {
            failures.retain(|_, (_, last)| now.saturating_duration_since(*last) < FORGET_AFTER);
            if failures.len() >= MOST_REMEMBERED {
                if let Some(any) = failures.keys().next().copied() {
                    failures.remove(&any);
                }
            }
        }
        let (count, last) = failures.entry(party).or_insert((0, now));
        if now.saturating_duration_since(*last) >= FORGET_AFTER {
            *count = 0;
        }
        *count = count.saturating_add(1);
        *last = now;
    }

    fn passed(&self, address: IpAddr) {
        self.failures().remove(&Gate::party(address));
    }
}

/// Lets a request through when it presents the token; otherwise 401,
/// asking a browser for it (a wrong token counts against its address;
/// none at all, what a browser sends first, does not); and 429 while its
/// address waits, whatever it presents.
async fn admit(
    State(gate): State<Gate>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(wait) = gate.barred(peer.ip()) {
        let seconds = wait.as_secs().max(1);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, seconds.to_string())],
            format!(
                "magic-sync: too many wrong tokens from this address: try again in {seconds} s\n"
            ),
        )
            .into_response();
    }
    match presented(request.headers()) {
        Some(p) if gate.token.admits(&p) => {
            gate.passed(peer.ip());
            return next.run(request).await;
        }
        Some(_) => gate.failed(peer.ip()),
        None => {}
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
