//! How long to wait before trying again what failed (a relay's attempt,
//! a snapshot, a replica's connection): doubling
//! from a least to a most wait, with jitter so that many waiters (a fleet's
//! snapshots, several relays after one outage) do not all come back at
//! once. The sequence is backon's.

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use std::time::Duration;

/// The waits after one failure after another, until [`Backoff::reset`].
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    waits: ExponentialBackoff,
    most: Duration,
}

impl Backoff {
    /// Waits from `least`, doubling, each with jitter, never past `most`.
    /// backon adds up to the wait itself as jitter, so the doubling stops
    /// at half of `most`: waits at the top spread between half of it and
    /// all of it, rather than all falling on `most` together.
    pub fn new(least: Duration, most: Duration) -> Backoff {
        let builder = ExponentialBuilder::default()
            .with_min_delay(least)
            .with_max_delay((most / 2).max(least))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Backoff {
            waits: builder.build(),
            builder,
            most,
        }
    }

    /// How long to wait after this failure.
    pub fn next_wait(&mut self) -> Duration {
        self.waits.next().unwrap_or(self.most).min(self.most)
    }

    /// The work succeeded: the next failure waits the least again.
    pub fn reset(&mut self) {
        self.waits = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[test]
    fn waits_grow_to_the_most_and_start_over_after_a_success() {
        let (least, most) = (Duration::from_millis(100), Duration::from_secs(5));
        let mut backoff = Backoff::new(least, most);
        let waits: Vec<Duration> = (0..12).map(|_| backoff.next_wait()).collect();
        assert!(waits.iter().all(|w| *w >= least && *w <= most), "{waits:?}");
        assert!(waits[11] >= most / 2, "never came near the most: {waits:?}");
        // With jitter, a fleet's waits at the top are not all the same.
        let tops: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| {
                let mut b = Backoff::new(least, most);
                (0..12).map(|_| b.next_wait()).last().unwrap()
            })
            .collect();
        assert!(tops.len() > 1, "{tops:?}");
        backoff.reset();
        assert!(backoff.next_wait() < least * 2, "a success starts over");
    }
}
