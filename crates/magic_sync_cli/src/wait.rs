//! `wait`: reads the fleet (settled, or caught up) or a deployment again
//! every interval until what was asked is reached, something waits for a
//! fix, or the timeout passes, and prints the last read. Given a timeout, a
//! database not migrated yet is waited on too.

use crate::{emit, Error, Outcome};
use magic_sync::core::schema::Fingerprint;
use magic_sync::ops::{self, Scope};
use std::io::Write;
use std::time::Duration;
use tokio_postgres::Client;

/// What `wait` waits for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until<'a> {
    /// The fleet settled.
    Settled,
    /// Every live replica caught up.
    CaughtUp,
    /// The deployment of the declarations with this fingerprint (by
    /// default, those the server last started with) complete.
    Deployed(Option<&'a Fingerprint>),
}

/// How often `wait` reads, and for how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    pub(crate) every: Duration,
    pub(crate) timeout: Option<Duration>,
}

/// One read of what `wait` waits for.
enum Reading {
    Settled(ops::Settled),
    Deployed(ops::Deployed),
    /// No sync schema yet, or one the server's migrations have not reached:
    /// nothing to read until a relay starts (or `migrate` runs).
    NotMigrated(NotMigrated),
}

/// What `wait` prints when it gave up before the database had a sync
/// schema it reads.
#[derive(Debug, Clone, serde::Serialize)]
struct NotMigrated {
    /// Always false.
    migrated: bool,
    /// Always false: a relay makes the schema as it starts.
    relay_started: bool,
    /// What is missing, in words.
    says: String,
}

impl Reading {
    async fn read(
        client: &mut Client,
        scope: &Scope,
        until: Until<'_>,
    ) -> Result<Self, ops::Error> {
        match until {
            Until::Deployed(build) => ops::deployed(client, scope, build)
                .await
                .map(Reading::Deployed),
            Until::Settled | Until::CaughtUp => {
                ops::settled(client, scope).await.map(Reading::Settled)
            }
        }
    }

    /// `error` as what is awaited, when it is one a relay starting mends.
    fn not_migrated(error: &ops::Error) -> Option<Self> {
        let says = match error {
            ops::Error::NoSyncSchema => {
                "the database has no sync schema yet: no relay has started on it".to_string()
            }
            ops::Error::SchemaBehind { .. } => error.to_string(),
            _ => return None,
        };
        Some(Reading::NotMigrated(NotMigrated {
            migrated: false,
            relay_started: false,
            says,
        }))
    }

    fn reached(&self, until: Until<'_>) -> bool {
        match (self, until) {
            (Reading::Settled(read), Until::CaughtUp) => read.caught_up,
            (Reading::Settled(read), _) => read.settled,
            (Reading::Deployed(read), _) => read.complete,
            (Reading::NotMigrated(_), _) => false,
        }
    }

    fn waits_for_fix(&self) -> bool {
        match self {
            Reading::Settled(read) => {
                read.waiting_on_fix > 0 || read.quarantined > 0 || read.parked > 0
            }
            Reading::Deployed(read) => read.waits_for_fix(),
            Reading::NotMigrated(_) => false,
        }
    }

    fn emit(&self, out: &mut dyn Write, json: bool) -> Result<(), Error> {
        match self {
            Reading::Settled(read) => emit(out, json, read, |r| format!("{}\n", r.says)),
            Reading::Deployed(read) => emit(out, json, read, |r| format!("{}\n", r.says)),
            Reading::NotMigrated(read) => emit(out, json, read, |r| format!("{}\n", r.says)),
        }
    }
}

/// Reads what `until` names every `pace.every` until it is reached,
/// something waits for a fix, or `pace.timeout` passes; prints the last
/// read. Given a timeout, a database not migrated yet is waited on.
pub(crate) async fn wait(
    client: &mut Client,
    scope: &Scope,
    until: Until<'_>,
    pace: Pace,
    json: bool,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    let deadline = pace.timeout.map(|t| tokio::time::Instant::now() + t);
    loop {
        let read = match Reading::read(client, scope, until).await {
            Ok(read) => read,
            Err(e) => match Reading::not_migrated(&e).filter(|_| deadline.is_some()) {
                Some(read) => read,
                None => return Err(e.into()),
            },
        };
        let outcome = if read.waits_for_fix() {
            Some(Outcome::WaitsForFix)
        } else if read.reached(until) {
            Some(Outcome::Fine)
        } else if deadline.is_some_and(|d| tokio::time::Instant::now() + pace.every > d) {
            Some(Outcome::TimedOut)
        } else {
            None
        };
        if let Some(outcome) = outcome {
            read.emit(out, json)?;
            return Ok(outcome);
        }
        tokio::time::sleep(pace.every).await;
    }
}
