//! Waking the relay when a change commits (`store::wake`): a runner that
//! had nothing to do dozes, and is woken by the next note's commit, not by
//! its longest wait; a writer that wrote while the relay was at work, and
//! so will not notify, is waited for.
//!
//! Each runner here dozes for an hour at most (`idle_longest`), so only a
//! wake explains a change arriving within the tests' minute.

use crate::fleet::Fleet;
use crate::relay::{backend, for_the_runner, product_name, start_server_with, till, until};
use magic_sync::relay::{ReplicaInfo, Settings};
use magic_sync::run::memory::Network;
use magic_sync::store::wake::{self, Doze};
use std::path::Path;
use std::time::Duration;

/// The runner for the till `u1`, dozing for an hour at most.
struct Runner {
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<magic_sync::Result<()>>,
}

impl Runner {
    /// Started, once the till whose file is `path` was provisioned.
    async fn start(fleet: &Fleet, network: &Network, path: &Path) -> Runner {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let settings = Settings {
            idle_longest: Duration::from_secs(3600),
            ..Settings::default()
        };
        let replicas = vec![ReplicaInfo::live("u1", Some("north"))];
        let server = start_server_with(fleet, network, replicas, settings, async {
            stopped.await.ok();
        });
        until("the till was never provisioned", || async {
            product_name(path).is_some()
        })
        .await;
        Runner { stop, server }
    }

    async fn stop(
        self,
        network: Network,
        till: std::thread::JoinHandle<magic_sync::replica::Result<()>>,
    ) {
        self.stop.send(()).unwrap();
        self.server.await.unwrap().unwrap();
        network.close();
        till.join().unwrap().unwrap();
    }
}

/// Whether some session of the fleet's database holds the advisory lock
/// `key` in `mode` (the tests beside this one have databases, and locks,
/// of their own).
async fn held(fleet: &Fleet, key: i64, mode: &str) -> bool {
    fleet
        .writer
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks
                 WHERE locktype = 'advisory' AND granted AND mode = $2 AND objsubid = 1
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND ((classid::int8 << 32) | objid::int8) = $1)",
            &[&key, &mode],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_commit_wakes_a_dozing_runner() {
    let (fleet, network) = for_the_runner().await;
    let (path, till) = till(&fleet, &network, "u1");
    let runner = Runner::start(&fleet, &network, &path).await;
    for name in ["green tea", "black tea", "white tea"] {
        until("the runner never dozed", || async {
            held(&fleet, wake::DOZING, "ExclusiveLock").await
        })
        .await;
        fleet
            .write(&format!("UPDATE products SET name = '{name}' WHERE id = 1"))
            .await;
        until(&format!("{name} did not reach the till"), || async {
            product_name(&path).as_deref() == Some(name)
        })
        .await;
    }
    runner.stop(network, till).await;
}

#[tokio::test]
async fn a_write_begun_while_the_runner_worked_is_waited_for() {
    let (fleet, network) = for_the_runner().await;
    let (path, till) = till(&fleet, &network, "u1");
    // Written before the runner starts: nobody dozes, so this transaction
    // will not notify when it commits.
    let mut writer = fleet.db.connect().await;
    let tx = writer.transaction().await.unwrap();
    tx.batch_execute("UPDATE products SET name = 'oolong' WHERE id = 1")
        .await
        .unwrap();
    assert!(held(&fleet, wake::DOZING, "ShareLock").await);
    let runner = Runner::start(&fleet, &network, &path).await;
    // The runner has looked, found the writer in flight, and not dozed.
    until("the runner never looked whether to doze", || async {
        fleet
            .writer
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                     WHERE application_name LIKE '%: record' AND query LIKE '%sync.doze()%')",
                &[],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
    })
    .await;
    assert!(!held(&fleet, wake::DOZING, "ExclusiveLock").await);
    assert_ne!(product_name(&path).as_deref(), Some("oolong"));
    tx.commit().await.unwrap();
    until(
        "the write the runner waited for did not reach the till",
        || async { product_name(&path).as_deref() == Some("oolong") },
    )
    .await;
    runner.stop(network, till).await;
}

/// What `sync.doze()` answers, session by session: a note's writer in
/// flight, then committed, then nothing left.
#[tokio::test]
async fn dozing_is_refused_while_a_note_may_come_unannounced() {
    let mut fleet = Fleet::new(crate::scenarios::SHOP).await;
    let relay = fleet.db.connect().await;
    // The shop's own rows were noted as it was filled.
    assert_eq!(wake::doze(&relay).await.unwrap(), Doze::Noted);
    fleet.pass().await;
    assert_eq!(wake::doze(&relay).await.unwrap(), Doze::Dozing);
    wake::wake(&relay).await.unwrap();
    assert!(!held(&fleet, wake::DOZING, "ExclusiveLock").await);

    let mut writer = fleet.db.connect().await;
    let tx = writer.transaction().await.unwrap();
    tx.batch_execute("UPDATE products SET name = 'sencha' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(wake::doze(&relay).await.unwrap(), Doze::Writing);
    assert!(
        !held(&fleet, wake::DOZING, "ExclusiveLock").await,
        "not dozing"
    );
    tx.commit().await.unwrap();
    assert_eq!(wake::doze(&relay).await.unwrap(), Doze::Noted);
    assert!(
        !held(&fleet, wake::DOZING, "ExclusiveLock").await,
        "not dozing"
    );
    fleet.pass().await;
    assert_eq!(wake::doze(&relay).await.unwrap(), Doze::Dozing);
    assert!(held(&fleet, wake::DOZING, "ExclusiveLock").await);
    wake::wake(&relay).await.unwrap();
}

/// A writer notifies only while the relay dozes: a transaction that
/// notifies commits in a queue of one.
#[tokio::test]
async fn a_writer_notifies_only_a_dozing_relay() {
    let mut fleet = Fleet::new(crate::scenarios::SHOP).await;
    let (listener, mut connection) = fleet
        .db
        .config()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    let (sent, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = futures_util::StreamExt::next(&mut messages).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                sent.send((n.channel().to_string(), n.process_id())).ok();
            }
        }
    });
    wake::listen(&listener).await.unwrap();
    let relay = fleet.db.connect().await;
    let write = "UPDATE products SET name = name || '!' WHERE id IN (1, 2, 3)";

    // Nobody dozes: the write notifies nobody.
    let quiet = fleet.db.connect().await;
    quiet.batch_execute(write).await.unwrap();
    fleet.pass().await;
    // Dozing: the next writer's commit notifies.
    assert_eq!(wake::doze(&relay).await.unwrap(), Doze::Dozing);
    let loud = fleet.db.connect().await;
    loud.batch_execute(write).await.unwrap();
    // Notifications come in the order their transactions committed: had
    // the quiet one notified, its would come first.
    let (channel, from) = tokio::time::timeout(Duration::from_secs(60), heard.recv())
        .await
        .expect("the dozing relay was never notified")
        .unwrap();
    assert_eq!(channel, wake::CHANNEL);
    assert_eq!(
        from,
        backend(&loud).await,
        "only the writer that found it dozing"
    );
    wake::wake(&relay).await.unwrap();
}
