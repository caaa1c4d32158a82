//! Who may try a secret, and how often: connections counted per address
//! and per network, failed attempts counted per party and per replica id
//! asked for by that party, each with a backoff that doubles.
//!
//! A *network* is an IPv4 /24 or an IPv6 /64: what one party usually holds
//! whole, so that a few hundred addresses of one network cannot take every
//! connection the server holds. A *party* is who failures are charged to:
//! an IPv4 address, or an IPv6 /64 (changing addresses within its own /64
//! costs a party nothing). Failures are not charged to an IPv4 /24: one
//! address guessing would then lock out its neighbours' replicas.
//!
//! A replica id is barred only for the party that failed with it, so
//! someone guessing a real replica's secret from elsewhere locks out
//! nobody but themselves. Ids are kept as a digest: what the guard holds
//! per entry is the same however long an id a stranger sends, and it holds
//! at most [`MOST_ENTRIES`] entries per map.

use crate::credentials::Standing;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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
/// Entries a map of failures keeps at most. Past it, the forgotten ones
/// are dropped (at most once a minute), and then any one.
const MOST_ENTRIES: usize = 100_000;
/// How often a full map is swept of forgotten entries.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// An IPv4 /24 or an IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Network(IpAddr);

impl Network {
    pub(crate) fn of(address: IpAddr) -> Network {
        Network(match address.to_canonical() {
            IpAddr::V4(v4) => {
                let [a, b, c, _] = v4.octets();
                IpAddr::V4(Ipv4Addr::new(a, b, c, 0))
            }
            IpAddr::V6(v6) => IpAddr::V6(slash_64(v6)),
        })
    }
}

fn slash_64(v6: Ipv6Addr) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))
}

/// Who failures are charged to: an IPv4 address, or an IPv6 /64.
fn party(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(slash_64(v6)),
    }
}

/// A replica id as the guard keeps it: its digest, whatever its length.
type IdDigest = [u8; 16];

fn digest(id: &str) -> IdDigest {
    let full: [u8; 32] = Sha256::digest(id.as_bytes()).into();
    let mut cut = [0; 16];
    cut.copy_from_slice(&full[..16]);
    cut
}

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

    fn remembered(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last) < FORGET_AFTER
    }
}

/// Failures per key, bounded in entries.
#[derive(Debug)]
struct Record<K> {
    strikes: HashMap<K, Strikes>,
    most: usize,
    swept: Option<Instant>,
}

impl<K: Hash + Eq + Copy> Record<K> {
    fn new(most: usize) -> Self {
        Record {
            strikes: HashMap::new(),
            most: most.max(1),
            swept: None,
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<&Strikes> {
        self.strikes.get(key).filter(|s| s.remembered(now))
    }

    /// One more failure for `key`, making room for it if it is new.
    fn bump(&mut self, key: K, now: Instant) {
        if !self.strikes.contains_key(&key) && self.strikes.len() >= self.most {
            self.make_room(now);
        }
        let strikes = self.strikes.entry(key).or_insert(Strikes {
            failures: 0,
            last: now,
        });
        if !strikes.remembered(now) {
            strikes.failures = 0;
        }
        strikes.failures = strikes.failures.saturating_add(1);
        strikes.last = now;
    }

    /// Drops the forgotten entries, if not swept lately; then, if still
    /// full, one entry (the first the map yields: any).
    fn make_room(&mut self, now: Instant) {
        if self
            .swept
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY)
        {
            self.strikes.retain(|_, s| s.remembered(now));
            self.swept = Some(now);
        }
        if self.strikes.len() >= self.most {
            if let Some(key) = self.strikes.keys().next().copied() {
                self.strikes.remove(&key);
            }
        }
    }

    fn remove(&mut self, key: &K) {
        self.strikes.remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.strikes.len()
    }
}

#[derive(Debug)]
struct State {
    by_party: Record<IpAddr>,
    by_id: Record<(IpAddr, IdDigest)>,
    open: HashMap<IpAddr, usize>,
    open_in: HashMap<Network, usize>,
}

/// Why a connection was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Crowded {
    /// Its address has as many open as it may.
    Address,
    /// Its network has as many open as it may.
    Network,
}

/// The hub's record of who tried what.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    state: Arc<Mutex<State>>,
    max_per_address: usize,
    max_per_network: usize,
}

/// A connection counted against its address and network while it lives.
#[derive(Debug)]
pub(crate) struct Open {
    guard: Guard,
    address: IpAddr,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut state = self.guard.lock();
        release(&mut state.open, self.address);
        release(&mut state.open_in, Network::of(self.address));
    }
}

fn release<K: Hash + Eq>(open: &mut HashMap<K, usize>, key: K) {
    if let Some(n) = open.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            open.remove(&key);
        }
    }
}

impl Guard {
    pub(crate) fn new(max_per_address: usize, max_per_network: usize) -> Guard {
        Guard::bounded(max_per_address, max_per_network, MOST_ENTRIES)
    }

    fn bounded(max_per_address: usize, max_per_network: usize, most: usize) -> Guard {
        Guard {
            state: Arc::new(Mutex::new(State {
                by_party: Record::new(most),
                by_id: Record::new(most),
                open: HashMap::new(),
                open_in: HashMap::new(),
            })),
            max_per_address,
            max_per_network,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts a connection from `address`, unless it or its network has as
    /// many open as it may.
    pub(crate) fn open(&self, address: IpAddr) -> Result<Open, Crowded> {
        let address = address.to_canonical();
        let network = Network::of(address);
        let mut state = self.lock();
        if state.open.get(&address).copied().unwrap_or(0) >= self.max_per_address {
            return Err(Crowded::Address);
        }
        if state.open_in.get(&network).copied().unwrap_or(0) >= self.max_per_network {
            return Err(Crowded::Network);
        }
        *state.open.entry(address).or_default() += 1;
        *state.open_in.entry(network).or_default() += 1;
        Ok(Open {
            guard: self.clone(),
            address,
        })
    }

    /// What is known of `address` asking for `id`'s secret.
    pub(crate) fn standing(&self, address: IpAddr, id: &str) -> Standing {
        let party = party(address);
        let state = self.lock();
        let now = Instant::now();
        let by_party = state.by_party.get(&party, now);
        let barred = [by_party, state.by_id.get(&(party, digest(id)), now)]
            .into_iter()
            .flatten()
            .filter_map(Strikes::barred_until)
            .filter(|until| *until > now)
            .max()
            .map(|until| until - now);
        Standing {
            barred,
            suspect: by_party.is_some(),
        }
    }

    /// Counts a failed attempt from `address`: a wrong secret for `id`, or
    /// (`None`) an id that cannot be a replica's.
    pub(crate) fn failed(&self, address: IpAddr, id: Option<&str>) {
        let party = party(address);
        let mut state = self.lock();
        let now = Instant::now();
        state.by_party.bump(party, now);
        if let Some(id) = id {
            state.by_id.bump((party, digest(id)), now);
        }
    }

    /// `id` proved itself from `address`: what its party failed is
    /// forgotten.
    pub(crate) fn proved(&self, address: IpAddr, id: &str) {
        let party = party(address);
        let mut state = self.lock();
        state.by_id.remove(&(party, digest(id)));
        state.by_party.remove(&party);
    }
}

/// The longest replica id written to a log line.
const LOGGED_ID: usize = 64;

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

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    const ELSEWHERE: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1));

    fn v6(last: u16, segment: u16) -> IpAddr {
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, segment, 0, 0, 0, last))
    }

    #[test]
    fn failures_past_the_free_ones_bar_the_address_and_not_another() {
        let guard = Guard::new(10, 10);
        for _ in 0..FREE_FAILURES {
            assert_eq!(guard.standing(A, "till-1").barred, None);
            guard.failed(A, Some("till-1"));
        }
        guard.failed(A, Some("till-1"));
        let barred = guard.standing(A, "till-1").barred.expect("barred");
        assert!(barred <= FIRST_BACKOFF * 2, "{barred:?}");
        assert!(
            guard.standing(A, "till-2").barred.is_some(),
            "the address is barred"
        );
        assert_eq!(
            guard.standing(B, "till-1"),
            Standing::default(),
            "the id from elsewhere, even next door, is not"
        );
        guard.proved(A, "till-1");
        assert_eq!(guard.standing(A, "till-1").barred, None);
    }

    #[test]
    fn an_ipv6_party_is_its_slash_64_whichever_address_it_takes() {
        let guard = Guard::new(10, 10);
        for last in 0..=FREE_FAILURES as u16 {
            guard.failed(v6(last, 1), Some("till-1"));
        }
        assert!(guard.standing(v6(999, 1), "till-9").barred.is_some());
        assert!(guard.standing(v6(999, 1), "till-9").suspect);
        assert_eq!(guard.standing(v6(1, 2), "till-1"), Standing::default());
        // The same for an IPv4 address, as an IPv6 socket sees it.
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        for _ in 0..=FREE_FAILURES {
            guard.failed(mapped, Some("till-1"));
        }
        assert!(guard.standing(A, "till-1").barred.is_some());
    }

    #[test]
    fn a_failure_that_names_no_id_counts_against_the_party() {
        let guard = Guard::new(10, 10);
        guard.failed(A, None);
        assert!(guard.standing(A, "till-1").suspect);
        for _ in 0..FREE_FAILURES {
            guard.failed(A, None);
        }
        assert!(guard.standing(A, "till-1").barred.is_some());
    }

    #[test]
    fn connections_per_address_are_bounded_and_given_back() {
        let guard = Guard::new(2, 10);
        let (a1, a2) = (guard.open(A).unwrap(), guard.open(A).unwrap());
        assert_eq!(guard.open(A).err(), Some(Crowded::Address));
        assert!(guard.open(B).is_ok());
        drop(a1);
        let _a3 = guard.open(A).expect("one was given back");
        drop(a2);
    }

    #[test]
    fn connections_per_network_are_bounded_and_given_back() {
        let guard = Guard::new(2, 3);
        let held = [guard.open(A).unwrap(), guard.open(A).unwrap()];
        let b = guard.open(B).unwrap();
        assert_eq!(
            guard.open(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3))).err(),
            Some(Crowded::Network)
        );
        assert!(guard.open(ELSEWHERE).is_ok(), "another /24");
        let (one, other) = (v6(1, 7), v6(2, 7));
        let six = [guard.open(one).unwrap(), guard.open(one).unwrap()];
        let _seven = guard.open(other).unwrap();
        assert_eq!(guard.open(v6(3, 7)).err(), Some(Crowded::Network));
        drop(b);
        assert!(guard.open(B).is_ok(), "given back");
        drop((held, six));
    }

    #[test]
    fn the_record_holds_a_bounded_number_of_entries_whatever_the_ids() {
        let guard = Guard::bounded(10, 10, 64);
        let long = "x".repeat(400 << 10);
        for n in 0..1_000u16 {
            guard.failed(v6(0, n), Some(&format!("{long}{n}")));
        }
        let state = guard.lock();
        assert!(state.by_party.len() <= 64, "{}", state.by_party.len());
        assert!(state.by_id.len() <= 64, "{}", state.by_id.len());
        // What the last ones failed is still counted.
        drop(state);
        assert!(guard.standing(v6(0, 999), "y").suspect);
    }

    #[test]
    fn an_id_in_a_log_is_escaped_and_short() {
        assert_eq!(logged("till-1"), "\"till-1\"");
        assert_eq!(logged("a\nb"), "\"a\\nb\"");
        let long = "x".repeat(500);
        assert!(logged(&long).chars().count() < 70);
    }
}
