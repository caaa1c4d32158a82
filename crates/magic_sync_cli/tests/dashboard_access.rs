//! Who may reach the dashboard (issue 41, item 12): a token of 32 bytes at
//! least; off this machine's loopback, only when plain HTTP is accepted in
//! so many words (the token would cross the network in the clear); and an
//! address that presents wrong tokens waits, longer each time.

use magic_sync::ops::Scope;
use magic_sync_cli::dashboard::{self, Access, Options, Token};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};

const TOKEN: &str = "a-token-of-more-than-32-bytes-at-least";

async fn database() -> magic_sync_testdb::TestDb {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    db
}

/// Serves the dashboard on `listener` with `options` until the sender is
/// dropped or sent to; what serving came to.
async fn start(
    db: &magic_sync_testdb::TestDb,
    listener: TcpListener,
    options: Options,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let mut client = db.connect().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        dashboard::serve_with(listener, &mut client, Scope::All, options, async {
            let _ = stopped.await;
        })
        .await
    });
    (stop, served)
}

fn with_token(token: &str) -> Options {
    Options {
        access: Access::Token(Token::new(token)),
        ..Options::default()
    }
}

/// The status of a GET of `/api/overview` to `to` from the loopback
/// address `from`, presenting `token` as a bearer token (if any), and its
/// `Retry-After`.
async fn get(from: Ipv4Addr, to: SocketAddr, token: Option<&str>) -> (u16, Option<u64>) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    let mut tcp = socket.connect(to).await.unwrap();
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{authorization}Connection: close\r\n\r\n",
        to.port()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    let head = response
        .split("\r\n\r\n")
        .next()
        .unwrap()
        .to_ascii_lowercase();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let retry = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after:"))
        .map(|v| v.trim().parse().unwrap());
    (status, retry)
}

#[tokio::test]
async fn a_token_shorter_than_32_bytes_is_refused_before_serving() {
    let db = database().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (_stop, served) = start(&db, listener, with_token("s3cret")).await;
    let refused = tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("it serves a short token")
        .unwrap()
        .expect_err("refused");
    assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
    let said = refused.to_string();
    assert!(
        said.contains("6 bytes") && said.contains("at least 32"),
        "{said}"
    );
}

#[tokio::test]
async fn off_loopback_plain_http_is_served_only_when_accepted_in_so_many_words() {
    let db = database().await;
    let everywhere = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let (_stop, served) = start(&db, everywhere, with_token(TOKEN)).await;
    let refused = tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("it serves plain HTTP off loopback")
        .unwrap()
        .expect_err("refused");
    assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
    let said = refused.to_string();
    assert!(
        said.contains("plain HTTP") && said.contains("in the clear"),
        "{said}"
    );
    // Accepted: served, and said so for the caller to warn.
    let options = Options {
        plain_http: true,
        ..with_token(TOKEN)
    };
    let everywhere = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let addr = everywhere.local_addr().unwrap();
    let warned = dashboard::exposure(addr, &options)
        .expect("accepted")
        .expect("a warning");
    assert!(warned.contains("in the clear"), "{warned}");
    let (stop, served) = start(&db, everywhere, options).await;
    let to = SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port()));
    assert_eq!(get(Ipv4Addr::LOCALHOST, to, Some(TOKEN)).await.0, 200);
    stop.send(()).unwrap();
    served.await.unwrap().unwrap();
    // Without a token, off loopback, never.
    let open = Options {
        plain_http: true,
        ..Options::default()
    };
    assert!(dashboard::exposure(addr, &open).is_err());
    // On loopback, nothing to warn of.
    let here = SocketAddr::from((Ipv4Addr::LOCALHOST, 9187));
    assert_eq!(dashboard::exposure(here, &Options::default()), Ok(None));
}

#[tokio::test]
async fn an_address_presenting_wrong_tokens_waits_and_others_do_not() {
    let db = database().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let to = listener.local_addr().unwrap();
    let (stop, served) = start(&db, listener, with_token(TOKEN)).await;
    let (guesser, operator) = (Ipv4Addr::new(127, 0, 30, 1), Ipv4Addr::new(127, 0, 30, 2));
    // Asking without a token is what a browser does first: not a failure.
    for _ in 0..10 {
        assert_eq!(get(guesser, to, None).await, (401, None));
    }
    // Wrong tokens: a few are answered, then the address waits, whatever
    // it presents, the right token included.
    let mut answered = 0;
    let wait = loop {
        match get(guesser, to, Some("not-the-token-but-as-long-as-it-is")).await {
            (401, None) => answered += 1,
            (429, Some(wait)) => break wait,
            other => panic!("{other:?}"),
        }
        assert!(answered < 12, "never throttled");
    };
    assert!(
        answered >= 1 && wait >= 1,
        "{answered} answered, then {wait} s"
    );
    assert_eq!(get(guesser, to, Some(TOKEN)).await.0, 429);
    // Another address is served.
    assert_eq!(get(operator, to, Some(TOKEN)).await.0, 200);
    stop.send(()).unwrap();
    served.await.unwrap().unwrap();
}
