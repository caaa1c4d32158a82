//! What the PostgreSQL catalogue says about the declared tables: their
//! columns, unique keys, partitions, and the foreign keys between them (the
//! table graph). Foreign keys are never declared; they are read here.

use crate::engine::Engine;
use crate::error::Result;
use std::collections::HashMap;
use tokio_postgres::Client;

/// A column as the database has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbColumn {
    /// Its name.
    pub name: String,
    /// Its type as declared, as `format_type` prints it (`bigint`,
    /// `numeric(10,2)`, `text[]`, `year`, `mpaa_rating[]`).
    pub type_name: String,
    /// The type it is checked against and read as: a domain's base type
    /// (through any domains it is over), an enum as `text`, an array by its
    /// elements (`year[]` is `integer[]`). The same as `type_name` for a
    /// column of a base type.
    pub base_type: String,
    /// What its declared type is, or its elements' for an array.
    pub type_kind: TypeKind,
    /// Whether it is declared NOT NULL, or is of a domain that is.
    pub not_null: bool,
}

/// What a column's declared type is (or, for an array, its elements'
/// type): what makes its [`DbColumn::base_type`] differ from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeKind {
    /// A type of its own: `integer`, `text`, `numeric(10,2)`.
    Base,
    /// A domain, checked and read as the type it is over.
    Domain,
    /// An enum, checked and read as `text`.
    Enum,
}

impl TypeKind {
    /// The kind `pg_type.typtype` names (`d` a domain, `e` an enum).
    fn of(typtype: &str) -> TypeKind {
        match typtype {
            "d" => TypeKind::Domain,
            "e" => TypeKind::Enum,
            _ => TypeKind::Base,
        }
    }
}

/// A table (or partitioned table) as the database has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Its oid.
    pub oid: i64,
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub name: String,
    /// Whether it is partitioned.
    pub partitioned: bool,
    /// Its columns, in table order.
    pub columns: Vec<DbColumn>,
    /// The column lists of its primary key and unique indexes (no partial or expression ones).
    pub unique: Vec<Vec<String>>,
    /// The column lists of all its valid indexes (no partial or expression
    /// ones), in index order.
    pub indexes: Vec<Vec<String>>,
    /// Every partition below it, at any depth, as (schema, name).
    pub partitions: Vec<(String, String)>,
}

impl Relation {
    /// The column called `name`.
    pub fn column(&self, name: &str) -> Option<&DbColumn> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Whether an index of the table leads with `columns`, in any order: one
    /// that finds the rows with given values of them without a scan.
    pub fn has_index_on(&self, columns: &[&str]) -> bool {
        self.indexes.iter().any(|ix| {
            ix.len() >= columns.len()
                && ix[..columns.len()]
                    .iter()
                    .all(|c| columns.contains(&c.as_str()))
        })
    }

    /// Whether `columns`, as a set, is exactly a unique key of the table.
    pub fn is_unique(&self, columns: &[&str]) -> bool {
        self.unique
            .iter()
            .any(|u| u.len() == columns.len() && columns.iter().all(|c| u.iter().any(|x| x == c)))
    }
}

/// A foreign key between two declared tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignKey {
    /// The constraint's name.
    pub name: String,
    /// The declared table that points.
    pub child: &'static str,
    /// Its columns, in the constraint's order.
    pub child_columns: Vec<String>,
    /// The declared table pointed at.
    pub parent: &'static str,
    /// The parent's columns, matching `child_columns` one to one.
    pub parent_columns: Vec<String>,
}

/// The catalogue, read for one engine's tables.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// Relations by (schema, name): every declared table and group table found.
    pub relations: HashMap<(String, String), Relation>,
    /// Foreign keys whose both ends are declared tables.
    pub foreign_keys: Vec<ForeignKey>,
}

const RELATIONS: &str = "
SELECT c.oid::int8, n.nspname::text, c.relname::text, c.relkind = 'p'
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN unnest($1::text[], $2::text[]) AS wanted(s, r) ON n.nspname = wanted.s AND c.relname = wanted.r
WHERE c.relkind IN ('r', 'p')";

/// Every column with its declared type and the type it is checked against.
///
/// `chain` walks from the column's type down to a type that is neither a
/// domain nor an array, as deep as domains are stacked: a domain steps to
/// the type it is over (its type modifier, `numeric(10,2)`, kept), an array
/// to its elements (counted, to be put back as `[]`). The last step is the
/// base type, an enum read as `text`. A domain's NOT NULL counts, unless an
/// array stands between it and the column (it then holds for the elements).
/// `declared` is the kind of the first type met that is not an array.
const COLUMNS: &str = "
SELECT a.attrelid::int8, a.attname::text, format_type(a.atttypid, a.atttypmod),
       checked.base_type, checked.declared, a.attnotnull OR checked.not_null
FROM pg_attribute a
CROSS JOIN LATERAL (
    WITH RECURSIVE chain(type, typmod, arrays, declared, not_null, depth) AS (
        SELECT a.atttypid, a.atttypmod, 0, NULL::text, false, 0
        UNION ALL
        SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.typelem END,
               CASE WHEN t.typtype = 'd' AND t.typtypmod <> -1 THEN t.typtypmod ELSE c.typmod END,
               c.arrays + (t.typtype <> 'd')::int,
               coalesce(c.declared, CASE WHEN t.typtype = 'd' THEN 'd' END),
               c.not_null OR (t.typtype = 'd' AND t.typnotnull AND c.arrays = 0),
               c.depth + 1
        FROM chain c
        JOIN pg_type t ON t.oid = c.type
        WHERE t.typtype = 'd'
           OR (t.typelem <> 0 AND t.typsubscript = 'array_subscript_handler'::regproc)
    )
    SELECT CASE WHEN t.typtype = 'e' THEN 'text' ELSE format_type(c.type, c.typmod) END
               || repeat('[]', c.arrays) AS base_type,
           coalesce(c.declared, t.typtype::text) AS declared,
           c.not_null
    FROM chain c
    JOIN pg_type t ON t.oid = c.type
    ORDER BY c.depth DESC
    LIMIT 1
) checked
WHERE a.attrelid::int8 = ANY($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum";

const INDEXES: &str = "
SELECT i.indrelid::int8, i.indisunique,
       array(SELECT a.attname::text
             FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE k.ord <= i.indnkeyatts
             ORDER BY k.ord)
FROM pg_index i
WHERE i.indrelid::int8 = ANY($1) AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL";

const PARTITIONS: &str = "
WITH RECURSIVE parts(root, child) AS (
    SELECT inhparent, inhrelid FROM pg_inherits WHERE inhparent::int8 = ANY($1)
    UNION ALL
    SELECT p.root, i.inhrelid FROM parts p JOIN pg_inherits i ON i.inhparent = p.child
)
SELECT p.root::int8, n.nspname::text, c.relname::text
FROM parts p
JOIN pg_class c ON c.oid = p.child
JOIN pg_namespace n ON n.oid = c.relnamespace
ORDER BY 1, 2, 3";

const FOREIGN_KEYS: &str = "
SELECT con.conname::text, con.conrelid::int8, con.confrelid::int8,
       array(SELECT a.attname::text
             FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
             ORDER BY k.ord),
       array(SELECT a.attname::text
             FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum
             ORDER BY k.ord)
FROM pg_constraint con
WHERE con.contype = 'f' AND con.conparentid = 0
  AND con.conrelid::int8 = ANY($1) AND con.confrelid::int8 = ANY($1)
ORDER BY con.conrelid, con.conname";

impl Catalog {
    /// Reads what the catalogue says about `engine`'s tables and group tables.
    pub async fn read(client: &Client, engine: &Engine) -> Result<Catalog> {
        let mut wanted: Vec<(String, String)> = engine
            .tables()
            .map(|t| (t.schema.to_string(), t.name.to_string()))
            .collect();
        wanted.extend(
            engine
                .group_tables()
                .into_iter()
                .map(|g| (g.schema.to_string(), g.name.to_string())),
        );
        let schemas: Vec<&str> = wanted.iter().map(|w| w.0.as_str()).collect();
        let names: Vec<&str> = wanted.iter().map(|w| w.1.as_str()).collect();

        let mut by_oid: HashMap<i64, Relation> = HashMap::new();
        for row in client.query(RELATIONS, &[&schemas, &names]).await? {
            let oid: i64 = row.get(0);
            by_oid.insert(
                oid,
                Relation {
                    oid,
                    schema: row.get(1),
                    name: row.get(2),
                    partitioned: row.get(3),
                    columns: Vec::new(),
                    unique: Vec::new(),
                    indexes: Vec::new(),
                    partitions: Vec::new(),
                },
            );
        }
        let oids: Vec<i64> = by_oid.keys().copied().collect();
        for row in client.query(COLUMNS, &[&oids]).await? {
            if let Some(rel) = by_oid.get_mut(&row.get::<_, i64>(0)) {
                rel.columns.push(DbColumn {
                    name: row.get(1),
                    type_name: row.get(2),
                    base_type: row.get(3),
                    type_kind: TypeKind::of(row.get(4)),
                    not_null: row.get(5),
                });
            }
        }
        for row in client.query(INDEXES, &[&oids]).await? {
            if let Some(rel) = by_oid.get_mut(&row.get::<_, i64>(0)) {
                let columns: Vec<String> = row.get(2);
                if row.get::<_, bool>(1) {
                    rel.unique.push(columns.clone());
                }
                rel.indexes.push(columns);
            }
        }
        for row in client.query(PARTITIONS, &[&oids]).await? {
            if let Some(rel) = by_oid.get_mut(&row.get::<_, i64>(0)) {
                rel.partitions.push((row.get(1), row.get(2)));
            }
        }

        let declared: HashMap<i64, &'static str> = engine
            .tables()
            .filter_map(|t| {
                by_oid
                    .values()
                    .find(|r| r.schema == t.schema && r.name == t.name)
                    .map(|r| (r.oid, t.name))
            })
            .collect();
        let declared_oids: Vec<i64> = declared.keys().copied().collect();
        let mut foreign_keys = Vec::new();
        for row in client.query(FOREIGN_KEYS, &[&declared_oids]).await? {
            let (Some(&child), Some(&parent)) = (
                declared.get(&row.get::<_, i64>(1)),
                declared.get(&row.get::<_, i64>(2)),
            ) else {
                continue;
            };
            foreign_keys.push(ForeignKey {
                name: row.get(0),
                child,
                child_columns: row.get(3),
                parent,
                parent_columns: row.get(4),
            });
        }

        let relations = by_oid
            .into_values()
            .map(|r| ((r.schema.clone(), r.name.clone()), r))
            .collect();
        Ok(Catalog {
            relations,
            foreign_keys,
        })
    }

    /// The relation `schema.name`, if it exists.
    pub fn relation(&self, schema: &str, name: &str) -> Option<&Relation> {
        self.relations.get(&(schema.to_string(), name.to_string()))
    }

    /// Foreign keys of the declared table `child`.
    pub fn parents_of<'a>(&'a self, child: &'a str) -> impl Iterator<Item = &'a ForeignKey> + 'a {
        self.foreign_keys.iter().filter(move |f| f.child == child)
    }

    /// Foreign keys pointing at the declared table `parent`.
    pub fn children_of<'a>(&'a self, parent: &'a str) -> impl Iterator<Item = &'a ForeignKey> + 'a {
        self.foreign_keys.iter().filter(move |f| f.parent == parent)
    }

    /// The columns of `child` that point at other declared tables, each once,
    /// in the order the constraints name them.
    pub fn pointing_columns(&self, child: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for fk in self.parents_of(child) {
            for c in &fk.child_columns {
                if !out.contains(c) {
                    out.push(c.clone());
                }
            }
        }
        out
    }
}

impl Catalog {
    /// What replicas' databases are made of: `engine`'s tables with the
    /// foreign keys among them, as this catalogue has them.
    pub fn schema(&self, engine: &Engine) -> magic_sync_core::schema::Schema {
        magic_sync_core::schema::Schema::new(engine, &self.replica_foreign_keys())
    }

    /// The foreign keys between declared tables, as the server describes
    /// them to replicas (a snapshot's end, and `ReplicaSchema`).
    pub fn replica_foreign_keys(&self) -> Vec<magic_sync_core::schema::ForeignKey> {
        self.foreign_keys
            .iter()
            .map(|fk| magic_sync_core::schema::ForeignKey {
                child: fk.child.to_string(),
                child_columns: fk.child_columns.clone(),
                parent: fk.parent.to_string(),
                parent_columns: fk.parent_columns.clone(),
            })
            .collect()
    }
}
