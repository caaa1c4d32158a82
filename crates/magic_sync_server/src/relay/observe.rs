//! Observing the replicas: what became of each since the last pass, against
//! what the host lists now.
//!
//! A replica is in one of three states (`sync.replicas`):
//!
//! - *waiting* for a snapshot (`provision`): new, live again, moved to
//!   another partition, or found out of step (a gap, a restore, an outbox
//!   past its bound). Passes leave it alone; a snapshot worker takes it up
//!   (`super::snapshot`).
//! - *streaming*: a snapshot of it is under way (`snapshot_attempt`).
//!   Passes leave it alone too, but keep for it the rows their notes
//!   changed (`sync.deferred`).
//! - *kept up* by the passes.
//!
//! One that stopped being live, or that the host no longer lists, is
//! forgotten: nothing recorded as held by it, nothing owed to it.

use super::outbox::Chain;
use super::ReplicaInfo;
use crate::error::{Error, Result};
use crate::store;
use magic_sync_core::MessageNo;
use std::collections::{HashMap, HashSet};
use tokio_postgres::Transaction;

/// A replica the passes keep up, as this pass sees it.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub id: String,
    pub partition: Option<String>,
    /// Where its chain of messages stands.
    pub last_number: i64,
    pub last_nonce: Vec<u8>,
    /// It takes the rows of the `all` tables from their cohort.
    pub member: bool,
    /// The cohort's newest message, with its own nonce, when it is the
    /// newest of the replica's chain.
    pub part: Option<(i64, Vec<u8>)>,
}

impl Kept {
    /// Where its chain stands: at its own last message, or at the cohort's
    /// newest, stamped for it as publishing stamps it (`secret` is the
    /// epoch's).
    pub fn chain(&self, secret: &[u8]) -> Chain {
        let (last_number, last_nonce) = match &self.part {
            Some((number, shared)) => (*number, member_nonce(secret, &self.id, *number, shared)),
            None => (self.last_number, self.last_nonce.clone()),
        };
        Chain {
            last_number,
            last_nonce,
            begins_snapshot: false,
            snapshot_number: None,
        }
    }
}

/// The nonce of the cohort's message `number` (its own nonce `shared`) as
/// sent to `replica`.
pub(crate) fn member_nonce(secret: &[u8], replica: &str, number: i64, shared: &[u8]) -> Vec<u8> {
    let number = MessageNo::from_store(number);
    magic_sync_core::seal::member_nonce(secret, replica, number, shared)
}

/// What a pass observed.
#[derive(Debug, Default)]
pub(crate) struct Observation {
    /// Replicas the pass keeps up, by id.
    pub kept: Vec<Kept>,
    /// Replicas waiting for a snapshot, by id.
    pub waiting: Vec<String>,
    /// Replicas whose snapshot streams.
    pub streaming: Vec<String>,
    /// Replicas forgotten by this pass (no longer live, or gone).
    pub forgotten: Vec<String>,
    /// Whether the cohort of the `all` tables is recorded (looked at only
    /// while the relay records by rule).
    pub cohort: bool,
}

/// Compares the replicas the host lists with what the relay saw last: a
/// replica that became live or moved partition waits for a snapshot (one of
/// its that streams is ended); one no longer live, or gone, is forgotten.
/// Whether the cohort is recorded is read beside them when `cohorts`.
pub(crate) async fn observe(
    tx: &Transaction<'_>,
    replicas: &[ReplicaInfo],
    cohorts: bool,
) -> Result<Observation> {
    let listed = listed(replicas)?;
    // Read at once, one round trip: in a steady fleet nothing changed, and
    // the live replicas read beside the known ones are the answer.
    let cohort = async {
        match cohorts {
            true => store::cohorts::exists(tx).await,
            false => Ok(false),
        }
    };
    let (known, live, cohort) = tokio::try_join!(
        store::replicas::known(tx),
        store::replicas::live(tx),
        cohort
    )?;
    let changes = Changes::between(replicas, &listed, &known);
    let live = match changes.is_empty() {
        true => live,
        false => {
            changes.write(tx).await?;
            store::replicas::live(tx).await?
        }
    };
    Ok(Observation {
        cohort,
        ..sorted(live, changes.forget)
    })
}

/// The ids the host lists, refusing a list that cannot be a fleet.
fn listed(replicas: &[ReplicaInfo]) -> Result<HashSet<&str>> {
    let mut seen = HashSet::new();
    for r in replicas {
        if r.id.is_empty() {
            return Err(Error::ReplicaList {
                problem: "a replica with an empty id".into(),
            });
        }
        // Names beginning with one are the cohorts' in the record
        // (`sync.cohorts`, how-it-works §20); the transports refuse them in
        // a replica's id.
        if r.id.chars().any(char::is_control) {
            return Err(Error::ReplicaList {
                problem: format!("replica {:?}: an id holds no control character", r.id),
            });
        }
        if !seen.insert(r.id.as_str()) {
            return Err(Error::ReplicaList {
                problem: format!("replica `{}` twice", r.id),
            });
        }
    }
    Ok(seen)
}

/// What became of the replicas since the relay saw them last.
struct Changes<'r> {
    /// No longer live, or gone: nothing held, nothing owed.
    forget: Vec<String>,
    /// Live anew, or moved partition: waiting for a snapshot.
    provision: Vec<(&'r str, Option<&'r str>)>,
    /// Listed, not live.
    quiet: Vec<&'r str>,
    /// Not listed any more.
    gone: Vec<String>,
}

impl<'r> Changes<'r> {
    fn between(
        replicas: &'r [ReplicaInfo],
        listed: &HashSet<&str>,
        known: &HashMap<String, (bool, Option<String>)>,
    ) -> Changes<'r> {
        let mut changes = Changes {
            forget: Vec::new(),
            provision: Vec::new(),
            quiet: Vec::new(),
            gone: Vec::new(),
        };
        for r in replicas {
            match (r.live, known.get(r.id.as_str())) {
                (true, Some((true, part))) if *part == r.partition => {}
                (true, _) => changes
                    .provision
                    .push((r.id.as_str(), r.partition.as_deref())),
                (false, Some((true, _))) => {
                    changes.forget.push(r.id.to_string());
                    changes.quiet.push(&r.id);
                }
                (false, Some((false, _))) => {}
                (false, None) => changes.quiet.push(&r.id),
            }
        }
        changes.gone = known
            .keys()
            .filter(|id| !listed.contains(id.as_str()))
            .cloned()
            .collect();
        changes.forget.extend(changes.gone.iter().cloned());
        changes
    }

    /// Whether nothing became of any replica.
    fn is_empty(&self) -> bool {
        self.forget.is_empty()
            && self.provision.is_empty()
            && self.quiet.is_empty()
            && self.gone.is_empty()
    }

    async fn write(&self, tx: &Transaction<'_>) -> Result<()> {
        for (id, part) in &self.provision {
            store::replicas::wait_for_snapshot(tx, id, *part).await?;
        }
        for id in &self.quiet {
            store::replicas::quiet(tx, id).await?;
        }
        store::replicas::drop(tx, &self.gone).await?;
        store::replicas::forget(tx, &self.forget).await
    }
}

/// The replicas of `live` kept up by the passes.
pub(crate) fn kept(live: Vec<store::replicas::Live>) -> Vec<Kept> {
    sorted(live, Vec::new()).kept
}

/// The live replicas as they stand now (`live`): kept up, waiting for a
/// snapshot, or streaming one.
fn sorted(live: Vec<store::replicas::Live>, forgotten: Vec<String>) -> Observation {
    let mut observation = Observation {
        forgotten,
        ..Observation::default()
    };
    for live in live {
        match (live.provision, live.streaming) {
            (_, true) => observation.streaming.push(live.id),
            (true, false) => observation.waiting.push(live.id),
            (false, false) => observation.kept.push(Kept {
                id: live.id,
                partition: live.partition,
                last_number: live.last_number,
                last_nonce: live.last_nonce,
                member: live.member,
                part: live.part,
            }),
        }
    }
    observation
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(ids: &[&str]) -> Option<String> {
        let replicas: Vec<ReplicaInfo> =
            ids.iter().map(|id| ReplicaInfo::live(*id, None)).collect();
        match listed(&replicas) {
            Ok(_) => None,
            Err(Error::ReplicaList { problem }) => Some(problem),
            Err(e) => panic!("not a list's problem: {e}"),
        }
    }

    #[test]
    fn a_list_that_cannot_be_a_fleet_is_refused_in_words() {
        assert_eq!(problem(&["till-1", "till-2"]), None);
        assert_eq!(
            problem(&["till-1", ""]).unwrap(),
            "a replica with an empty id"
        );
        assert_eq!(
            problem(&["till-1", "till-1"]).unwrap(),
            "replica `till-1` twice"
        );
        // A cohort's name in the record begins with a control character:
        // no replica may be named so, nor hold one anywhere.
        for id in ["\u{1}all", "till\n1", "till\u{7f}"] {
            let said = problem(&["till-1", id]).unwrap();
            assert!(said.contains("control character"), "{id:?}: {said}");
        }
    }
}
