//! Start-up checks: the server refuses to start while a declaration disagrees
//! with the database, or a trigger is missing, disabled or changed.

use crate::catalog::{Catalog, Relation};
use crate::engine::Engine;
use crate::error::{Error, Mismatch, Result};
use crate::row::{Mirror, Rule, Table};
use tokio_postgres::Client;

/// Everything the server checks before it starts. Returns the catalogue it read.
pub async fn startup(engine: &Engine, client: &Client) -> Result<Catalog> {
    crate::schema::require_current(client).await?;
    let catalog = Catalog::read(client, engine).await?;
    declarations(engine, &catalog)?;
    crate::trigger::verify(engine, client, &catalog).await?;
    Ok(catalog)
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
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Declarations(problems))
    }
}

fn check_table(table: &Table, catalog: &Catalog, problems: &mut Vec<Mismatch>) {
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
        if !col.kind.fits_postgres(&db.type_name) {
            problems.push(mismatch(format!(
                "the field is {}, which does not fit the column's type {}",
                col.kind, db.type_name
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
