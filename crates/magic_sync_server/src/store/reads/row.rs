//! Where one row is: per live replica, whether it holds it, holds an older
//! version, has it on its way, is letting it go, does not hold it, is provisioned,
//! or had its own version of it set aside.
//!
//! The row is named by its table and its key's values as text. The record
//! keeps a held row's key as the text PostgreSQL prints for the key's
//! `jsonb` array (`[5, "a"]`, decision 51), and uploads and messages carry
//! it as compact JSON (`[5,"a"]`). The values' kinds (number, text,
//! boolean) are not recorded with the table, only in its keys: they are
//! taken from a key of the table the record holds (a held row, a pending
//! note, a kept change, a refused upload), which gives the key's arity too;
//! the array is printed by PostgreSQL's own `jsonb` output, as the relay's
//! keys are. A key whose columns are numerics or timestamps prints in
//! other forms on the wire than in the record; those are found by the
//! record's form only.

use super::ruled::Given;
use super::{begin, Error, Result, IN_SCOPE};
use crate::envelope::{to_replica, ToReplica};
use crate::store::cohorts::OWED;
use chrono::{DateTime, Utc};
use prost::Message as _;
use serde::Serialize;
use std::collections::BTreeSet;
use tokio_postgres::Transaction;

/// Where the row is, for one replica. The first that applies, in this
/// order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RowState {
    /// The server refused the replica's own upload of the row
    /// (`sync.inbox`): it waits for a fix.
    SetAside,
    /// The replica is provisioned from scratch: whether it will hold the
    /// row is recorded when its snapshot ends.
    Provisioning,
    /// Recorded as held, in a message it has not acknowledged yet.
    OnItsWay,
    /// Not recorded as held, and a message waiting in its outbox lets go
    /// of it. (Once the transport took that message, the record no longer
    /// tells it from [`DoesNotHold`](RowState::DoesNotHold).)
    LettingGo,
    /// Held, and the database changed the row since: a pending note is
    /// newer than the version held, or a change was kept for it.
    HoldsOlder,
    /// Held at the version the database has.
    Holds,
    /// The row cannot go down (its codec refuses it, or it is larger than
    /// any message): in quarantine, it waits for a change or a fix.
    Quarantined,
    /// Not sent the replica because it points at a row in quarantine
    /// (directly or through rows like it): it goes once that row does.
    HeldBack,
    /// Not recorded as held: most often a row its rules do not give it.
    /// Whether they do is not this read's to say: a pending note of the row
    /// ([`RowProgress::pending_note`]) means the next pass may send it.
    DoesNotHold,
}

impl RowState {
    /// The state as an operator reads it.
    pub fn words(self) -> &'static str {
        match self {
            RowState::SetAside => "set aside",
            RowState::Provisioning => "provisioning",
            RowState::OnItsWay => "on its way",
            RowState::LettingGo => "letting go",
            RowState::HoldsOlder => "holds older",
            RowState::Holds => "holds",
            RowState::Quarantined => "cannot go down",
            RowState::HeldBack => "held back",
            RowState::DoesNotHold => "does not hold",
        }
    }
}

/// The row, at one replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowPlace {
    /// The replica.
    pub replica: String,
    /// Where the row is.
    pub state: RowState,
    /// The version recorded as held (the newest note of it its recording
    /// pass saw; 0 when none was pending).
    pub version: Option<i64>,
    /// The message recorded as carrying it.
    pub message: Option<i64>,
    /// Why the server refused the replica's upload of it.
    pub refused: Option<String>,
}

/// Where a row is, across the live replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowProgress {
    /// The server's time of the read.
    pub now: DateTime<Utc>,
    /// The table.
    pub table: String,
    /// The key, as the record keeps it.
    pub key: String,
    /// The newest pending note of the row, if one is pending.
    pub pending_note: Option<i64>,
    /// Why the row cannot go down, when it is in quarantine.
    pub quarantined: Option<String>,
    /// Per live replica, by id.
    pub replicas: Vec<RowPlace>,
}

impl RowProgress {
    /// Whether some replica's version of the row waits for a fix.
    pub fn waits_for_fix(&self) -> bool {
        self.quarantined.is_some()
            || self.replicas.iter().any(|r| {
                matches!(
                    r.state,
                    RowState::SetAside | RowState::Quarantined | RowState::HeldBack
                )
            })
    }
}

/// Where the row of `table` keyed by `key` (its values as text, in the
/// table's key order) is, per live replica.
pub async fn row_progress(
    client: &mut tokio_postgres::Client,
    table: &str,
    key: &[String],
) -> Result<RowProgress> {
    let (tx, now) = begin(client).await?;
    let sample = recorded_key(&tx, table).await?;
    let json = key_json(table, &sample, key)?;
    let held: String = tx
        .query_one("SELECT $1::text::jsonb::text", &[&json])
        .await?
        .get(0);
    let wire = compact(&held);
    let pending_note: Option<i64> = tx
        .query_one(
            "SELECT max(seq) FROM sync.notes
             WHERE format = 1 AND table_name = $1 AND key = $2::text::jsonb",
            &[&table, &held],
        )
        .await?
        .get(0);
    let letting_go = letting_go(&tx, table, &wire).await?;
    let quarantined: Option<String> = tx
        .query_opt(
            "SELECT reason FROM sync.quarantine WHERE table_name = $1 AND key = $2",
            &[&table, &held],
        )
        .await?
        .map(|row| row.get(0));
    // Whom its rule gave it to, for the replicas that hold it by their
    // rule alone, with no record row of it.
    let given = match super::ruled::thinned(&tx).await? {
        true => super::ruled::given(&tx, table, &held).await?,
        false => Given::Nobody,
    };
    let no_scope: Option<Vec<String>> = None;
    let no_partition: Option<String> = None;
    let rows = tx
        .query(
            &format!(
                "SELECT r.id, r.provision OR r.snapshot_attempt IS NOT NULL,
                        coalesce(a.number, 0), h.version, h.message,
                        d.seq IS NOT NULL, i.reason, bl.root_key IS NOT NULL,
                        r.partition_id, r.snapshot_last,
                        (SELECT m.since FROM sync.members m JOIN sync.cohorts c ON c.id = m.cohort
                         WHERE m.replica = r.id AND c.kind = 'all'),
                        (SELECT l.message FROM sync.let_go l
                         WHERE l.replica = r.id AND l.table_name = $3 AND l.key = $4)
                 FROM sync.replicas r
                 LEFT JOIN sync.acks a ON a.replica = r.id
                 LEFT JOIN LATERAL (
                     SELECT h.version, h.message FROM sync.held h
                     WHERE h.table_name = $3 AND h.key = $4 AND h.replica = r.id
                     UNION ALL
                     SELECT h.version, greatest(h.message, m.since)
                     FROM sync.members m
                     JOIN sync.held h ON h.table_name = $3 AND h.key = $4 AND h.replica = m.cohort
                     WHERE m.replica = r.id
                     LIMIT 1) h ON true
                 LEFT JOIN sync.deferred d
                        ON d.replica = r.id AND d.table_name = $3 AND d.key = $4::text::jsonb
                 LEFT JOIN sync.inbox i ON i.replica = r.id AND i.table_name = $3 AND i.key = $5
                 LEFT JOIN LATERAL (
                     SELECT bl.root_key FROM sync.blocked bl
                     WHERE bl.table_name = $3 AND bl.key = $4
                       AND (bl.replica = r.id
                            OR bl.replica IN (SELECT cohort FROM sync.members WHERE replica = r.id))
                     LIMIT 1) bl ON true
                 WHERE {IN_SCOPE}
                 ORDER BY r.id"
            ),
            &[&no_scope, &no_partition, &table, &held, &wire],
        )
        .await?;
    tx.commit().await?;
    let replicas = rows
        .iter()
        .map(|row| {
            let replica: String = row.get(0);
            let provisioning: bool = row.get(1);
            let acked: i64 = row.get(2);
            let version: Option<i64> = row.get(3);
            let message: Option<i64> = row.get(4);
            let kept: bool = row.get(5);
            let refused: Option<String> = row.get(6);
            let held_back: bool = row.get(7);
            let newer = pending_note.zip(version).is_some_and(|(n, v)| n > v) || kept;
            // Held by its rule alone: on its way until the message that
            // carried it is acknowledged (the one that let its record row
            // go, its snapshot's last, or, through the `all` cohort, the
            // one it joined at), and older than the database's as soon as
            // a note of it is pending.
            let (part, snapshot_last, since, let_go): (
                Option<String>,
                i64,
                Option<i64>,
                Option<i64>,
            ) = (row.get(8), row.get(9), row.get(10), row.get(11));
            let own = let_go.unwrap_or(0).max(snapshot_last);
            let carried = match &given {
                Given::Nobody => None,
                Given::All => Some(since.unwrap_or(own)),
                Given::Replica(id) => (*id == replica).then_some(own),
                Given::Partition(p) => (part.as_ref() == Some(p)).then_some(own),
            }
            .filter(|_| !kept && !held_back && quarantined.is_none());
            let state = if refused.is_some() {
                RowState::SetAside
            } else if provisioning {
                RowState::Provisioning
            } else if let Some(m) = message {
                if m > acked {
                    RowState::OnItsWay
                } else if newer {
                    RowState::HoldsOlder
                } else {
                    RowState::Holds
                }
            } else if let Some(m) = carried {
                if m > acked {
                    RowState::OnItsWay
                } else if pending_note.is_some() {
                    RowState::HoldsOlder
                } else {
                    RowState::Holds
                }
            } else if letting_go.contains(&replica) {
                RowState::LettingGo
            } else if quarantined.is_some() {
                RowState::Quarantined
            } else if held_back {
                RowState::HeldBack
            } else {
                RowState::DoesNotHold
            };
            RowPlace {
                replica,
                state,
                version,
                message,
                refused,
            }
        })
        .collect();
    Ok(RowProgress {
        now,
        table: table.to_string(),
        key: held,
        pending_note,
        quarantined,
        replicas,
    })
}

/// A key of `table` as the record holds one: of a held row, a pending
/// note, a change kept or a refused upload, as a JSON array.
async fn recorded_key(tx: &Transaction<'_>, table: &str) -> Result<Vec<serde_json::Value>> {
    let row = tx
        .query_opt(
            "SELECT k FROM (
                 (SELECT key AS k FROM sync.held WHERE table_name = $1 LIMIT 1)
                 UNION ALL (SELECT key::text FROM sync.notes WHERE table_name = $1 LIMIT 1)
                 UNION ALL (SELECT key::text FROM sync.deferred WHERE table_name = $1 LIMIT 1)
                 UNION ALL (SELECT key FROM sync.inbox WHERE table_name = $1 LIMIT 1)) k
             LIMIT 1",
            &[&table],
        )
        .await?;
    let Some(row) = row else {
        return declared_key(tx, table).await;
    };
    let text: String = row.get(0);
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Array(items)) => Ok(items),
        // A refused upload keeps the key as it came, which may be anything.
        _ => Err(Error::UnrecordedTable(table.to_string())),
    }
}

/// A key of `table` of the kinds its declaration gives its key columns
/// (`sync.tables.definition`), for a table none of whose keys is recorded:
/// every row of it held by its rule alone.
async fn declared_key(tx: &Transaction<'_>, table: &str) -> Result<Vec<serde_json::Value>> {
    let kinds: Option<serde_json::Value> = tx
        .query_opt(
            "SELECT definition -> 'key' FROM sync.tables WHERE name = $1",
            &[&table],
        )
        .await?
        .and_then(|r| r.get(0));
    let Some(serde_json::Value::Array(columns)) = kinds else {
        return Err(Error::UnrecordedTable(table.to_string()));
    };
    Ok(columns
        .iter()
        .map(|c| match c[1].as_str() {
            Some("i16" | "i32" | "i64") => serde_json::Value::from(0),
            Some("bool") => serde_json::Value::Bool(false),
            _ => serde_json::Value::from(""),
        })
        .collect())
}

/// The JSON array of `values`, each of the kind its place has in `sample`
/// (a recorded key of the table): a number where the record has a number,
/// a boolean where it has one, text otherwise.
pub(crate) fn key_json(
    table: &str,
    sample: &[serde_json::Value],
    values: &[String],
) -> Result<String> {
    if values.len() != sample.len() {
        return Err(Error::KeyArity {
            table: table.to_string(),
            given: values.len(),
            expected: sample.len(),
        });
    }
    let mut items = Vec::with_capacity(values.len());
    for (i, (kind, value)) in sample.iter().zip(values).enumerate() {
        let item = match kind {
            serde_json::Value::Number(_) | serde_json::Value::Bool(_) => {
                let parsed: Option<serde_json::Value> = serde_json::from_str(value).ok();
                let same_kind = matches!(
                    (kind, &parsed),
                    (
                        serde_json::Value::Number(_),
                        Some(serde_json::Value::Number(_))
                    ) | (serde_json::Value::Bool(_), Some(serde_json::Value::Bool(_)))
                );
                if !same_kind {
                    return Err(Error::KeyValue {
                        table: table.to_string(),
                        position: i + 1,
                        value: value.clone(),
                        expected: if kind.is_number() {
                            "a number"
                        } else {
                            "a boolean"
                        },
                    });
                }
                // As given: PostgreSQL's jsonb reads it as it reads the
                // relay's keys, with its scale.
                value.trim().to_string()
            }
            _ => serde_json::Value::String(value.clone()).to_string(),
        };
        items.push(item);
    }
    Ok(format!("[{}]", items.join(",")))
}

/// The compact JSON form keys travel in, of the record's form.
fn compact(held: &str) -> String {
    serde_json::from_str::<serde_json::Value>(held)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| held.to_string())
}

/// The replicas with a message waiting in their outbox, or a cohort's
/// owed them, that lets go of the row. Bodies are searched for the key's bytes first, and only those that
/// contain them decoded.
async fn letting_go(tx: &Transaction<'_>, table: &str, wire: &str) -> Result<BTreeSet<String>> {
    let rows = tx
        .query(
            &format!(
                "SELECT o.replica, b.bytes FROM (
                     SELECT o.replica, o.number, o.body FROM sync.outbox o
                     UNION ALL
                     {OWED}) o
                 JOIN sync.bodies b ON b.id = o.body
                 WHERE position($1::bytea IN b.bytes) > 0
                 ORDER BY o.replica, o.number"
            ),
            &[&wire.as_bytes()],
        )
        .await?;
    let mut replicas = BTreeSet::new();
    for row in rows {
        let replica: String = row.get(0);
        let bytes: &[u8] = row.get(1);
        let Ok(message) = ToReplica::decode(bytes) else {
            continue;
        };
        let Some(to_replica::Body::Down(down)) = message.body else {
            continue;
        };
        let lets_go = down
            .tables
            .iter()
            .filter(|t| t.table == table)
            .any(|t| t.deletes.iter().any(|k| k == wire.as_bytes()));
        let takes = down
            .tables
            .iter()
            .filter(|t| t.table == table)
            .any(|t| t.upserts.iter().any(|r| r.key == wire.as_bytes()));
        // Messages in order: the last that names the row decides.
        if lets_go {
            replicas.insert(replica);
        } else if takes {
            replicas.remove(&replica);
        }
    }
    Ok(replicas)
}

#[cfg(test)]
mod tests {
    use super::key_json;
    use serde_json::json;

    #[test]
    fn values_take_the_kinds_of_the_recorded_keys() {
        let sample = [json!(5), json!("north"), json!(true)];
        let given = ["42".to_string(), "7".to_string(), "false".to_string()];
        assert_eq!(key_json("t", &sample, &given).unwrap(), r#"[42,"7",false]"#);
        let quoted = ["1".to_string(), "a\"b".to_string(), "true".to_string()];
        assert_eq!(
            key_json("t", &sample, &quoted).unwrap(),
            r#"[1,"a\"b",true]"#
        );
    }

    #[test]
    fn a_key_of_another_arity_or_kind_is_refused() {
        let sample = [json!(5), json!("north")];
        let short = ["42".to_string()];
        assert_eq!(
            key_json("orders", &sample, &short).unwrap_err().to_string(),
            "table `orders` is keyed by 2 values (as its recorded keys show), the key given has 1"
        );
        let word = ["x".to_string(), "y".to_string()];
        assert_eq!(
            key_json("orders", &sample, &word).unwrap_err().to_string(),
            "table `orders`: key value 1 (`x`) is not a number, as its recorded keys are"
        );
    }
}
