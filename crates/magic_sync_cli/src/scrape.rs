//! The figures of one [`Gauges`] read in Prometheus' text format, through
//! the `metrics` facade and its Prometheus exporter: a recorder of its own
//! per scrape, so a replica gone since the last scrape is gone from this
//! one, and nothing global is installed.
//!
//! Every metric is a gauge of the record at the read's moment; the names
//! and meanings are listed in docs/operating.md. Pass durations
//! (`magic_sync_pass_seconds`) are not here: only the relay's process
//! knows them, and reports them through the same facade to whatever
//! recorder its host installs.

use magic_sync::ops::{Gauges, ReplicaState};
use metrics::{describe_gauge, gauge};
use metrics_exporter_prometheus::PrometheusBuilder;

/// The read in Prometheus' text format.
pub fn render(g: &Gauges) -> String {
    let recorder = PrometheusBuilder::new().build_recorder();
    metrics::with_local_recorder(&recorder, || {
        describe();
        record(g);
    });
    recorder.handle().render()
}

fn describe() {
    describe_gauge!("magic_sync_replicas", "Live replicas, by state.");
    describe_gauge!(
        "magic_sync_deployment_rows_done",
        "Rows of a table the last deployment of changed declarations worked through, by table and work."
    );
    describe_gauge!(
        "magic_sync_deployment_rows_total",
        "Rows of the table to work through, as estimated when the deployment began."
    );
    describe_gauge!(
        "magic_sync_deployment_done",
        "1 once the deployment is done with the table, 0 while it works through it."
    );
    describe_gauge!(
        "magic_sync_notes_pending",
        "Notes no relay pass has planned yet (sync.notes)."
    );
    describe_gauge!(
        "magic_sync_notes_pending_rows",
        "Rows the pending notes are about."
    );
    describe_gauge!(
        "magic_sync_notes_oldest_pending_seconds",
        "Since the oldest pending note's transaction committed (only with track_commit_timestamp on)."
    );
    describe_gauge!(
        "magic_sync_rows_refused",
        "Rows of uploads the server refused, kept in sync.inbox until a fix is deployed, by table."
    );
    describe_gauge!(
        "magic_sync_provisionings",
        "Replicas provisioned from scratch, by whether their snapshot waits or streams."
    );
    describe_gauge!(
        "magic_sync_replica_outbox_messages",
        "Messages written for the replica that the transport has not taken yet."
    );
    describe_gauge!(
        "magic_sync_replica_outbox_bytes",
        "What those messages weigh: heads, seals and bodies."
    );
    describe_gauge!(
        "magic_sync_replica_messages_unacknowledged",
        "Messages written for the replica after the last it acknowledged."
    );
    describe_gauge!(
        "magic_sync_replica_unacknowledged_seconds",
        "Since the replica last acknowledged a message, while it has messages it has not \
         acknowledged; 0 when it has none. At least the age of its oldest unacknowledged message."
    );
    describe_gauge!(
        "magic_sync_replica_rows_on_their_way",
        "Rows sent to the replica in messages it has not acknowledged."
    );
    describe_gauge!(
        "magic_sync_replica_rows_outdated",
        "Rows the replica holds that a pending note changed since."
    );
    describe_gauge!(
        "magic_sync_replica_rows_refused",
        "Rows of the replica's uploads the server refused (sync.inbox)."
    );
    describe_gauge!(
        "magic_sync_rows_quarantined",
        "Rows that cannot go down (their codec refuses them, or no message could carry them), \
         set aside until they change or a fix is deployed (sync.quarantine)."
    );
    describe_gauge!(
        "magic_sync_rows_held_back",
        "Rows not sent to their replica because they point at a row in quarantine (sync.blocked)."
    );
    describe_gauge!(
        "magic_sync_replica_changes_kept",
        "Changes kept for the replica while its snapshot streams (sync.deferred)."
    );
}

/// A count as a gauge's value: exact up to 2^53.
fn value(n: i64) -> f64 {
    n as f64
}

fn record(g: &Gauges) {
    let s = &g.states;
    for (state, n) in [
        (ReplicaState::CaughtUp, s.caught_up),
        (ReplicaState::OnItsWay, s.on_its_way),
        (ReplicaState::Provisioning, s.provisioning),
        (ReplicaState::OutOfReach, s.out_of_reach),
        (ReplicaState::WaitingOnFix, s.waiting_on_fix),
    ] {
        gauge!("magic_sync_replicas", "state" => state_label(state)).set(value(n));
    }
    gauge!("magic_sync_notes_pending").set(value(g.pending.notes));
    gauge!("magic_sync_notes_pending_rows").set(value(g.pending.rows));
    if let Some(at) = g.oldest_pending_at.filter(|_| g.pending.notes > 0) {
        gauge!("magic_sync_notes_oldest_pending_seconds").set(seconds_since(g, at));
    }
    for t in g.tables.iter().filter(|t| t.rows_refused > 0) {
        gauge!("magic_sync_rows_refused", "table" => t.table.clone()).set(value(t.rows_refused));
    }
    for (table, n) in &g.quarantined {
        gauge!("magic_sync_rows_quarantined", "table" => table.clone()).set(value(*n));
    }
    gauge!("magic_sync_rows_held_back").set(value(g.held_back));
    for d in &g.deployment {
        let labels = [("table", d.table.clone()), ("work", d.work.clone())];
        gauge!("magic_sync_deployment_rows_done", &labels).set(d.rows_done as f64);
        gauge!("magic_sync_deployment_rows_total", &labels).set(d.rows_total as f64);
        gauge!("magic_sync_deployment_done", &labels).set(if d.done { 1.0 } else { 0.0 });
    }
    gauge!("magic_sync_provisionings", "snapshot" => "waiting").set(value(g.provisionings.waiting));
    gauge!("magic_sync_provisionings", "snapshot" => "streaming")
        .set(value(g.provisionings.streaming));
    for r in &g.replicas {
        let s = &r.summary;
        let id = s.id.clone();
        let set = |name: &'static str, v: f64| gauge!(name, "replica" => id.clone()).set(v);
        set("magic_sync_replica_outbox_messages", value(s.outbox));
        set("magic_sync_replica_outbox_bytes", value(r.outbox_bytes));
        let unacknowledged = (s.last_message - s.acknowledged).max(0);
        set(
            "magic_sync_replica_messages_unacknowledged",
            value(unacknowledged),
        );
        // Never acknowledged: since when is not recorded.
        match (unacknowledged, s.acknowledged_at) {
            (0, _) => set("magic_sync_replica_unacknowledged_seconds", 0.0),
            (_, Some(at)) => set(
                "magic_sync_replica_unacknowledged_seconds",
                seconds_since(g, at),
            ),
            (_, None) => {}
        }
        set(
            "magic_sync_replica_rows_on_their_way",
            value(s.rows_on_their_way),
        );
        set("magic_sync_replica_rows_outdated", value(s.rows_outdated));
        set("magic_sync_replica_rows_refused", value(s.rows_refused));
        set("magic_sync_replica_changes_kept", value(s.changes_kept));
    }
}

/// Seconds from `at` to the read's moment, both the server's clock.
fn seconds_since(g: &Gauges, at: chrono::DateTime<chrono::Utc>) -> f64 {
    (g.now - at).num_milliseconds().max(0) as f64 / 1000.0
}

/// A state as a label value: the `--json` name.
fn state_label(state: ReplicaState) -> &'static str {
    match state {
        ReplicaState::CaughtUp => "caught_up",
        ReplicaState::OnItsWay => "on_its_way",
        ReplicaState::Provisioning => "provisioning",
        ReplicaState::OutOfReach => "out_of_reach",
        ReplicaState::WaitingOnFix => "waiting_on_fix",
    }
}
