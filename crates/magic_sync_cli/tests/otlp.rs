//! The engine's spans reach an OpenTelemetry collector over OTLP/HTTP when
//! the environment names one: a relay runs a pass and publishes, and the
//! collector (a stand-in on a real socket, answering as a collector does)
//! is sent spans named for them, under the service's name.
//!
//! A binary of its own: `logs` installs the process's subscriber once.

use magic_sync::Row;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

#[derive(Row, Debug, Clone)]
#[row(table = "counters", down, all, key(id))]
struct Counter {
    id: i64,
    n: i64,
}

struct Tills(Vec<magic_sync::relay::ReplicaInfo>);

impl magic_sync::relay::Replicas for Tills {
    async fn replicas(&self) -> magic_sync::Result<Vec<magic_sync::relay::ReplicaInfo>> {
        Ok(self.0.clone())
    }
}

/// What the collector was sent: each request's path and body.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A collector stand-in on a socket: answers every request 200, as a
/// collector does once it took the spans, keeping its path and body.
async fn collector() -> (String, Received) {
    let received = Received::default();
    let kept = received.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri, body: axum::body::Bytes| {
        let kept = kept.clone();
        async move {
            kept.lock()
                .unwrap()
                .push((uri.path().to_string(), body.to_vec()));
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (address, received)
}

fn contains(body: &[u8], text: &str) -> bool {
    body.windows(text.len()).any(|w| w == text.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_s_passes_and_publishing_reach_the_collector_the_environment_names() {
    let (address, received) = collector().await;
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &address);
    std::env::set_var("OTEL_SERVICE_NAME", "till-fleet-relay");
    // Batches every 100 ms, so the test waits for them no longer.
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "100");
    magic_sync_cli::logs();

    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE counters (id bigint PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO counters SELECT g, 0 FROM generate_series(1, 5) g;",
        )
        .await
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let engine = magic_sync::Engine::builder()
        .table::<Counter>()
        .build()
        .unwrap();
    magic_sync::trigger::install(&engine, &mut client)
        .await
        .unwrap();
    let network = magic_sync::run::memory::Network::new(64 * 1024);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let (config, network) = (db.config(), network.clone());
        tokio::spawn(async move {
            magic_sync::run::server::server(
                config,
                engine,
                magic_sync::relay::Settings::default(),
                &Tills(vec![magic_sync::relay::ReplicaInfo::live("t1", None)]),
                &network,
                &network,
                async {
                    let _ = stopped.await;
                },
            )
            .await
        })
    };
    // A change for the till: a pass writes it, the publisher sends it.
    client
        .batch_execute("UPDATE counters SET n = n + 1 WHERE id = 1")
        .await
        .unwrap();
    let spans = |name: &str| {
        received
            .lock()
            .unwrap()
            .iter()
            .any(|(path, body)| path == "/v1/traces" && contains(body, name))
    };
    magic_sync_testkit::until("a pass and a publish exported", async || {
        spans("pass") && spans("publish")
    })
    .await;
    let sent = received.lock().unwrap().clone();
    assert!(
        sent.iter().all(|(path, _)| path == "/v1/traces"),
        "only traces"
    );
    assert!(
        sent.iter()
            .any(|(_, body)| contains(body, "till-fleet-relay")),
        "under the service's name"
    );
    // The pass's fields travel with it.
    assert!(sent.iter().any(|(_, body)| contains(body, "messages")));
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
