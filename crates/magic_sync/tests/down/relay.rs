//! The relay's own promises: seals, replicas out of reach, provisioning
//! equal to keeping up, and the runners end to end.

use crate::fleet::{replica_rows, Fleet};
use crate::scenarios::{shop, SHOP};
use magic_sync::envelope::Ack;
use magic_sync::relay::{Acknowledged, ByteSize, ReplicaInfo, Replicas, Settings};
use magic_sync::run::memory::Network;
use magic_sync::Error;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

async fn last_ack(fleet: &mut Fleet, unit: &str) -> Ack {
    fleet
        .unit(unit)
        .replica
        .ack()
        .expect("the till applied something")
}

#[tokio::test]
async fn an_acknowledgement_under_a_forged_seal_is_refused_and_changes_nothing() {
    let mut fleet = shop().await;
    let mut ack = last_ack(&mut fleet, "u1").await;
    let before: i64 = fleet
        .client
        .query_one("SELECT number FROM sync.acks WHERE replica = 'u1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        before as u64, ack.number,
        "the fleet heeded u1's acknowledgement"
    );
    // u2 claims u1's message: the seal is u1's, so it does not verify for u2.
    let claimed = acknowledge(&fleet, "u2", &ack).await;
    assert!(
        matches!(claimed, Err(Error::Forged { ref replica, .. }) if replica == "u2"),
        "{claimed:?}"
    );
    ack.seal[0] ^= 1;
    let forged = acknowledge(&fleet, "u1", &ack).await;
    let Err(e) = forged else {
        panic!("a forged seal was accepted")
    };
    assert!(
        e.to_string().contains("seal the server did not make"),
        "{e}"
    );
    ack.seal[0] ^= 1;
    assert_eq!(
        acknowledge(&fleet, "u1", &ack).await.unwrap(),
        Acknowledged::Recorded
    );
}

/// What became of one acknowledgement, heeded on the relay's connection.
async fn acknowledge(
    fleet: &Fleet,
    replica: &str,
    ack: &magic_sync::envelope::Ack,
) -> magic_sync::Result<Acknowledged> {
    magic_sync::relay::acknowledge_all(&fleet.client, &[(replica.into(), ack.clone())])
        .await
        .expect("heeding")
        .pop()
        .expect("one outcome")
}

#[tokio::test]
async fn a_till_out_of_reach_keeps_its_messages_and_holds_back_no_one() {
    let mut fleet = shop().await;
    fleet.per_replica().await;
    fleet.cut("u1", true);
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    fleet.sync().await;
    fleet.check().await;
    let waiting: i64 = fleet
        .client
        .query_one("SELECT count(*) FROM sync.outbox WHERE replica = 'u1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(waiting, 1);
    let error: Option<String> = fleet
        .client
        .query_one("SELECT last_error FROM sync.replicas WHERE id = 'u1'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(error.unwrap().contains("out of reach"));
    fleet
        .write("UPDATE products SET name = 'black tea' WHERE id = 1")
        .await;
    fleet.sync().await;
    fleet.cut("u1", false);
    fleet.sync().await;
    fleet.check().await;
    let cleared: Option<String> = fleet
        .client
        .query_one("SELECT last_error FROM sync.replicas WHERE id = 'u1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(cleared, None);
}

/// A transport that refuses every send to one replica with `error`, and
/// hands the rest to the network.
struct Refusing<'a> {
    network: &'a Network,
    replica: magic_sync::ReplicaId,
    error: magic_sync::relay::SendError,
}

impl magic_sync::relay::Transport for Refusing<'_> {
    fn max_message_bytes(&self) -> usize {
        self.network.max_message_bytes()
    }

    async fn send(
        &self,
        replica: &magic_sync::ReplicaId,
        id: &str,
        message: Vec<u8>,
    ) -> Result<(), magic_sync::relay::SendError> {
        match *replica == self.replica {
            true => Err(self.error.clone()),
            false => self.network.send(replica, id, message).await,
        }
    }
}

#[tokio::test]
async fn a_send_refused_for_good_ends_publishing_with_what_the_transport_said() {
    let mut fleet = shop().await;
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    fleet.record().await;
    let refusing = Refusing {
        network: &fleet.network,
        replica: "u1".into(),
        error: magic_sync::relay::SendError::misconfigured(
            "the broker refused the server's credentials",
        ),
    };
    let err =
        magic_sync::relay::publish(&fleet.client, &refusing, 16, magic_sync::relay::BATCH_FROM)
            .await
            .expect_err("not tried again for ever");
    assert!(
        matches!(err, Error::Send { ref replica, .. } if replica == "u1"),
        "{err}"
    );
    assert_eq!(err.handling(), magic_sync::Handling::Stop, "{err}");
    assert!(err.to_string().contains("refused the server's credentials"));
    let recorded: Option<String> = fleet
        .client
        .query_one("SELECT last_error FROM sync.replicas WHERE id = 'u1'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        recorded
            .unwrap()
            .contains("refused the server's credentials"),
        "where the operator looks"
    );
    // What went to the others went: the refusal is the transport's, and
    // the runner stops on it, not on their messages.
    assert_eq!(fleet.network.take("u2").len(), 1);
    assert_eq!(fleet.network.take("u1").len(), 0);

    // Out of reach instead, the same send is for later: publishing goes on.
    let unreachable = Refusing {
        error: magic_sync::relay::SendError::unreachable("no route to the till"),
        ..refusing
    };
    let published = magic_sync::relay::publish(
        &fleet.client,
        &unreachable,
        16,
        magic_sync::relay::BATCH_FROM,
    )
    .await
    .expect("a replica out of reach holds back no one");
    assert_eq!(published.failed.len(), 1, "{:?}", published.failed);
}

/// The shop with u1 out of reach, and an outbox bound of `messages` and
/// `bytes` measured at every pass.
async fn bounded(messages: i64, bytes: u64) -> Fleet {
    let mut fleet = shop().await;
    fleet
        .reconfigure(|s| {
            s.outbox_messages = messages;
            s.outbox_bytes = ByteSize::b(bytes);
            s.outbox_check_every = Duration::ZERO;
        })
        .await;
    fleet.cut("u1", true);
    fleet
}

/// u1's outbox: messages in all, messages beyond the snapshot it begins
/// with, and whether its first message begins that snapshot.
async fn u1_outbox(fleet: &Fleet) -> (i64, i64, bool) {
    let row = fleet
        .client
        .query_one(
            "SELECT count(o.number), count(*) FILTER (WHERE o.number > r.snapshot_last),
                    coalesce(min(o.number) = r.snapshot_number, false)
             FROM sync.replicas r LEFT JOIN sync.outbox o ON o.replica = r.id
             WHERE r.id = 'u1' GROUP BY r.snapshot_last, r.snapshot_number",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Names product 1 `tea {i}` for each `i` in turn, settling after each.
async fn rename(fleet: &mut Fleet, names: std::ops::Range<i32>) {
    for i in names {
        fleet
            .settle(&format!(
                "UPDATE products SET name = 'tea {i}' WHERE id = 1"
            ))
            .await;
    }
}

async fn u1_alarm(fleet: &Fleet) -> Option<String> {
    fleet
        .client
        .query_one("SELECT alarm FROM sync.replicas WHERE id = 'u1'", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_till_out_of_reach_past_its_outbox_bound_is_provisioned_again_and_converges_when_back() {
    let mut fleet = bounded(4, u64::MAX).await;
    fleet.per_replica().await;
    rename(&mut fleet, 0..4).await;
    assert_eq!(u1_outbox(&fleet).await.1, 4, "one message a change, kept");
    assert_eq!(u1_alarm(&fleet).await, None);
    fleet
        .write("UPDATE products SET name = 'tea 4' WHERE id = 1")
        .await;
    // The pass that writes the fifth message measured four: within bound.
    let wrote = fleet.record().await;
    assert!(wrote.dropped.is_empty(), "{:?}", wrote.recorded);
    assert_eq!(u1_outbox(&fleet).await.1, 5);
    // The others take theirs; u1's waits. The next pass measures five: past
    // the bound. u1 waits for a snapshot, which cannot reach it: its outbox
    // is dropped, and nothing is staged in its place.
    fleet.deliver().await;
    let next = fleet.record().await;
    assert_eq!(next.dropped, ["u1"]);
    assert!(next.provisioned.is_empty(), "u1 is out of reach");
    assert_eq!(u1_outbox(&fleet).await.0, 0, "the outbox is dropped");
    let alarm = u1_alarm(&fleet).await.expect("an alarm");
    assert!(alarm.contains("outgrew its bound: 5 messages"), "{alarm}");
    // Everyone else is kept up all along, u1 waiting.
    fleet
        .write("UPDATE products SET name = 'tea 5' WHERE id = 1")
        .await;
    let later = fleet.record().await;
    assert!(later.waiting.contains(&"u1".into()), "{:?}", later.recorded);
    assert!(later.dropped.is_empty(), "not dropped again while it waits");
    fleet.deliver().await;
    fleet.check().await;
    fleet.cut("u1", false);
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(
        product_name(&fleet.dir.path().join("u1.sqlite")).as_deref(),
        Some("tea 5")
    );
}

#[tokio::test]
async fn an_outbox_past_its_byte_bound_is_dropped_too() {
    let mut fleet = bounded(i64::MAX, 1).await;
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    assert!(fleet.record().await.dropped.is_empty());
    // The others take theirs; u1's waits.
    fleet.deliver().await;
    let next = fleet.record().await;
    assert_eq!(next.dropped, ["u1"]);
    let alarm = u1_alarm(&fleet).await.expect("an alarm");
    assert!(
        alarm.contains("at most 9223372036854775807 messages, 1 bytes"),
        "{alarm}"
    );
    fleet.cut("u1", false);
    fleet.sync().await;
    fleet.check().await;
}

/// Held rows whose message the replica has not acknowledged yet.
async fn unconfirmed(fleet: &Fleet) -> i64 {
    fleet
        .client
        .query_one(
            "SELECT count(*) FROM (
                 SELECT h.replica, h.message FROM sync.held h
                 JOIN sync.replicas r ON r.id = h.replica
                 UNION ALL
                 -- What a replica holds through a cohort, when the relay
                 -- records by rule.
                 SELECT m.replica, greatest(h.message, m.since) FROM sync.members m
                 JOIN sync.held h ON h.replica = m.cohort) h
             LEFT JOIN sync.acks a ON a.replica = h.replica
             WHERE h.message > coalesce(a.number, 0)",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_row_counts_as_held_once_the_message_that_carried_it_is_acknowledged() {
    let mut fleet = shop().await;
    assert_eq!(
        unconfirmed(&fleet).await,
        0,
        "after a sync everything is confirmed"
    );
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    fleet.record().await;
    assert_eq!(
        unconfirmed(&fleet).await,
        3,
        "recorded for three tills, confirmed by none"
    );
    fleet.deliver().await;
    assert_eq!(unconfirmed(&fleet).await, 0);
}

/// Every table's rows a replica holds, as compared by the check.
fn everything(fleet: &mut Fleet, unit: &str) -> BTreeMap<&'static str, BTreeMap<String, String>> {
    let tables: Vec<&'static magic_sync::Table> = fleet.engine.down_tables().collect();
    let replica = &fleet.unit(unit).replica;
    tables
        .into_iter()
        .map(|t| (t.name, replica_rows(replica, t)))
        .collect()
}

#[tokio::test]
async fn a_till_provisioned_from_scratch_ends_equal_to_one_kept_up() {
    let mut fleet = shop().await;
    for sql in [
        "UPDATE orders SET customer_id = 9 WHERE id = 1",
        "INSERT INTO orders (id, unit_id, customer_id) VALUES (5, 'u1', 8)",
        "INSERT INTO order_lines VALUES (5, 1, 3, 1)",
        "UPDATE products SET id = 100 WHERE id = 1",
        "INSERT INTO unit_groups VALUES ('u1', 200)",
        "DELETE FROM promotion_members WHERE promotion_id = 10",
        "UPDATE orders SET unit_id = 'u2' WHERE id = 3",
        "INSERT INTO logistics.shipments VALUES (4, 'north', 1, 2)",
    ] {
        fleet.write(sql).await;
        fleet.sync().await;
    }
    fleet.check().await;
    let kept_up = everything(&mut fleet, "u1");
    // The same till again, from an empty file.
    fleet.set_live("u1", false);
    fleet.sync().await;
    let path = fleet.dir.path().join("u1-again.sqlite");
    fleet.add_at("u1", Some("north"), path);
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(everything(&mut fleet, "u1"), kept_up);
}

pub struct Host(pub Vec<ReplicaInfo>);

impl Replicas for Host {
    async fn replicas(&self) -> magic_sync::Result<Vec<ReplicaInfo>> {
        Ok(self.0.clone())
    }
}

/// The runners end to end: the server's loop in a task, a till's loop on a
/// thread, the in-process network between them.
/// Waits until `done` says so, failing with `what` after a minute. The
/// condition is made true by other threads (the runners), so there is no
/// event to wait on; it is asked again every 20 ms.
#[tokio::test]
async fn an_acknowledgement_heeded_while_a_pass_forgets_its_replica_waits_and_leaves_nothing() {
    let mut fleet = shop().await;
    let ack = last_ack(&mut fleet, "u3").await;
    // A pass forgetting u3, not yet committed (its row, and with it its
    // acknowledgement, deleted).
    let forgetting = fleet.db.connect().await;
    forgetting
        .batch_execute("BEGIN; DELETE FROM sync.replicas WHERE id = 'u3'")
        .await
        .unwrap();
    let heeding = fleet.db.connect().await;
    let (waiter, holder) = (backend(&heeding).await, backend(&forgetting).await);
    let acks = [("u3".into(), ack)];
    let heed = magic_sync::relay::acknowledge_all(&heeding, &acks);
    let observe = async {
        until("heeding never waited for the pass", || async {
            fleet
                .client
                .query_one("SELECT $2 = ANY(pg_blocking_pids($1))", &[&waiter, &holder])
                .await
                .unwrap()
                .get::<_, bool>(0)
        })
        .await;
        forgetting.batch_execute("COMMIT").await.unwrap();
    };
    let (outcomes, ()) = tokio::join!(heed, observe);
    let outcomes = outcomes.expect("heeding beside the pass does not fail");
    assert_eq!(outcomes.len(), 1);
    let left: i64 = fleet
        .client
        .query_one("SELECT count(*) FROM sync.acks WHERE replica = 'u3'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "no acknowledgement of a forgotten replica");
}

/// The process id of `client`'s backend.
pub async fn backend(client: &tokio_postgres::Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

pub use magic_sync_testkit::until;

/// Waits until the sale `id` is on the server and the till whose file
/// `host` has open let go of it: filed and answered.
pub async fn until_filed(fleet: &Fleet, host: &rusqlite::Connection, id: &str) {
    until(&format!("the sale {id} was never filed"), || async {
        fleet
            .writer
            .query_opt("SELECT 1 FROM sales WHERE id = $1", &[&id])
            .await
            .unwrap()
            .is_some()
    })
    .await;
    until(
        &format!("the till never let go of its filed sale {id}"),
        || async {
            host.query_row("SELECT count(*) FROM _magic_sync_up", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
                == 0
        },
    )
    .await;
}

/// The name of product 1 in the SQLite file at `path`.
pub fn product_name(path: &std::path::Path) -> Option<String> {
    rusqlite::Connection::open(path)
        .ok()?
        .query_row("SELECT name FROM products WHERE id = 1", [], |r| r.get(0))
        .ok()
}

/// The shop, with the fleet's own relay connection letting go of the lock
/// for the runner, and a network for it.
pub async fn for_the_runner() -> (Fleet, Network) {
    let fleet = Fleet::new(SHOP).await;
    fleet
        .client
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .unwrap();
    (fleet, Network::new(64 * 1024))
}

/// Renames product 1 "green tea", and waits until the till at `path` has
/// applied it.
async fn green_tea_reaches(fleet: &Fleet, path: &std::path::Path) {
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    until("the write did not reach the till", || async {
        product_name(path).as_deref() == Some("green tea")
    })
    .await;
}

/// A till on a thread of its own, applying what the network brings it.
pub fn till(
    fleet: &Fleet,
    network: &Network,
    id: &'static str,
) -> (
    std::path::PathBuf,
    std::thread::JoinHandle<magic_sync::replica::Result<()>>,
) {
    let path = fleet.dir.path().join(format!("runner-{id}.sqlite"));
    let (network, file, engine, key) = (
        network.clone(),
        path.clone(),
        fleet.engine.clone(),
        fleet.key,
    );
    let thread = std::thread::spawn(move || {
        let mut replica = magic_sync::replica::Replica::open(&file, id, &engine).unwrap();
        replica.trust(&key).unwrap();
        magic_sync::run::replica::replica(&mut replica, &network.link(id))
    });
    (path, thread)
}

/// `run::server` for `replicas` over the fleet's database, until `stopped`.
pub fn start_server(
    fleet: &Fleet,
    network: &Network,
    replicas: Vec<ReplicaInfo>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<magic_sync::Result<()>> {
    start_server_until(fleet, network, replicas, async {
        stopped.await.ok();
    })
}

/// `run::server` for `replicas` over the fleet's database, until `stop`
/// resolves.
pub fn start_server_until(
    fleet: &Fleet,
    network: &Network,
    replicas: Vec<ReplicaInfo>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<magic_sync::Result<()>> {
    start_server_with(fleet, network, replicas, Settings::default(), stop)
}

/// `run::server` with `settings` for `replicas` over the fleet's database,
/// until `stop` resolves.
pub fn start_server_with(
    fleet: &Fleet,
    network: &Network,
    replicas: Vec<ReplicaInfo>,
    settings: Settings,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<magic_sync::Result<()>> {
    let (config, network, engine) = (fleet.db.config(), network.clone(), fleet.engine.clone());
    tokio::spawn(async move {
        let host = Host(replicas);
        magic_sync::run::server::server(config, engine, settings, &host, &network, &network, stop)
            .await
    })
}

#[tokio::test]
async fn the_runners_carry_a_write_to_a_till() {
    let (fleet, network) = for_the_runner().await;
    let (path, till) = till(&fleet, &network, "u1");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = start_server(
        &fleet,
        &network,
        vec![ReplicaInfo::live("u1", Some("north"))],
        stopped,
    );
    green_tea_reaches(&fleet, &path).await;
    // The till said what it applied, and the relay recorded it.
    until("the acknowledgement did not come back", || async {
        let row = fleet
            .writer
            .query_one(
                "SELECT coalesce(a.number, 0), r.last_number
                 FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id WHERE r.id = 'u1'",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) == row.get::<_, i64>(1)
    })
    .await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    till.join().unwrap().unwrap();
}

/// With the rows a rule gives left to it, what each message carried is
/// counted whether recorded or not, and once the replica acknowledged the
/// message nothing reads the count again: the runner forgets it with its
/// figures, and which messages rows let go of were in, so that neither
/// grows with every message a till ever had.
#[tokio::test]
async fn the_runner_forgets_what_acknowledged_messages_carried() {
    let (fleet, network) = for_the_runner().await;
    let (path, till) = till(&fleet, &network, "u1");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let settings = Settings {
        record_ruled_rows: false,
        figures_every: Duration::from_millis(100),
        ..Settings::default()
    };
    let server = start_server_with(
        &fleet,
        &network,
        vec![ReplicaInfo::live("u1", Some("north"))],
        settings,
        async {
            stopped.await.ok();
        },
    );
    // Its snapshot counted its orders at its last message; an order changed
    // is sent, and let go of to its rule while on its way.
    fleet
        .write("UPDATE orders SET customer_id = NULL WHERE id = 1")
        .await;
    green_tea_reaches(&fleet, &path).await;
    until(
        "the counts of what acknowledged messages carried were not forgotten",
        || async {
            let row = fleet
                .writer
                .query_one(
                    "SELECT f.by_rule,
                            -- Caught up, with no snapshot under way: one begun
                            -- while the record was still whole begins again
                            -- once it leaves rows to their rule.
                            coalesce(a.number, 0) = r.last_number AND r.last_number > 0
                              AND NOT r.provision AND r.snapshot_attempt IS NULL,
                            (SELECT count(*) FROM sync.held_carried c
                             WHERE c.replica = r.id AND c.message <= coalesce(a.number, 0))
                          + (SELECT count(*) FROM sync.let_go l
                             WHERE l.replica = r.id AND l.message <= coalesce(a.number, 0))
                     FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
                     CROSS JOIN sync.record_form f
                     WHERE r.id = 'u1'",
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, bool>(0) && row.get::<_, bool>(1) && row.get::<_, i64>(2) == 0
        },
    )
    .await;
    // The reads still count what it holds.
    let mut client = fleet.db.connect().await;
    let progress = magic_sync::ops::progress(&mut client, "u1").await.unwrap();
    let orders = progress.tables.iter().find(|t| t.table == "orders");
    assert_eq!(
        orders.map(|t| (t.should, t.holds, t.on_its_way)),
        Some((2, 2, 0)),
        "{progress:?}"
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    till.join().unwrap().unwrap();
}

/// The runner reports each pass's duration through the `metrics` facade, to
/// whatever recorder its host installed: here Prometheus' exporter, as a
/// host would. (The recorder is the process's: passes of other tests may
/// count too, never fewer.)
#[tokio::test]
async fn the_runner_reports_its_passes_to_the_hosts_recorder() {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("no other test installs a recorder");
    let passes = || {
        prometheus
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("magic_sync_pass_seconds_count "))
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    let (fleet, network) = for_the_runner().await;
    let (_path, till) = till(&fleet, &network, "u1");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = start_server(
        &fleet,
        &network,
        vec![ReplicaInfo::live("u1", Some("north"))],
        stopped,
    );
    until("no pass was reported to the host's recorder", || async {
        passes() >= 2
    })
    .await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    till.join().unwrap().unwrap();
}

/// The runners carry a till's sale up: the host writes on a connection of
/// its own to the till's file, the till's loop sends it, the relay files it
/// and answers, and the till lets go of it.
#[tokio::test]
async fn the_runners_carry_a_tills_sale_to_the_server() {
    let (fleet, network) = for_the_runner().await;
    let (path, till) = till(&fleet, &network, "u1");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = start_server(
        &fleet,
        &network,
        vec![ReplicaInfo::live("u1", Some("north"))],
        stopped,
    );
    // The till holds its snapshot before the host writes.
    until("the till was never provisioned", || async {
        product_name(&path).is_some()
    })
    .await;
    let host = rusqlite::Connection::open(&path).unwrap();
    host.busy_timeout(Duration::from_secs(10)).unwrap();
    host.execute_batch("INSERT INTO sales VALUES ('s1', 'u1', 7, '4.50', 1)")
        .unwrap();
    until_filed(&fleet, &host, "s1").await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    till.join().unwrap().unwrap();
}

/// A till reads its own writes: a sale the server's own trigger answers
/// with a change to a product the till holds. Once the till says its write
/// reached it, it holds that change: the `Reached` message comes after it.
#[tokio::test]
async fn a_till_reads_its_own_writes_once_the_server_says_they_reached_it() {
    let (fleet, network) = for_the_runner().await;
    fleet
        .writer
        .batch_execute(
            "CREATE FUNCTION sold() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN UPDATE products SET name = 'sold as ' || NEW.id WHERE id = 1; RETURN NEW; END $$;
             CREATE TRIGGER sold AFTER INSERT ON sales FOR EACH ROW EXECUTE FUNCTION sold();",
        )
        .await
        .unwrap();
    let (path, till) = till(&fleet, &network, "u1");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = start_server(
        &fleet,
        &network,
        vec![ReplicaInfo::live("u1", Some("north"))],
        stopped,
    );
    until("the till was never provisioned", || async {
        product_name(&path).is_some()
    })
    .await;
    let host = rusqlite::Connection::open(&path).unwrap();
    host.busy_timeout(Duration::from_secs(10)).unwrap();
    host.execute_batch("INSERT INTO sales VALUES ('s1', 'u1', 7, '4.50', 1)")
        .unwrap();
    let mark = magic_sync::replica::mark(&host).unwrap();
    let written = || magic_sync::replica::written(&host, mark).unwrap();
    until("the sale was never filed", || async {
        written() >= magic_sync::replica::Written::Filed
    })
    .await;
    // Waiting, as a host showing "everyone sees it" would: the till's loop
    // in this process wakes it.
    let reached = tokio::task::spawn_blocking(move || {
        magic_sync::replica::wait_written(
            &host,
            mark,
            magic_sync::replica::Written::Reached,
            Duration::from_secs(60),
        )
        .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(reached, magic_sync::replica::Written::Reached);
    assert_eq!(
        product_name(&path).as_deref(),
        Some("sold as s1"),
        "reached, so the server's answer to the sale is here"
    );
    // Once acknowledged, the server lets go of the checkpoint.
    until("the checkpoint was never let go of", || async {
        fleet
            .writer
            .query_one("SELECT count(*) FROM sync.checkpoints", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
    })
    .await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    till.join().unwrap().unwrap();
}

/// The runner publishes on a connection of its own while it records: a till
/// out of reach has why recorded and keeps its messages, and the passes go
/// on serving the other till; once back, it gets everything.
#[tokio::test]
async fn the_runners_keep_serving_while_one_till_is_out_of_reach() {
    let (fleet, network) = for_the_runner().await;
    network.cut("u2", true);
    let (near, near_till) = till(&fleet, &network, "u1");
    let (far, far_till) = till(&fleet, &network, "u2");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = start_server(
        &fleet,
        &network,
        vec![
            ReplicaInfo::live("u1", Some("north")),
            ReplicaInfo::live("u2", Some("north")),
        ],
        stopped,
    );
    let last_error = || async {
        fleet
            .writer
            .query_one("SELECT last_error FROM sync.replicas WHERE id = 'u2'", &[])
            .await
            .ok()
            .and_then(|r| r.get::<_, Option<String>>(0))
    };
    fleet
        .write("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    until("the write did not reach the near till", || async {
        product_name(&near).as_deref() == Some("green tea")
    })
    .await;
    until("the far till's failure was not recorded", || async {
        last_error().await.is_some()
    })
    .await;
    assert!(
        last_error().await.unwrap().contains("out of reach"),
        "the transport's reason is kept"
    );
    // Passes go on while sends to the far till keep failing.
    for name in ["black tea", "white tea"] {
        fleet
            .write(&format!("UPDATE products SET name = '{name}' WHERE id = 1"))
            .await;
        until("a later write did not reach the near till", || async {
            product_name(&near).as_deref() == Some(name)
        })
        .await;
    }
    // The far till waits for its snapshot, which is begun again now and
    // then, and fails: nothing is staged for it meanwhile.
    let (waiting, staged): (bool, i64) = {
        let row = fleet
            .writer
            .query_one(
                "SELECT provision OR snapshot_attempt IS NOT NULL,
                        (SELECT count(*) FROM sync.outbox WHERE replica = 'u2')
                 FROM sync.replicas WHERE id = 'u2'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(
        waiting && staged == 0,
        "the far till waits for a snapshot: {waiting}, {staged} messages staged"
    );
    assert_eq!(product_name(&far), None, "nothing reached the far till");

    network.cut("u2", false);
    until("the far till did not catch up", || async {
        product_name(&far).as_deref() == Some("white tea")
    })
    .await;
    until("the far till's failure was not cleared", || async {
        last_error().await.is_none()
    })
    .await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    near_till.join().unwrap().unwrap();
    far_till.join().unwrap().unwrap();
}

/// One relay at a time: a second connection cannot take the lock, and a
/// relay on a connection without it refuses to record.
#[tokio::test]
async fn only_the_connection_holding_the_lock_records() {
    let mut fleet = shop().await;
    let mut other = fleet.db.connect().await;
    assert!(!magic_sync::relay::Relay::lock(&other).await.unwrap());
    let engine = fleet.engine.clone();
    let mut second = magic_sync::relay::Relay::new(&other, engine, Settings::default())
        .await
        .unwrap();
    let refused = second
        .record(&mut other, &[ReplicaInfo::live("u1", Some("north"))], 4096)
        .await;
    let Err(e) = refused else {
        panic!("a relay without the lock recorded")
    };
    assert!(e.to_string().contains("holds its lock"), "{e}");
    // The fleet's relay still works, and nothing was recorded twice.
    fleet
        .settle("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
}

/// Times the busy handler below was asked; the first ask is refused.
static BUSY_ASKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Refuses the first wait for the file (as a busy timeout running out
/// would), then waits as long as it takes.
fn busy_once(_: i32) -> bool {
    if BUSY_ASKED.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
        return false;
    }
    std::thread::yield_now();
    true
}

/// A link handing the loop what the test lined up, and keeping what the
/// loop says.
struct Lined {
    deliveries: std::sync::Mutex<std::collections::VecDeque<magic_sync::run::Delivery>>,
    reports: std::sync::Mutex<Vec<magic_sync::run::Report>>,
}

impl Lined {
    /// A link bringing `messages`, then its end.
    fn messages(messages: Vec<Vec<u8>>) -> Lined {
        Lined {
            deliveries: std::sync::Mutex::new(
                messages
                    .into_iter()
                    .map(magic_sync::run::Delivery::Message)
                    .collect(),
            ),
            reports: Default::default(),
        }
    }
}

impl magic_sync::run::replica::Link for Lined {
    fn max_message_bytes(&self) -> usize {
        1 << 20
    }

    fn next(&self, _: Duration) -> magic_sync::run::Delivery {
        let mut deliveries = self.deliveries.lock().unwrap();
        deliveries
            .pop_front()
            .unwrap_or(magic_sync::run::Delivery::Closed)
    }

    fn report(&self, report: magic_sync::run::Report) {
        self.reports.lock().unwrap().push(report);
    }

    fn upload(
        &self,
        _: &magic_sync::envelope::Up,
    ) -> std::result::Result<(), magic_sync::replica::UplinkError> {
        Ok(())
    }
}

/// A message the replica could not apply because its host held the file
/// longer than the replica waits is applied again once the host lets go:
/// the transport has let go of it, and dropping it would open a gap (and
/// cost the till a snapshot).
#[tokio::test]
async fn a_message_the_host_held_the_file_against_is_applied_once_it_lets_go() {
    let mut fleet = shop().await;
    let mut messages = Vec::new();
    for name in ["black tea", "white tea"] {
        fleet
            .write(&format!("UPDATE products SET name = '{name}' WHERE id = 1"))
            .await;
        fleet.record().await;
        fleet.publish().await;
        messages.extend(fleet.network.take("u1"));
    }
    assert_eq!(messages.len(), 2, "a message for each change");
    let replica = &mut fleet.unit("u1").replica;
    let path = replica.connection().path().unwrap().to_string();
    // The host holds the file for writing.
    let host = rusqlite::Connection::open(&path).unwrap();
    host.execute_batch("BEGIN IMMEDIATE").unwrap();
    replica.connection().busy_handler(Some(busy_once)).unwrap();
    let letting_go = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        while BUSY_ASKED.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            assert!(
                Instant::now() < deadline,
                "the replica never met the host's lock"
            );
            std::thread::yield_now();
        }
        host.execute_batch("COMMIT").unwrap();
    });
    let link = Lined::messages(messages);
    magic_sync::run::replica::replica(replica, &link).expect("the loop ends with the link");
    letting_go.join().unwrap();
    replica
        .connection()
        .busy_timeout(Duration::from_secs(30))
        .unwrap();
    let reports = link.reports.into_inner().unwrap();
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(
        reports
            .iter()
            .all(|r| matches!(r, magic_sync::run::Report::Applied(_))),
        "both applied, no gap: {reports:?}"
    );
    for report in reports {
        fleet.network.report("u1", report);
    }
    fleet.heed().await;
    fleet.sync().await;
    fleet.check().await;
    let names = replica_rows(
        &fleet.unit("u1").replica,
        &<crate::shop::Product as magic_sync::Row>::TABLE,
    );
    assert!(
        names.values().any(|row| row.contains("white tea")),
        "{names:?}"
    );
}

/// Refuses every wait for the file.
fn never_wait(_: i32) -> bool {
    false
}

/// While the host holds the file and a message waits to be applied, the
/// loop still heeds its link: when the link ends, the loop ends.
#[tokio::test]
async fn a_loop_holding_a_message_ends_with_its_link() {
    let mut fleet = shop().await;
    fleet
        .write("UPDATE products SET name = 'black tea' WHERE id = 1")
        .await;
    fleet.record().await;
    fleet.publish().await;
    let messages = fleet.network.take("u1");
    assert_eq!(messages.len(), 1);
    let replica = &mut fleet.unit("u1").replica;
    let path = replica.connection().path().unwrap().to_string();
    let host = rusqlite::Connection::open(&path).unwrap();
    host.execute_batch("BEGIN IMMEDIATE").unwrap();
    replica.connection().busy_handler(Some(never_wait)).unwrap();
    let link = Lined::messages(messages);
    magic_sync::run::replica::replica(replica, &link).expect("the loop ends with the link");
    host.execute_batch("ROLLBACK").unwrap();
    replica
        .connection()
        .busy_timeout(Duration::from_secs(30))
        .unwrap();
    assert!(
        link.reports.into_inner().unwrap().is_empty(),
        "nothing applied, nothing said"
    );
}

/// A pass says, per replica it wrote to, the last message it wrote, and
/// since when its oldest change waits (here, PostgreSQL not keeping
/// commit times: the pass's beginning); a pass with nothing to plan says
/// no change.
#[tokio::test]
async fn a_pass_says_what_it_wrote_and_since_when() {
    let mut fleet = shop().await;
    fleet.per_replica().await;
    let before = std::time::SystemTime::now();
    fleet
        .write("UPDATE products SET name = 'black tea' WHERE id = 1")
        .await;
    let step = fleet.record().await;
    let oldest = step.oldest_change.expect("a change planned");
    assert!(oldest >= before && oldest <= std::time::SystemTime::now());
    let last: BTreeMap<String, i64> = fleet
        .writer
        .query("SELECT id, last_number FROM sync.replicas", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(!step.written.is_empty());
    for (replica, number) in &step.written {
        assert_eq!(last[replica.as_str()], *number, "{replica}");
    }
    fleet.deliver().await;
    let quiet = fleet.record().await;
    assert_eq!(quiet.oldest_change, None);
}

/// A server database restored from an older copy records less than its
/// replicas applied: the first acknowledgement beyond its record, sealed
/// by it, begins a new epoch and has every replica provisioned again, and
/// the fleet converges on the database as it is.
#[tokio::test]
async fn a_server_restored_from_an_older_copy_begins_a_new_epoch_and_provisions_every_replica() {
    let mut fleet = shop().await;
    fleet.per_replica().await;
    fleet
        .settle("UPDATE products SET price = 3 WHERE id = 1")
        .await;
    let before = epoch_of(&fleet).await;
    // What a restore leaves: the record of what was sent is older than
    // what the replicas applied.
    fleet
        .write(
            "UPDATE sync.replicas SET last_number = last_number - 1 WHERE id = 'u1';
             DELETE FROM sync.acks;",
        )
        .await;
    let ack = fleet.unit("u1").replica.ack().expect("it applied messages");
    fleet
        .network
        .report("u1", magic_sync::run::Report::Applied(ack));
    fleet.heed().await;
    assert_ne!(epoch_of(&fleet).await, before, "a new epoch");
    let waiting: i64 = fleet
        .count("SELECT count(*) FROM sync.replicas WHERE live AND provision")
        .await;
    assert_eq!(waiting, fleet.units.len() as i64, "every replica");
    fleet.sync().await;
    fleet.check().await;
}

/// The server's epoch.
pub async fn epoch_of(fleet: &Fleet) -> Vec<u8> {
    fleet
        .writer
        .query_one("SELECT id FROM sync.epoch", &[])
        .await
        .unwrap()
        .get(0)
}
