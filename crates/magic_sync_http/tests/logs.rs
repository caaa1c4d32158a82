//! What the hub logs of what strangers and replicas do wrong (issue 41,
//! item 15): a line for the first of a kind, then a line a minute at most
//! saying how many more there were, however many addresses they come
//! from. A binary of its own: it counts every line the process logs.

#[path = "transport/support.rs"]
mod support;

use magic_sync::relay::Transport;
use magic_sync::ReplicaId;
use magic_sync_http::server::Security;
use std::net::Ipv4Addr;
use std::sync::{Mutex, OnceLock};
use support::*;
use tracing::field::{Field, Visit};

/// Every event the hub logged: its level and what it said.
#[derive(Default)]
struct Lines(Mutex<Vec<(tracing::Level, String)>>);

struct Said(String);

impl Visit for Said {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

struct Counting(&'static Lines);

impl tracing::Subscriber for Counting {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        if !meta.target().starts_with("magic_sync_http")
            && !meta.target().starts_with("magic_sync_server")
        {
            return;
        }
        let mut said = Said(String::new());
        event.record(&mut said);
        self.0 .0.lock().unwrap().push((*meta.level(), said.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn lines() -> &'static Lines {
    static LINES: OnceLock<Lines> = OnceLock::new();
    let lines = LINES.get_or_init(Lines::default);
    static SET: OnceLock<()> = OnceLock::new();
    SET.get_or_init(|| {
        tracing::subscriber::set_global_default(Counting(lines)).expect("the only subscriber")
    });
    lines
}

/// Lines logged at warn or above that say `what`.
fn warned(what: &str) -> Vec<String> {
    lines()
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(level, said)| *level <= tracing::Level::WARN && said.contains(what))
        .map(|(_, said)| said.clone())
        .collect()
}

const TIMES: u8 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_wrong_is_logged_once_then_counted_whatever_the_addresses() {
    lines();
    let mut server = server(&["t1"], hub_settings(), Security::Plain).await;
    // From thirty addresses, each wrong once: a wrong secret, an id that
    // cannot be one, no credentials at all.
    for n in 1..=TIMES {
        let address = Ipv4Addr::new(127, 0, 20, n);
        assert_eq!(
            attempt(&server, address, "t1", "not the secret, but long")
                .await
                .0,
            401
        );
        let address = Ipv4Addr::new(127, 0, 21, n);
        assert_eq!(
            attempt(&server, address, "t\0x", "whatever, long").await.0,
            401
        );
    }
    for n in 1..=TIMES {
        let tcp = from(Ipv4Addr::new(127, 0, 22, n), server.addr)
            .await
            .unwrap();
        let plain = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
            format!("{}{}", server.url, magic_sync_http::PATH),
        )
        .unwrap();
        let answered = tokio_tungstenite::client_async(plain, tcp).await;
        assert_eq!(refusal(answered).0, 401);
    }
    // A replica the relay found misbehaving, again and again.
    let t1 = ReplicaId::from("t1");
    for _ in 0..TIMES {
        server.hub.misbehaved(&t1, "a forged acknowledgement");
    }
    for what in [
        "wrong credentials",
        "an id that cannot be a replica's",
        "no credentials",
        "a forged acknowledgement",
    ] {
        let said = warned(what);
        // One line, and a second if the test took over a minute.
        assert!(
            !said.is_empty() && said.len() <= 2,
            "{what}: {} lines: {said:#?}",
            said.len()
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_logs_forged_acknowledgements_a_line_a_minute() {
    use futures_util::SinkExt;
    use prost::Message as _;
    lines();
    let mut server = server(&["t2"], hub_settings(), Security::Plain).await;
    let epoch: Vec<u8> = server
        .client
        .query_one("SELECT id FROM sync.epoch", &[])
        .await
        .unwrap()
        .get(0);
    // The server's epoch, a seal it never made: refused, and the
    // connection closed for it; the till comes back and says it again.
    let forged = magic_sync::envelope::Up {
        applied: Some(magic_sync::envelope::Ack {
            epoch,
            number: 1,
            nonce: vec![1; 16],
            seal: vec![2; 32],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    let secret = server.secrets["t2"].clone();
    // Once the relay knows the till: before, an acknowledgement of it
    // names nobody.
    let client = &server.client;
    until(
        "the relay to know t2",
        std::time::Duration::from_secs(30),
        async || {
            client
                .query_opt("SELECT 1 FROM sync.replicas WHERE id = 't2'", &[])
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
    for _ in 0..TIMES / 3 {
        let mut ws = raw(&server.url, "t2", &secret).await.unwrap();
        ws.send(tokio_tungstenite::tungstenite::Message::Binary(
            forged.clone().into(),
        ))
        .await
        .unwrap();
        reading(ws).closed().await;
    }
    let said = warned("acknowledgement refused");
    assert!(
        !said.is_empty() && said.len() <= 2,
        "{} lines: {said:#?}",
        said.len()
    );
    server.stop().await;
}
