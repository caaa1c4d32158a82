//! A pass's steps, in the order [`Relay::record`] runs them: opened (the
//! epoch, the outboxes' bound, the replicas observed and listed), planned
//! until no row it meets must be set aside, loaded and written, closed and
//! committed; then a few replicas join the cohort of the `all` tables.

use super::{
    configured, ids, load, observe, outbox, reached, trace, Recorded, Relay, ReplicaId,
    ReplicaInfo, RELAY_LOCK,
};
use crate::error::{Error, Result};
use crate::store::plan::scratch::{Plan, Scratch};
use crate::store::plan::{self, quarantine, Planned};
use crate::store::{self, deployment, held};
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, IsolationLevel, Transaction};

/// Plans one pass makes at most around rows set aside. Each plan after
/// the first sets aside at least one row more than the one before, and a
/// chain of rows leaning on one another is set aside a link per plan: far
/// more than any schema's depth.
pub(super) const MAX_PLAN_ATTEMPTS: u32 = 64;

/// The most replicas that join the cohort of the `all` tables in one pass:
/// each forgets its own record of those tables, a catalogue's worth of
/// deletes, in the pass's transaction.
const JOIN_PER_PASS: usize = 16;

/// What a pass's first steps found, for the rest of it.
struct Opened {
    epoch: outbox::Epoch,
    /// Replicas whose outbox outgrew its bound, or whose snapshot's end was
    /// lost: provisioned again.
    dropped: Vec<String>,
    /// Whether the outboxes were measured this pass.
    bounded: bool,
    observed: observe::Observation,
    blocks: quarantine::Blocks,
    /// A deployment's chunk, if one is owed.
    work: Option<deployment::Work>,
    /// The planner's tables analysed, over every attempt.
    analysed: std::collections::BTreeSet<crate::store::plan::scratch::Scratch>,
}

impl Relay {
    /// The graph, while the rows a rule gives are left to it: what moves
    /// the sums of the rows held by the rule alone as rows are held back.
    fn by_rule(&self) -> Option<&crate::graph::Graph> {
        (held::Ruled::of(&self.context.settings) == held::Ruled::ByRule)
            .then_some(&self.context.graph)
    }

    /// One pass, as [`record`](Self::record) describes it.
    pub(super) async fn pass(
        &mut self,
        client: &mut Client,
        replicas: &[ReplicaInfo],
        max_message_bytes: usize,
    ) -> Result<Recorded> {
        let began = std::time::SystemTime::now();
        let pass_began = std::time::Instant::now();
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .start()
            .await?;
        let mut opened = self.open(&tx, replicas).await?;
        // Whether this pass looks for replicas due a `Configured`.
        let looked = !self.deploying;
        let (plan, recorded, closing) = self
            .plan_until_settled(&tx, &mut opened, began, max_message_bytes)
            .await?;
        self.close_and_commit(tx, &opened, &plan, closing).await?;
        self.apart
            .retain(|id| opened.observed.kept.iter().any(|k| &k.id == id));
        // Only now, so that a pass that failed leaves the relay as it was
        // and can run again on the same session.
        if opened.bounded {
            self.outbox_checked = Some(std::time::Instant::now());
        }
        self.prepared = true;
        self.started = true;
        if let Some(work) = &opened.work {
            self.pace(pass_began.elapsed());
            if plan.worked.done {
                tracing::info!(table = work.table(), "a table's deployment is done");
            }
        }
        if looked && recorded.configured.is_empty() {
            self.configuring = false;
        }
        if recorded.described == 0 {
            self.describing = false;
        }
        self.leftovers.left(plan.filled, opened.analysed);
        Ok(recorded)
    }

    /// A pass's first steps, in its transaction: the epoch and the lock
    /// checked, the outboxes measured, the replicas observed and listed for
    /// the planner, the rows set aside read, and a deployment's next chunk
    /// taken. The plan's savepoint is set: a plan that meets a row it
    /// cannot send, or that would leave a row pointing at one set aside,
    /// runs again from there with it set aside.
    async fn open(&mut self, tx: &Transaction<'_>, replicas: &[ReplicaInfo]) -> Result<Opened> {
        let epoch = self.open_pass(tx).await?;
        let t0 = std::time::Instant::now();
        let (dropped, bounded) = self.bound_outboxes(tx).await?;
        let by_rule = self.context.settings.record_by_rule;
        let observed = observe::observe(tx, replicas, by_rule).await?;
        if by_rule {
            self.cohort = Some(observed.cohort);
        }
        trace("observe", t0);
        self.list(tx, &observed).await?;
        // Sent together: one round trip.
        let ((), blocks) = tokio::try_join!(
            async { Ok(tx.batch_execute("SAVEPOINT plan").await?) },
            quarantine::Blocks::read(tx)
        )?;
        let work = match self.deploying {
            true => {
                let context = &self.context;
                deployment::next(tx, &context.graph, &context.schema).await?
            }
            false => None,
        };
        if self.deploying && work.is_none() {
            // Nothing is owed any more: this pass tells the replicas.
            tracing::info!("the deployment is complete");
            self.deploying = false;
        }
        Ok(Opened {
            epoch,
            dropped,
            bounded,
            observed,
            blocks,
            work,
            analysed: Default::default(),
        })
    }

    /// Plans, loads and writes the pass, again from the plan's savepoint
    /// each time a row has to be set aside first, at most
    /// `MAX_PLAN_ATTEMPTS` times. Returns the plan, what was recorded, and
    /// the pass's closing statements so far.
    async fn plan_until_settled(
        &mut self,
        tx: &Transaction<'_>,
        opened: &mut Opened,
        began: std::time::SystemTime,
        max_message_bytes: usize,
    ) -> Result<(Plan, Recorded, String)> {
        for _ in 0..MAX_PLAN_ATTEMPTS {
            let plan = self.plan(tx, opened.blocks, opened.work.as_ref()).await?;
            opened.analysed.extend(plan.analysed.iter().copied());
            if let Some(blocked) = plan.blocked.as_ref().filter(|b| !b.is_empty()) {
                tx.batch_execute("ROLLBACK TO SAVEPOINT plan").await?;
                quarantine::block(tx, blocked, false, self.by_rule()).await?;
                // What was set aside stays when the next attempt rolls back.
                tx.batch_execute("RELEASE SAVEPOINT plan; SAVEPOINT plan")
                    .await?;
                opened.blocks.added();
                continue;
            }
            let observed = &opened.observed;
            let mut recorded = Recorded {
                planned: plan.planned,
                waiting: ids(&observed.waiting),
                streaming: ids(&observed.streaming),
                forgotten: ids(&observed.forgotten),
                dropped: ids(&opened.dropped),
                oldest_change: self.oldest_change(tx, &plan.planned, began).await?,
                deployed: opened
                    .work
                    .as_ref()
                    .map(|w| (w.table().to_string(), plan.worked.rows)),
                ..Recorded::default()
            };
            let loaded = self
                .load_and_write(
                    tx,
                    observed,
                    &plan,
                    &opened.epoch,
                    max_message_bytes,
                    &mut recorded,
                )
                .await;
            match loaded {
                Ok(closing) => {
                    // The closing wrote the last messages of a pass that
                    // sent or took back rows (`held::closing`).
                    let mut plan = plan;
                    if plan.planned.sends > 0 || plan.planned.deletes > 0 {
                        let written = recorded.written.len().max(1) as u64;
                        plan.filled.add(Scratch::Last, written);
                    }
                    return Ok((plan, recorded, closing));
                }
                Err(Error::Unsendable(rows)) => {
                    self.set_aside(tx, &rows).await?;
                    opened.blocks.added();
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unsettled {
            attempts: MAX_PLAN_ATTEMPTS,
        })
    }

    /// Sets aside rows that cannot go down (and what leans on them), after
    /// rolling the plan back to its savepoint; kept when the next attempt
    /// rolls back.
    async fn set_aside(
        &self,
        tx: &Transaction<'_>,
        rows: &[crate::error::Unsendable],
    ) -> Result<()> {
        let found =
            quarantine::resolve(tx, &self.context.graph, quarantine::From::Sends, rows).await?;
        tx.batch_execute("ROLLBACK TO SAVEPOINT plan").await?;
        for row in rows {
            tracing::error!(
                table = row.table,
                key = %row.key,
                reason = %row.reason,
                "a row cannot go down: set aside until it changes or a fix is deployed"
            );
        }
        store::quarantine::set_aside(tx, &found, self.by_rule()).await?;
        tx.batch_execute("RELEASE SAVEPOINT plan; SAVEPOINT plan")
            .await?;
        metrics::counter!("magic_sync_rows_quarantined_total").increment(rows.len() as u64);
        Ok(())
    }

    /// Runs the pass's closing statements (what each replica now holds, a
    /// deployment's progress, what was set aside taken back) and commits.
    async fn close_and_commit(
        &mut self,
        tx: Transaction<'_>,
        opened: &Opened,
        plan: &Plan,
        mut closing: String,
    ) -> Result<()> {
        closing.push_str(&held::kept_and_done(
            &opened.observed.streaming,
            &plan.filled,
            held::Ruled::of(&self.context.settings),
        ));
        if let Some(graph) = self.by_rule() {
            // Its notes planned, the view reads each row as it is now. Only
            // when a key's notes could not say what it was: the statements
            // are costly to plan, and such a key is rare.
            if plan.filled.any_not_known() {
                closing.push_str(&store::by_rule::recounted_where_not_known(
                    graph,
                    &plan.filled,
                ));
            }
        }
        if let Some(work) = &opened.work {
            closing.push_str(&deployment::closing(work.table(), &plan.worked));
        }
        if opened.blocks.unsettled {
            // Every row set aside is taken back now from wherever it was held.
            closing.push_str(store::quarantine::SETTLE);
        }
        if self.context.settings.record_by_rule
            && opened.observed.cohort
            && (opened.bounded || !closing.is_empty())
        {
            // What every member has of the cohort's messages goes: in a
            // pass that closes anything, and in one that measured the
            // outboxes, so an idle fleet pays for it once in a while.
            closing.push_str(store::cohorts::FORGET_SENT_BATCHES);
        }
        close(&tx, closing).await?;
        self.join_cohort(&tx, &opened.observed).await?;
        // Where a test takes the lock away mid-pass. The lock is the
        // session's, checked at the pass's start: it is lost only with the
        // session, and the transaction dies with it, so a relay that lost
        // it never commits over the one that took it.
        fail::fail_point!("relay-before-commit");
        let t0 = std::time::Instant::now();
        tx.commit().await?;
        trace("commit", t0);
        // Recorded, not published: whoever relays next publishes it.
        fail::fail_point!("relay-after-commit", |_| Err(Error::Injected(
            "relay-after-commit"
        )));
        Ok(())
    }

    /// While the relay records by rule, a few of the replicas this pass
    /// kept up join the cohort of the `all` tables, once the pass recorded
    /// what they hold: from the next pass, those tables' rows are recorded
    /// once for all of them, and each is sent what the cohort is.
    async fn join_cohort(
        &mut self,
        tx: &Transaction<'_>,
        observed: &observe::Observation,
    ) -> Result<()> {
        if !self.context.settings.record_by_rule || !observed.cohort {
            return Ok(());
        }
        let joining: Vec<String> = observed
            .kept
            .iter()
            .filter(|k| !k.member && !self.apart.contains(&k.id))
            .take(JOIN_PER_PASS)
            .map(|k| k.id.clone())
            .collect();
        if joining.is_empty() {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        let joined = store::cohorts::join(tx, &joining, &self.cohort_tables).await?;
        trace("join the cohort", t0);
        for id in joining.into_iter().filter(|id| !joined.contains(id)) {
            tracing::warn!(
                replica = %id,
                "a replica's record of the `all` tables differs from their cohort's, or it holds back rows of a table both hold: it holds them itself"
            );
            self.apart.insert(id);
        }
        Ok(())
    }

    /// The next chunk's size, from how long the pass that worked this one
    /// took against the budget.
    fn pace(&mut self, took: Duration) {
        let settings = &self.context.settings;
        let most = settings.deploy_chunk_rows.max(1);
        if took > settings.deploy_pass_budget {
            self.deploy_chunk = (self.deploy_chunk / 2).max(1);
        } else if took < settings.deploy_pass_budget / 2 {
            self.deploy_chunk = (self.deploy_chunk * 2).min(most);
        }
    }

    /// The pass's first steps, on its transaction: the planner's tables and
    /// the outbox's statements prepared once, the lock checked, what the
    /// last pass left in the planner's tables cleared, the epoch read; on
    /// the first pass, snapshots a relay before this one left under way put
    /// back to waiting.
    async fn open_pass(&mut self, tx: &Transaction<'_>) -> Result<outbox::Epoch> {
        if self.commit_times.is_none() {
            let row = tx
                .query_one(
                    "SELECT current_setting('track_commit_timestamp') = 'on'",
                    &[],
                )
                .await?;
            self.commit_times = Some(row.get(0));
        }
        if !self.prepared {
            plan::prepare(tx).await?;
            self.statements = Some(crate::store::outbox::Statements::prepare(tx).await?);
        }
        let t0 = std::time::Instant::now();
        // Three independent statements, sent together: one round trip.
        let holds_lock = async {
            let row = tx
                .query_typed_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
                       AND pid = pg_backend_pid() AND granted
                       AND ((classid::int8 << 32) | objid::int8) = $1)",
                    &[(&RELAY_LOCK, Type::INT8)],
                )
                .await?;
            Ok::<bool, Error>(row.get(0))
        };
        let (holds_lock, (), epoch) = tokio::try_join!(
            holds_lock,
            self.leftovers.clear(tx),
            outbox::Epoch::read(tx)
        )?;
        if !holds_lock {
            return Err(Error::NotLocked);
        }
        if !self.started {
            // Snapshots a relay before this one left under way have no
            // worker any more: their replicas wait for another.
            store::snapshots::orphaned(tx).await?;
        }
        trace("clear", t0);
        Ok(epoch)
    }

    /// Every `outbox_check_every`, the replicas whose outbox outgrew its
    /// bound: dropped, to be provisioned again. Whether it checked: the
    /// check counts once the pass commits.
    async fn bound_outboxes(&self, tx: &Transaction<'_>) -> Result<(Vec<String>, bool)> {
        let due = match self.outbox_checked {
            None => true,
            Some(at) => at.elapsed() >= self.context.settings.outbox_check_every,
        };
        if !due {
            return Ok((Vec::new(), false));
        }
        Ok((outbox::bound(tx, &self.context.settings).await?, true))
    }

    /// The replicas `observed` kept up, as the planner's replica list.
    async fn list(&mut self, tx: &Transaction<'_>, observed: &observe::Observation) -> Result<()> {
        let mut listed: Vec<plan::Listed> = observed
            .kept
            .iter()
            .map(|o| plan::Listed::replica(o.id.clone(), o.partition.clone(), o.member))
            .collect();
        if observed.cohort {
            listed.push(plan::Listed {
                id: store::cohorts::ALL.to_string(),
                partition: None,
                fresh: false,
                kind: plan::Kind::All,
            });
        }
        self.leftovers.list(tx, listed).await
    }

    /// Plans every pending note for the replicas listed, into the planner's
    /// tables, around the rows set aside (`blocks`). With rows set aside,
    /// also what the plan would leave pointing at one of them
    /// ([`Plan::blocked`]).
    async fn plan(
        &self,
        tx: &Transaction<'_>,
        blocks: quarantine::Blocks,
        work: Option<&deployment::Work>,
    ) -> Result<Plan> {
        let planner = plan::Planner {
            tx,
            graph: &self.context.graph,
            groups: self.groups.clone(),
            filled: Default::default(),
            analysed: Default::default(),
            blocks,
            deployment: work.map(|w| (w, self.deploy_chunk)),
            worked: Default::default(),
            ruled_out: Default::default(),
            ruled: crate::store::held::Ruled::of(&self.context.settings),
            cache: Some(&self.plan_cache),
            rehearsing: false,
        };
        let t0 = std::time::Instant::now();
        let planned = planner.plan().await?;
        trace("plan", t0);
        let blocked = match blocks.any {
            true => Some(planner.newly_blocked().await?),
            false => None,
        };
        let worked = planner.worked.lock().expect("not poisoned").clone();
        Ok(Plan {
            planned,
            filled: planner.filled(),
            analysed: planner.analysed(),
            blocked,
            worked,
            removed: match work {
                Some(deployment::Work::Remove(removed)) => Some(removed.clone()),
                _ => None,
            },
        })
    }

    /// When the oldest change `planned` carries was committed: PostgreSQL's
    /// commit time where it records them, else when the pass began.
    async fn oldest_change(
        &self,
        tx: &Transaction<'_>,
        planned: &Planned,
        began: std::time::SystemTime,
    ) -> Result<Option<std::time::SystemTime>> {
        if planned.notes == 0 {
            return Ok(None);
        }
        if self.commit_times == Some(true) {
            let oldest: Option<chrono::DateTime<chrono::Utc>> = tx
                .query_typed_one(
                    "SELECT min(pg_xact_commit_timestamp(xid(xid))) FROM _ms_notes",
                    &[],
                )
                .await?
                .get(0);
            if let Some(oldest) = oldest {
                return Ok(Some(oldest.into()));
            }
        }
        Ok(Some(began))
    }

    /// Loads and encodes the rows the plan sends, packs them into each
    /// replica's messages with the `Reached` answers due, and writes them
    /// to the outbox. Returns the statements that close the pass: where the
    /// chains stand and what each replica now holds.
    async fn load_and_write(
        &self,
        tx: &Transaction<'_>,
        observed: &observe::Observation,
        plan: &Plan,
        epoch: &outbox::Epoch,
        max_message_bytes: usize,
        recorded: &mut Recorded,
    ) -> Result<String> {
        let reached = reached::due(tx, observed).await?;
        let schema = &self.context.schema;
        let describe = match self.describing {
            true => configured::due(tx, observed, configured::Told::Described, schema).await?,
            false => Vec::new(),
        };
        let configure = match self.configuring && !self.deploying {
            true => configured::due(tx, observed, configured::Told::Configured, schema).await?,
            false => Vec::new(),
        };
        recorded.described = describe.len();
        let planned_any = plan.planned.sends > 0 || plan.planned.deletes > 0;
        if !planned_any && reached.is_empty() && configure.is_empty() && describe.is_empty() {
            return Ok(String::new());
        }
        let context = &self.context;
        let chains = observed
            .kept
            .iter()
            .map(|o| (o.id.clone(), o.chain(&epoch.secret)))
            .collect();
        let statements = self
            .statements
            .as_ref()
            .expect("prepared with the planner's tables");
        let mut writer = outbox::Writer::new(statements, epoch, chains);
        let described =
            configured::describe(tx, &mut writer, &describe, &self.context.described).await?;
        if planned_any {
            let t0 = std::time::Instant::now();
            let mut members: Vec<String> = match observed.cohort {
                true => observed
                    .kept
                    .iter()
                    .filter(|o| o.member)
                    .map(|o| o.id.clone())
                    .collect(),
                false => Vec::new(),
            };
            // The cohort's messages are written once, for the members
            // with nothing of their own in the pass; the others are sent
            // them in messages of their own, beside their own rows.
            let batches = !members.is_empty();
            if batches {
                let alone = store::cohorts::alone(tx, &self.cohort_tables.shared).await?;
                let owed = members.iter().filter(|m| !alone.contains(m)).cloned();
                writer.batch_for(owed.collect());
                members = alone;
            }
            let loader = load::Loader {
                graph: &context.graph,
                engine: &context.engine,
                settings: &context.settings,
                max_message_bytes,
                removed: plan.removed.as_ref(),
                described: &context.described,
                cache: (plan.planned.sends <= plan::CACHED_UP_TO).then_some(&self.plan_cache),
                members: &members,
                batches,
                shared: &self.cohort_tables.shared,
            };
            let mut kept: Vec<String> = observed.kept.iter().map(|o| o.id.clone()).collect();
            if observed.cohort {
                // Planned for, loaded for no one yet (see `store::cohorts`).
                kept.push(store::cohorts::ALL.to_string());
            }
            let source = load::Source::Difference {
                deletes: plan.planned.deletes > 0,
            };
            loader.load(tx, source, &kept, &mut writer).await?;
            trace("load", t0);
        }
        // Rows count as held at the last message that carried them, not at
        // the `Reached` that follows.
        let mut carried: std::collections::HashMap<String, i64> = writer
            .last_numbers()
            .into_iter()
            .map(|(r, n)| (r.to_string(), n))
            .collect();
        if observed.cohort && planned_any {
            // The cohort's rows of the pass are recorded at the number its
            // members' streams end on, drawn here if none was written.
            let number = match writer.pass_last() {
                Some(number) => number,
                None => store::outbox::draw(tx, 1).await?[0],
            };
            carried.insert(store::cohorts::ALL.to_string(), number);
        }
        let mut closing = described;
        closing.push_str(&reached::write(tx, &mut writer, reached).await?);
        closing
            .push_str(&configured::write(tx, &mut writer, &configure, &self.context.schema).await?);
        recorded.configured = ids(&configure);
        recorded.messages = writer.written();
        recorded.written = writer
            .last_numbers()
            .into_iter()
            .map(|(r, n)| (ReplicaId::from(r), n))
            .collect();
        if let Some((owed, last)) = writer.sent_batches() {
            // Those sent the cohort's messages: at the last of them, unless
            // a message of their own followed.
            for (replica, number) in &mut recorded.written {
                if owed.contains(replica.as_str()) {
                    *number = (*number).max(last);
                }
            }
            let written: std::collections::HashSet<ReplicaId> =
                recorded.written.iter().map(|(r, _)| r.clone()).collect();
            for member in owed.iter().map(ReplicaId::from) {
                if !written.contains(&member) {
                    recorded.written.push((member, last));
                }
            }
        }
        let (_, chains) = writer.finish();
        closing.push_str(&chains);
        if planned_any {
            // A small pass's closing runs by the plans made the first time.
            let cache = (plan.filled.total() <= plan::CACHED_UP_TO).then_some(&self.plan_cache);
            let held = held::closing(
                &context.graph,
                &carried,
                &plan.filled,
                held::Ruled::of(&context.settings),
            );
            closing.push_str(&held.sql(tx, cache).await?);
        }
        Ok(closing)
    }
}

/// Where the chains stand, what each replica now holds, the notes done:
/// one round trip. Bodies no message carries any more go with them, here
/// and not where messages are published: publishing runs beside a pass,
/// and could delete a body the pass is pointing a new message at, unseen
/// until it commits.
async fn close(tx: &Transaction<'_>, mut closing: String) -> Result<()> {
    if closing.is_empty() {
        return Ok(());
    }
    closing.push_str(store::outbox::FORGET_UNCARRIED_BODIES);
    let t0 = std::time::Instant::now();
    tx.batch_execute(&closing).await?;
    trace("close (chains, held, notes done)", t0);
    Ok(())
}
