//! What the server's runner does with a failure only the operator can end
//! (the error policy): a start whose declarations disagree with the
//! database, or that lacks an index the relay needs, returns the error with
//! what to do, instead of trying again for ever.

use crate::shop;
use crate::startup::ProductWithColour;
use magic_sync::relay::{ReplicaInfo, SendError, Settings, Transport};
use magic_sync::run::memory::Network;
use magic_sync::{Engine, Error, Handling, ReplicaId};
use std::time::Duration;

/// Runs the server's runner for `engine` until it returns. A runner that
/// retried what it cannot fix would never return: after two minutes the
/// test fails instead of hanging (retrying waits at most seconds between
/// attempts, so it would have tried dozens of times by then).
async fn runner_until_it_returns(db: &magic_sync_testdb::TestDb, engine: Engine) -> Error {
    let network = Network::new(64 * 1024);
    runner_over_until_it_returns(db, engine, &network, &network).await
}

/// [`runner_until_it_returns`], over `transport`.
async fn runner_over_until_it_returns(
    db: &magic_sync_testdb::TestDb,
    engine: Engine,
    transport: &impl Transport,
    network: &Network,
) -> Error {
    let replicas = vec![ReplicaInfo::live("u1", Some("north"))];
    let run = magic_sync::run::server::server(
        db.config(),
        engine,
        Settings::default(),
        &replicas,
        transport,
        network,
        std::future::pending(),
    );
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the runner kept trying what only the operator can fix")
        .expect_err("the runner returned without a failure")
}

#[tokio::test]
async fn a_missing_index_stops_the_runner_with_the_statement_to_run() {
    let (db, client) = shop::installed().await;
    client
        .batch_execute("DROP INDEX logistics.shipments_event")
        .await
        .unwrap();
    let err = runner_until_it_returns(&db, shop::engine()).await;
    assert!(matches!(err, Error::MissingIndexes(_)), "{err}");
    assert_eq!(err.handling(), Handling::Stop);
    let m = err.to_string();
    assert!(
        m.contains(
            r#"CREATE INDEX CONCURRENTLY IF NOT EXISTS "shipments_region_event_id_idx" ON "logistics"."shipments" ("region", "event_id")"#
        ),
        "{m}"
    );
}

#[tokio::test]
async fn a_declaration_the_table_disagrees_with_stops_the_runner_naming_table_and_column() {
    let (db, _client) = shop::installed().await;
    let engine = Engine::builder()
        .table::<ProductWithColour>()
        .build()
        .unwrap();
    let err = runner_until_it_returns(&db, engine).await;
    assert!(matches!(err, Error::Declarations(_)), "{err}");
    assert_eq!(err.handling(), Handling::Stop);
    let m = err.to_string();
    assert!(m.contains("table `products`, column `colour`"), "{m}");
}

/// A transport whose every send is refused: the broker will not take the
/// server's credentials.
struct Refused;

impl Transport for Refused {
    fn max_message_bytes(&self) -> usize {
        64 * 1024
    }

    async fn send(&self, _: &ReplicaId, _: &str, _: Vec<u8>) -> Result<(), SendError> {
        Err(SendError::misconfigured(
            "the broker refused the server's credentials: is its nkey enrolled?",
        ))
    }
}

#[tokio::test]
async fn a_transport_that_refuses_the_relay_stops_the_runner_with_what_it_said() {
    let (db, _client) = shop::installed().await;
    // u1's first snapshot is the first send, and it is refused.
    let network = Network::new(64 * 1024);
    let err = runner_over_until_it_returns(&db, shop::engine(), &Refused, &network).await;
    assert!(matches!(err, Error::Send { .. }), "{err}");
    assert_eq!(err.handling(), Handling::Stop);
    assert!(err.to_string().contains("is its nkey enrolled?"), "{err}");
}

#[test]
fn a_send_is_retried_only_while_its_replica_is_out_of_reach() {
    let send = |reason: SendError| Error::Send {
        replica: "u1".into(),
        number: 4,
        reason,
    };
    assert_eq!(
        send(SendError::unreachable("out of reach")).handling(),
        Handling::Retry
    );
    // Made within the transport's limit, and refused: the two disagree.
    assert_eq!(
        send(SendError::refused("max payload size exceeded")).handling(),
        Handling::Stop
    );
    assert_eq!(
        send(SendError::misconfigured("authorization violation")).handling(),
        Handling::Stop
    );
}

#[test]
fn only_the_listed_kinds_are_retried() {
    let send = Error::Send {
        replica: "u1".into(),
        number: 4,
        reason: SendError::unreachable("out of reach"),
    };
    assert_eq!(send.handling(), Handling::Retry);
    let too_large = Error::Unsendable(vec![magic_sync::error::Unsendable {
        table: "products",
        key: "[1]".into(),
        reason: "the row encodes to 10 bytes, more than a message may carry (5)".into(),
    }]);
    assert_eq!(too_large.handling(), Handling::SetAside);
    assert_eq!(
        Error::SchemaBehind {
            found: 0,
            needed: 15
        }
        .handling(),
        Handling::Stop
    );
}
