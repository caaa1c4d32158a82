//! Who may try a secret, and how often: connections counted per address,
//! failed attempts counted per address and per replica id asked for from
//! that address, each with a backoff that doubles, and what is logged of
//! them kept to a line a minute per address.
//!
//! A replica id is barred only from the address that failed with it, so
//! someone guessing a real replica's secret from elsewhere locks out
//! nobody but themselves.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failed attempts let through before a backoff begins.
const FREE_FAILURES: u32 = 5;
/// The first backoff; it doubles with each failure after.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest backoff.
const LONGEST_BACKOFF: Duration = Duration::from_secs(300);
/// Failures are forgotten this long after the last one.
const FORGET_AFTER: Duration = Duration::from_secs(900);
/// Entries kept at most before the forgotten ones are dropped.
const MOST_ENTRIES: usize = 100_000;
/// The longest replica id written to a log line.
const LOGGED_ID: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Strikes {
    failures: u32,
    last: Instant,
}

impl Strikes {
    /// Until when trying again is refused.
    fn barred_until(&self) -> Option<Instant> {
        let over = self.failures.checked_sub(FREE_FAILURES)?;
        let backoff = FIRST_BACKOFF
            .saturating_mul(1u32 << over.min(16))
            .min(LONGEST_BACKOFF);
        Some(self.last + backoff)
    }
}

#[derive(Debug, Default)]
struct State {
    by_address: HashMap<IpAddr, Strikes>,
    by_id: HashMap<(IpAddr, String), Strikes>,
    open: HashMap<IpAddr, usize>,
    /// Per address: when a failure was last logged, and how many were not
    /// logged since.
    logged: HashMap<IpAddr, (Instant, u64)>,
}

/// The hub's record of who tried what.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    state: Arc<Mutex<State>>,
    max_per_address: usize,
}

/// A connection counted against its address while it lives.
#[derive(Debug)]
pub(crate) struct Open {
    guard: Guard,
    address: IpAddr,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut state = self.guard.lock();
        if let Some(n) = state.open.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                state.open.remove(&self.address);
            }
        }
    }
}

impl Guard {
    pub(crate) fn new(max_per_address: usize) -> Guard {
        Guard {
            state: Arc::default(),
            max_per_address,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts a connection from `address`, unless it has as many open as
    /// it may.
    pub(crate) fn open(&self, address: IpAddr) -> Option<Open> {
        let mut state = self.lock();
        let n = state.open.entry(address).or_default();
        if *n >= self.max_per_address {
            return None;
        }
        *n += 1;
        Some(Open {
            guard: self.clone(),
            address,
        })
    }

    /// How long `address` must wait before trying `id`'s secret again, if
    /// it must.
    pub(crate) fn barred(&self, address: IpAddr, id: &str) -> Option<Duration> {
        let state = self.lock();
        let now = Instant::now();
        [
            state.by_address.get(&address),
            state.by_id.get(&(address, id.to_string())),
        ]
        .into_iter()
        .flatten()
        .filter_map(Strikes::barred_until)
        .filter(|until| *until > now)
        .max()
        .map(|until| until - now)
    }

    /// Counts a wrong secret for `id` from `address`. Returns whether to log
    /// it now, with how many were not logged since the last line.
    pub(crate) fn failed(&self, address: IpAddr, id: &str) -> Option<u64> {
        let mut state = self.lock();
        let now = Instant::now();
        if state.by_id.len() > MOST_ENTRIES || state.by_address.len() > MOST_ENTRIES {
            state.by_id.retain(|_, s| now - s.last < FORGET_AFTER);
            state.by_address.retain(|_, s| now - s.last < FORGET_AFTER);
            state.logged.retain(|_, (at, _)| now - *at < FORGET_AFTER);
        }
        bump(
            state.by_address.entry(address).or_insert(Strikes {
                failures: 0,
                last: now,
            }),
            now,
        );
        bump(
            state
                .by_id
                .entry((address, id.to_string()))
                .or_insert(Strikes {
                    failures: 0,
                    last: now,
                }),
            now,
        );
        let (at, unlogged) = state.logged.entry(address).or_insert((now, 0));
        if *unlogged == 0 || now - *at >= Duration::from_secs(60) {
            let told = *unlogged;
            *at = now;
            *unlogged = 1;
            Some(told.saturating_sub(1))
        } else {
            *unlogged += 1;
            None
        }
    }

    /// `id` proved itself from `address`: what they failed is forgotten.
    pub(crate) fn proved(&self, address: IpAddr, id: &str) {
        let mut state = self.lock();
        state.by_id.remove(&(address, id.to_string()));
        state.by_address.remove(&address);
    }
}

fn bump(strikes: &mut Strikes, now: Instant) {
    if now - strikes.last >= FORGET_AFTER {
        strikes.failures = 0;
    }
    strikes.failures += 1;
    strikes.last = now;
}

/// A replica id as a log line may show it: escaped, and cut short.
pub(crate) fn logged(id: &str) -> String {
    let mut cut: String = id.chars().take(LOGGED_ID).collect();
    if cut.len() < id.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn failures_past_the_free_ones_bar_the_address_and_not_another() {
        let guard = Guard::new(10);
        for _ in 0..FREE_FAILURES {
            assert_eq!(guard.barred(A, "till-1"), None);
            guard.failed(A, "till-1");
        }
        guard.failed(A, "till-1");
        let barred = guard.barred(A, "till-1").expect("barred");
        assert!(barred <= FIRST_BACKOFF * 2, "{barred:?}");
        assert!(guard.barred(A, "till-2").is_some(), "the address is barred");
        assert_eq!(
            guard.barred(B, "till-1"),
            None,
            "the id from elsewhere is not"
        );
        guard.proved(A, "till-1");
        assert_eq!(guard.barred(A, "till-1"), None);
    }

    #[test]
    fn connections_per_address_are_bounded_and_given_back() {
        let guard = Guard::new(2);
        let (a1, a2) = (guard.open(A).unwrap(), guard.open(A).unwrap());
        assert!(guard.open(A).is_none());
        assert!(guard.open(B).is_some());
        drop(a1);
        let _a3 = guard.open(A).expect("one was given back");
        drop(a2);
    }

    #[test]
    fn failures_are_logged_a_line_a_minute_per_address() {
        let guard = Guard::new(10);
        assert_eq!(guard.failed(A, "x"), Some(0));
        assert_eq!(guard.failed(A, "x"), None);
        assert_eq!(guard.failed(A, "y"), None);
        assert_eq!(guard.failed(B, "x"), Some(0));
    }

    #[test]
    fn an_id_in_a_log_is_escaped_and_short() {
        assert_eq!(logged("till-1"), "\"till-1\"");
        assert_eq!(logged("a\nb"), "\"a\\nb\"");
        let long = "x".repeat(500);
        assert!(logged(&long).chars().count() < 70);
    }
}
