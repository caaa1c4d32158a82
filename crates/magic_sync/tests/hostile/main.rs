//! Nothing one replica says moves another (issue 41): what a replica
//! reports can change only what is that replica's, and what is done for the
//! whole fleet (a new epoch, every replica provisioned again) follows only
//! from what the server can check was its own, a seal or a receipt it made.
//! Every report kind a replica sends, each field at its extremes, heard from
//! one till of a real server and real SQLite files: the others' record,
//! outboxes, held rows and rows on the server stay as they were, and none of
//! them is provisioned again. Beside it, the fixes the issue asked for: gaps
//! that cost a round trip however many come, epochs a replica orders, a pace
//! of its own asking that grows, forgeries a till refuses cheaply, and where
//! a replica's chain ends.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test says what it saw, for whoever reads its output"
)]

mod checkpoints;
mod epochs;
mod extremes;
mod fleet_wide;
mod gaps;
mod pace;
mod replica;

use magic_sync::envelope::Ack;
use magic_sync::run::Report;
use magic_sync::ReplicaId;
use magic_sync_testkit::fleet::Fleet;
use magic_sync_testkit::shop::ROWS;
use std::collections::BTreeSet;

/// Three tills, u1 and u2 in the north, u3 in the south, provisioned and
/// kept up.
pub async fn shop() -> Fleet {
    let mut fleet = Fleet::new(ROWS).await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("north"));
    fleet.add("u3", Some("south"));
    fleet.sync().await;
    fleet.check().await;
    fleet
}

/// Everything the server records of the replicas other than `replica`, and
/// their rows in the host's tables: what nothing `replica` says may change.
pub async fn the_others(fleet: &Fleet, replica: &str) -> Vec<String> {
    fleet
        .writer
        .query(
            "SELECT format('epoch %s', encode(id, 'hex')) FROM sync.epoch
             UNION ALL SELECT format('replica %s', row_to_json(r)) FROM sync.replicas r WHERE id <> $1
             UNION ALL SELECT format('ack %s', row_to_json(a)) FROM sync.acks a WHERE replica <> $1
             UNION ALL SELECT format('held %s %s %s %s %s', replica, table_name, key, version, message)
                 FROM sync.held WHERE replica <> $1
             UNION ALL SELECT format('outbox %s %s %s', replica, number, sent_at IS NULL)
                 FROM sync.outbox WHERE replica <> $1
             UNION ALL SELECT format('answered %s %s', replica, sequence)
                 FROM sync.uploads_answered WHERE replica <> $1
             UNION ALL SELECT format('backlog %s %s', replica, tables) FROM sync.backlogs WHERE replica <> $1
             UNION ALL SELECT format('inbox %s %s %s', replica, table_name, key) FROM sync.inbox WHERE replica <> $1
             UNION ALL SELECT format('stock %s', row_to_json(s)) FROM stock s WHERE unit_id <> $1
             UNION ALL SELECT format('sale %s', row_to_json(s)) FROM sales s WHERE unit_id <> $1
             ORDER BY 1",
            &[&replica],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
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

/// The replicas waiting to be provisioned.
pub async fn waiting(fleet: &Fleet) -> BTreeSet<String> {
    fleet
        .writer
        .query("SELECT id FROM sync.replicas WHERE live AND provision", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `replica` says `reports`, and the relay heeds them.
pub async fn says(fleet: &mut Fleet, replica: &str, reports: Vec<Report>) {
    for report in reports {
        fleet.network.report(replica, report);
    }
    fleet.heed().await;
}

/// The last message `replica` applied, as it says it.
pub fn ack_of(fleet: &mut Fleet, replica: &str) -> Ack {
    fleet
        .unit(replica)
        .replica
        .ack()
        .expect("it applied messages")
}

/// Steps until nothing moves, as `Fleet::sync` does; returns the replicas
/// provisioned from scratch on the way.
pub async fn settle(fleet: &mut Fleet) -> BTreeSet<ReplicaId> {
    let mut provisioned = BTreeSet::new();
    for _ in 0..100 {
        let step = fleet.record().await;
        let applied = fleet.deliver().await;
        provisioned.extend(step.provisioned.iter().cloned());
        let moved = step.messages > 0
            || step.planned.notes > 0
            || step.planned.sends > 0
            || step.deployed.is_some()
            || !step.provisioned.is_empty();
        if !moved && applied == 0 {
            return provisioned;
        }
    }
    panic!("the fleet did not settle in 100 steps");
}

/// `ids` as a set of replica ids.
pub fn ids(ids: &[&str]) -> BTreeSet<ReplicaId> {
    ids.iter().map(|id| ReplicaId::from(*id)).collect()
}
