//! The table graph as the planner uses it: every table that goes down, in an
//! order where parents come before their children, and every foreign key
//! between them, with the SQL that follows it either way.
//!
//! Keys are JSON arrays (`jsonb`) in the planner's tables: the same form the
//! triggers write into notes, so a note's key and a row's key compare equal.

use crate::catalog::{Catalog, ForeignKey};
use crate::error::{Error, Mismatch, Result};
use crate::row::{Rule, Table};
use crate::sql::{ident, literal, qualified};
use crate::value::{canonical_key, Kind, Value};
use std::collections::BTreeSet;

/// One table that goes down.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub table: &'static Table,
    /// The schema-qualified, quoted name.
    pub relation: String,
    /// The PostgreSQL types of its key columns, in key order.
    pub key_types: Vec<String>,
    /// Whether one of its foreign keys points at itself.
    pub self_referencing: bool,
    /// The type the column its rule reads (`replica`, `partition`) is read
    /// as (its base type), when it has one.
    pub rule_type: Option<String>,
}

/// A foreign key between two tables that go down.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub child: &'static Table,
    pub parent: &'static Table,
    /// Its name among the child's links: the child's columns, joined by
    /// commas (the parent's name added when two links share them). It keys
    /// the link in what a held row points at (`sync.held.ptrs`), so it stays
    /// the same from build to build while the foreign key does.
    pub name: String,
    /// The child's columns, in the order of the parent's key.
    pub columns: Vec<String>,
    /// Their PostgreSQL types (the child's).
    pub types: Vec<String>,
    /// Whether the child follows its parent through this key.
    pub follows: bool,
}

/// Every table that goes down and the links between them.
#[derive(Debug, Clone)]
pub(crate) struct Graph {
    /// Parents before children (tables in a cycle, in declared order).
    pub shapes: Vec<Shape>,
    pub links: Vec<Link>,
}

impl Graph {
    /// The graph of `engine`'s tables as the catalogue has them now, for
    /// those who read the record beside the relay (filing, digests) while it
    /// leaves the rows a rule gives to their rule (`sync.record_form`):
    /// `None` while it keeps a row for each.
    pub async fn while_by_rule(
        client: &tokio_postgres::Client,
        engine: &crate::engine::Engine,
    ) -> Result<Option<Graph>> {
        use crate::store::held::Ruled;
        if Ruled::stored(client).await? == Ruled::Recorded {
            return Ok(None);
        }
        let catalog = Catalog::read(client, engine).await?;
        let tables: Vec<&'static Table> = engine.down_tables().collect();
        Ok(Some(Graph::new(&tables, &catalog)?))
    }

    pub fn new(tables: &[&'static Table], catalog: &Catalog) -> Result<Graph> {
        let links = links(tables, catalog)?;
        let mut shapes = Vec::new();
        for t in tables {
            shapes.push(Shape {
                table: t,
                relation: qualified(t.schema, t.name),
                key_types: key_types(t, catalog)?,
                self_referencing: links
                    .iter()
                    .any(|l| l.child.name == t.name && l.parent.name == t.name),
                rule_type: match t.rule {
                    Rule::Replica(c) | Rule::Partition(c) => catalog
                        .relation(t.schema, t.name)
                        .and_then(|r| r.column(c))
                        .map(|c| c.base_type.clone()),
                    _ => None,
                },
            });
        }
        Ok(Graph {
            shapes: parents_first(shapes, &links),
            links,
        })
    }

    /// The links whose pointers a held row records (`sync.held.ptrs`) and
    /// its parents count (`sync.held.refs`): every link but those into an
    /// `all` table, whose rows every replica holds by its rule whatever
    /// points at them, and the follows links among those, which say whether
    /// the row is wanted at all.
    pub fn tracked(&self) -> impl Iterator<Item = &Link> {
        self.links
            .iter()
            .filter(|l| l.follows || !matches!(l.parent.rule, Rule::All))
    }

    /// The tracked links as an SQL `VALUES` list of (child, name, parent,
    /// whether the child follows the parent), for statements that go over
    /// every link at once; `None` when there are none.
    pub fn tracked_values(&self) -> Option<String> {
        let rows: Vec<String> = self
            .tracked()
            .map(|l| {
                format!(
                    "({}, {}, {}, {})",
                    literal(l.child.name),
                    literal(&l.name),
                    literal(l.parent.name),
                    l.follows
                )
            })
            .collect();
        if rows.is_empty() {
            None
        } else {
            Some(format!(
                "(VALUES {}) AS l (c, name, p, follows)",
                rows.join(", ")
            ))
        }
    }

    /// What the row `alias` of `table` points at through the tracked links,
    /// as a `jsonb` object from link name to parent key (a link pointing at
    /// nothing left out); `NULL` for a table with no tracked link.
    pub fn pointers(&self, alias: &str, table: &str) -> String {
        let items: Vec<String> = self
            .tracked()
            .filter(|l| l.child.name == table)
            .map(|l| format!("{}, {}", literal(&l.name), l.pointer(alias)))
            .collect();
        if items.is_empty() {
            "NULL::jsonb".into()
        } else {
            format!(
                "jsonb_strip_nulls(jsonb_build_object({}))",
                items.join(", ")
            )
        }
    }

    /// The follows link of `table`, if it follows a parent.
    pub fn follows_link(&self, table: &str) -> Option<&Link> {
        self.links
            .iter()
            .find(|l| l.follows && l.child.name == table)
    }

    pub fn shape(&self, name: &str) -> &Shape {
        self.shapes
            .iter()
            .find(|s| s.table.name == name)
            .expect("a table that goes down")
    }

    /// Whether every row the child's own rule gives a holder points, through
    /// `link`, at a row the parent's own rule gives it too: both tables are
    /// ruled by the same kind of rule (`partition`, or `replica`), and the
    /// child's rule column is the link's column for the parent's rule column
    /// (`pgbench_accounts.bid` for `pgbench_branches.bid`, both by
    /// partition). Then the parents of a holder's ruled rows need no
    /// looking up: they are its already. Only where equal values always
    /// print alike (both columns of an integer type, or both `uuid`), since
    /// a rule compares a column's text.
    pub fn implied(&self, link: &Link) -> bool {
        let (child, parent) = match (link.child.rule, link.parent.rule) {
            (Rule::Partition(c), Rule::Partition(p)) | (Rule::Replica(c), Rule::Replica(p)) => {
                (c, p)
            }
            _ => return false,
        };
        let parent_types = &self.shape(link.parent.name).key_types;
        let integer = |t: &str| matches!(t, "smallint" | "integer" | "bigint");
        link.columns
            .iter()
            .zip(link.parent.key)
            .zip(link.types.iter().zip(parent_types))
            .any(|((column, key), (theirs, ours))| {
                column == child
                    && *key == parent
                    && ((integer(theirs) && integer(ours)) || (theirs == "uuid" && ours == "uuid"))
            })
    }

    /// The tables the cohort of the `all` tables holds rows of: those
    /// tables, and every table their rows reach as parents or followers.
    pub fn all_cohort_tables(&self) -> BTreeSet<&'static str> {
        self.closure(self.seeded(false))
    }

    /// The tables of the cohort of the `all` tables that a replica's own
    /// rows (by any other rule) can reach too: a row of them may be held
    /// both by the cohort and by a member itself, and each lets it go
    /// only when the other does not hold it.
    pub fn shared_cohort_tables(&self) -> BTreeSet<&'static str> {
        let own = self.closure(self.seeded(true));
        self.all_cohort_tables()
            .into_iter()
            .filter(|t| own.contains(t))
            .collect()
    }

    /// The tables outside the cohort of the `all` tables whose rows reach
    /// a row of `shared` through one link: pointing at it, or followed by
    /// it. A member's own rows of the shared tables are found from theirs.
    pub fn reaching(&self, shared: &BTreeSet<&'static str>) -> BTreeSet<&'static str> {
        let cohort = self.all_cohort_tables();
        self.tracked()
            .filter_map(|l| {
                if shared.contains(l.parent.name) {
                    Some(l.child.name)
                } else if l.follows && shared.contains(l.child.name) {
                    Some(l.parent.name)
                } else {
                    None
                }
            })
            .filter(|t| !cohort.contains(t))
            .collect()
    }

    /// The tables whose rule is `all` (`own` false), or those whose rule
    /// selects a replica's own rows (`own` true).
    fn seeded(&self, own: bool) -> BTreeSet<&'static str> {
        self.shapes
            .iter()
            .filter(|s| match s.table.rule {
                Rule::All => !own,
                Rule::Referenced | Rule::Follows(_) => false,
                _ => own,
            })
            .map(|s| s.table.name)
            .collect()
    }

    /// `tables`, and the tables their rows reach as parents (never into an
    /// `all` table: every holder of such a row's child holds it whole) or
    /// followers.
    fn closure(&self, mut tables: BTreeSet<&'static str>) -> BTreeSet<&'static str> {
        loop {
            let before = tables.len();
            for link in &self.links {
                let parent_all = matches!(link.parent.rule, Rule::All);
                if tables.contains(link.child.name) && !parent_all {
                    tables.insert(link.parent.name);
                }
                if link.follows && tables.contains(link.parent.name) {
                    tables.insert(link.child.name);
                }
            }
            if tables.len() == before {
                return tables;
            }
        }
    }
}

/// Orders tables so every parent comes before its children; tables left in a
/// cycle keep their declared order at the end.
/// The foreign keys among `tables`, each followed to its parent's declared
/// key; one that points at other columns is refused.
fn links(tables: &[&'static Table], catalog: &Catalog) -> Result<Vec<Link>> {
    let mut problems = Vec::new();
    let mut links: Vec<Link> = Vec::new();
    for fk in &catalog.foreign_keys {
        let (Some(child), Some(parent)) = (
            tables.iter().find(|t| t.name == fk.child),
            tables.iter().find(|t| t.name == fk.parent),
        ) else {
            continue;
        };
        match link(fk, child, parent, catalog, &links) {
            Ok(link) => links.push(link),
            Err(problem) => problems.push(problem),
        }
    }
    if problems.is_empty() {
        Ok(links)
    } else {
        Err(Error::Declarations(problems))
    }
}

/// The link `fk` makes from `child` to `parent`, named apart from the
/// `links` before it.
fn link(
    fk: &ForeignKey,
    child: &'static Table,
    parent: &'static Table,
    catalog: &Catalog,
    links: &[Link],
) -> std::result::Result<Link, Mismatch> {
    // The child's columns in the order of the parent's key.
    let mut columns = Vec::new();
    for k in parent.key {
        match fk.parent_columns.iter().position(|p| p == k) {
            Some(i) if fk.parent_columns.len() == parent.key.len() => {
                columns.push(fk.child_columns[i].clone())
            }
            _ => break,
        }
    }
    if columns.len() != parent.key.len() {
        return Err(Mismatch {
            table: child.name.to_string(),
            column: None,
            problem: format!(
                "foreign key `{}` points at columns ({}) of `{}` that are not its declared key ({}): \
                 the relay follows foreign keys to a table's declared key only",
                fk.name,
                fk.parent_columns.join(", "),
                parent.name,
                parent.key.join(", ")
            ),
        });
    }
    let relation = catalog.relation(child.schema, child.name);
    let types = columns
        .iter()
        .map(|c| {
            relation
                .and_then(|r| r.column(c))
                .map(|c| c.type_name.clone())
                .unwrap_or_else(|| "text".into())
        })
        .collect();
    let follows = match child.rule {
        Rule::Follows(cols) => {
            cols.len() == fk.child_columns.len()
                && cols.iter().all(|c| fk.child_columns.iter().any(|x| x == c))
        }
        _ => false,
    };
    let mut name = fk.child_columns.join(",");
    if links
        .iter()
        .any(|l| l.child.name == child.name && l.name == name)
    {
        name = format!("{name}>{}", parent.name);
    }
    Ok(Link {
        child,
        parent,
        name,
        columns,
        types,
        follows,
    })
}

/// The PostgreSQL types of `t`'s key columns, as the catalogue has them.
fn key_types(t: &Table, catalog: &Catalog) -> Result<Vec<String>> {
    let relation = catalog.relation(t.schema, t.name);
    t.key
        .iter()
        .map(|k| {
            relation
                .and_then(|r| r.column(k))
                .map(|c| c.type_name.clone())
                .ok_or_else(|| {
                    Error::Declarations(vec![Mismatch {
                        table: t.name.to_string(),
                        column: Some(k.to_string()),
                        problem: "is a key column the catalogue does not have; run the \
                                  start-up checks first"
                            .into(),
                    }])
                })
        })
        .collect()
}

fn parents_first(mut left: Vec<Shape>, links: &[Link]) -> Vec<Shape> {
    let mut out: Vec<Shape> = Vec::new();
    loop {
        let ready = left.iter().position(|s| {
            links.iter().all(|l| {
                l.child.name != s.table.name
                    || l.parent.name == s.table.name
                    || out.iter().any(|o| o.table.name == l.parent.name)
            })
        });
        match ready {
            Some(i) => out.push(left.remove(i)),
            None => {
                out.append(&mut left);
                return out;
            }
        }
    }
}

/// `jsonb_build_array(a.k1, a.k2)`: the key of the row `alias`.
pub(crate) fn key_json(alias: &str, table: &Table) -> String {
    let cols: Vec<String> = table
        .key
        .iter()
        .map(|c| format!("{alias}.{}", ident(c)))
        .collect();
    format!("jsonb_build_array({})", cols.join(", "))
}

/// `a.k1 = (json->>0)::type AND ...`: the row `alias` has the key `json`.
/// `LATERAL (...) alias`: the row of `shape` whose key is the `jsonb` value
/// `json`, looked up through the key's index once per row of the outer side
/// (`OFFSET 0` keeps PostgreSQL from turning it into a join). The planner's
/// small tables often have no statistics, and PostgreSQL, guessing them
/// large, would rather hash the whole source table: a change is planned
/// around its own row, never by a scan of the table.
pub(crate) fn row_by_key(alias: &str, shape: &Shape, json: &str) -> String {
    let inner = format!("{alias}_row");
    format!(
        "LATERAL (SELECT * FROM {} {inner} WHERE {} OFFSET 0) {alias}",
        shape.relation,
        key_match(&inner, shape, json)
    )
}

pub(crate) fn key_match(alias: &str, shape: &Shape, json: &str) -> String {
    columns_match(alias, shape.table.key, &shape.key_types, json)
}

fn columns_match(alias: &str, columns: &[impl AsRef<str>], types: &[String], json: &str) -> String {
    columns
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (c, ty))| format!("{alias}.{} = ({json}->>{i})::{ty}", ident(c.as_ref())))
        .collect::<Vec<_>>()
        .join(" AND ")
}

impl Link {
    /// The parent key the row `alias` of the child points at, NULL when it
    /// points at nothing (a NULL in any of the columns).
    pub fn pointer(&self, alias: &str) -> String {
        let cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("{alias}.{}", ident(c)))
            .collect();
        let nulls: Vec<String> = cols.iter().map(|c| format!("{c} IS NULL")).collect();
        format!(
            "CASE WHEN {} THEN NULL ELSE jsonb_build_array({}) END",
            nulls.join(" OR "),
            cols.join(", ")
        )
    }

    /// The row `alias` of the child points at the parent key `json`.
    pub fn points_at(&self, alias: &str, json: &str) -> String {
        columns_match(alias, &self.columns, &self.types, json)
    }
}

/// The condition under which the row `alias` of `table` goes to the holder
/// `r` (a row of the planner's holder list: `r.r`, `r.part`, `r.kind`) by
/// its table's own rule; `None` for tables without a rule of their own.
pub(crate) fn rule(table: &Table, alias: &str, r: &str) -> Option<String> {
    rule_for(
        table,
        alias,
        &Holder {
            id: &format!("{r}.r"),
            partition: &format!("{r}.part"),
            kind: Some(&format!("{r}.kind")),
        },
    )
}

/// A holder of rows as SQL expressions (a row's columns, or literals).
pub(crate) struct Holder<'a> {
    /// Its id: a replica's, or a cohort's.
    pub id: &'a str,
    /// The replica's partition.
    pub partition: &'a str,
    /// What it holds by rule, as `_ms_r.kind` says it: `full`, every rule;
    /// `all`, the cohort of the tables whose rule is `all`; `own`, a member
    /// of that cohort, which holds every rule but `all` itself. `None`: a
    /// replica that holds every rule.
    pub kind: Option<&'a str>,
}

/// [`rule`], for the holder `holder`.
pub(crate) fn rule_for(table: &Table, alias: &str, holder: &Holder) -> Option<String> {
    let ruled = rule_of(table, alias, holder.id, holder.partition)?;
    // The kind guards both ways: an `all` row is the cohort's, not its
    // members', and a cohort holds no row by another rule, whatever a
    // host's row or grant names (a cohort's id is no replica's).
    Some(match (holder.kind, table.rule) {
        (None, _) => ruled,
        (Some(kind), Rule::All) => format!("{kind} <> 'own'"),
        (Some(kind), _) => format!("({kind} <> 'all' AND {ruled})"),
    })
}

/// The rule of `table` for the replica `replica` of `partition`, whatever
/// its kind.
fn rule_of(table: &Table, alias: &str, replica: &str, partition: &str) -> Option<String> {
    Some(match table.rule {
        Rule::All => "true".to_string(),
        Rule::Replica(c) => format!("{alias}.{}::text = {replica}", ident(c)),
        Rule::Partition(c) => format!("{alias}.{}::text = {partition}", ident(c)),
        Rule::Group(g) => {
            let members = g
                .member
                .iter()
                .zip(table.key)
                .map(|(m, k)| format!("m.{} = {alias}.{}", ident(m), ident(k)))
                .collect::<Vec<_>>()
                .join(" AND ");
            // Fenced: looked up per row through the members' and the
            // grants' indexes, never turned into a join over the tables.
            format!(
                "EXISTS (SELECT 1 FROM {} m JOIN {} g ON g.{grp} = m.{grp} WHERE {members} AND g.{}::text = {replica} OFFSET 0)",
                qualified(table.schema, g.members),
                qualified(table.schema, g.grants),
                ident(g.replica),
                grp = ident(g.group),
            )
        }
        Rule::Referenced | Rule::Follows(_) | Rule::Origin => return None,
    })
}

/// The wire key of a key read back from the planner's tables.
pub(crate) fn wire_key(table: &Table, json: serde_json::Value) -> Result<String> {
    wire_key_of(table.name, &key_kinds(table), json)
}

/// The kinds of `table`'s key columns, in key order.
pub(crate) fn key_kinds(table: &Table) -> Vec<Kind> {
    table
        .key
        .iter()
        .map(|name| table.column(name).map_or(Kind::Text, |c| c.kind))
        .collect()
}

/// The wire key of a key of `table` read back from the planner's tables,
/// its columns of `kinds`.
pub(crate) fn wire_key_of(table: &str, kinds: &[Kind], json: serde_json::Value) -> Result<String> {
    let bad = |why: String| Error::Damaged {
        what: format!("table `{table}`: recorded key {json}: {why}"),
    };
    let serde_json::Value::Array(items) = json.clone() else {
        return Err(bad("not an array".into()));
    };
    if items.len() != kinds.len() {
        return Err(bad("not as many values as key columns".into()));
    }
    let mut values = Vec::with_capacity(items.len());
    for (item, &kind) in items.into_iter().zip(kinds) {
        let item = match (kind, item) {
            // PostgreSQL writes numerics as JSON numbers; they travel as text.
            (Kind::Numeric, serde_json::Value::Number(n)) => {
                serde_json::Value::String(n.to_string())
            }
            (_, item) => item,
        };
        values.push(Value::from_json(kind, item).map_err(|e| bad(e.to_string()))?);
    }
    Ok(canonical_key(&values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::Mirror;
    use magic_sync_core::columns::Column;

    const fn table(rule: Rule) -> Table {
        Table {
            name: "t",
            schema: "public",
            rust_type: "T",
            mirror: Mirror::Down,
            rule,
            columns: &[Column {
                name: "id",
                kind: Kind::Int64,
                nullable: false,
                checked: false,
            }],
            key: &["id"],
            owned: &[],
            version: None,
            origin: None,
            retired: None,
            lane: None,
        }
    }

    #[test]
    fn a_holders_kind_keeps_all_rows_to_the_cohort_and_every_other_rule_to_replicas() {
        let listed = |table: &Table| rule(table, "a", "r").unwrap();
        assert_eq!(listed(&table(Rule::All)), "r.kind <> 'own'");
        assert_eq!(
            listed(&table(Rule::Replica("till"))),
            r#"(r.kind <> 'all' AND a."till"::text = r.r)"#
        );
        assert_eq!(
            listed(&table(Rule::Partition("region"))),
            r#"(r.kind <> 'all' AND a."region"::text = r.part)"#
        );
        assert_eq!(rule(&table(Rule::Referenced), "a", "r"), None);

        // A replica given as literals, with no kind: its rule alone.
        let replica = Holder {
            id: "'t1'",
            partition: "'north'",
            kind: None,
        };
        assert_eq!(rule_for(&table(Rule::All), "a", &replica).unwrap(), "true");
        assert_eq!(
            rule_for(&table(Rule::Replica("till")), "a", &replica).unwrap(),
            r#"a."till"::text = 't1'"#
        );
    }
}
