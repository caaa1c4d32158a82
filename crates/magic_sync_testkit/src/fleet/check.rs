//! The check every down-path test ends with: each live replica the network
//! reaches against the reference (`wanted`), row for row, with nothing it
//! refused; no replica holding a row without its parents; the record's
//! counts and the `all` cohort as the reference gives them; and the
//! relay's audit of itself.

use super::rows::{replica_rows, server_rows};
use super::{Fleet, Unit};
use crate::wanted;
use magic_sync::sql::ident;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

impl Fleet {
    /// No replica holds a row without the rows it points at.
    pub fn check_orphans(&self) {
        let mut problems = String::new();
        for unit in self.units.values() {
            orphans(self, unit, &mut problems);
        }
        assert!(
            problems.is_empty(),
            "a replica holds rows without their parents:\n{problems}"
        );
    }

    /// The rows the record says each holder holds by its own rule are the
    /// rows its rule gives it at its position, read from the host's rows
    /// and the pending notes alone ([`Relay::audit_rules`]): exact while
    /// notes are pending, which [`Fleet::check`] never sees.
    ///
    /// [`Relay::audit_rules`]: magic_sync::relay::Relay::audit_rules
    pub async fn check_rules(&self) {
        let problems = self
            .relay
            .audit_rules(&self.client)
            .await
            .expect("the audit");
        assert!(
            problems.is_empty(),
            "the rule read at each holder's position disagrees with the record:\n  {}",
            problems.join("\n  ")
        );
    }

    /// The rows in quarantine, as (table, compact key).
    pub async fn quarantined(&self) -> BTreeSet<(String, String)> {
        self.writer
            .query("SELECT table_name, key FROM sync.quarantine", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| {
                let key: serde_json::Value = serde_json::from_str(row.get(1)).unwrap();
                (row.get(0), key.to_string())
            })
            .collect()
    }

    /// The invariant: every live replica the network reaches holds exactly
    /// what the reference says it should, row for row, and no replica holds
    /// a row without the rows it points at.
    pub async fn check(&self) {
        let mut problems = String::new();
        // Rows in quarantine are held by no replica, and nor is anything
        // that leans on them: the reference leaves them out.
        let set_aside = self.quarantined().await;
        // The counts per message the operator's reads sum agree with the
        // record they count, whatever path wrote it, for every message not
        // acknowledged yet (the reads count nothing else): as many, or, with
        // the rows a rule gives left to it, at least as many (a row let go
        // to its rule is still on its way in its message).
        for row in self
            .writer
            .query(
                "SELECT * FROM (
                     SELECT replica, message, table_name, h.rows AS held, c.rows AS counted
                     FROM (SELECT replica, message, table_name, count(*) AS rows
                           FROM sync.held GROUP BY 1, 2, 3) h
                     FULL JOIN sync.held_carried c USING (replica, message, table_name)) x
                 WHERE x.message > coalesce((SELECT a.number FROM sync.acks a
                                             WHERE a.replica = x.replica), 0)
                   AND CASE WHEN (SELECT by_rule FROM sync.record_form)
                            THEN coalesce(x.held, 0) > coalesce(x.counted, 0)
                            ELSE x.held IS DISTINCT FROM x.counted END",
                &[],
            )
            .await
            .unwrap()
        {
            let (replica, message, table): (String, i64, String) =
                (row.get(0), row.get(1), row.get(2));
            let (held, counted): (Option<i64>, Option<i64>) = (row.get(3), row.get(4));
            let _ = writeln!(
                problems,
                "  {replica} holds {held:?} rows of {table} from message {message}, counted {counted:?}"
            );
        }
        for (id, unit) in &self.units {
            orphans(self, unit, &mut problems);
            if !unit.info.live || unit.cut {
                continue;
            }
            for refused in unit.replica.refused().unwrap() {
                let _ = writeln!(
                    problems,
                    "  {id} refused {} {} from message {}: {}",
                    refused.table,
                    String::from_utf8_lossy(&refused.key),
                    refused.number,
                    refused.reason
                );
            }
            let should = wanted::wanted_around(
                &self.writer,
                &self.engine,
                &self.catalog,
                &wanted::Replica {
                    id,
                    partition: unit.info.partition.as_deref(),
                },
                &set_aside,
            )
            .await;
            for table in self.engine.down_tables() {
                let server = server_rows(&self.writer, table).await;
                let expected: BTreeMap<String, String> = should[table.name]
                    .iter()
                    .map(|k| (k.clone(), server.get(k).cloned().unwrap_or_default()))
                    .collect();
                let held = replica_rows(&unit.replica, table);
                compare(id, table.name, &expected, &held, &mut problems);
            }
        }
        self.check_cohort(&set_aside, &mut problems).await;
        // What the relay records of them agrees with itself and the
        // database: the reasons each row is held, and the counts of what
        // points at it, kept up pass by pass, are what they would be if
        // worked out afresh.
        for line in self.relay.audit(&self.client).await.expect("the audit") {
            let _ = writeln!(problems, "  record: {line}");
        }
        assert!(problems.is_empty(), "the fleet diverged:\n{problems}");
    }
}

impl Fleet {
    /// The cohort of the `all` tables, when the relay records one, is
    /// recorded holding exactly what the reference gives a holder that no
    /// rule names but `all`: every row of those tables but what is set
    /// aside, and the rows they point at.
    async fn check_cohort(&self, set_aside: &BTreeSet<(String, String)>, problems: &mut String) {
        let cohort = "\u{1}all";
        let recorded: bool = self
            .writer
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM sync.cohorts WHERE id = $1)",
                &[&cohort],
            )
            .await
            .unwrap()
            .get(0);
        if !recorded {
            return;
        }
        let holder = wanted::Replica {
            id: cohort,
            partition: None,
        };
        let should = wanted::wanted_around(
            &self.writer,
            &self.engine,
            &self.catalog,
            &holder,
            set_aside,
        )
        .await;
        for table in self.engine.down_tables() {
            let held: BTreeSet<String> = self
                .relay
                .holds(&self.writer, cohort, table.name)
                .await
                .unwrap()
                .iter()
                .map(|key| key.to_string())
                .collect();
            let want = &should[table.name];
            for k in want.difference(&held) {
                let _ = writeln!(
                    problems,
                    "  the `all` cohort should hold {} {k}, but does not hold it",
                    table.name
                );
            }
            for k in held.difference(want) {
                let _ = writeln!(
                    problems,
                    "  the `all` cohort is recorded holding {} {k}, which it should not",
                    table.name
                );
            }
        }
    }
}

fn compare(
    replica: &str,
    table: &str,
    expected: &BTreeMap<String, String>,
    held: &BTreeMap<String, String>,
    problems: &mut String,
) {
    let want: BTreeSet<&String> = expected.keys().collect();
    let have: BTreeSet<&String> = held.keys().collect();
    for k in want.difference(&have) {
        let _ = writeln!(problems, "  {replica} lacks {table} {k}");
    }
    for k in have.difference(&want) {
        let _ = writeln!(
            problems,
            "  {replica} holds {table} {k}, which it should not"
        );
    }
    for k in want.intersection(&have) {
        if expected[*k] != held[*k] {
            let _ = writeln!(
                problems,
                "  {replica} holds {table} {k} as {}, the server has {}",
                held[*k], expected[*k]
            );
        }
    }
}

/// Rows of the replica pointing at a row it does not hold.
fn orphans(fleet: &Fleet, unit: &Unit, problems: &mut String) {
    let conn = unit.replica.connection();
    for fk in &fleet.catalog.foreign_keys {
        let present: Vec<String> = fk
            .child_columns
            .iter()
            .map(|c| format!("c.{} IS NOT NULL", ident(c)))
            .collect();
        let matches: Vec<String> = fk
            .child_columns
            .iter()
            .zip(&fk.parent_columns)
            .map(|(c, p)| format!("p.{} = c.{}", ident(p), ident(c)))
            .collect();
        let sql = format!(
            "SELECT count(*) FROM {} c WHERE {} AND NOT EXISTS (SELECT 1 FROM {} p WHERE {})",
            ident(fk.child),
            present.join(" AND "),
            ident(fk.parent),
            matches.join(" AND ")
        );
        let n: i64 = conn.query_row(&sql, [], |r| r.get(0)).unwrap();
        if n > 0 {
            let _ = writeln!(
                problems,
                "  {} holds {n} row(s) of {} pointing at {} rows it lacks ({})",
                unit.info.id, fk.child, fk.parent, fk.name
            );
        }
    }
}
