//! The planner's scratch tables: temporary tables of the relay's
//! connection in which a pass works out its plan set by set, and from which
//! loading and recording read it. A plan is a [`Plan`]: what it came to,
//! and which of these tables it filled; every statement that fills one says
//! which ([`Scratch`]), so what reads the plan asks by name, not by text.

use super::Planned;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One of the planner's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Scratch {
    /// The replicas the pass plans for (`_ms_r`): id, partition, whether provisioned from scratch.
    Replicas,
    /// The pending notes the pass read (`_ms_notes`).
    Notes,
    /// Changes kept for replicas while their snapshots streamed (`_ms_deferred`).
    Deferred,
    /// Each changed row once, with its newest note (`_ms_changed`).
    Changed,
    /// What each changed row was before the notes the pass read, as far as
    /// its rule and links say, where its rule reads its own columns and the
    /// record leaves such rows to the rule (`_ms_before`).
    Before,
    /// Rows changed for every replica (`_ms_touched`), and rows a
    /// deployment plans again (`resend`: and sends again to their holders).
    Touched,
    /// Rows changed for one replica: a group given or taken, a change kept for it (`_ms_grant`).
    Grant,
    /// Rows in question, per holder (`_ms_q`).
    Questioned,
    /// Rows each replica keeps (`_ms_k`).
    Kept,
    /// The difference: rows to send (`_ms_send`).
    Send,
    /// The difference: rows to take back (`_ms_del`).
    Delete,
    /// The whole set of a replica provisioned from scratch (`_ms_f`).
    Fresh,
    /// A deployment's chunk of rows to send again as they are held (`_ms_chunk`).
    Chunk,
    /// Rows set aside or held back that the pass lets go to be tried
    /// again, per holder (`NULL`: every holder), with the rows a rule gives
    /// left to it (`_ms_released`): whoever the rule gives them to did not
    /// hold them, whatever the reading says once they are let go.
    Released,
    /// Each replica a pass wrote to, with its last message (`_ms_last`):
    /// what the closing's statements record as carrying the rows, read from
    /// a table so that their text, and the plan made of it, is the same
    /// pass after pass (`store::plan::Batch`).
    Last,
}

impl Scratch {
    /// Every one, in the order they are made.
    pub const ALL: [Scratch; 15] = [
        Scratch::Replicas,
        Scratch::Notes,
        Scratch::Deferred,
        Scratch::Changed,
        Scratch::Before,
        Scratch::Touched,
        Scratch::Grant,
        Scratch::Questioned,
        Scratch::Kept,
        Scratch::Send,
        Scratch::Delete,
        Scratch::Fresh,
        Scratch::Chunk,
        Scratch::Released,
        Scratch::Last,
    ];

    /// Its name in SQL.
    pub fn name(self) -> &'static str {
        match self {
            Scratch::Replicas => "_ms_r",
            Scratch::Notes => "_ms_notes",
            Scratch::Deferred => "_ms_deferred",
            Scratch::Changed => "_ms_changed",
            Scratch::Before => "_ms_before",
            Scratch::Touched => "_ms_touched",
            Scratch::Grant => "_ms_grant",
            Scratch::Questioned => "_ms_q",
            Scratch::Kept => "_ms_k",
            Scratch::Send => "_ms_send",
            Scratch::Delete => "_ms_del",
            Scratch::Fresh => "_ms_f",
            Scratch::Chunk => "_ms_chunk",
            Scratch::Released => "_ms_released",
            Scratch::Last => "_ms_last",
        }
    }

    /// The statement that makes it.
    pub fn create(self) -> &'static str {
        match self {
            Scratch::Replicas => "CREATE TEMP TABLE IF NOT EXISTS _ms_r (r text PRIMARY KEY, part text, fresh boolean NOT NULL, kind text NOT NULL DEFAULT 'full', alone boolean NOT NULL DEFAULT false)",
            Scratch::Notes => "CREATE TEMP TABLE IF NOT EXISTS _ms_notes (at tid, seq bigint, t text, k jsonb, xid xid8)",
            Scratch::Deferred => "CREATE TEMP TABLE IF NOT EXISTS _ms_deferred (at tid, r text, t text, k jsonb, seq bigint, unseen boolean NOT NULL)",
            Scratch::Changed => "CREATE TEMP TABLE IF NOT EXISTS _ms_changed (t text, k jsonb, last_seq bigint NOT NULL, PRIMARY KEY (t, k))",
            Scratch::Before => "CREATE TEMP TABLE IF NOT EXISTS _ms_before (t text, k jsonb, known boolean NOT NULL, was boolean, before jsonb, candidates jsonb, PRIMARY KEY (t, k))",
            Scratch::Touched => "CREATE TEMP TABLE IF NOT EXISTS _ms_touched (t text, k jsonb, resend boolean NOT NULL DEFAULT false, PRIMARY KEY (t, k))",
            Scratch::Grant => "CREATE TEMP TABLE IF NOT EXISTS _ms_grant (r text, t text, k jsonb, seq bigint NOT NULL DEFAULT 0, PRIMARY KEY (r, t, k))",
            Scratch::Questioned => "CREATE TEMP TABLE IF NOT EXISTS _ms_q (r text, t text, k jsonb, round int NOT NULL,
             ruled boolean NOT NULL, questioned boolean NOT NULL, present boolean NOT NULL,
             version bigint NOT NULL, hruled boolean NOT NULL, hptrs jsonb, cptrs jsonb,
             refs int NOT NULL, PRIMARY KEY (r, t, k))",
            Scratch::Kept => "CREATE TEMP TABLE IF NOT EXISTS _ms_k (r text, t text, k jsonb, round int NOT NULL,
             held boolean NOT NULL, questioned boolean NOT NULL, ruled boolean NOT NULL,
             ptrs jsonb, hptrs jsonb, hruled boolean, version bigint, PRIMARY KEY (r, t, k))",
            Scratch::Send => "CREATE TEMP TABLE IF NOT EXISTS _ms_send (r text, t text, k jsonb, version bigint NOT NULL,
             held boolean NOT NULL, ruled boolean NOT NULL, ptrs jsonb, hptrs jsonb,
             stays boolean NOT NULL DEFAULT false)",
            Scratch::Delete => "CREATE TEMP TABLE IF NOT EXISTS _ms_del (r text, t text, k jsonb, hptrs jsonb)",
            Scratch::Fresh => "CREATE TEMP TABLE IF NOT EXISTS _ms_f (r text, t text, k jsonb, round int NOT NULL, ptrs jsonb, via int NOT NULL DEFAULT -1)",
            Scratch::Chunk => "CREATE TEMP TABLE IF NOT EXISTS _ms_chunk (k jsonb)",
            Scratch::Released => "CREATE TEMP TABLE IF NOT EXISTS _ms_released (r text, t text, k jsonb)",
            Scratch::Last => "CREATE TEMP TABLE IF NOT EXISTS _ms_last (r text PRIMARY KEY, number bigint NOT NULL)",
        }
    }
}

impl fmt::Display for Scratch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How many rows a plan put in each of the planner's tables (none listed:
/// left empty), and whether a key in `_ms_before` is one whose notes could
/// not say what it was.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Filled {
    rows: BTreeMap<Scratch, u64>,
    not_known: bool,
}

impl Filled {
    /// Only `tables`, each as holding rows.
    pub fn only(tables: impl IntoIterator<Item = Scratch>) -> Filled {
        Filled {
            rows: tables.into_iter().map(|t| (t, 1)).collect(),
            not_known: false,
        }
    }

    /// `n` more rows in `table`.
    pub fn add(&mut self, table: Scratch, n: u64) {
        if n > 0 {
            *self.rows.entry(table).or_default() += n;
        }
    }

    /// Whether `table` holds rows.
    pub fn has(&self, table: Scratch) -> bool {
        self.rows.contains_key(&table)
    }

    /// The rows every table was given.
    pub fn total(&self) -> u64 {
        self.rows.values().sum()
    }

    /// The rows `table` was given.
    pub fn rows(&self, table: Scratch) -> u64 {
        self.rows.get(&table).copied().unwrap_or(0)
    }

    /// A key read into `_ms_before` is one whose notes cannot say what it
    /// was (`store::by_rule::recounted_where_not_known`).
    pub fn not_known(&mut self) {
        self.not_known = true;
    }

    /// Whether a key read into `_ms_before` is one whose notes cannot say
    /// what it was.
    pub fn any_not_known(&self) -> bool {
        self.not_known
    }
}

/// A pass's plan: what it came to, the tables it filled, and the tables it
/// analysed (which the next pass makes again rather than keep their
/// statistics).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub planned: Planned,
    pub filled: Filled,
    pub analysed: BTreeSet<Scratch>,
    /// With rows set aside: what the plan would leave pointing at one,
    /// to be set aside in turn before the plan runs again.
    pub blocked: Option<Vec<crate::store::plan::quarantine::Blocked>>,
    /// What the deployment's chunk came to, if the plan worked one.
    pub worked: crate::store::deployment::Worked,
    /// The removed table whose held rows the plan takes back, if any.
    pub removed: Option<crate::store::deployment::Removed>,
}
