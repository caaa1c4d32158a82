//! A snapshot's pace: while one streams, the passes that keep every other
//! replica up run beside it on the same machine, and what the snapshot
//! takes of the machine they lose. By default it goes as fast as it can;
//! a budget of rows a second ([`SnapshotPace::Rows`]) spreads it out,
//! waiting between the chunks it reads and the chunks it records (all but
//! the plan, which is one statement).
//!
//! A budget takes less of the machine at a time, but a snapshot open
//! longer costs the passes more for as long as it is open (what its view
//! of the database holds back from vacuum), so a slower snapshot is not a
//! gentler one: see decision 138 and BENCHMARKS.md, "A snapshot's pace".

use std::num::NonZeroU32;
use std::time::Duration;
use tokio::time::Instant;

/// How fast a snapshot streams while the passes go on beside it
/// (`Settings::snapshot_pace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SnapshotPace {
    /// As fast as the database, the relay and the transport go.
    #[default]
    Unpaced,
    /// At most this many rows a second, read and sent, then recorded.
    Rows(NonZeroU32),
}

/// One snapshot's pace: the rows it went through since it began, against
/// its budget.
pub(crate) struct Pacer {
    /// Rows a second, if it has a budget.
    rate: Option<f64>,
    from: Instant,
    rows: u64,
    /// The time it spent waiting.
    pub waited: Duration,
}

impl Pacer {
    pub(crate) fn new(pace: SnapshotPace) -> Pacer {
        Pacer {
            rate: match pace {
                SnapshotPace::Unpaced => None,
                SnapshotPace::Rows(n) => Some(f64::from(n.get())),
            },
            from: Instant::now(),
            rows: 0,
            waited: Duration::ZERO,
        }
    }

    /// Whether it ever waits: an unpaced snapshot records in one statement.
    pub(crate) fn paced(&self) -> bool {
        self.rate.is_some()
    }

    /// Rows a chunk of the record should hold so that it waits about ten
    /// times a second.
    pub(crate) fn chunk_rows(&self) -> u64 {
        match self.rate {
            None => u64::MAX,
            Some(rate) => ((rate / 10.0) as u64).max(100),
        }
    }

    /// `rows` more went: waits until the budget allows every row since the
    /// snapshot began.
    pub(crate) async fn went(&mut self, rows: u64) {
        let Some(rate) = self.rate else {
            return;
        };
        self.rows += rows;
        let due = self.from + Duration::from_secs_f64(self.rows as f64 / rate);
        let now = Instant::now();
        if due > now {
            self.waited += due - now;
            tokio::time::sleep_until(due).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_budget_of_rows_holds_the_snapshot_to_it() {
        let mut pacer = Pacer::new(SnapshotPace::Rows(NonZeroU32::new(10_000).unwrap()));
        let began = Instant::now();
        for _ in 0..10 {
            pacer.went(2_000).await;
        }
        // 20,000 rows at 10,000 a second.
        assert_eq!(began.elapsed(), Duration::from_secs(2));
        assert_eq!(pacer.waited, Duration::from_secs(2));
        assert_eq!(pacer.chunk_rows(), 1_000, "a tenth of a second's rows");
    }

    #[tokio::test(start_paused = true)]
    async fn time_spent_elsewhere_counts_toward_the_budget() {
        let mut pacer = Pacer::new(SnapshotPace::Rows(NonZeroU32::new(1_000).unwrap()));
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let began = Instant::now();
        pacer.went(2_000).await;
        // Two seconds' rows, one and a half of them gone already.
        assert_eq!(began.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unpaced_snapshot_never_waits() {
        let mut pacer = Pacer::new(SnapshotPace::Unpaced);
        let began = Instant::now();
        pacer.went(1_000_000).await;
        assert_eq!(began.elapsed(), Duration::ZERO);
        assert!(!pacer.paced());
        assert_eq!(pacer.chunk_rows(), u64::MAX);
    }
}
