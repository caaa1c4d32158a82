//! One replica as the record shows it, and the one state that says where
//! it stands. Deciding the state does no I/O.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Where a replica stands, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Something of it waits for a fix to be deployed: rows of its uploads
    /// the server refused (`sync.inbox`).
    WaitingOnFix,
    /// The last send to it failed (`sync.replicas.last_error`): its
    /// messages wait in the outbox, or its snapshot waits to be begun
    /// again, until it is back in reach.
    OutOfReach,
    /// It is provisioned from scratch: waiting for its snapshot
    /// (`provision`) or streaming it (`snapshot_attempt`). What it held is
    /// no longer recorded; what it will hold is recorded when the snapshot
    /// ends.
    Provisioning,
    /// Kept up, and something is on its way to it: messages written that
    /// it has not acknowledged, rows it holds that a pending note changed,
    /// or changes kept for it since its snapshot.
    OnItsWay,
    /// Kept up, and nothing is on its way: it acknowledged every message
    /// written for it and no pending note changed a row it holds.
    CaughtUp,
}

impl ReplicaState {
    /// The state's name as `--json` and tables print it.
    pub fn name(self) -> &'static str {
        match self {
            ReplicaState::WaitingOnFix => "waiting on fix",
            ReplicaState::OutOfReach => "out of reach",
            ReplicaState::Provisioning => "provisioning",
            ReplicaState::OnItsWay => "on its way",
            ReplicaState::CaughtUp => "caught up",
        }
    }
}

/// One live replica as the record shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplicaSummary {
    /// Its id.
    pub id: String,
    /// Its partition.
    pub partition: Option<String>,
    /// Where it stands.
    pub state: ReplicaState,
    /// The number of the last message written for it (0: none yet).
    pub last_message: i64,
    /// The number of the last message it acknowledged (0: none yet).
    pub acknowledged: i64,
    /// When it last acknowledged one.
    pub acknowledged_at: Option<DateTime<Utc>>,
    /// Messages written for it that the transport has not taken yet.
    pub outbox: i64,
    /// Rows recorded as sent to it in a message it has not acknowledged.
    pub rows_on_their_way: i64,
    /// Rows it holds (acknowledged) that a pending note changed since.
    pub rows_outdated: i64,
    /// Rows of its uploads the server refused, kept in `sync.inbox`.
    pub rows_refused: i64,
    /// Changes kept for it while its snapshot streams (`sync.deferred`).
    pub changes_kept: i64,
    /// Whether it waits for a snapshot, or streams one.
    pub provisioning: bool,
    /// When its snapshot under way began.
    pub snapshot_began_at: Option<DateTime<Utc>>,
    /// Why the last send to it failed.
    pub last_error: Option<String>,
    /// Why its outbox was dropped (it outgrew its bound), if it was.
    pub alarm: Option<String>,
    /// The cohorts it is a member of, while the relay records by rule
    /// (`all`: it takes the rows of the `all` tables from theirs, recorded
    /// once for every member). Left out of the JSON when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cohorts: Vec<String>,
}

impl ReplicaSummary {
    /// Rows it lacks as the record shows: on their way, or outdated.
    pub fn rows_behind(&self) -> i64 {
        self.rows_on_their_way + self.rows_outdated
    }

    /// Orders replicas worst first: those that need someone first (a fix,
    /// then reach), then those provisioned, then the furthest behind by
    /// rows, then by messages waiting; by id last.
    pub fn worst_first(a: &Self, b: &Self) -> std::cmp::Ordering {
        a.state
            .cmp(&b.state)
            .then(b.rows_behind().cmp(&a.rows_behind()))
            .then(b.outbox.cmp(&a.outbox))
            .then(a.id.cmp(&b.id))
    }
}

/// The facts a state is decided from.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Facts {
    pub provisioning: bool,
    pub failing: bool,
    pub refused: i64,
    pub unacknowledged: bool,
    pub outbox: i64,
    pub on_their_way: i64,
    pub outdated: i64,
    pub kept: i64,
}

/// A replica's one state: the first that applies of waiting on a fix, out
/// of reach, provisioning, on its way, caught up.
pub(crate) fn decide(f: Facts) -> ReplicaState {
    if f.refused > 0 {
        ReplicaState::WaitingOnFix
    } else if f.failing {
        ReplicaState::OutOfReach
    } else if f.provisioning {
        ReplicaState::Provisioning
    } else if f.unacknowledged || f.outbox > 0 || f.on_their_way > 0 || f.outdated > 0 || f.kept > 0
    {
        ReplicaState::OnItsWay
    } else {
        ReplicaState::CaughtUp
    }
}

#[cfg(test)]
mod tests {
    use super::{decide, Facts, ReplicaState};

    #[test]
    fn the_first_state_that_applies() {
        let quiet = Facts::default();
        assert_eq!(decide(quiet), ReplicaState::CaughtUp);
        let behind = Facts {
            unacknowledged: true,
            ..quiet
        };
        assert_eq!(decide(behind), ReplicaState::OnItsWay);
        let outdated = Facts {
            outdated: 3,
            ..quiet
        };
        assert_eq!(decide(outdated), ReplicaState::OnItsWay);
        let provisioning = Facts {
            provisioning: true,
            ..behind
        };
        assert_eq!(decide(provisioning), ReplicaState::Provisioning);
        let failing = Facts {
            failing: true,
            ..provisioning
        };
        assert_eq!(decide(failing), ReplicaState::OutOfReach);
        let refused = Facts {
            refused: 1,
            ..failing
        };
        assert_eq!(decide(refused), ReplicaState::WaitingOnFix);
    }
}
