//! The reference answer to "what should this replica hold?", computed the
//! plain way: read every row, apply the three rules until nothing changes.
//! The down path's tests compare every replica against it.

use magic_sync::catalog::Catalog;
use magic_sync::row::{Rule, Table};
use magic_sync::sql::ident;
use magic_sync::Engine;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tokio_postgres::Client;

/// A replica as its host describes it.
#[derive(Debug, Clone)]
pub struct Replica<'a> {
    pub id: &'a str,
    pub partition: Option<&'a str>,
}

/// Per table, the keys (as compact JSON arrays) a replica should hold.
pub type Holding = BTreeMap<String, BTreeSet<String>>;

/// One row as the reference needs it: its key, and the values of each
/// foreign key it has (by constraint index), and of its rule column.
struct Row {
    key: String,
    rule_value: Option<String>,
    pointers: Vec<Option<String>>,
}

fn array_of(alias: &str, columns: &[impl AsRef<str>]) -> String {
    let cols: Vec<String> = columns
        .iter()
        .map(|c| format!("{alias}.{}", ident(c.as_ref())))
        .collect();
    format!("jsonb_build_array({})", cols.join(", "))
}

/// Compact JSON text, the way keys travel.
fn compact(json: serde_json::Value) -> String {
    json.to_string()
}

async fn rows_of(client: &Client, table: &Table, catalog: &Catalog) -> Vec<Row> {
    let fks: Vec<_> = catalog.parents_of(table.name).collect();
    let rule_column = match table.rule {
        Rule::Replica(c) | Rule::Partition(c) => format!("t.{}::text", ident(c)),
        _ => "NULL::text".to_string(),
    };
    let mut select = vec![array_of("t", table.key), rule_column];
    for fk in &fks {
        // A pointer is absent when any of its columns is NULL (MATCH SIMPLE).
        let nulls: Vec<String> = fk
            .child_columns
            .iter()
            .map(|c| format!("t.{} IS NULL", ident(c)))
            .collect();
        select.push(format!(
            "CASE WHEN {} THEN NULL ELSE {} END",
            nulls.join(" OR "),
            array_of("t", &fk.child_columns)
        ));
    }
    let query = format!(
        "SELECT {} FROM {} AS t",
        select.join(", "),
        table.qualified()
    );
    client
        .query(&query, &[])
        .await
        .expect("read a table for the reference")
        .iter()
        .map(|r| Row {
            key: compact(r.get(0)),
            rule_value: r.get(1),
            pointers: (0..fks.len())
                .map(|i| r.get::<_, Option<serde_json::Value>>(2 + i).map(compact))
                .collect(),
        })
        .collect()
}

/// The keys of `table` (a group rule's table) given to `replica` through its groups.
async fn granted(client: &Client, table: &Table, replica: &str) -> BTreeSet<String> {
    let Rule::Group(g) = table.rule else {
        return BTreeSet::new();
    };
    let query = format!(
        "SELECT DISTINCT {} FROM {} AS m JOIN {} AS g ON g.{group} = m.{group} WHERE g.{} = $1",
        array_of("m", g.member),
        magic_sync::sql::qualified(table.schema, g.members),
        magic_sync::sql::qualified(table.schema, g.grants),
        ident(g.replica),
        group = ident(g.group),
    );
    client
        .query(&query, &[&replica])
        .await
        .expect("read groups for the reference")
        .iter()
        .map(|r| compact(r.get(0)))
        .collect()
}

/// What `replica` should hold: the least set closed under its tables' rules,
/// "a row brings the rows it points at", and "a row brings its followers".
pub async fn wanted(
    client: &Client,
    engine: &Engine,
    catalog: &Catalog,
    replica: &Replica<'_>,
) -> Holding {
    wanted_around(client, engine, catalog, replica, &BTreeSet::new()).await
}

/// What `replica` should hold while the rows `set_aside` (table, compact
/// key) cannot go down: as [`wanted`], but no row that is one of them, or
/// that points at one (directly or through rows like it), is held.
pub async fn wanted_around(
    client: &Client,
    engine: &Engine,
    catalog: &Catalog,
    replica: &Replica<'_>,
    set_aside: &BTreeSet<(String, String)>,
) -> Holding {
    let tables: Vec<&Table> = engine.down_tables().collect();
    let mut rows: HashMap<&str, Vec<Row>> = HashMap::new();
    for t in &tables {
        rows.insert(t.name, rows_of(client, t, catalog).await);
    }
    let blocked = blocked(&tables, &rows, catalog, set_aside);
    let mut holding: Holding = tables
        .iter()
        .map(|t| (t.name.to_string(), BTreeSet::new()))
        .collect();
    for t in &tables {
        let granted = granted(client, t, replica.id).await;
        let held = holding.get_mut(t.name).expect("every table has an entry");
        for row in &rows[t.name] {
            let by_rule = match t.rule {
                Rule::All => true,
                Rule::Replica(_) => row.rule_value.as_deref() == Some(replica.id),
                Rule::Partition(_) => {
                    row.rule_value.is_some() && row.rule_value.as_deref() == replica.partition
                }
                Rule::Group(_) => granted.contains(&row.key),
                Rule::Referenced | Rule::Follows(_) | Rule::Origin => false,
            };
            if by_rule && !blocked.contains(&(t.name.to_string(), row.key.clone())) {
                held.insert(row.key.clone());
            }
        }
    }
    close(&tables, &rows, catalog, &blocked, &mut holding);
    holding
}

/// Per foreign key into a table that goes down, the parent's key by the
/// values the child points with.
fn parents_by_values(
    tables: &[&Table],
    rows: &HashMap<&str, Vec<Row>>,
    catalog: &Catalog,
) -> HashMap<String, HashMap<String, String>> {
    let down: HashMap<&str, &Table> = tables.iter().map(|t| (t.name, *t)).collect();
    let mut lookup = HashMap::new();
    for fk in &catalog.foreign_keys {
        if let Some(parent) = down.get(fk.parent) {
            let by_values = rows[fk.parent]
                .iter()
                .map(|p| (key_values(p, parent, &fk.parent_columns), p.key.clone()))
                .collect();
            lookup.insert(fk.name.clone() + "@" + fk.child, by_values);
        }
    }
    lookup
}

/// `set_aside`, and every row that points at one of its rows, or at a row
/// that does, and so on.
fn blocked(
    tables: &[&Table],
    rows: &HashMap<&str, Vec<Row>>,
    catalog: &Catalog,
    set_aside: &BTreeSet<(String, String)>,
) -> BTreeSet<(String, String)> {
    let mut blocked = set_aside.clone();
    if blocked.is_empty() {
        return blocked;
    }
    let lookup = parents_by_values(tables, rows, catalog);
    loop {
        let mut added = Vec::new();
        for t in tables {
            let fks: Vec<_> = catalog.parents_of(t.name).collect();
            for row in &rows[t.name] {
                if blocked.contains(&(t.name.to_string(), row.key.clone())) {
                    continue;
                }
                for (i, fk) in fks.iter().enumerate() {
                    let parent = row.pointers[i].as_ref().and_then(|values| {
                        lookup.get(&(fk.name.clone() + "@" + fk.child))?.get(values)
                    });
                    if parent.is_some_and(|p| blocked.contains(&(fk.parent.to_string(), p.clone())))
                    {
                        added.push((t.name.to_string(), row.key.clone()));
                        break;
                    }
                }
            }
        }
        if added.is_empty() {
            return blocked;
        }
        blocked.extend(added);
    }
}

/// Adds parents of held rows and followers of held rows until nothing
/// changes; never a row `blocked` names.
fn close(
    tables: &[&Table],
    rows: &HashMap<&str, Vec<Row>>,
    catalog: &Catalog,
    blocked: &BTreeSet<(String, String)>,
    holding: &mut Holding,
) {
    let lookup = parents_by_values(tables, rows, catalog);
    loop {
        let mut added = Vec::new();
        for t in tables {
            let fks: Vec<_> = catalog.parents_of(t.name).collect();
            for row in &rows[t.name] {
                let held = holding[t.name].contains(&row.key);
                for (i, fk) in fks.iter().enumerate() {
                    let Some(parent_values) = &row.pointers[i] else {
                        continue;
                    };
                    let Some(parents) = lookup.get(&(fk.name.clone() + "@" + fk.child)) else {
                        continue;
                    };
                    let Some(parent_key) = parents.get(parent_values).cloned() else {
                        continue;
                    };
                    let parent_held = holding[fk.parent].contains(&parent_key);
                    let follows = matches!(t.rule, Rule::Follows(cols) if cols.iter().copied().eq(fk.child_columns.iter().map(String::as_str)));
                    if held && !parent_held {
                        added.push((fk.parent.to_string(), parent_key));
                    } else if follows && parent_held && !held {
                        added.push((t.name.to_string(), row.key.clone()));
                    }
                }
            }
        }
        added.retain(|row| !blocked.contains(row));
        if added.is_empty() {
            return;
        }
        for (table, key) in added {
            holding.get_mut(&table).expect("a down table").insert(key);
        }
    }
}

/// The compact JSON array of `columns` of a parent row, when they are its key
/// (the common case); other unique columns are matched through the key.
fn key_values(row: &Row, table: &Table, columns: &[String]) -> String {
    if table
        .key
        .iter()
        .copied()
        .eq(columns.iter().map(String::as_str))
    {
        return row.key.clone();
    }
    let key: Vec<serde_json::Value> =
        serde_json::from_str(&row.key).expect("a key is a JSON array");
    let picked: Vec<serde_json::Value> = columns
        .iter()
        .map(|c| {
            let i = table
                .key
                .iter()
                .position(|k| k == c)
                .expect("the reference only follows foreign keys to key columns");
            key[i].clone()
        })
        .collect();
    compact(serde_json::Value::Array(picked))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shop;

    fn keys(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    /// Scenario 1 of the down path: what a till should hold when provisioned.
    #[tokio::test]
    async fn a_till_should_hold_its_rules_rows_and_exactly_their_parents() {
        let (_db, client) = shop::installed().await;
        client
            .batch_execute(
                "INSERT INTO products VALUES (1, 'tea', 2.5, NULL), (2, 'milk', 1, NULL), (3, 'jam', 4, NULL);
                 INSERT INTO customers VALUES (7, 'Ada'), (8, 'Bob'), (9, 'Cy');
                 INSERT INTO orders (id, unit_id, customer_id) VALUES (1, 'u1', 7), (2, 'u2', 8), (3, 'u1', NULL);
                 INSERT INTO order_lines VALUES (1, 1, 1, 2), (1, 2, 2, 1), (2, 1, 3, 5);
                 INSERT INTO notices VALUES (1, 'north', 'early close'), (2, 'south', 'late open');
                 INSERT INTO promotions VALUES (10, 3, 15), (11, 2, 5);
                 INSERT INTO promotion_members VALUES (100, 10), (200, 11);
                 INSERT INTO unit_groups VALUES ('u1', 100), ('u2', 200);
                 INSERT INTO stock VALUES ('u1', 1, 5, NULL), ('u2', 2, 3, NULL);
                 INSERT INTO events VALUES ('north', 1, 'fair'), ('south', 2, 'market');
                 INSERT INTO logistics.shipments VALUES (1, 'north', 1, NULL), (2, 'north', 1, 1), (3, 'south', 2, NULL);",
            )
            .await
            .unwrap();
        let engine = shop::engine();
        let catalog = Catalog::read(&client, &engine).await.unwrap();
        let u1 = wanted(
            &client,
            &engine,
            &catalog,
            &Replica {
                id: "u1",
                partition: Some("north"),
            },
        )
        .await;
        assert_eq!(u1["products"], keys(&["[1]", "[2]", "[3]"]));
        assert_eq!(
            u1["customers"],
            keys(&["[7]"]),
            "only the customers its rows point at"
        );
        assert_eq!(u1["orders"], keys(&["[1]", "[3]"]));
        assert_eq!(
            u1["order_lines"],
            keys(&["[1,1]", "[1,2]"]),
            "lines follow their order"
        );
        assert_eq!(u1["notices"], keys(&["[1]"]));
        assert_eq!(u1["promotions"], keys(&["[10]"]));
        assert_eq!(u1["stock"], keys(&[r#"["u1",1]"#]));
        assert_eq!(u1["events"], keys(&[r#"["north",1]"#]));
        assert_eq!(
            u1["shipments"],
            keys(&["[1]", "[2]"]),
            "shipments follow their event"
        );

        let u3 = wanted(
            &client,
            &engine,
            &catalog,
            &Replica {
                id: "u3",
                partition: None,
            },
        )
        .await;
        assert_eq!(u3["products"].len(), 3);
        assert!(u3["customers"].is_empty() && u3["orders"].is_empty() && u3["notices"].is_empty());
        assert!(u3["events"].is_empty() && u3["shipments"].is_empty());
    }
}
