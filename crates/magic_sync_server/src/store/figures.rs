//! The runner's figures over time: what it wrote, sent and filed, and how
//! long changes took to be acknowledged, tallied as it goes and written to
//! `sync.figures` once a period (`Settings::figures_every`), with the
//! record's levels (notes pending, replicas provisioning) as the period
//! ends. The table keeps [`KEPT`] and no more: each write deletes what is
//! older. [`crate::store::reads::history`] reads it back.

use crate::error::Result;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// How long the figures are kept.
pub const KEPT: Duration = Duration::from_secs(3600);

/// Pending notes counted at most: a backlog of millions would otherwise
/// cost the publishing loop a scan of them every period. The figure says
/// "at least this many" past it.
pub const NOTES_COUNTED: i64 = 100_000;

/// Lags kept per period at most, for its percentiles: past it, one in two
/// is let go of, evenly, so a busy period costs bounded memory.
const LAGS_PER_PERIOD: usize = 20_000;

/// What the runner did since the period began.
#[derive(Debug)]
pub(crate) struct Tally {
    began: Instant,
    messages: u64,
    rows: u64,
    uploads: u64,
    acknowledged: u64,
    lags_ms: Vec<f64>,
    /// Every how many lags heard one is kept (1, 2, 4, …).
    stride: u64,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            began: Instant::now(),
            messages: 0,
            rows: 0,
            uploads: 0,
            acknowledged: 0,
            lags_ms: Vec::new(),
            stride: 1,
        }
    }
}

impl Tally {
    /// Messages written and rows sent, by a pass or a snapshot.
    pub fn sent(&mut self, messages: u64, rows: u64) {
        self.messages += messages;
        self.rows += rows;
    }

    /// Uploads filed.
    pub fn filed(&mut self, uploads: u64) {
        self.uploads += uploads;
    }

    /// An acknowledgement, `lag` after the oldest change it covers committed.
    pub fn acknowledged(&mut self, lag: Duration) {
        self.acknowledged += 1;
        if !self.acknowledged.is_multiple_of(self.stride) {
            return;
        }
        self.lags_ms.push(lag.as_secs_f64() * 1e3);
        if self.lags_ms.len() >= LAGS_PER_PERIOD {
            let mut i = 0;
            self.lags_ms.retain(|_| {
                i += 1;
                i % 2 == 0
            });
            self.stride *= 2;
        }
    }

    /// Whether the period is over.
    pub fn due(&self, every: Duration) -> bool {
        self.began.elapsed() >= every
    }
}

/// The `p`-th percentile (0 to 1) of `sorted`, nearest rank.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// Writes the period `period` tallied, with the record's levels now, and
/// lets go of figures older than [`KEPT`].
pub(crate) async fn write(client: &Client, period: Tally) -> Result<()> {
    let mut lags = period.lags_ms;
    lags.sort_by(f64::total_cmp);
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    client
        .execute(
            "WITH gone AS (DELETE FROM sync.figures
                           WHERE at < now() - $8::float8 * interval '1 second')
             INSERT INTO sync.figures (at, seconds, messages, rows_sent, uploads_filed, acknowledged,
                                       lag_p50_ms, lag_p99_ms, pending_notes, provisioning, live)
             SELECT clock_timestamp(), $1, $2, $3, $4, $5, $6, $7,
                    (SELECT count(*) FROM (SELECT 1 FROM sync.notes LIMIT $9) n),
                    count(*) FILTER (WHERE r.provision OR r.snapshot_attempt IS NOT NULL),
                    count(*)
             FROM sync.replicas r WHERE r.live
             ON CONFLICT (at) DO NOTHING",
            &[
                &period.began.elapsed().as_secs_f64(),
                &count(period.messages),
                &count(period.rows),
                &count(period.uploads),
                &count(period.acknowledged),
                &percentile(&lags, 0.5),
                &percentile(&lags, 0.99),
                &KEPT.as_secs_f64(),
                &NOTES_COUNTED,
            ],
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{percentile, Tally, LAGS_PER_PERIOD};
    use std::time::Duration;

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 0.5), Some(50.0));
        assert_eq!(percentile(&sorted, 0.99), Some(99.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn a_busy_period_keeps_an_even_share_of_its_lags() {
        let mut tally = Tally::default();
        for i in 0..(LAGS_PER_PERIOD as u64 * 5) {
            tally.acknowledged(Duration::from_millis(i % 100));
        }
        assert_eq!(tally.acknowledged, LAGS_PER_PERIOD as u64 * 5);
        assert!(
            tally.lags_ms.len() < LAGS_PER_PERIOD,
            "{}",
            tally.lags_ms.len()
        );
        let mut lags = tally.lags_ms.clone();
        lags.sort_by(f64::total_cmp);
        // The kept share spreads like the whole: 0 to 99 ms, evenly.
        let median = percentile(&lags, 0.5).unwrap();
        assert!((40.0..=60.0).contains(&median), "{median}");
    }
}
