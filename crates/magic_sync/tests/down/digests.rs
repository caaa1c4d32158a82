//! The backstop: a replica's digest of what it holds, compared with what
//! the server records it holding. A replica that drifted from the record,
//! however it happened, is provisioned again and holds what it should; the
//! difference is counted and shown.

use crate::fleet::{replica_rows, Fleet};
use crate::scenarios::shop;
use magic_sync::core::digest::{self, DigestForm};
use magic_sync::envelope::{Digest, TableDigest};
use magic_sync::ops::{self, Concern, Scope};
use magic_sync::relay::Compared;
use magic_sync::run;

/// `unit`'s digest, heard by the server: what became of it.
pub(crate) async fn digest_of(fleet: &mut Fleet, unit: &str) -> Compared {
    let report = run::replica::digest(&fleet.unit(unit).replica).unwrap();
    heard(fleet, unit, report).await
}

/// As if the minute a replica's digests wait between comparisons passed.
async fn a_minute_later(fleet: &Fleet) {
    fleet
        .write("UPDATE sync.replicas SET digest_compared_at = now() - interval '2 minutes'")
        .await;
}

#[tokio::test]
async fn a_replica_that_drifted_from_the_record_is_provisioned_again() {
    // The drift made here is the record losing a row a replica holds: its
    // record row. A record that leaves the rows a rule gives to it has none
    // for u1's order 3 to lose, so this record keeps every row.
    let mut fleet = Fleet::new(crate::scenarios::SHOP).await;
    fleet.reconfigure(|s| s.record_ruled_rows = true).await;
    for (unit, region) in [("u1", "north"), ("u2", "north"), ("u3", "south")] {
        fleet.add(unit, Some(region));
    }
    fleet.sync().await;
    fleet.check().await;
    for unit in ["u1", "u2", "u3"] {
        assert_eq!(
            digest_of(&mut fleet, unit).await,
            Compared::Matched,
            "{unit}"
        );
    }
    // Again within the minute: not read again.
    assert!(matches!(
        digest_of(&mut fleet, "u1").await,
        Compared::Skipped(_)
    ));

    // The record loses a row u1 holds (a bug nobody predicted).
    fleet
        .write(
            "DELETE FROM sync.held WHERE replica = 'u1' AND table_name = 'orders' AND key = '[3]'",
        )
        .await;
    a_minute_later(&fleet).await;
    let Compared::Differed(differed) = digest_of(&mut fleet, "u1").await else {
        panic!("the digest differs from the record");
    };
    assert_eq!(
        differed,
        vec!["orders: it holds 2 rows, the record 1".to_string()]
    );
    let mut client = fleet.db.connect().await;
    let health = ops::health(&mut client, &Scope::All).await.unwrap();
    let shown = health.items.iter().find_map(|i| match &i.concern {
        Concern::DigestDiffered {
            replica,
            said,
            times,
            ..
        } => Some((replica.clone(), said.clone(), *times)),
        _ => None,
    });
    assert_eq!(
        shown,
        Some(("u1".to_string(), differed[0].clone(), 1)),
        "{health:?}"
    );
    // Provisioned again, it holds what it should, and the record agrees.
    let step = fleet.record().await;
    assert_eq!(step.provisioned, vec!["u1".to_string()]);
    fleet.deliver().await;
    fleet.sync().await;
    fleet.check().await;
    a_minute_later(&fleet).await;
    assert_eq!(digest_of(&mut fleet, "u1").await, Compared::Matched);
}

/// `report`'s digest, heard by the server as `unit`'s.
async fn heard(fleet: &mut Fleet, unit: &str, report: run::Report) -> Compared {
    let heeded = run::server::heed(
        &mut fleet.client,
        &fleet.engine,
        &fleet.network,
        vec![(unit.into(), report)],
    )
    .await
    .unwrap();
    assert_eq!(heeded.digests.len(), 1);
    heeded.digests[0].1.clone()
}

/// u1's digest as it sends it, changed by `change`.
fn digest_changed(fleet: &mut Fleet, change: impl FnOnce(&mut Digest)) -> run::Report {
    let run::Report::Upload(mut up) = run::replica::digest(&fleet.unit("u1").replica).unwrap()
    else {
        panic!("a digest is an upload");
    };
    change(up.digest.as_mut().unwrap());
    run::Report::Upload(up)
}

/// u1's digest as it sends it, each table's fingerprints changed by `change`.
fn tables_changed(fleet: &mut Fleet, change: impl Fn(&mut TableDigest)) -> run::Report {
    digest_changed(fleet, |d| d.tables.iter_mut().for_each(change))
}

/// A replica sends its fingerprints in both forms: the first (the sorted
/// keys') in `fingerprint`, which a server of any build reads, and the
/// summed one beside it, which this server compares. A server that knows
/// no `summed` (one rolled back to an earlier build) still matches what the
/// replica holds; and a replica of another build or language that sends
/// one form alone is compared in that form, as exactly.
#[tokio::test]
async fn a_digest_is_compared_in_the_form_the_server_reads() {
    let mut fleet = shop().await;
    let tables = fleet.engine.down_tables().count();
    let differs = |compared: Compared| {
        let Compared::Differed(differed) = compared else {
            panic!("a fingerprint that is not the record's differs: {compared:?}");
        };
        assert!(
            differed.iter().all(|d| d.ends_with("(other keys)")),
            "{differed:?}"
        );
        differed.len()
    };
    let keys = |fleet: &mut Fleet, table: &str| -> Vec<String> {
        let table = fleet
            .engine
            .down_tables()
            .find(|d| d.name == table)
            .unwrap();
        replica_rows(&fleet.unit("u1").replica, table)
            .into_keys()
            .collect()
    };
    let mut digest = Digest::default();
    digest_changed(&mut fleet, |d| digest = d.clone());
    assert_eq!(
        digest.form,
        DigestForm::Sorted as i32,
        "`fingerprint` in the first form"
    );
    for t in &digest.tables {
        let mut keys = keys(&mut fleet, &t.table);
        assert_eq!(t.summed, Some(digest::summed(&keys)), "{}", t.table);
        assert_eq!(t.fingerprint, digest::sorted(&mut keys), "{}", t.table);
    }

    // As sent, as a server that knows no `summed` reads it (the first form
    // alone), and as a replica that sends the summed form alone, saying so:
    // each matches.
    let report = tables_changed(&mut fleet, |_| {});
    assert_eq!(heard(&mut fleet, "u1", report).await, Compared::Matched);
    a_minute_later(&fleet).await;
    let report = tables_changed(&mut fleet, |t| t.summed = None);
    assert_eq!(heard(&mut fleet, "u1", report).await, Compared::Matched);
    a_minute_later(&fleet).await;
    let report = digest_changed(&mut fleet, |d| {
        d.form = DigestForm::Summed.into();
        for t in &mut d.tables {
            t.fingerprint = t.summed.take().unwrap();
        }
    });
    assert_eq!(heard(&mut fleet, "u1", report).await, Compared::Matched);
    a_minute_later(&fleet).await;

    // The summed fingerprints are what this server compares: off by one
    // they differ, whatever the first form says.
    let report = tables_changed(&mut fleet, |t| {
        t.summed = t.summed.map(|s| s.wrapping_add(1))
    });
    assert_eq!(differs(heard(&mut fleet, "u1", report).await), tables);
    // Provisioned again; then the first form alone, off by one, differs too.
    fleet.sync().await;
    a_minute_later(&fleet).await;
    let report = tables_changed(&mut fleet, |t| {
        t.summed = None;
        t.fingerprint = t.fingerprint.wrapping_add(1);
    });
    assert_eq!(differs(heard(&mut fleet, "u1", report).await), tables);
}

#[tokio::test]
async fn a_digest_is_compared_only_once_the_replica_applied_all_it_was_sent() {
    let mut fleet = shop().await;
    fleet
        .write("UPDATE orders SET customer_id = 9 WHERE id = 3")
        .await;
    fleet.record().await;
    // Recorded and published, not applied yet: its digest is of an older state.
    fleet.publish().await;
    assert_eq!(
        digest_of(&mut fleet, "u1").await,
        Compared::Skipped("messages recorded for it are not applied yet")
    );
    fleet.deliver().await;
    fleet.sync().await;
    assert_eq!(digest_of(&mut fleet, "u1").await, Compared::Matched);
    let provisioned: i32 = fleet
        .writer
        .query_one(
            "SELECT digest_mismatches FROM sync.replicas WHERE id = 'u1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(provisioned, 0);
}

/// A link that is quiet `left` times, then ends, keeping what it is told.
struct Quiet {
    left: std::sync::Mutex<u32>,
    reports: std::sync::Mutex<Vec<run::Report>>,
}

impl run::replica::Link for Quiet {
    fn max_message_bytes(&self) -> usize {
        1 << 20
    }

    fn next(&self, _: std::time::Duration) -> run::Delivery {
        let mut left = self.left.lock().unwrap();
        if *left == 0 {
            return run::Delivery::Closed;
        }
        *left -= 1;
        run::Delivery::Quiet
    }

    fn report(&self, report: run::Report) {
        self.reports.lock().unwrap().push(report);
    }

    fn upload(&self, _: &magic_sync::envelope::Up) -> Result<(), magic_sync::replica::UplinkError> {
        Ok(())
    }
}

/// The digests a replica's loop tells over a link quiet twice, with
/// digests due `every`.
fn digests_told(fleet: &mut Fleet, every: std::time::Duration) -> Vec<run::Report> {
    let link = Quiet {
        left: std::sync::Mutex::new(2),
        reports: Default::default(),
    };
    let uploads = run::replica::Uploads {
        digest_every: every,
        ..run::replica::Uploads::default()
    };
    run::replica::replica_with(&mut fleet.unit("u1").replica, &link, &uploads).unwrap();
    let reports = link.reports.into_inner().unwrap();
    reports
        .into_iter()
        .filter(|r| matches!(r, run::Report::Upload(up) if up.digest.is_some()))
        .collect()
}

#[tokio::test]
async fn the_replicas_loop_tells_its_digest_when_due() {
    let mut fleet = shop().await;
    assert!(digests_told(&mut fleet, std::time::Duration::from_secs(3600)).is_empty());
    let told = digests_told(&mut fleet, std::time::Duration::ZERO);
    assert!(!told.is_empty());
    let heeded = run::server::heed(
        &mut fleet.client,
        &fleet.engine,
        &fleet.network,
        vec![("u1".into(), told[0].clone())],
    )
    .await
    .unwrap();
    assert_eq!(
        heeded.digests,
        vec![(magic_sync::ReplicaId::from("u1"), Compared::Matched)],
        "it names the last message it applied, so the server compares"
    );
}

/// A gap whose report was lost on the way is said again once the link is
/// quiet: the till is not left waiting for a snapshot nobody begins.
#[tokio::test]
async fn a_gap_whose_report_was_lost_is_said_again_and_brings_a_snapshot() {
    let mut fleet = shop().await;
    fleet
        .write("UPDATE products SET name = 'black tea' WHERE id = 1")
        .await;
    fleet.record().await;
    fleet.publish().await;
    assert_eq!(fleet.network.take("u1").len(), 1, "lost on the way");
    fleet
        .write("UPDATE products SET name = 'white tea' WHERE id = 1")
        .await;
    fleet.record().await;
    fleet.publish().await;
    let next = fleet.network.take("u1").pop().unwrap();
    let said = run::replica::deliver(&mut fleet.unit("u1").replica, &next).unwrap();
    assert!(matches!(said, Some(run::Report::Gap(_))), "{said:?}");
    // What it said is lost too; the server has nothing more to send it.
    let link = Quiet {
        left: std::sync::Mutex::new(1),
        reports: Default::default(),
    };
    let uploads = run::replica::Uploads {
        say_again_every: std::time::Duration::ZERO,
        ..run::replica::Uploads::default()
    };
    run::replica::replica_with(&mut fleet.unit("u1").replica, &link, &uploads).unwrap();
    let reports = link.reports.into_inner().unwrap();
    let gaps: Vec<_> = reports
        .into_iter()
        .filter(|r| matches!(r, run::Report::Gap(_)))
        .collect();
    assert_eq!(gaps.len(), 1, "said again, once");
    for gap in gaps {
        fleet.network.report("u1", gap);
    }
    fleet.heed().await;
    fleet.provisions("u1").await;
}

/// The runner compares digests on a connection of their own: a comparison
/// that cannot finish (here, u1's record row locked by another session; in
/// life, a replica of millions of rows) holds back no other till's upload,
/// and ends once it can.
#[tokio::test]
async fn a_digest_the_runner_cannot_finish_comparing_holds_back_no_other_tills_upload() {
    use crate::relay::{for_the_runner, product_name, start_server, till, until, until_filed};
    use magic_sync::relay::ReplicaInfo;
    use std::time::Duration;

    let (fleet, network) = for_the_runner().await;
    let (near, near_till) = till(&fleet, &network, "u1");
    let (other, other_till) = till(&fleet, &network, "u2");
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
    // u1 kept up, everything sent to it acknowledged: its digest can be
    // compared exactly, so the comparison goes as far as recording it.
    until("the tills were never provisioned", || async {
        product_name(&near).is_some() && product_name(&other).is_some()
    })
    .await;
    until("u1 never acknowledged all it was sent", || async {
        fleet
            .writer
            .query_one(
                "SELECT r.live AND NOT r.provision AND r.snapshot_attempt IS NULL
                        AND NOT EXISTS (SELECT 1 FROM sync.outbox o WHERE o.replica = r.id)
                        AND a.number = r.last_number
                 FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
                 WHERE r.id = 'u1'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, Option<bool>>(0)
            == Some(true)
    })
    .await;

    let mut blocker = fleet.db.connect().await;
    let blocking = blocker.transaction().await.unwrap();
    blocking
        .execute("SELECT 1 FROM sync.replicas WHERE id = 'u1' FOR SHARE", &[])
        .await
        .unwrap();
    let digest = {
        let replica = magic_sync::replica::Replica::open(&near, "u1", &fleet.engine).unwrap();
        run::replica::digest(&replica).unwrap()
    };
    network.report("u1", digest);
    until("the comparison never came to wait on the lock", || async {
        fleet
            .writer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%digest_compared_at%'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 1
    })
    .await;

    let host = rusqlite::Connection::open(&other).unwrap();
    host.busy_timeout(Duration::from_secs(10)).unwrap();
    host.execute_batch("INSERT INTO sales VALUES ('s2', 'u2', 7, '4.50', 1)")
        .unwrap();
    // Meanwhile u2's sale is filed and answered.
    until_filed(&fleet, &host, "s2").await;
    let compared: Option<bool> = fleet
        .writer
        .query_one(
            "SELECT digest_compared_at IS NOT NULL FROM sync.replicas WHERE id = 'u1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(compared, Some(false), "u1's comparison still waits");

    blocking.commit().await.unwrap();
    until("u1's digest was never compared", || async {
        fleet
            .writer
            .query_one(
                "SELECT digest_compared_at IS NOT NULL AND digest_mismatches = 0
                 FROM sync.replicas WHERE id = 'u1'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, Option<bool>>(0)
            == Some(true)
    })
    .await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    network.close();
    near_till.join().unwrap().unwrap();
    other_till.join().unwrap().unwrap();
}
