//! The dashboard against a real database whose `sync` schema holds a fleet
//! in a known state: the page in a real headless browser (Debian's
//! `chromium`), `/metrics` scraped over a plain socket, and `watch`.

use magic_sync::ops::Scope;
use magic_sync_cli::dashboard::{Access, Token};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A replica id a page could mistake for markup.
const EVIL: &str = r#"<b id="x">evil</b>"#;

/// A dashboard's token: 32 bytes at least.
const TOKEN: &str = "s3cret-s3cret-s3cret-s3cret-s3cret";

/// One replica in each state, written as the engine writes them:
///
/// - `a` (north) caught up;
/// - `b` (north) on its way: message 7 unacknowledged, carrying one row,
///   two messages in its outbox weighing (10 + 32 + 100) + (10 + 32 + 50)
///   = 234 bytes, its last acknowledgement two minutes old;
/// - `c` (south) waiting on a fix: one row of `sales` refused;
/// - `d` provisioning: its snapshot streams, two changes kept for it;
/// - the evil one out of reach.
///
/// One note is pending, about a row no replica holds.
fn fleet_sql() -> String {
    format!(
        "INSERT INTO sync.replicas (id, live, partition_id, provision, last_number, last_error,
                                    snapshot_attempt, snapshot_began_at) VALUES
            ('a', true, 'north', false, 5, NULL, NULL, NULL),
            ('b', true, 'north', false, 7, NULL, NULL, NULL),
            ('c', true, 'south', false, 7, NULL, NULL, NULL),
            ('d', true, 'south', true, 0, NULL, '\\x01', now()),
            ({evil}, true, NULL, false, 3, 'unreachable <i>x</i>', NULL, NULL),
            ('gone', false, NULL, true, 0, NULL, NULL, NULL);
         INSERT INTO sync.acks (replica, number, at) VALUES
            ('a', 5, now()), ('b', 5, now() - interval '2 minutes'), ('c', 7, now()),
            ({evil}, 3, now());
         INSERT INTO sync.held (replica, table_name, key, version, message) VALUES
            ('a', 'items', '[1]', 0, 5), ('a', 'items', '[2]', 0, 5),
            ('b', 'items', '[1]', 0, 5), ('b', 'items', '[2]', 0, 7),
            ('c', 'items', '[1]', 0, 7), ('c', 'items', '[2]', 0, 7),
            ({evil}, 'items', '[1]', 0, 3);
         INSERT INTO sync.bodies (hash, bytes) VALUES
            ('\\x01', decode(repeat('ab', 100), 'hex')), ('\\x02', decode(repeat('cd', 50), 'hex'));
         INSERT INTO sync.outbox (replica, number, nonce, head, body, seal)
            SELECT 'b', n, '\\x00', decode(repeat('00', 10), 'hex'), b.id, decode(repeat('00', 32), 'hex')
            FROM (VALUES (6, '\\x01'::bytea), (7, '\\x02')) v (n, h) JOIN sync.bodies b ON b.hash = v.h;
         INSERT INTO sync.inbox (replica, table_name, key, data, reason, at) VALUES
            ('c', 'sales', '[\"s1\"]', NULL, 'a record of another replica', '2026-01-02T03:04:05Z');
         INSERT INTO sync.deferred (replica, table_name, key, seq, xid) VALUES
            ('d', 'items', '[1]', 1, pg_current_xact_id()), ('d', 'items', '[3]', 2, pg_current_xact_id());
         INSERT INTO sync.notes (table_name, source, key) VALUES ('orders', 'orders', '[9]');",
        evil = quote(EVIL)
    )
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

async fn fleet() -> magic_sync_testdb::TestDb {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    client.batch_execute(&fleet_sql()).await.unwrap();
    db
}

/// A dashboard on an ephemeral port, stopped when dropped.
struct Dashboard {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<std::io::Result<()>>>,
}

impl Dashboard {
    async fn start(db: &magic_sync_testdb::TestDb) -> Dashboard {
        Dashboard::start_with(db, Access::Open).await
    }

    async fn start_with(db: &magic_sync_testdb::TestDb, access: Access) -> Dashboard {
        let mut client = db.connect().await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            let stopped = async {
                let _ = stopped.await;
            };
            magic_sync_cli::dashboard::serve(listener, &mut client, Scope::All, access, stopped)
                .await
        });
        Dashboard {
            addr,
            stop: Some(stop),
            served: Some(served),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops it, and says whether it served without an error.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let served = self.served.take().unwrap();
        served.await.unwrap().unwrap();
    }

    /// A GET over a plain socket: the status and the body.
    async fn get(&self, path: &str) -> (u16, String) {
        self.get_with(path, "").await
    }

    /// A GET with `headers` (each line ending in CRLF): the status and the
    /// body; a 401 also gives what it asks for.
    async fn get_with(&self, path: &str, headers: &str) -> (u16, String) {
        let mut socket = TcpStream::connect(self.addr).await.unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\n{headers}Connection: close\r\n\r\n",
            self.addr
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        socket.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        if status == 401 {
            let asks = head
                .lines()
                .find(|l| l.to_ascii_lowercase().starts_with("www-authenticate:"))
                .unwrap_or("");
            return (status, format!("{asks}\n{body}"));
        }
        // A body of unknown length comes chunked.
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            unchunk(body)
        } else {
            body.to_string()
        };
        (status, body)
    }
}

fn unchunk(mut rest: &str) -> String {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return body;
        }
        body.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

/// Debian's Chromium, or a failure that says how to install it: the test
/// must not pass without a browser.
fn chromium() -> &'static str {
    ["chromium", "chromium-browser"]
        .into_iter()
        .find(|name| {
            std::process::Command::new(name)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .unwrap_or_else(|| {
            panic!(
                "the dashboard test loads the page in a real browser, and no `chromium` was \
                 found on PATH: install Debian's package with \
                 `sudo apt-get install -y --no-install-recommends chromium` (.ci/run does)"
            )
        })
}

/// The page as Chromium leaves it once its script has read the endpoints.
async fn browse(chromium: &str, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            // Virtual time stands still while the page's reads are under
            // way: the budget runs the script to its first refresh and on.
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn assert_shows(dom: &str, what: &str) {
    assert!(
        dom.contains(what),
        "the page does not show `{what}`:\n{dom}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_in_a_browser_shows_the_engines_figures() {
    let chromium = chromium();
    let db = fleet().await;
    let dashboard = Dashboard::start(&db).await;
    let dom = browse(chromium, &dashboard.url("/")).await;

    // The fleet at a glance: one replica in each state.
    for state in [
        "caught_up",
        "on_its_way",
        "provisioning",
        "out_of_reach",
        "waiting_on_fix",
    ] {
        assert_shows(&dom, &format!(r#"id="state-{state}">1</span>"#));
    }
    assert_shows(&dom, "5 live replicas, 1 notes pending");
    // A bar per replica: messages acknowledged of those written.
    assert_shows(
        &dom,
        r#"<progress data-replica="b" value="5" max="7"></progress>"#,
    );
    assert_shows(
        &dom,
        r#"<progress data-replica="a" value="5" max="5"></progress>"#,
    );
    // Per-table bars.
    assert_shows(&dom, r#"<div class="bar" data-table="items">"#);
    assert_shows(&dom, r#"<div class="bar" data-table="sales">"#);
    // Health in plain words, each saying what to do.
    assert_shows(&dom, "Something waits for a fix to be deployed.");
    assert_shows(
        &dom,
        r#"<li class="deploy_fix">deploy a fix: 1 rows of sales from 1 replicas refused since 2026-01-02T03:04:05+00:00: a record of another replica</li>"#,
    );
    assert_shows(
        &dom,
        r#"<li class="wait">wait: 2 changes kept for d while its snapshot streams</li>"#,
    );
    // What the database holds is shown as text, never as markup.
    assert_shows(&dom, r#"&lt;b id="x"&gt;evil&lt;/b&gt;"#);
    assert_shows(&dom, "unreachable &lt;i&gt;x&lt;/i&gt;");
    assert!(!dom.contains(EVIL), "{dom}");
    assert!(!dom.contains("<i>x</i>"), "{dom}");
    assert!(
        !dom.contains(r#"class="shown""#),
        "an error is shown:\n{dom}"
    );

    dashboard.stop().await;
}

#[tokio::test]
async fn metrics_are_the_records_figures() {
    let db = fleet().await;
    let dashboard = Dashboard::start(&db).await;
    let (status, text) = dashboard.get("/metrics").await;
    assert_eq!(status, 200, "{text}");
    let lines: BTreeSet<&str> = text.lines().collect();
    let evil = r#"<b id=\"x\">evil</b>"#;
    for line in [
        "# TYPE magic_sync_replicas gauge".to_string(),
        r#"magic_sync_replicas{state="caught_up"} 1"#.into(),
        r#"magic_sync_replicas{state="on_its_way"} 1"#.into(),
        r#"magic_sync_replicas{state="provisioning"} 1"#.into(),
        r#"magic_sync_replicas{state="out_of_reach"} 1"#.into(),
        r#"magic_sync_replicas{state="waiting_on_fix"} 1"#.into(),
        "magic_sync_notes_pending 1".into(),
        "magic_sync_notes_pending_rows 1".into(),
        r#"magic_sync_rows_refused{table="sales"} 1"#.into(),
        r#"magic_sync_provisionings{snapshot="waiting"} 0"#.into(),
        r#"magic_sync_provisionings{snapshot="streaming"} 1"#.into(),
        r#"magic_sync_replica_outbox_messages{replica="b"} 2"#.into(),
        r#"magic_sync_replica_outbox_bytes{replica="b"} 234"#.into(),
        r#"magic_sync_replica_outbox_bytes{replica="a"} 0"#.into(),
        r#"magic_sync_replica_messages_unacknowledged{replica="b"} 2"#.into(),
        r#"magic_sync_replica_unacknowledged_seconds{replica="a"} 0"#.into(),
        r#"magic_sync_replica_rows_on_their_way{replica="b"} 1"#.into(),
        r#"magic_sync_replica_rows_outdated{replica="b"} 0"#.into(),
        r#"magic_sync_replica_rows_refused{replica="c"} 1"#.into(),
        r#"magic_sync_replica_changes_kept{replica="d"} 2"#.into(),
        format!(r#"magic_sync_replica_outbox_messages{{replica="{evil}"}} 0"#),
    ] {
        assert!(lines.contains(line.as_str()), "no `{line}` in:\n{text}");
    }
    // Since b's last acknowledgement, two minutes before the fleet was
    // written: at least that, read on the server's clock.
    let waited: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"magic_sync_replica_unacknowledged_seconds{replica="b"} "#))
        .unwrap()
        .parse()
        .unwrap();
    assert!(waited >= 120.0, "{waited}");
    // Not live: not counted.
    assert!(!text.contains("gone"), "{text}");
    // PostgreSQL tracks no commit times here: no age is made up.
    assert!(
        !text.contains("magic_sync_notes_oldest_pending_seconds "),
        "{text}"
    );

    let (status, body) = dashboard.get("/api/overview").await;
    assert_eq!(status, 200);
    let overview: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(overview["replicas"], 5);
    dashboard.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_sync_schema_it_says_so_and_keeps_serving() {
    let chromium = chromium();
    let bare = magic_sync_testdb::database().await;
    let dashboard = Dashboard::start(&bare).await;
    let message = "the database has no sync schema: magic_sync was never installed in it";
    for path in ["/api/overview", "/api/replicas", "/api/health"] {
        let (status, body) = dashboard.get(path).await;
        assert_eq!(status, 503, "{path}: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            body["error"].as_str().unwrap().starts_with(message),
            "{body}"
        );
    }
    let (status, body) = dashboard.get("/metrics").await;
    assert_eq!(status, 503);
    assert!(
        body.starts_with(&format!("magic-sync: {message}")),
        "{body}"
    );
    let (status, _) = dashboard.get("/api/replicas?limit=0").await;
    assert_eq!(status, 400);

    let dom = browse(chromium, &dashboard.url("/")).await;
    assert_shows(&dom, r#"<div id="error" role="alert" class="shown">"#);
    assert_shows(
        &dom,
        &format!("The dashboard cannot read the fleet: {message}"),
    );
    dashboard.stop().await;
}

#[tokio::test]
async fn watch_ends_once_every_replica_is_caught_up_and_no_note_is_pending() {
    let db = magic_sync_testdb::database().await;
    let client = {
        let mut client = db.connect().await;
        magic_sync::schema::migrate(&mut client).await.unwrap();
        client
    };
    client
        .batch_execute(
            "INSERT INTO sync.replicas (id, live, partition_id, provision, last_number) VALUES
                ('a', true, NULL, false, 5), ('b', true, NULL, false, 7);
             INSERT INTO sync.acks (replica, number, at) VALUES ('a', 5, now()), ('b', 5, now());",
        )
        .await
        .unwrap();
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .args(["watch", "--every", "0.05"])
        .env("DATABASE_URL", db.url())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // It saw b behind before b caught up.
    assert_eq!(
        lines.next_line().await.unwrap().as_deref(),
        Some("1 of 2 replicas not caught up yet")
    );
    client
        .batch_execute(
            "INSERT INTO sync.notes (table_name, source, key) VALUES ('items', 'items', '[9]');
             UPDATE sync.acks SET number = 7 WHERE replica = 'b';",
        )
        .await
        .unwrap();
    // Caught up is not the end while a note may still be on its way.
    assert_eq!(
        lines.next_line().await.unwrap().as_deref(),
        Some("all 2 replicas caught up; 1 notes pending")
    );
    client
        .batch_execute("DELETE FROM sync.notes")
        .await
        .unwrap();
    assert_eq!(
        lines.next_line().await.unwrap().as_deref(),
        Some("all 2 replicas caught up")
    );
    let status = watch.wait().await.unwrap();
    assert_eq!(status.code(), Some(0));
}

/// `magic-sync dashboard` with `args` (and the token file in the
/// environment), once it said where it listens: the process, and a client
/// of the address it named (over loopback when it listens on every one).
async fn command(
    db: &magic_sync_testdb::TestDb,
    args: &[&str],
    token_file: Option<&std::path::Path>,
) -> (tokio::process::Child, Dashboard) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_magic-sync"));
    command
        .arg("dashboard")
        .args(args)
        .env("DATABASE_URL", db.url());
    match token_file {
        Some(path) => command.env("MAGIC_SYNC_DASHBOARD_TOKEN_FILE", path),
        None => command.env_remove("MAGIC_SYNC_DASHBOARD_TOKEN_FILE"),
    };
    let mut dashboard = command
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(dashboard.stdout.take().unwrap()).lines();
    let said = lines.next_line().await.unwrap().unwrap();
    let mut addr: SocketAddr = said
        .strip_prefix("magic-sync dashboard at http://")
        .and_then(|rest| rest.strip_suffix("/ (Ctrl-C stops it)"))
        .unwrap_or_else(|| panic!("{said}"))
        .parse()
        .unwrap();
    if addr.ip().is_unspecified() {
        addr.set_ip([127, 0, 0, 1].into());
    }
    let client = Dashboard {
        addr,
        stop: None,
        served: None,
    };
    (dashboard, client)
}

#[tokio::test]
async fn the_command_says_where_it_listens_and_serves_there() {
    let db = fleet().await;
    let (mut dashboard, client) = command(
        &db,
        &["--listen", "127.0.0.1:0", "--partition", "north"],
        None,
    )
    .await;
    let (status, body) = client.get("/api/overview").await;
    assert_eq!(status, 200, "{body}");
    let overview: serde_json::Value = serde_json::from_str(&body).unwrap();
    // The north only: a and b.
    assert_eq!(overview["replicas"], 2, "{overview}");
    assert_eq!(overview["states"]["on_its_way"], 1, "{overview}");
    dashboard.kill().await.unwrap();

    // An address it cannot listen on: an error that names it.
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = taken.local_addr().unwrap().to_string();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .args(["dashboard", "--listen", &at])
        .env("DATABASE_URL", db.url())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8(out.stderr).unwrap();
    assert!(
        said.starts_with(&format!("magic-sync: serving the dashboard on {at}: ")),
        "{said}"
    );
}

/// Given a token, every path wants it: the password of HTTP Basic (what a
/// browser sends once asked) or a bearer token (a Prometheus scrape);
/// without it, or with another, 401 asking for Basic, and nothing is read.
#[tokio::test]
async fn given_a_token_every_path_wants_it() {
    use base64::Engine as _;
    let db = fleet().await;
    let dashboard = Dashboard::start_with(&db, Access::Token(Token::new(TOKEN))).await;
    let basic = |pair: &str| {
        format!(
            "Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    };
    for path in [
        "/",
        "/api/overview",
        "/api/replicas",
        "/api/health",
        "/metrics",
    ] {
        for headers in [
            String::new(),
            basic("operator:wrong"),
            basic(TOKEN),
            format!("Authorization: Bearer {}\r\n", &TOKEN[1..]),
            format!("Authorization: Digest {TOKEN}\r\n"),
        ] {
            let (status, said) = dashboard.get_with(path, &headers).await;
            assert_eq!(status, 401, "{path} with {headers:?}: {said}");
            assert!(
                said.to_ascii_lowercase()
                    .contains("www-authenticate: basic"),
                "{said}"
            );
            assert!(!said.contains("replicas"), "{said}");
        }
        for headers in [
            basic(&format!("operator:{TOKEN}")),
            basic(&format!(":{TOKEN}")),
            format!("Authorization: Bearer {TOKEN}\r\n"),
        ] {
            let (status, said) = dashboard.get_with(path, &headers).await;
            assert_eq!(status, 200, "{path} with {headers:?}: {said}");
        }
    }
    let (_, overview) = dashboard
        .get_with("/api/overview", &basic(&format!("operator:{TOKEN}")))
        .await;
    let overview: serde_json::Value = serde_json::from_str(&overview).unwrap();
    assert_eq!(overview["replicas"], 5, "{overview}");
    dashboard.stop().await;
}

/// Beyond a loopback address the command wants a token file, of 32 bytes
/// at least, and plain HTTP accepted in so many words: without that, the
/// token would cross the network in the clear. An empty token file is an
/// error that names it.
#[tokio::test]
async fn beyond_this_machine_the_command_wants_a_token() {
    let db = fleet().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .args(["dashboard", "--listen", "0.0.0.0:0"])
        .env("DATABASE_URL", db.url())
        .env_remove("MAGIC_SYNC_DASHBOARD_TOKEN_FILE")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8(out.stderr).unwrap();
    assert!(said.contains("needs --token-file"), "{said}");

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "  \n").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .args(["dashboard", "--listen", "0.0.0.0:0", "--token-file"])
        .arg(&empty)
        .env("DATABASE_URL", db.url())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8(out.stderr).unwrap();
    assert!(
        said.contains("empty") && said.contains(&*empty.to_string_lossy()),
        "{said}"
    );

    let token = dir.path().join("token");
    for (written, says) in [
        ("s3cret\n", "at least 32"),
        (&*format!("{TOKEN}\n"), "plain HTTP"),
    ] {
        std::fs::write(&token, written).unwrap();
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_magic-sync"))
            .args(["dashboard", "--listen", "0.0.0.0:0", "--token-file"])
            .arg(&token)
            .env("DATABASE_URL", db.url())
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let said = String::from_utf8(out.stderr).unwrap();
        assert!(said.contains(says), "{said}");
    }

    // Plain HTTP accepted in so many words: served, saying what it costs.
    let mut served = tokio::process::Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .args(["dashboard", "--listen", "0.0.0.0:0", "--allow-plain-http"])
        .arg("--token-file")
        .arg(&token)
        .env("DATABASE_URL", db.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(served.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().unwrap_or_default();
    assert!(first.contains("magic-sync dashboard at http://"), "{first}");
    served.kill().await.unwrap();
    let mut said = String::new();
    served
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .await
        .unwrap();
    assert!(
        said.contains("warning:") && said.contains("in the clear"),
        "{said}"
    );
}

/// The replicas' progress bars a page shows, by id as the DOM has it.
fn bars(dom: &str) -> Vec<String> {
    dom.split(r#"<progress data-replica=""#)
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .collect()
}

/// The address a link of the page points at, by the link's id.
fn link(dom: &str, id: &str) -> String {
    let at = dom
        .find(&format!(r#"id="{id}""#))
        .unwrap_or_else(|| panic!("no link `{id}`:\n{dom}"));
    let before = &dom[..at];
    let href = &before[before.rfind(r#"href=""#).unwrap() + 6..];
    href[..href.find('"').unwrap()].replace("&amp;", "&")
}

/// The page lists the replicas a page at a time, with links to the next
/// page and back to the first; the figures above stay the fleet's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_the_replicas_a_page_at_a_time() {
    let chromium = chromium();
    let db = fleet().await;
    let dashboard = Dashboard::start(&db).await;
    let mut seen = Vec::new();
    let mut dom = browse(chromium, &dashboard.url("/?limit=2")).await;
    assert!(!dom.contains(r#"id="first-page""#), "{dom}");
    loop {
        let shown = bars(&dom);
        assert!(!shown.is_empty() && shown.len() <= 2, "{shown:?}\n{dom}");
        assert_shows(&dom, "5 live replicas, 1 notes pending");
        seen.extend(shown);
        if !dom.contains(r#"id="next-page""#) {
            break;
        }
        let next = link(&dom, "next-page");
        assert!(next.contains("limit=2"), "{next}");
        dom = browse(chromium, &dashboard.url(&format!("/{next}"))).await;
        assert_eq!(link(&dom, "first-page"), "?limit=2");
    }
    // Every replica once, in the listing's order.
    assert_eq!(seen.len(), 5, "{seen:?}");
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 5, "{seen:?}");
    dashboard.stop().await;
}

/// The head and body of a GET of `path` sent with `Host: host`.
async fn raw_get(addr: SocketAddr, host: &str, path: &str) -> (String, String) {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

#[tokio::test]
async fn it_answers_only_to_this_machines_names_and_no_page_may_frame_it() {
    let db = fleet().await;
    let dashboard = Dashboard::start(&db).await;
    let port = dashboard.addr.port();
    // Another site's name pointed at this machine (DNS rebinding) reads nothing.
    for host in ["evil.example", "evil.example:80", "127.0.0.1.evil.example"] {
        let (head, body) = raw_get(dashboard.addr, host, "/api/overview").await;
        assert!(head.starts_with("HTTP/1.1 421"), "{host}: {head}");
        assert!(!body.contains("replicas"), "{body}");
    }
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let (head, _) = raw_get(dashboard.addr, &host, "/").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{host}: {head}");
        let head = head.to_ascii_lowercase();
        assert!(head.contains("frame-ancestors 'none'"), "{head}");
        assert!(head.contains("x-frame-options: deny"), "{head}");
    }
    dashboard.stop().await;
}

#[tokio::test]
async fn what_a_request_asks_for_is_clamped() {
    let db = fleet().await;
    db.connect()
        .await
        .batch_execute(
            "INSERT INTO sync.replicas (id, live, provision, last_number, last_error)
             SELECT format('r%s', lpad(i::text, 4, '0')), true, false, 0, 'unreachable'
             FROM generate_series(1, 700) i",
        )
        .await
        .unwrap();
    let dashboard = Dashboard::start(&db).await;
    let (status, body) = dashboard.get("/api/replicas?limit=100000").await;
    assert_eq!(status, 200, "{body}");
    let listing: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listing["replicas"].as_array().unwrap().len(), 500);
    let (status, body) = dashboard.get("/api/overview?worst=100000").await;
    assert_eq!(status, 200, "{body}");
    let overview: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(overview["worst"].as_array().unwrap().len(), 100, "{body}");
    dashboard.stop().await;
}

mod live {
    use magic_sync::Row;

    /// What the load writes, to every till.
    #[derive(Row, Debug, Clone)]
    #[row(table = "counters", down, all, key(id))]
    pub struct Counter {
        pub id: i64,
        pub n: i64,
    }

    /// What a till's host writes: a tap of its counter, filed on the server.
    #[derive(Row, Debug, Clone)]
    #[row(table = "taps", up, key(id), key_without_origin)]
    pub struct Tap {
        pub id: String,
        #[row(origin)]
        pub unit_id: String,
        pub n: i64,
    }
}

struct Tills(Vec<magic_sync::relay::ReplicaInfo>);

impl magic_sync::relay::Replicas for Tills {
    async fn replicas(&self) -> magic_sync::Result<Vec<magic_sync::relay::ReplicaInfo>> {
        Ok(self.0.clone())
    }
}

/// `sync.figures` rows written so far, and how many saw rows sent and
/// uploads filed.
async fn figures(client: &tokio_postgres::Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE rows_sent > 0 AND uploads_filed > 0)
             FROM sync.figures",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

use magic_sync_testkit::until;

/// The `points` of the polyline of `series` in chart `chart`.
fn series(dom: &str, chart: &str, series: &str) -> String {
    let at = dom
        .find(&format!(r#"data-chart="{chart}""#))
        .unwrap_or_else(|| panic!("no chart {chart}:\n{dom}"));
    let rest = &dom[at..];
    let end = rest.find("</svg>").unwrap();
    let svg = &rest[..end];
    let at = svg
        .find(&format!(r#"data-series="{series}""#))
        .unwrap_or_else(|| panic!("no series {series} in {chart}:\n{svg}"));
    let points = &svg[at..];
    let start = points.find(r#"points=""#).unwrap() + r#"points=""#.len();
    let stop = points[start..].find('"').unwrap();
    points[start..start + stop].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_draws_the_fleets_history_and_it_moves_under_a_load() {
    let chromium = chromium();
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE counters (id bigint PRIMARY KEY, n bigint NOT NULL);
             CREATE TABLE taps (id text PRIMARY KEY, unit_id text NOT NULL, n bigint NOT NULL);
             INSERT INTO counters SELECT g, 0 FROM generate_series(1, 20) g;",
        )
        .await
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let engine = &magic_sync::Engine::builder()
        .table::<live::Counter>()
        .table::<live::Tap>()
        .build()
        .unwrap();
    magic_sync::trigger::install(engine, &mut client)
        .await
        .unwrap();
    let key = magic_sync::store::keys::public(&client).await.unwrap();
    let network = magic_sync::run::memory::Network::new(64 * 1024);
    let dir = tempfile::tempdir().unwrap();
    let tills: Vec<_> = ["t1", "t2"]
        .into_iter()
        .map(|id| {
            let (network, path) = (network.clone(), dir.path().join(format!("{id}.sqlite")));
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut replica = magic_sync::replica::Replica::open(&path, id, &engine).unwrap();
                replica.trust(&key).unwrap();
                magic_sync::run::replica::replica(&mut replica, &network.link(id))
            })
        })
        .collect();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = {
        let (config, network, engine) = (db.config(), network.clone(), engine.clone());
        tokio::spawn(async move {
            let settings = magic_sync::relay::Settings {
                figures_every: std::time::Duration::from_millis(200),
                ..Default::default()
            };
            let tills = Tills(vec![
                magic_sync::relay::ReplicaInfo::live("t1", None),
                magic_sync::relay::ReplicaInfo::live("t2", None),
            ]);
            magic_sync::run::server::server(
                config,
                engine,
                settings,
                &tills,
                &network,
                &network,
                async {
                    let _ = stopped.await;
                },
            )
            .await
        })
    };
    // The load: a counter moved every few milliseconds until the end, and
    // t1's host tapping it.
    let loading = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let till_file = rusqlite::Connection::open(dir.path().join("t1.sqlite")).unwrap();
    till_file
        .busy_timeout(std::time::Duration::from_secs(30))
        .unwrap();
    let load = {
        let (writer, loading) = (db.connect().await, loading.clone());
        tokio::spawn(async move {
            let mut i = 0_i64;
            while loading.load(std::sync::atomic::Ordering::Relaxed) {
                writer
                    .execute(
                        "UPDATE counters SET n = n + 1 WHERE id = $1",
                        &[&(i % 20 + 1)],
                    )
                    .await
                    .unwrap();
                if i % 10 == 0 {
                    // The replica made the table as it opened: a write may
                    // come before that, and is tried again.
                    let _ = till_file.execute(
                        "INSERT INTO taps (id, unit_id, n) VALUES (?1, 't1', ?2)",
                        rusqlite::params![format!("tap-{i}"), i],
                    );
                }
                i += 1;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
    };
    until("the runner wrote no figures of rows sent", || async {
        figures(&client).await.1 >= 3
    })
    .await;

    let dashboard = Dashboard::start(&db).await;
    let first = browse(chromium, &dashboard.url("/")).await;
    for chart in ["lag", "pending", "sent", "filed", "provisioning"] {
        assert_shows(&first, &format!(r#"data-chart="{chart}""#));
    }
    let rows_then = series(&first, "sent", "rows");
    assert!(rows_then.split(' ').count() >= 3, "{rows_then}");
    assert!(
        !series(&first, "lag", "p50").is_empty(),
        "acknowledgements under the load have their lag drawn:\n{first}"
    );
    assert!(
        series(&first, "filed", "uploads")
            .split(' ')
            .any(|point| !point.ends_with(",30.00")),
        "the till's taps are drawn as filed:\n{first}"
    );
    // Each till's rows behind, since the page opened.
    assert_shows(&first, r#"data-replica="t1" data-points="#);
    assert!(
        !first.contains(r#"class="shown""#),
        "an error is shown:\n{first}"
    );

    // More periods go by under the load: the charts move.
    let (written, _) = figures(&client).await;
    until("the runner wrote no more figures", || async {
        figures(&client).await.0 >= written + 3
    })
    .await;
    let second = browse(chromium, &dashboard.url("/")).await;
    let rows_now = series(&second, "sent", "rows");
    assert!(
        rows_now.split(' ').count() > rows_then.split(' ').count(),
        "{rows_then} then {rows_now}"
    );
    assert_ne!(rows_now, rows_then);

    loading.store(false, std::sync::atomic::Ordering::Relaxed);
    load.await.unwrap();
    dashboard.stop().await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    for till in tills {
        till.join().unwrap().unwrap();
    }
}
