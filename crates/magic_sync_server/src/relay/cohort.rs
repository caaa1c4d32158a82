//! Making the cohort of the `all` tables (`store::cohorts`): between
//! passes, on the relay's connection, from one view of the database, as a
//! snapshot makes a replica's set. Its rows are planned whole by the
//! planner's provisioning, read and encoded once (a row that cannot go is
//! set aside, as a snapshot sets it aside), and recorded as the cohort's,
//! each at the newest note the view saw of it: a pass planning that note
//! afterwards finds the cohort holding it already.

use super::load::{Loader, Sink, Source};
use super::pack::Packed;
use super::snapshot::Context;
use crate::error::{Error, Result};
use crate::sql::literal;
use crate::store::cohorts;
use crate::store::held;
use crate::store::plan::quarantine;
use crate::store::plan::scratch::{Filled, Scratch};
use crate::store::plan::{self, Leftovers};
use std::collections::HashMap;
use tokio_postgres::{Client, IsolationLevel, Transaction};

/// Makes the cohort of the `all` tables unless it is recorded. Returns
/// whether it is recorded now: not when rows it would hold could not go,
/// which are set aside, and the next pass's start tries again around them.
///
/// `leftovers` is made unknown: the planner's tables are the pass's, and
/// the next pass makes them again.
pub(super) async fn make(
    client: &mut Client,
    context: &Context,
    leftovers: &mut Leftovers,
    max_message_bytes: usize,
) -> Result<bool> {
    if cohorts::exists(&*client).await? {
        return Ok(true);
    }
    *leftovers = Leftovers::default();
    let t0 = std::time::Instant::now();
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .await?;
    let mut fresh = String::new();
    for table in Scratch::ALL {
        fresh.push_str(&format!(
            "DROP TABLE IF EXISTS {table}; {};",
            table.create()
        ));
    }
    tx.batch_execute(&fresh).await?;
    cohorts::clear(&tx).await?;
    let rows = super::snapshot::plan_snapshot(
        &tx,
        context,
        cohorts::ALL,
        None,
        plan::Kind::All,
        &Default::default(),
    )
    .await?;
    let loader = Loader {
        graph: &context.graph,
        engine: &context.engine,
        settings: &context.settings,
        max_message_bytes,
        removed: None,
        described: &context.described,
        cache: None,
        members: &[],
        batches: false,
        shared: &[],
    };
    let holder = [cohorts::ALL.to_string()];
    match loader
        .load(&tx, Source::Snapshot, &holder, &mut Nowhere)
        .await
    {
        Ok(_) => {}
        Err(Error::Unsendable(unsendable)) => {
            let found =
                quarantine::resolve(&tx, &context.graph, quarantine::From::Fresh, &unsendable)
                    .await?;
            tx.rollback().await?;
            let by_rule = (held::Ruled::of(&context.settings) == held::Ruled::ByRule)
                .then_some(&context.graph);
            crate::store::quarantine::set_aside(&*client, &found, by_rule).await?;
            metrics::counter!("magic_sync_rows_quarantined_total")
                .increment(unsendable.len() as u64);
            tracing::warn!(
                rows = unsendable.len(),
                "rows of the `all` tables cannot go: set aside before their cohort is recorded"
            );
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    // Carried by no message: every member holds them from its own chain
    // until it joins.
    let last = HashMap::from([(cohorts::ALL.to_string(), 0)]);
    tx.batch_execute(
        &held::closing(
            &context.graph,
            &last,
            &Filled::only([Scratch::Fresh]),
            held::Ruled::of(&context.settings),
        )
        .text(),
    )
    .await?;
    // The notes its view saw are planned by the next pass: until then the
    // record alone says what the cohort holds of their rows.
    let ruled = held::Ruled::of(&context.settings);
    if let Some(kept) = held::kept_as_seen(&context.graph, &literal(cohorts::ALL), "true", ruled) {
        tx.batch_execute(&kept).await?;
    }
    cohorts::record(&tx).await?;
    tx.commit().await?;
    tracing::info!(
        rows,
        ms = t0.elapsed().as_millis() as u64,
        "the cohort of the `all` tables is recorded"
    );
    Ok(true)
}

/// Where the cohort's encoded rows go while it has no member to send them
/// to: nowhere. Encoding them finds the rows that cannot go.
struct Nowhere;

impl Sink for Nowhere {
    async fn take(&mut self, _: &Transaction<'_>, _: Vec<Packed>) -> Result<()> {
        Ok(())
    }
}

/// Forgets the cohort of the `all` tables, as `cohorts::forget` does, once
/// its members hold in their own outboxes what it owes them: each of its
/// messages a member was not sent and acknowledged yet is written to the
/// member's outbox as publishing would have stamped it, and a member whose
/// chain stands at one of the cohort's messages is recorded standing
/// there. Their chains go on unbroken, and nobody is provisioned again.
/// Returns whether it was forgotten.
pub(super) async fn forget(client: &mut Client, tables: &cohorts::Tables) -> Result<bool> {
    let tx = client.transaction().await?;
    if !cohorts::exists(&tx).await? {
        return Ok(false);
    }
    let epoch = super::outbox::Epoch::read(&tx).await?;
    let statements = crate::store::outbox::Statements::prepare(&tx).await?;
    // Every page read before any is written: a message written would be
    // read as the member's own, sent it in place of the cohort's.
    let mut after = (String::new(), 0);
    let mut rows = crate::store::outbox::Rows::default();
    let statement = cohorts::prepare_owed_page(&tx).await?;
    let none = std::collections::BTreeSet::new();
    loop {
        let page =
            cohorts::owed_page(&tx, &statement, &after, 512, &none, 4096, (&[], &[])).await?;
        let owed = page.owed;
        // Each list is whole up to its last message when full, else up to
        // where the members looked at end.
        let next = match owed.last() {
            Some(last) if owed.len() == 512 => Some((last.replica.clone(), last.number)),
            _ => page.through,
        };
        let stamped =
            super::publish::stamp_owed(&epoch, owed, &page.bodies, &|_, _| false, i64::MAX)?;
        for m in stamped {
            rows.replica.push(m.replica.to_string());
            rows.number.push(m.number);
            rows.nonce.push(m.nonce);
            rows.head.push(m.head);
            rows.hash.push(m.hash);
            rows.seal.push(m.seal);
        }
        match next {
            Some(next) => after = next,
            None => break,
        }
    }
    crate::store::outbox::insert(&tx, &statements, &[], &[], &rows).await?;
    let heads = cohorts::heads_at_cohort(&tx).await?;
    let nonces: Vec<Vec<u8>> = heads
        .iter()
        .map(|(replica, number, shared)| {
            super::observe::member_nonce(&epoch.secret, replica, *number, shared)
        })
        .collect();
    let replicas: Vec<&str> = heads.iter().map(|(r, _, _)| r.as_str()).collect();
    let numbers: Vec<i64> = heads.iter().map(|(_, n, _)| *n).collect();
    crate::store::replicas::chains_at(&tx, &replicas, &numbers, &nonces).await?;
    let forgotten = cohorts::forget(&tx, None, Some(tables)).await?;
    tx.commit().await?;
    Ok(forgotten)
}
