//! The backstop: a replica's digest of what it holds (per table, a row
//! count and a fingerprint of its keys, in the form the digest names:
//! `magic_sync_core::digest`), compared with what the
//! server records it holding (`sync.held`). A replica that drifted from
//! the record, by a bug nobody predicted or a failure misjudged as
//! harmless, is provisioned again, and the difference counted and shown.
//!
//! The comparison is made only when it can be exact: the replica is live,
//! kept up (not waiting for or streaming a snapshot), has nothing waiting
//! in its outbox, and applied the last message the server recorded for it
//! (the digest names it). Rows the replica says it could not take are left
//! out on both sides. A replica's digests are compared at most once a
//! minute: each reads its whole record. The runner compares them on a
//! connection of their own, one at a time, so a large replica's record
//! (about a second for a million rows) holds back no acknowledgement or
//! upload of anyone's.

use crate::engine::Engine;
use crate::envelope::{Ack, Digest, Refused};
use crate::error::Result;
use crate::graph::Graph;
use crate::store;
use magic_sync_core::digest::{self, DigestForm};
use magic_sync_core::MessageNo;
use std::collections::{BTreeMap, HashSet};
use tokio_postgres::{Client, IsolationLevel};

/// What became of a digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compared {
    /// Not compared: the replica is not where an exact comparison can be
    /// made (why), or its last digest was compared less than a minute ago.
    Skipped(&'static str),
    /// It matches the record.
    Matched,
    /// It differs: the replica is provisioned again. What differed, per
    /// table.
    Differed(Vec<String>),
}

/// A digest as it was heard, with what its replica said beside it: the last
/// message it applied and the rows it could not take.
#[derive(Debug, Clone, PartialEq)]
pub struct Heard {
    pub digest: Digest,
    pub applied: Option<Ack>,
    pub refused: Vec<Refused>,
}

impl Heard {
    /// Compares it with the record of `replica` (as the transport
    /// authenticated it). See [`compare_digest`].
    pub async fn compare(
        &self,
        client: &mut Client,
        engine: &Engine,
        replica: &str,
    ) -> Result<Compared> {
        compare_digest(
            client,
            engine,
            replica,
            &self.digest,
            self.applied.as_ref(),
            &self.refused,
        )
        .await
    }
}

/// Compares the digest `replica` sent (as the transport authenticated it)
/// with the record. A pass that writes to the replica while the comparison
/// reads makes it [`Compared::Skipped`]: the replica is no longer where its
/// digest was, and its next digest is compared instead.
pub async fn compare_digest(
    client: &mut Client,
    engine: &Engine,
    replica: &str,
    digest: &Digest,
    applied: Option<&Ack>,
    refused: &[Refused],
) -> Result<Compared> {
    match compare_in_one_snapshot(client, engine, replica, digest, applied, refused).await {
        Err(e) if e.is_conflict() => Ok(Compared::Skipped(
            "the record changed while it was compared",
        )),
        compared => compared,
    }
}

async fn compare_in_one_snapshot(
    client: &mut Client,
    engine: &Engine,
    replica: &str,
    digest: &Digest,
    applied: Option<&Ack>,
    refused: &[Refused],
) -> Result<Compared> {
    let Some(applied) = applied.and_then(|a| MessageNo::from_wire(a.number).ok()) else {
        return Ok(Compared::Skipped("it names no message it applied"));
    };
    let Some((form, said)) = fingerprints(digest) else {
        return Ok(Compared::Skipped(
            "its fingerprints are of a form this build does not read",
        ));
    };
    let by_rule = Graph::while_by_rule(client, engine).await?;
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .await?;
    let Some(standing) = store::digests::standing(&tx, replica).await? else {
        return Ok(Compared::Skipped("the server does not know it"));
    };
    let store::digests::Standing {
        kept_up,
        last_number: last,
        owed,
        recent,
    } = standing;
    let skipped = if !kept_up {
        Some("it is not kept up (not live, or provisioned)")
    } else if owed || last != applied.store() {
        Some("messages recorded for it are not applied yet")
    } else if recent {
        Some("its last digest was compared less than a minute ago")
    } else {
        None
    };
    if let Some(why) = skipped {
        return Ok(Compared::Skipped(why));
    }
    let recorded = recorded(&tx, engine, by_rule.as_ref(), replica, refused, form).await?;
    let empty = (0, fingerprint(form, &mut Vec::new()));
    let mut differed = Vec::new();
    for table in engine.down_tables() {
        let ours = recorded.get(table.name).copied().unwrap_or(empty);
        let theirs = said.get(table.name).copied().unwrap_or(empty);
        if ours != theirs {
            differed.push(format!(
                "{}: it holds {} rows, the record {}{}",
                table.name,
                theirs.0,
                ours.0,
                if ours.0 == theirs.0 {
                    " (other keys)"
                } else {
                    ""
                }
            ));
        }
    }
    if differed.is_empty() {
        store::digests::matched(&tx, replica).await?;
        tx.commit().await?;
        return Ok(Compared::Matched);
    }
    store::digests::differed(&tx, replica, &differed.join("; ")).await?;
    tx.commit().await?;
    // A line a minute at most: a replica can send a digest that differs
    // as often as it likes (each provisions only it, at its pace).
    static DIFFERED: std::sync::LazyLock<magic_sync_core::logbook::Logbook<()>> =
        std::sync::LazyLock::new(Default::default);
    DIFFERED.log((), |more| {
        tracing::error!(
            replica,
            differed = %differed.join("; "),
            "a replica's digest differs from the record: it is provisioned again{more}"
        )
    });
    metrics::counter!("magic_sync_digest_mismatches_total").increment(1);
    Ok(Compared::Differed(differed))
}

/// Per table, the rows a digest says and their fingerprint.
type Said<'a> = BTreeMap<&'a str, (u64, u64)>;

/// The form a digest is compared in, and per table the rows and the
/// fingerprint it gives in that form: the summed fingerprints when every
/// table carries one (`TableDigest.summed`), otherwise `fingerprint` in the
/// digest's form. None for a form this build does not know.
fn fingerprints(digest: &Digest) -> Option<(DigestForm, Said<'_>)> {
    let tables = || digest.tables.iter();
    let summed: Option<BTreeMap<_, _>> = tables()
        .map(|t| Some((t.table.as_str(), (t.rows, t.summed?))))
        .collect();
    match summed {
        Some(said) if !said.is_empty() => Some((DigestForm::Summed, said)),
        _ => {
            let form = DigestForm::try_from(digest.form).ok()?;
            let said = tables().map(|t| (t.table.as_str(), (t.rows, t.fingerprint)));
            Some((form, said.collect()))
        }
    }
}

/// Per table, the rows the record says `replica` holds and their
/// fingerprint in `form`, leaving out the rows it says it refused: as the
/// replica computes its own (`magic_sync_replica::fingerprint`), over the
/// keys as they travel.
async fn recorded(
    tx: &tokio_postgres::Transaction<'_>,
    engine: &Engine,
    by_rule: Option<&Graph>,
    replica: &str,
    refused: &[Refused],
    form: DigestForm,
) -> Result<BTreeMap<&'static str, (u64, u64)>> {
    let refused: HashSet<(&str, &[u8])> = refused
        .iter()
        .map(|r| (r.table.as_str(), r.key.as_slice()))
        .collect();
    let mut out = BTreeMap::new();
    for table in engine.down_tables() {
        let held = store::held::keys(tx, replica, table.name, by_rule).await?;
        let mut keys = Vec::with_capacity(held.len());
        for json in held {
            let key = crate::graph::wire_key(table, json)?;
            if !refused.contains(&(table.name, key.as_bytes())) {
                keys.push(key);
            }
        }
        out.insert(
            table.name,
            (keys.len() as u64, fingerprint(form, &mut keys)),
        );
    }
    Ok(out)
}

/// The fingerprint of `keys` in `form`.
fn fingerprint(form: DigestForm, keys: &mut [String]) -> u64 {
    match form {
        DigestForm::Sorted => digest::sorted(keys),
        DigestForm::Summed => digest::summed(keys.iter()),
    }
}
