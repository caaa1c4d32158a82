//! The fleet's recent history, as the runner wrote it (`sync.figures`, see
//! [`crate::store::figures`]): a figure per period of the last hour, oldest first.
//! Fleet-wide: the figures are of every live replica, whatever the scope.

use super::{begin, Result};
use chrono::{DateTime, Utc};
use serde::Serialize;

/// One period of the runner's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figure {
    /// When the period ended.
    pub at: DateTime<Utc>,
    /// How long it was, in seconds.
    pub seconds: f64,
    /// Messages written in it.
    pub messages: i64,
    /// Rows sent in it, by passes and snapshots.
    pub rows_sent: i64,
    /// Uploads filed in it.
    pub uploads_filed: i64,
    /// Acknowledgements heard in it whose lag was measured.
    pub acknowledged: i64,
    /// The median of their lags (commit of the oldest change a message
    /// carried to the replica saying it applied it), in milliseconds; none
    /// without acknowledgements.
    pub lag_p50_ms: Option<f64>,
    /// Their 99th percentile.
    pub lag_p99_ms: Option<f64>,
    /// Notes pending as the period ended, counted up to
    /// [`crate::store::figures::NOTES_COUNTED`] (at least that many past it).
    pub pending_notes: i64,
    /// Live replicas being provisioned as it ended.
    pub provisioning: i64,
    /// Live replicas as it ended.
    pub live: i64,
}

/// The figures of the last hour.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct History {
    /// The server's time of the read.
    pub now: DateTime<Utc>,
    /// Oldest first; empty before a runner wrote any.
    pub figures: Vec<Figure>,
}

/// The runner's figures of the last hour.
pub async fn history(client: &mut tokio_postgres::Client) -> Result<History> {
    let (tx, now) = begin(client).await?;
    let rows = tx
        .query(
            "SELECT at, seconds, messages, rows_sent, uploads_filed, acknowledged,
                    lag_p50_ms, lag_p99_ms, pending_notes, provisioning, live
             FROM sync.figures WHERE at > now() - $1::float8 * interval '1 second'
             ORDER BY at",
            &[&crate::store::figures::KEPT.as_secs_f64()],
        )
        .await?;
    tx.commit().await?;
    let figures = rows
        .iter()
        .map(|r| Figure {
            at: r.get(0),
            seconds: r.get(1),
            messages: r.get(2),
            rows_sent: r.get(3),
            uploads_filed: r.get(4),
            acknowledged: r.get(5),
            lag_p50_ms: r.get(6),
            lag_p99_ms: r.get(7),
            pending_notes: r.get(8),
            provisioning: r.get(9),
            live: r.get(10),
        })
        .collect();
    Ok(History { now, figures })
}
