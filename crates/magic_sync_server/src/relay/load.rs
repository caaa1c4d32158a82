//! Loading: every row a plan sends is read once, a chunk at a time, and
//! encoded once by its codec, however many replicas it goes to; each
//! replica's rows and deletes are packed into messages (`super::pack`),
//! handed as they fill to where messages go: the outbox for a pass, the
//! transport itself for a snapshot.

use super::pack::{Packed, Packer};
use super::{trace_sum, Settings};
use crate::engine::Engine;
use crate::envelope::RowData;
use crate::error::{Error, Result, Unsendable};
use crate::graph::{key_kinds, key_match, Graph, Shape};
use crate::row::Table;
use crate::sql::literal;
use crate::store::cohorts;
use crate::store::plan::closed::Closed;
use crate::value::{canonical_key, Kind};
use std::collections::HashSet;
use tokio_postgres::Transaction;

/// Where packed messages go, in the order they are packed.
pub(crate) trait Sink {
    /// Takes `packed`, in order.
    async fn take(&mut self, tx: &Transaction<'_>, packed: Vec<Packed>) -> Result<()>;

    /// Heard after each chunk of `rows` rows read: a snapshot waits here
    /// when its pace says so. A pass goes on.
    async fn read(&mut self, rows: usize) -> Result<()> {
        let _ = rows;
        Ok(())
    }
}

/// What a load reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source<'a> {
    /// A pass's difference: the rows in `_ms_send`, each read by its key,
    /// and the keys in `_ms_del`.
    Difference {
        /// Whether the plan takes any row back.
        deletes: bool,
    },
    /// A snapshot's whole set, in `_ms_f`: read in bulk, then ended with an
    /// `EndSnapshot` naming every table.
    Snapshot,
    /// A snapshot's whole set, read straight from the host's tables by
    /// their queries in closed form, nothing planned: then ended like
    /// [`Source::Snapshot`].
    Closed(&'a Closed),
}

impl Source<'_> {
    fn is_snapshot(self) -> bool {
        matches!(self, Source::Snapshot | Source::Closed(_))
    }
}

/// Where one table's rows are read from.
#[derive(Debug, Clone, Copy)]
enum Rows<'a> {
    /// `_ms_send`.
    Difference,
    /// `_ms_f`.
    Planned,
    /// The table's rows by its query in closed form (none: nothing of
    /// it), for one replica.
    Closed(Option<&'a str>, &'a str),
}

/// Who the rows read go to.
#[derive(Debug, Clone, Copy)]
enum To<'a> {
    /// The replicas in the first column.
    Column,
    /// This one.
    Only(&'a str),
}

/// Which tables a pass's difference reads (`Loader::tables_in_difference`).
struct Difference {
    /// Tables with rows in `_ms_send`.
    sent: HashSet<String>,
    /// Tables with keys in `_ms_del` (a table a deployment removed among
    /// them).
    deleted: HashSet<String>,
    /// Replicas and tables with both.
    both: HashSet<(String, String)>,
}

/// A load under way.
pub(crate) struct Loader<'a> {
    pub graph: &'a Graph,
    pub engine: &'a Engine,
    pub settings: &'a Settings,
    /// The transport's limit on a message.
    pub max_message_bytes: usize,
    /// A table a deployment removed, whose held rows the plan takes back.
    pub removed: Option<&'a super::deployment::Removed>,
    /// The declarations as a replica is told them, with their
    /// fingerprint, which a snapshot's end carries.
    pub described: &'a crate::envelope::ReplicaSchema,
    /// Where a small pass keeps its statements prepared: its difference is
    /// read by plans PostgreSQL made once.
    pub cache: Option<&'a crate::store::plan::Cache>,
    /// The members of the cohort of the `all` tables the pass keeps up
    /// that are sent what the plan sends the cohort and takes back from
    /// it, beside their own, in messages of their own: every member, or
    /// with `batches` those `cohorts::alone` marked.
    pub members: &'a [String],
    /// The cohort's rows are packed for the cohort itself, into messages
    /// written once for its members (`sync.batches`), rather than for
    /// each member.
    pub batches: bool,
    /// The tables both the cohort and its members' own rows may hold rows
    /// of (`Graph::shared_cohort_tables`).
    pub shared: &'a [&'static str],
}

impl Loader<'_> {
    /// Reads what `source` says, packs it for the replicas `replicas` (all
    /// that the source names), and hands the messages to `sink`. Returns
    /// the rows read of each table, in the graph's order.
    pub async fn load(
        &self,
        tx: &Transaction<'_>,
        source: Source<'_>,
        replicas: &[String],
        sink: &mut impl Sink,
    ) -> Result<Vec<u64>> {
        let deletes = matches!(source, Source::Difference { deletes: true });
        // The tables with anything to read: a pass's difference is most
        // often a few rows of one or two tables, and asking each of the
        // others for nothing costs round trips (binding, reading, closing)
        // every pass.
        let mut tables = match source {
            Source::Difference { .. } => Some(self.tables_in_difference(tx, deletes).await?),
            Source::Snapshot | Source::Closed(_) => None,
        };
        let both = tables
            .as_mut()
            .map(|t| std::mem::take(&mut t.both))
            .unwrap_or_default();
        let sends = |table: &str| tables.as_ref().is_none_or(|t| t.sent.contains(table));
        let takes_back = |table: &str| tables.as_ref().is_none_or(|t| t.deleted.contains(table));
        let self_referencing = self
            .graph
            .shapes
            .iter()
            .filter(|s| s.self_referencing)
            .map(|s| s.table.name.to_string())
            .collect();
        // Room for the head (ids, numbers, nonces) and the seal around a body.
        let limit = self.max_message_bytes.saturating_sub(256).max(1024);
        let mut packer = Packer::new(limit, both, self_referencing);
        let mut read = vec![0; self.graph.shapes.len()];
        if source.is_snapshot() {
            // A snapshot begins with the description of the tables it
            // fills, so a replica that follows it (one with no declarations
            // of its own) holds them before their first row.
            for r in replicas {
                packer.describe(r, self.described);
            }
        }
        for (index, shape) in self.graph.shapes.iter().enumerate() {
            if !sends(shape.table.name) {
                packer.upserts_done(shape.table.name);
                continue;
            }
            let rows = match source {
                Source::Difference { .. } => Rows::Difference,
                Source::Snapshot => Rows::Planned,
                Source::Closed(closed) => Rows::Closed(closed.rows(index).as_deref(), &replicas[0]),
            };
            read[index] = self
                .upserts(
                    tx,
                    shape,
                    rows,
                    replicas.len() == 1,
                    &mut packer,
                    sink,
                    limit,
                )
                .await?;
            packer.upserts_done(shape.table.name);
        }
        if let (true, Some(removed)) = (deletes, self.removed) {
            // Nothing this build declares points at it: its rows go first.
            self.deletes(tx, &removed.name, &removed.key, &mut packer, sink)
                .await?;
            packer.deletes_done(&removed.name);
        }
        for shape in self.graph.shapes.iter().rev() {
            if deletes && takes_back(shape.table.name) {
                let kinds = key_kinds(shape.table);
                self.deletes(tx, shape.table.name, &kinds, &mut packer, sink)
                    .await?;
            }
            packer.deletes_done(shape.table.name);
        }
        packer.end_all();
        if self.batches {
            // A member sent the pass in messages of its own has one, if
            // empty: the cohort's are not for it.
            packer.end_empty(self.members);
        }
        if source.is_snapshot() {
            let tables: Vec<String> = self
                .graph
                .shapes
                .iter()
                .map(|s| s.table.name.to_string())
                .collect();
            for r in replicas {
                packer.end_snapshot(r, tables.clone(), self.described);
            }
        }
        sink.take(tx, packer.take()).await?;
        Ok(read)
    }

    /// The tables a pass's difference sends rows of and takes rows back
    /// from, and the replicas and tables with both: each side read on its
    /// own, then matched here (no join of the two for PostgreSQL to
    /// misjudge). Sent together: one round trip.
    async fn tables_in_difference(
        &self,
        tx: &Transaction<'_>,
        deletes: bool,
    ) -> Result<Difference> {
        let pairs = |sql: &'static str| async move {
            Ok::<_, Error>(
                tx.query_typed(sql, &[])
                    .await?
                    .iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                    .collect::<HashSet<(String, String)>>(),
            )
        };
        let (deleted, sent) = tokio::try_join!(
            async {
                match deletes {
                    true => pairs("SELECT DISTINCT r, t FROM _ms_del").await,
                    false => Ok(HashSet::new()),
                }
            },
            pairs("SELECT DISTINCT r, t FROM _ms_send")
        )?;
        let (deleted, sent) = (self.to_members(deleted), self.to_members(sent));
        let both = deleted.intersection(&sent).cloned().collect();
        let tables =
            |pairs: &HashSet<(String, String)>| pairs.iter().map(|(_, t)| t.clone()).collect();
        Ok(Difference {
            sent: tables(&sent),
            deleted: tables(&deleted),
            both,
        })
    }

    /// `pairs` of holder and table, with each of the cohort's given to every
    /// member too.
    fn to_members(&self, pairs: HashSet<(String, String)>) -> HashSet<(String, String)> {
        let mut out = pairs.clone();
        for (_, table) in pairs.iter().filter(|(h, _)| h == cohorts::ALL) {
            for m in self.members {
                out.insert((m.clone(), table.clone()));
            }
        }
        out
    }

    /// A pass's rows of table `t` (a literal) in the planner's table
    /// `from`, as `(r, k)`: each of the cohort's given to every member
    /// instead (`cohorts::given_to_members`).
    fn difference_of(&self, from: &str, t: &str) -> String {
        if self.members.is_empty() {
            return format!("SELECT r, k FROM {from} WHERE t = {t}");
        }
        let shared = self.shared.iter().any(|s| literal(s) == t);
        let rows = cohorts::given_to_members(from, &format!("s.t = {t}"), shared, self.batches);
        format!("SELECT r, k FROM ({rows}) g")
    }

    /// The rows of `shape` the source sends, each read once with every
    /// replica it goes to. Returns how many were read.
    #[allow(clippy::too_many_arguments)]
    async fn upserts(
        &self,
        tx: &Transaction<'_>,
        shape: &Shape,
        rows: Rows<'_>,
        single: bool,
        packer: &mut Packer,
        sink: &mut impl Sink,
        limit: usize,
    ) -> Result<u64> {
        let table = shape.table;
        let t = literal(table.name);
        let cols = crate::pg::select_list("a", table);
        let rel = &shape.relation;
        let planned = |from: &str| {
            let rows = match from {
                "_ms_send" => self.difference_of(from, &t),
                _ => format!("SELECT r, k FROM {from} WHERE t = {t}"),
            };
            // Each row once, with every replica it goes to; with one
            // replica there is nothing to gather.
            match single {
                true => format!("SELECT k, ARRAY[r] AS rs FROM ({rows}) u"),
                false => format!("SELECT k, array_agg(r) AS rs FROM ({rows}) u GROUP BY k"),
            }
        };
        let m = key_match("a", shape, "s.k");
        let sql = match rows {
            // A snapshot reads much of the table: joined in bulk.
            Rows::Planned => format!(
                "SELECT s.rs, {cols} FROM ({}) s JOIN {rel} a ON {m}",
                planned("_ms_f")
            ),
            // Read by its query in closed form, for the one replica.
            Rows::Closed(Some(rows), _) => format!("SELECT {cols} FROM ({rows}) a"),
            Rows::Closed(None, _) => format!("SELECT {cols} FROM {rel} a WHERE false"),
            // A pass reads the rows it sends, each by its key, and nothing
            // else of the table, whatever PostgreSQL guesses of their number.
            Rows::Difference => format!(
                "SELECT s.rs, a.* FROM ({}) s
                 CROSS JOIN LATERAL (SELECT {cols} FROM {rel} a WHERE {m} OFFSET 0) a",
                planned("_ms_send")
            ),
        };
        let to = match rows {
            Rows::Closed(_, replica) => To::Only(replica),
            Rows::Difference | Rows::Planned => To::Column,
        };
        let portal = match (self.cache, rows) {
            (Some(cache), Rows::Difference) => {
                tx.bind(&cache.statement(tx, &sql).await?, &[]).await?
            }
            _ => tx.bind(sql.as_str(), &[]).await?,
        };
        let chunk = self.settings.chunk_rows.max(1);
        let mut rows = tx.query_portal(&portal, chunk).await?;
        // Rows of the table that cannot go. Once there is one, nothing more
        // is handed on (what points at it may follow), but the table is
        // read to its end, so that one load finds every such row of it.
        let mut unsendable = Vec::new();
        let mut read = 0;
        loop {
            if rows.is_empty() {
                return match unsendable.is_empty() {
                    true => Ok(read),
                    false => Err(Error::Unsendable(unsendable)),
                };
            }
            read += rows.len() as u64;
            // A full chunk may have more behind it: the next one is asked for
            // before this one is encoded, so PostgreSQL reads while the
            // relay encodes. A short chunk is the last.
            let next = if rows.len() == chunk as usize {
                let t_fetch = std::time::Instant::now();
                let (next, packed) = tokio::join!(tx.query_portal(&portal, chunk), async {
                    self.pack_rows(table, &rows, to, packer, limit, &mut unsendable)
                });
                trace_sum("fetch+encode", t_fetch);
                packed?;
                next?
            } else {
                self.pack_rows(table, &rows, to, packer, limit, &mut unsendable)?;
                Vec::new()
            };
            if unsendable.is_empty()
                && packer.pending_bytes() as u64 >= self.settings.flush_bytes.as_u64()
            {
                let t_write = std::time::Instant::now();
                sink.take(tx, packer.take()).await?;
                trace_sum("write", t_write);
            }
            sink.read(rows.len()).await?;
            rows = next;
        }
    }

    /// Encodes each row read once, and hands it to the packer for every
    /// replica it goes to (`to`). A row that does not encode, or that no
    /// message could carry, goes in `unsendable` instead.
    #[allow(clippy::too_many_arguments)]
    fn pack_rows(
        &self,
        table: &'static Table,
        rows: &[tokio_postgres::Row],
        to: To<'_>,
        packer: &mut Packer,
        limit: usize,
        unsendable: &mut Vec<Unsendable>,
    ) -> Result<()> {
        let codec = self
            .engine
            .codec(table.name)
            .expect("every table that goes down has a codec");
        let key_positions = table.key_positions();
        let first = match to {
            To::Column => 1,
            To::Only(_) => 0,
        };
        for row in rows {
            let values =
                crate::pg::read_row(row, first, table).map_err(|e| Error::RowMismatch {
                    table: table.name.to_string(),
                    problem: e.to_string(),
                })?;
            let key = canonical_key(
                &key_positions
                    .iter()
                    .map(|&i| values[i].clone())
                    .collect::<Vec<_>>(),
            );
            let data = match codec.encode(values) {
                Ok(data) if data.len() + key.len() + 16 <= limit => data,
                Ok(data) => {
                    unsendable.push(Unsendable {
                        table: table.name,
                        key,
                        reason: format!(
                            "the row encodes to {} bytes, more than a message may carry ({limit})",
                            data.len()
                        ),
                    });
                    continue;
                }
                Err(e) => {
                    unsendable.push(Unsendable {
                        table: table.name,
                        key,
                        reason: format!("its codec refuses it: {e}"),
                    });
                    continue;
                }
            };
            let key = key.into_bytes();
            let replicas: Vec<String> = match to {
                To::Column => row.get(0),
                To::Only(replica) => {
                    packer.upsert(replica, table.name, RowData { key, data });
                    continue;
                }
            };
            // A cohort is sent nothing itself, unless into its batches:
            // its members are (`difference_of`).
            for r in replicas
                .iter()
                .filter(|r| self.batches || !cohorts::is_cohort(r))
            {
                packer.upsert(
                    r,
                    table.name,
                    RowData {
                        key: key.clone(),
                        data: data.clone(),
                    },
                );
            }
        }
        Ok(())
    }

    /// The keys of `table` the plan takes back, with every replica that lets
    /// each go.
    async fn deletes(
        &self,
        tx: &Transaction<'_>,
        table: &str,
        kinds: &[Kind],
        packer: &mut Packer,
        sink: &mut impl Sink,
    ) -> Result<()> {
        let sql = format!(
            "SELECT k, array_agg(r) FROM ({}) d GROUP BY k",
            self.difference_of("_ms_del", &literal(table))
        );
        let portal = tx.bind(sql.as_str(), &[]).await?;
        let chunk = self.settings.chunk_rows.max(1);
        loop {
            let rows = tx.query_portal(&portal, chunk).await?;
            if rows.is_empty() {
                return Ok(());
            }
            for row in &rows {
                let key = crate::graph::wire_key_of(table, kinds, row.get(0))?.into_bytes();
                let replicas: Vec<String> = row.get(1);
                for r in replicas
                    .iter()
                    .filter(|r| self.batches || !cohorts::is_cohort(r))
                {
                    packer.delete(r, table, key.clone());
                }
            }
            if packer.pending_bytes() as u64 >= self.settings.flush_bytes.as_u64() {
                sink.take(tx, packer.take()).await?;
            }
            if rows.len() < chunk as usize {
                return Ok(());
            }
        }
    }
}
