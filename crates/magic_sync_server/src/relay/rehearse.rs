//! A deployment rehearsed: what each replica would be sent and have taken
//! back, counted from the record before anything changes.
//!
//! The dry run (`crate::deploy::dry_run`) plans the deployment's work as the
//! passes will, table by table (removals first, then parents first), each
//! over the whole table at once, in one transaction that it rolls back. It
//! reads no pending note and records nothing: each table's plan is against
//! the record as it stands now. The rows sent and taken back are gathered
//! across the tables, each row once per replica.
//!
//! So one table's work is counted exactly. Over several, a row one table's
//! work sends and a later one's would then find held is counted once all
//! the same; what is not exact is a parent one table takes back that
//! another still needs, or the other way round: the counts are then an
//! upper bound, and say so ([`Rehearsal::exact`]).
//!
//! Planning takes row locks on what a removal lowers the counts of, held
//! until the rollback; a lock timeout keeps the running relay from waiting
//! on a dry run for long.

use super::{observe, Relay, Settings};
use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::error::Result;
use crate::store;
use crate::store::deployment::Work;
use crate::store::plan::{self, quarantine, Planner};
use std::collections::BTreeMap;
use tokio_postgres::{Client, IsolationLevel};

/// What a deployment would move for one replica, in one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Moves {
    /// Rows sent, new or again.
    pub send: u64,
    /// Rows taken back.
    pub take_back: u64,
}

/// What a rehearsed deployment would move, per replica and table.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Rehearsal {
    /// Per replica, per table.
    pub moves: BTreeMap<String, BTreeMap<String, Moves>>,
    /// Whether the counts are exact: one table worked (or several that
    /// cannot lean on one another's rows). Otherwise they are upper bounds.
    pub exact: bool,
}

impl Rehearsal {
    /// Rows sent and taken back over every replica.
    pub fn totals(&self) -> Moves {
        let mut total = Moves::default();
        for moves in self.moves.values().flat_map(|t| t.values()) {
            total.send += moves.send;
            total.take_back += moves.take_back;
        }
        total
    }
}

/// One table's work, as `sync.deployment` would owe it.
pub(crate) struct Owed {
    pub table: String,
    /// `plan`, `resend`, `both` or `remove`.
    pub work: &'static str,
    /// For a removal, the table as the build that declared it recorded it.
    pub definition: Option<serde_json::Value>,
}

/// Plans what `owed` says for `engine` against the record, on `client`,
/// and rolls back. `catalog` is the database's, read for `engine`.
pub(crate) async fn rehearse(
    client: &mut Client,
    engine: &Engine,
    catalog: &Catalog,
    owed: &[Owed],
) -> Result<Rehearsal> {
    let relay = Relay::with_catalog(catalog, engine.clone(), Settings::default())?;
    let graph = &relay.context.graph;
    let mut works = Vec::new();
    for o in owed.iter().filter(|o| o.work == "remove") {
        works.push(Work::Remove(store::deployment::removed_table(
            &o.table,
            o.definition.as_ref(),
            graph,
        )?));
    }
    for shape in &graph.shapes {
        if let Some(o) = owed
            .iter()
            .find(|o| o.work != "remove" && o.table == shape.table.name)
        {
            works.push(Work::Plan {
                table: shape.table.name,
                replan: o.work != "resend",
                resend: o.work != "plan",
                after: None,
            });
        }
    }
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .await?;
    tx.batch_execute(
        "SET LOCAL lock_timeout = '2s';
         CREATE TEMP TABLE _ms_rehearsed_send (r text, t text, k jsonb, PRIMARY KEY (r, t, k));
         CREATE TEMP TABLE _ms_rehearsed_del (r text, t text, k jsonb, PRIMARY KEY (r, t, k));",
    )
    .await?;
    plan::prepare(&tx).await?;
    let mut kept: Vec<plan::Listed> = observe::kept(store::replicas::live(&tx).await?)
        .into_iter()
        .map(|k| plan::Listed::replica(k.id, k.partition, k.member))
        .collect();
    if store::cohorts::exists(&tx).await? {
        // Its moves are its members'.
        kept.push(plan::Listed {
            id: store::cohorts::ALL.to_string(),
            partition: None,
            fresh: false,
            kind: plan::Kind::All,
        });
    }
    // Rows set aside stay as they are: taking them back is no deployment's.
    let blocks = quarantine::Blocks {
        unsettled: false,
        ..quarantine::Blocks::read(&tx).await?
    };
    for work in &works {
        let mut leftovers = plan::Leftovers::default();
        leftovers.clear(&tx).await?;
        leftovers.list(&tx, kept.clone()).await?;
        let planner = Planner {
            tx: &tx,
            graph,
            groups: relay.groups.clone(),
            filled: Default::default(),
            analysed: Default::default(),
            blocks,
            deployment: Some((work, i64::MAX)),
            worked: Default::default(),
            ruled_out: Default::default(),
            ruled: crate::store::held::Ruled::of(&relay.context.settings),
            cache: None,
            rehearsing: true,
        };
        planner.plan().await?;
        // A member's moves are its own and its cohort's, as the loader
        // gives them.
        let shared = !relay.cohort_tables.shared.is_empty();
        let gathered = |from: &str, to: &str| {
            format!(
                "INSERT INTO {to} SELECT DISTINCT r, t, k FROM ({}) g
                 ON CONFLICT DO NOTHING;",
                store::cohorts::given_to_members(from, "true", shared, false)
            )
        };
        tx.batch_execute(&format!(
            "{}{}",
            gathered("_ms_send", "_ms_rehearsed_send"),
            gathered("_ms_del", "_ms_rehearsed_del")
        ))
        .await?;
    }
    let rows = tx
        .query(
            "SELECT r, t, count(*) FILTER (WHERE sent), count(*) FILTER (WHERE NOT sent)
             FROM (SELECT r, t, true AS sent FROM _ms_rehearsed_send
                   UNION ALL SELECT r, t, false FROM _ms_rehearsed_del) m
             GROUP BY 1, 2",
            &[],
        )
        .await?;
    tx.rollback().await?;
    let mut rehearsal = Rehearsal {
        moves: BTreeMap::new(),
        exact: works.len() <= 1,
    };
    for row in rows {
        let (replica, table): (String, String) = (row.get(0), row.get(1));
        let (send, take_back): (i64, i64) = (row.get(2), row.get(3));
        rehearsal.moves.entry(replica).or_default().insert(
            table,
            Moves {
                send: send as u64,
                take_back: take_back as u64,
            },
        );
    }
    Ok(rehearsal)
}
