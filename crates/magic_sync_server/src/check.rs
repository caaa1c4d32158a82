//! Start-up checks: the server refuses to start while a declaration disagrees
//! with the database, or a trigger is missing, disabled or changed.

use crate::catalog::{Catalog, DbColumn, Relation, TypeKind};
use crate::engine::Engine;
pub use crate::error::MissingIndex;
use crate::error::{Error, Mismatch, Result};
use crate::row::{Mirror, Rule, Table};
use tokio_postgres::Client;

/// Everything the server checks before it starts. Returns the catalogue it read.
pub async fn startup(engine: &Engine, client: &Client) -> Result<Catalog> {
    crate::schema::require_current(client).await?;
    let catalog = Catalog::read(client, engine).await?;
    declarations(engine, &catalog)?;
    let missing = indexes(engine, &catalog);
    if !missing.is_empty() {
        return Err(Error::MissingIndexes(missing));
    }
    crate::trigger::verify(engine, client, &catalog).await?;
    Ok(catalog)
}

/// The indexes the relay needs that the database lacks (see
/// [`MissingIndex`]), read from the catalogue: what the start-up check
/// refuses to start without, for a host to print and run.
pub async fn missing_indexes(engine: &Engine, client: &Client) -> Result<Vec<MissingIndex>> {
    let catalog = Catalog::read(client, engine).await?;
    Ok(indexes(engine, &catalog))
}

/// The indexes the relay needs that `catalog` lacks. Tables the catalogue
/// does not have are left to [`declarations`] to name.
pub fn indexes(engine: &Engine, catalog: &Catalog) -> Vec<MissingIndex> {
    let mut wanted: Vec<(&str, &str, Vec<&str>, String)> = Vec::new();
    for table in engine.down_tables() {
        match &table.rule {
            Rule::Follows(columns) => wanted.push((
                table.schema,
                table.name,
                columns.to_vec(),
                format!("the rows of `{}` that follow a parent", table.name),
            )),
            Rule::Group(g) => {
                wanted.push((
                    table.schema,
                    g.members,
                    g.member.to_vec(),
                    format!("the groups a row of `{}` is a member of", table.name),
                ));
                wanted.push((
                    table.schema,
                    g.members,
                    vec![g.group],
                    format!("the members of a group of `{}`", table.name),
                ));
                wanted.push((
                    table.schema,
                    g.grants,
                    vec![g.replica, g.group],
                    format!("whether a group of `{}` is given to a replica", table.name),
                ));
            }
            _ => {}
        }
    }
    let mut missing: Vec<MissingIndex> = Vec::new();
    for (schema, name, columns, why) in wanted {
        let Some(rel) = catalog.relation(schema, name) else {
            continue;
        };
        if rel.has_index_on(&columns) {
            continue;
        }
        let columns: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
        if missing
            .iter()
            .any(|m| m.schema == schema && m.table == name && m.columns == columns)
        {
            continue;
        }
        missing.push(MissingIndex {
            schema: schema.to_string(),
            table: name.to_string(),
            columns,
            partitioned: rel.partitioned,
            why: format!("the relay looks up {why} through it"),
        });
    }
    missing
}

/// Checks every declaration against the catalogue; lists every disagreement.
pub fn declarations(engine: &Engine, catalog: &Catalog) -> Result<()> {
    let mut problems = Vec::new();
    for table in engine.tables() {
        check_table(table, catalog, &mut problems);
    }
    for g in engine.group_tables() {
        match catalog.relation(g.schema, g.name) {
            None => problems.push(Mismatch {
                table: g.name.to_string(),
                column: None,
                problem: format!(
                    "a group rule names this table, but schema `{}` has no such table",
                    g.schema
                ),
            }),
            Some(rel) => {
                for c in &g.key {
                    if rel.column(c).is_none() {
                        problems.push(Mismatch {
                            table: g.name.to_string(),
                            column: Some(c.to_string()),
                            problem:
                                "a group rule names this column, but the table has no such column"
                                    .into(),
                        });
                    }
                }
            }
        }
    }
    foreign_key_types(engine, catalog, &mut problems);
    owned_pointers(engine, catalog, &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Declarations(problems))
    }
}

/// Foreign keys whose columns print differently from the key they point at.
///
/// The relay compares a pointer with its parent's key as text (decision
/// 51), and a replica compares them as canonical keys (decision 18): a
/// `numeric(10,2)` pointing at a `numeric(12,4)` key prints `1.50` where the
/// key prints `1.5000`, and would never find it. Types that print a value
/// the same way (integers of any width, `text` and `varchar`, a domain and
/// the type it is over) are allowed.
fn foreign_key_types(engine: &Engine, catalog: &Catalog, problems: &mut Vec<Mismatch>) {
    let family = |ty: &str| -> String {
        match ty {
            "smallint" | "integer" | "bigint" => "integer".into(),
            "text" => "text".into(),
            t if t.starts_with("character varying") => "text".into(),
            t => t.to_string(),
        }
    };
    let column_of = |table: &str, column: &str| {
        let table = engine.tables().find(|t| t.name == table)?;
        let relation = catalog.relation(table.schema, table.name)?;
        relation.column(column)
    };
    for fk in &catalog.foreign_keys {
        for (c, p) in fk.child_columns.iter().zip(&fk.parent_columns) {
            let (Some(child), Some(parent)) = (column_of(fk.child, c), column_of(fk.parent, p))
            else {
                continue;
            };
            if family(&child.base_type) != family(&parent.base_type) {
                problems.push(Mismatch {
                    table: fk.child.to_string(),
                    column: Some(c.clone()),
                    problem: format!(
                        "foreign key `{}` is {} but points at `{}.{p}`, which is {}: \
                         keys are compared as they print, so a pointer must have its key's type",
                        fk.name,
                        described_type(child),
                        fk.parent,
                        described_type(parent)
                    ),
                });
            }
        }
    }
}

/// Owned columns that are part of a foreign key among the declared tables.
/// A replica that owned one could point its row at a parent its rules do not
/// give it (and, for a table that follows its parent, move the row to the
/// replicas of another): what a row points at is the server's to say.
fn owned_pointers(engine: &Engine, catalog: &Catalog, problems: &mut Vec<Mismatch>) {
    for fk in &catalog.foreign_keys {
        let Some(child) = engine.tables().find(|t| t.name == fk.child) else {
            continue;
        };
        for c in fk
            .child_columns
            .iter()
            .filter(|c| child.owned.contains(&c.as_str()))
        {
            problems.push(Mismatch {
                table: fk.child.to_string(),
                column: Some(c.clone()),
                problem: format!(
                    "is owned by the replica (`#[row(owned)]`), but it is part of foreign key \
                     `{}` to `{}`: a replica could point its row at a parent its rules do not \
                     give it; remove `#[row(owned)]` from it",
                    fk.name, fk.parent
                ),
            });
        }
    }
}

/// What the derive refuses, checked again for a table declared by hand:
/// a `both` table needs an owned column, and none may be its rule's.
fn owned_columns(table: &Table, problems: &mut Vec<Mismatch>) {
    if table.mirror != Mirror::Both {
        return;
    }
    if table.owned.is_empty() {
        problems.push(Mismatch {
            table: table.name.to_string(),
            column: None,
            problem: "is `both` but has no owned column: the replica would write nothing \
                      the server can file; mark what it writes `#[row(owned)]`, or declare it `down`"
                .into(),
        });
    }
    let decides: &[&str] = match &table.rule {
        Rule::Replica(c) | Rule::Partition(c) => std::slice::from_ref(c),
        Rule::Follows(cs) => cs,
        _ => &[],
    };
    for c in table.owned.iter().filter(|c| decides.contains(c)) {
        problems.push(Mismatch {
            table: table.name.to_string(),
            column: Some(c.to_string()),
            problem: "is owned by the replica, but the table's rule reads it to decide which \
                      replicas hold a row; a replica never owns it"
                .into(),
        });
    }
}

fn check_table(table: &Table, catalog: &Catalog, problems: &mut Vec<Mismatch>) {
    owned_columns(table, problems);
    let mismatch = |column: Option<&str>, problem: String| Mismatch {
        table: table.name.to_string(),
        column: column.map(str::to_string),
        problem,
    };
    let Some(rel) = catalog.relation(table.schema, table.name) else {
        problems.push(mismatch(
            None,
            format!(
                "declared by `{}`, but schema `{}` has no such table",
                table.rust_type, table.schema
            ),
        ));
        return;
    };
    check_columns(table, rel, problems);
    if !rel.is_unique(table.key) {
        problems.push(mismatch(
            None,
            format!(
                "the declared key ({}) is not unique in the database: no primary key or unique index has exactly these columns",
                table.key.join(", ")
            ),
        ));
    }
    match &table.rule {
        Rule::Follows(columns) => {
            let found = catalog.parents_of(table.name).any(|fk| {
                fk.child_columns
                    .iter()
                    .map(String::as_str)
                    .eq(columns.iter().copied())
            });
            if !found {
                problems.push(mismatch(
                    Some(&columns.join(", ")),
                    "the table follows its parent through these columns, but no foreign key on exactly them points at a declared table".into(),
                ));
            }
        }
        Rule::Referenced if catalog.children_of(table.name).next().is_none() => {
            problems.push(mismatch(
                None,
                "declared `referenced`, but no foreign key of a declared table points at it, so no replica would ever hold a row of it".into(),
            ));
        }
        _ => {}
    }
    if table.mirror == Mirror::Up && table.retired.is_some() {
        problems.push(mismatch(
            table.retired,
            "an up table has no retired column".into(),
        ));
    }
}

fn check_columns(table: &Table, rel: &Relation, problems: &mut Vec<Mismatch>) {
    for col in table.columns {
        let mismatch = |problem: String| Mismatch {
            table: table.name.to_string(),
            column: Some(col.name.to_string()),
            problem,
        };
        let Some(db) = rel.column(col.name) else {
            problems.push(mismatch(format!(
                "declared by field `{}::{}`, but the table has no such column",
                table.rust_type, col.name
            )));
            continue;
        };
        if !col.kind.fits_postgres(&db.base_type) {
            problems.push(mismatch(format!(
                "the field is {}, which does not fit the column's type {}",
                col.kind,
                described_type(db)
            )));
        }
        if !db.not_null && !col.nullable {
            problems.push(mismatch(
                "the column can be NULL, but its field is not an Option".into(),
            ));
        }
    }
    if let Some(retired) = table.retired {
        if rel.column(retired).is_some() {
            problems.push(Mismatch {
                table: table.name.to_string(),
                column: Some(retired.to_string()),
                problem: "is declared as the replica's retired column, but the server table has a column of that name".into(),
            });
        }
    }
}

/// A column's declared type for a message, with the type it is checked
/// against when that differs: `year (a domain over integer)`,
/// `mpaa_rating[] (an array of an enum, checked as text[])`.
fn described_type(column: &DbColumn) -> String {
    let (declared, base) = (&column.type_name, &column.base_type);
    if declared == base {
        return declared.clone();
    }
    let in_array = declared.ends_with("[]");
    match (column.type_kind, in_array) {
        (TypeKind::Domain, false) => format!("{declared} (a domain over {base})"),
        (TypeKind::Domain, true) => format!(
            "{declared} (an array of a domain over {})",
            base.strip_suffix("[]").unwrap_or(base)
        ),
        (TypeKind::Enum, false) => format!("{declared} (an enum, checked as {base})"),
        (TypeKind::Enum, true) => format!("{declared} (an array of an enum, checked as {base})"),
        (TypeKind::Base, _) => format!("{declared} (checked as {base})"),
    }
}
