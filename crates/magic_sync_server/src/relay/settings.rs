//! How the relay works: its [`Settings`], every size, interval and bound a
//! host may change, with the defaults the benchmarks were measured at.

use super::{SnapshotPace, BATCH_FROM};
use bytesize::ByteSize;
use std::time::Duration;

/// How the relay works.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Replicas published to at once.
    pub concurrency: usize,
    /// A page of the outbox signs its messages to replicas that read
    /// batches together once this many go ([`BATCH_FROM`]).
    pub batch_from: usize,
    /// Rows loaded per round trip.
    pub chunk_rows: i32,
    /// Message bytes buffered before they are written to the outbox.
    pub flush_bytes: ByteSize,
    /// How long the runner waits before the next pass when the last had
    /// nothing to do but a note may still come unannounced: a transaction
    /// that wrote one while the relay was at work has not ended (or
    /// `wake_on_commit` is off).
    pub idle: Duration,
    /// Whether a runner with nothing to do dozes until a note's commit
    /// wakes it (`LISTEN`/`NOTIFY`, sent only while it dozes), rather than
    /// polling every `idle`. Turn it off where a declared table is written
    /// by a prepared (two-phase) transaction: PostgreSQL refuses to prepare
    /// one that notified.
    pub wake_on_commit: bool,
    /// The longest a dozing runner waits before a pass all the same, for
    /// what wakes nothing: a change in the host's list of replicas, a retry
    /// that came due.
    pub idle_longest: Duration,
    /// The least wait after a failed pass; the waits double from it, with
    /// jitter, up to `backoff_max`.
    pub backoff_min: Duration,
    /// The longest wait after failed passes.
    pub backoff_max: Duration,
    /// The most messages a replica's outbox may hold beyond the snapshot it
    /// begins with. Past it (or past `outbox_bytes`), the outbox is dropped
    /// and the replica provisioned again: a replica out of reach for long
    /// costs one snapshot, not storage without end.
    pub outbox_messages: i64,
    /// The most bytes (heads, bodies and seals) a replica's outbox may hold
    /// beyond the snapshot it begins with.
    pub outbox_bytes: ByteSize,
    /// How often a pass measures the outboxes against their bound.
    pub outbox_check_every: Duration,
    /// How the runner's sessions are set up and ended (see
    /// [`crate::session`]).
    pub session: crate::session::SessionSettings,
    /// Snapshots the runner streams at once, each on a connection of its
    /// own.
    pub snapshots: usize,
    /// How fast a snapshot streams beside the passes: by default as fast as
    /// it can, or within a budget of rows a second (see [`SnapshotPace`]).
    pub snapshot_pace: SnapshotPace,
    /// A replica is provisioned again at its own request (a gap it
    /// reports, an acknowledgement the server did not expect, a digest
    /// that differs) at most once this often: one that asks again sooner
    /// waits, so a replica cannot make the server read its whole share over
    /// and over. The wait doubles with each such snapshot it asked for
    /// since it last went an hour without asking, up to an hour.
    pub provision_asked_every: Duration,
    /// The most rows of a table a deployment works through in one pass
    /// (`crate::deploy`). A deployment begins with at most 1,000 rows a
    /// chunk and paces itself by `deploy_pass_budget`.
    pub deploy_chunk_rows: i64,
    /// How long a pass that works through a deployment's chunk should
    /// take: the chunk doubles while its passes take less than half of it
    /// and halves when one takes more, so the changes planned beside it
    /// wait about this long at most.
    pub deploy_pass_budget: Duration,
    /// How often the runner writes its figures (`sync.figures`: messages
    /// and rows sent, uploads filed, commit-to-acknowledged lags, notes
    /// pending), which an operator's page draws history from.
    pub figures_every: Duration,
    /// Whether the relay records what many replicas hold alike once, for
    /// their cohort (how-it-works §20). On (the default), the rows of the
    /// tables whose rule is `all`, and the rows they point at, are recorded
    /// once for their cohort, and the replicas kept up join it a few a
    /// pass; a change to them is written once, in the cohort's messages,
    /// and stamped for each member as it is sent. Off, each replica's
    /// record holds every row it holds: a cohort recorded by an earlier run
    /// is forgotten when the relay starts, its members holding its rows
    /// themselves again and given what they were owed in messages of their
    /// own, with no snapshot.
    pub record_by_rule: bool,
    /// Whether the record keeps a row for each row a holder's own rule
    /// gives it (decision 176). On (the default), every row held has its
    /// record row. Off, a provisioning records none for a row that says
    /// only what its rule says: the relay reads such a row by its rule, at
    /// the holder's position, from the row and its pending notes
    /// (`docs/how-it-works.md`, "The record leaves to the rule what the
    /// rule says"). Off makes the record of a fleet far smaller and its
    /// provisioning faster, but a pass under a TPC-B load several times
    /// slower (BENCHMARKS.md, "The record thinned, back off by default"),
    /// so it is not the default yet. The relay marks the record's form in
    /// the database (`sync.record_form`) for filing, digests and the
    /// operator's reads; turned back on, it provisions every replica again
    /// first.
    /// Turned off over a record an earlier build's note functions wrote
    /// notes for, it keeps recording every row until those notes are
    /// planned and their writers have ended.
    pub record_ruled_rows: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            concurrency: 16,
            batch_from: BATCH_FROM,
            chunk_rows: 2_000,
            flush_bytes: ByteSize::mib(1),
            idle: Duration::from_millis(5),
            wake_on_commit: true,
            idle_longest: Duration::from_millis(100),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(10),
            outbox_messages: 50_000,
            outbox_bytes: ByteSize::mib(512),
            outbox_check_every: Duration::from_secs(10),
            session: crate::session::SessionSettings::default(),
            snapshots: 2,
            snapshot_pace: SnapshotPace::default(),
            provision_asked_every: Duration::from_secs(10),
            deploy_chunk_rows: 50_000,
            deploy_pass_budget: Duration::from_millis(250),
            figures_every: Duration::from_secs(5),
            record_by_rule: true,
            record_ruled_rows: true,
        }
    }
}
