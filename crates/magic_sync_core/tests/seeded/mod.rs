//! What the seeded model walks (`cohort_model.rs`, `rule_record_model.rs`)
//! share: their schemas' foreign keys, and how a run is chosen from the
//! environment. `MAGIC_SYNC_SEED=n`
//! replays one seed, `MAGIC_SYNC_SEEDS=n` walks that many from the test's
//! base.

/// The number the environment variable `name` holds, if it holds one.
pub fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The seeds to walk: the one `MAGIC_SYNC_SEED` names, or
/// `MAGIC_SYNC_SEEDS` (else `default`) of them from `base`.
pub fn seeds(default: u64, base: u64) -> Vec<u64> {
    match env("MAGIC_SYNC_SEED") {
        Some(seed) => vec![seed],
        None => (0..env("MAGIC_SYNC_SEEDS").unwrap_or(default))
            .map(|i| base + i)
            .collect(),
    }
}

/// A foreign key of a model's schema (tables of type `T`): the child's
/// `fks[i]` names a row of `parent`.
#[derive(Debug)]
pub struct Link<T> {
    pub parent: T,
    pub nullable: bool,
    pub follows: bool,
}

pub const fn link<T>(parent: T, nullable: bool, follows: bool) -> Link<T> {
    Link {
        parent,
        nullable,
        follows,
    }
}
