//! A schema as the wire carries it, both ways: the description a server
//! sends a replica, a replica without declarations of its own built from
//! one (each problem with it said in words), and a replica's own
//! declarations compared against one.

use super::{ColumnSchema, ForeignKey, Schema, TableSchema};
use crate::envelope;
use crate::row::Mirror;
use crate::value::Kind;

impl Schema {
    /// What these declarations make of a replica's tables, as the wire
    /// carries it: columns, keys and foreign keys, under the fingerprint.
    pub fn described(&self) -> envelope::ReplicaSchema {
        envelope::ReplicaSchema {
            fingerprint: self.fingerprint().0.to_vec(),
            tables: self
                .tables
                .iter()
                .map(|t| envelope::TableSchema {
                    name: t.name.clone(),
                    mirror: t.mirror.as_str().to_string(),
                    columns: t
                        .columns
                        .iter()
                        .map(|c| envelope::ColumnSchema {
                            name: c.name.clone(),
                            kind: c.kind.to_string(),
                            nullable: c.nullable,
                        })
                        .collect(),
                    key: t.key.clone(),
                    foreign_keys: t
                        .foreign_keys
                        .iter()
                        .map(|fk| envelope::ForeignKey {
                            columns: fk.child_columns.clone(),
                            parent: fk.parent.clone(),
                            parent_columns: fk.parent_columns.clone(),
                        })
                        .collect(),
                    rule: t.rule.clone(),
                    owned: t.owned.clone(),
                    version: t.version.clone().unwrap_or_default(),
                    origin: t.origin.clone().unwrap_or_default(),
                    retired: t.retired.clone().unwrap_or_default(),
                    codec: t.codec.clone(),
                })
                .collect(),
        }
    }

    /// The schema a server's description gives: every table with all it
    /// declares, for a replica that has no declarations of its own. Refused,
    /// with each reason in words, when the description is not whole (a
    /// server of an earlier build described only columns, keys and foreign
    /// keys), names what no build writes (a direction, a kind, a codec),
    /// contradicts itself (a key, owned or foreign-key column the table
    /// does not have), or does not add up to the fingerprint it carries.
    pub fn from_described(described: &envelope::ReplicaSchema) -> Result<Schema, Vec<String>> {
        let mut problems = Vec::new();
        let mut tables = Vec::with_capacity(described.tables.len());
        for t in &described.tables {
            let mut problem = |what: String| problems.push(format!("table `{}`: {what}", t.name));
            if t.codec.is_empty() {
                problem("described without its codec, owned columns or rule: the server's build is too old to describe its tables whole".into());
                continue;
            }
            let mirror = match t.mirror.as_str() {
                "down" => Mirror::Down,
                "up" => Mirror::Up,
                "both" => Mirror::Both,
                other => {
                    problem(format!(
                        "travels `{other}`, which is none of down, up or both"
                    ));
                    continue;
                }
            };
            let mut columns = Vec::with_capacity(t.columns.len());
            for c in &t.columns {
                match Kind::named(&c.kind) {
                    Some(kind) => columns.push(ColumnSchema {
                        name: c.name.clone(),
                        kind,
                        nullable: c.nullable,
                    }),
                    None => problem(format!(
                        "column `{}` is of kind `{}`, which no build writes",
                        c.name, c.kind
                    )),
                }
            }
            if !matches!(t.codec.as_str(), "json" | "protobuf") {
                problem(format!(
                    "its codec `{}` is neither json nor protobuf",
                    t.codec
                ));
            }
            let has = |name: &str| t.columns.iter().any(|c| c.name == name);
            let optional = |text: &str| (!text.is_empty()).then(|| text.to_string());
            let (version, origin, retired) = (
                optional(&t.version),
                optional(&t.origin),
                optional(&t.retired),
            );
            for (what, names) in [
                ("key", t.key.iter().collect::<Vec<_>>()),
                ("owned", t.owned.iter().collect()),
                ("version", version.iter().collect()),
                ("origin", origin.iter().collect()),
            ] {
                for name in names.into_iter().filter(|n| !has(n)) {
                    problem(format!(
                        "its {what} column `{name}` is not among its columns"
                    ));
                }
            }
            if t.key.is_empty() {
                problem("it has no key".into());
            }
            let mut foreign_keys: Vec<ForeignKey> = Vec::new();
            for fk in &t.foreign_keys {
                for name in fk.columns.iter().filter(|n| !has(n)) {
                    problem(format!(
                        "a foreign key points through `{name}`, which is not among its columns"
                    ));
                }
                if fk.columns.is_empty() || fk.columns.len() != fk.parent_columns.len() {
                    problem(format!(
                        "a foreign key into `{}` pairs {} columns with {}",
                        fk.parent,
                        fk.columns.len(),
                        fk.parent_columns.len()
                    ));
                }
                foreign_keys.push(ForeignKey {
                    child: t.name.clone(),
                    child_columns: fk.columns.clone(),
                    parent: fk.parent.clone(),
                    parent_columns: fk.parent_columns.clone(),
                });
            }
            foreign_keys.sort();
            tables.push(TableSchema {
                name: t.name.clone(),
                mirror,
                rule: t.rule.clone(),
                columns,
                key: t.key.clone(),
                owned: t.owned.clone(),
                version,
                origin,
                retired,
                codec: t.codec.clone(),
                foreign_keys,
            });
        }
        let schema = Schema { tables };
        for t in &schema.tables {
            for fk in &t.foreign_keys {
                match schema.table(&fk.parent) {
                    None => problems.push(format!(
                        "table `{}`: a foreign key points at table `{}`, which is not described",
                        t.name, fk.parent
                    )),
                    Some(parent) => {
                        for name in fk
                            .parent_columns
                            .iter()
                            .filter(|n| parent.column(n).is_none())
                        {
                            problems.push(format!(
                                "table `{}`: a foreign key points at `{}`.`{name}`, which is not among its columns",
                                t.name, fk.parent
                            ));
                        }
                    }
                }
            }
        }
        if problems.is_empty() && schema.fingerprint().0[..] != described.fingerprint[..] {
            problems.push(format!(
                "the tables described add up to the fingerprint {}, not to the {} the description carries",
                schema.fingerprint(),
                hex::encode(&described.fingerprint)
            ));
        }
        match problems.is_empty() {
            true => Ok(schema),
            false => Err(problems),
        }
    }

    /// How `described`, a server's description of the replica's tables,
    /// disagrees with these declarations (a replica's own build): each
    /// table or column one side has and the other lacks, or declares
    /// otherwise, in words. Empty when they agree on every table.
    pub fn disagreements(&self, described: &envelope::ReplicaSchema) -> Vec<String> {
        let mut found = Vec::new();
        for theirs in &described.tables {
            let Some(ours) = self.table(&theirs.name) else {
                found.push(format!(
                    "the server sends table `{}`, which this build does not declare",
                    theirs.name
                ));
                continue;
            };
            if ours.mirror.as_str() != theirs.mirror {
                found.push(format!(
                    "table `{}` travels {} on the server, {} in this build",
                    ours.name,
                    theirs.mirror,
                    ours.mirror.as_str()
                ));
            }
            if ours.key != theirs.key {
                found.push(format!(
                    "table `{}` is keyed by ({}) on the server, by ({}) in this build",
                    ours.name,
                    theirs.key.join(", "),
                    ours.key.join(", ")
                ));
            }
            for column in &theirs.columns {
                match ours.column(&column.name) {
                    None => found.push(format!(
                        "table `{}`: the server sends column `{}`, which this build does not declare",
                        ours.name, column.name
                    )),
                    Some(c) if c.kind.to_string() != column.kind || c.nullable != column.nullable => {
                        found.push(format!(
                            "table `{}`: column `{}` is {}{} on the server, {}{} in this build",
                            ours.name,
                            column.name,
                            column.kind,
                            if column.nullable { " or NULL" } else { "" },
                            c.kind,
                            if c.nullable { " or NULL" } else { "" },
                        ))
                    }
                    Some(_) => {}
                }
            }
            if !theirs.codec.is_empty() {
                // A whole description: what replicas own and keep says
                // how the replica's own writes travel.
                fn said(text: &str) -> Option<&str> {
                    (!text.is_empty()).then_some(text)
                }
                for (what, server, build) in [
                    (
                        "replicas own",
                        theirs.owned.join(", "),
                        ours.owned.join(", "),
                    ),
                    (
                        "the version is in",
                        said(&theirs.version).unwrap_or("no column").to_string(),
                        ours.version.as_deref().unwrap_or("no column").to_string(),
                    ),
                    (
                        "who wrote a row is in",
                        said(&theirs.origin).unwrap_or("no column").to_string(),
                        ours.origin.as_deref().unwrap_or("no column").to_string(),
                    ),
                    (
                        "a retired row is marked in",
                        said(&theirs.retired).unwrap_or("no column").to_string(),
                        ours.retired.as_deref().unwrap_or("no column").to_string(),
                    ),
                    ("rows travel in", theirs.codec.clone(), ours.codec.clone()),
                ] {
                    if server != build {
                        found.push(format!(
                            "table `{}`: {what} ({server}) on the server, ({build}) in this build",
                            ours.name
                        ));
                    }
                }
            }
            for column in &ours.columns {
                if !theirs.columns.iter().any(|c| c.name == column.name) {
                    found.push(format!(
                        "table `{}`: this build declares column `{}`, which the server does not send",
                        ours.name, column.name
                    ));
                }
            }
        }
        for ours in &self.tables {
            if !described.tables.iter().any(|t| t.name == ours.name) {
                found.push(format!(
                    "this build declares table `{}`, which the server does not",
                    ours.name
                ));
            }
        }
        found
    }
}

/// The foreign keys `described` gives, among the tables it describes.
pub fn described_foreign_keys(described: &envelope::ReplicaSchema) -> Vec<ForeignKey> {
    described
        .tables
        .iter()
        .flat_map(|t| {
            t.foreign_keys.iter().map(|fk| ForeignKey {
                child: t.name.clone(),
                child_columns: fk.columns.clone(),
                parent: fk.parent.clone(),
                parent_columns: fk.parent_columns.clone(),
            })
        })
        .collect()
}
