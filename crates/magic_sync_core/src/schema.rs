//! What a replica's database is made of, owned: every declared table with
//! its columns, key, direction, rule and codec, and the foreign keys among
//! the declared tables, which the server reads from its catalogue. Built
//! from the engine's declarations and those foreign keys, so it can be
//! compared, stored and sent, which `&'static` declarations cannot.
//!
//! Each table has a [`Fingerprint`] of what decides what replicas hold of
//! it and how its rows travel: its name, columns (name, kind, whether NULL
//! is taken, in declared order), key, direction, rule, owned, version,
//! origin and retired columns, codec format, and the foreign keys it points
//! through. Nothing else goes in: not the Rust type's name, not the
//! PostgreSQL schema the server reads it from, not the upload lane. The
//! fingerprint is SHA-256 over a canonical encoding in which every part
//! stands behind its length, so it is stable from build to build and two
//! different tables cannot encode alike.

use crate::engine::Engine;
use crate::envelope;
use crate::row::{Mirror, Rule, Table};
use crate::value::Kind;
use sha2::{Digest, Sha256};
use std::fmt;

/// A foreign key among the replica's tables: the `child_columns` of `child`
/// point at the `parent_columns` of `parent`, pairwise. The server reads them
/// from its catalogue; the replica is told them when it opens.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ForeignKey {
    /// The table that points.
    pub child: String,
    /// Its columns that point, in the constraint's order.
    pub child_columns: Vec<String>,
    /// The table pointed at.
    pub parent: String,
    /// The columns pointed at, in the constraint's order.
    pub parent_columns: Vec<String>,
}

impl ForeignKey {
    /// `child(child_columns) → parent(parent_columns)`.
    pub fn new(child: &str, child_columns: &[&str], parent: &str, parent_columns: &[&str]) -> Self {
        ForeignKey {
            child: child.to_string(),
            child_columns: child_columns.iter().map(ToString::to_string).collect(),
            parent: parent.to_string(),
            parent_columns: parent_columns.iter().map(ToString::to_string).collect(),
        }
    }
}

/// SHA-256 of a canonical encoding.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl Fingerprint {
    /// The fingerprint of a whole set of declarations, from each table's
    /// name and fingerprint, in any order: what [`Schema::fingerprint`]
    /// gives, for a reader that has only the tables' prints (the server's
    /// `sync.tables`).
    pub fn of_tables<'a>(tables: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Fingerprint {
        let mut tables: Vec<(&str, &[u8])> = tables.into_iter().collect();
        tables.sort();
        let mut canon = Canon::default();
        for (name, print) in tables {
            canon.part(name, &hex::encode(print));
        }
        canon.finish()
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// One column as a replica holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSchema {
    /// Its name.
    pub name: String,
    /// The kind of value it holds.
    pub kind: Kind,
    /// Whether it takes NULL.
    pub nullable: bool,
}

/// One declared table, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSchema {
    /// Its name, on the server and on replicas alike.
    pub name: String,
    /// Which way its rows travel.
    pub mirror: Mirror,
    /// Which replicas hold which of its rows, in words a reader and a
    /// fingerprint take alike: `all`, `replica(unit_id)`,
    /// `follows(order_id)`, `group(members=…, …)`.
    pub rule: String,
    /// Its columns, in declared order.
    pub columns: Vec<ColumnSchema>,
    /// Its key columns, in declared order.
    pub key: Vec<String>,
    /// The columns replicas own (`both`).
    pub owned: Vec<String>,
    /// The version column (`up`).
    pub version: Option<String>,
    /// The column naming the replica that wrote a row (`up`).
    pub origin: Option<String>,
    /// The replica-side column set on a row retired rather than deleted.
    pub retired: Option<String>,
    /// The codec's format: `json` or `protobuf`.
    pub codec: String,
    /// The foreign keys it points through at declared tables, sorted.
    pub foreign_keys: Vec<ForeignKey>,
}

impl TableSchema {
    /// `table` as declared, travelling in `codec`, pointing through
    /// whichever of `foreign_keys` it is the child of.
    pub fn new(table: &Table, codec: &str, foreign_keys: &[ForeignKey]) -> TableSchema {
        let mut fks: Vec<ForeignKey> = foreign_keys
            .iter()
            .filter(|fk| fk.child == table.name)
            .cloned()
            .collect();
        fks.sort();
        TableSchema {
            name: table.name.to_string(),
            mirror: table.mirror,
            rule: rule_text(&table.rule),
            columns: table
                .columns
                .iter()
                .map(|c| ColumnSchema {
                    name: c.name.to_string(),
                    kind: c.kind,
                    nullable: c.nullable,
                })
                .collect(),
            key: strings(table.key),
            owned: strings(table.owned),
            version: table.version.map(str::to_string),
            origin: table.origin.map(str::to_string),
            retired: table.retired.map(str::to_string),
            codec: codec.to_string(),
            foreign_keys: fks,
        }
    }

    /// The column called `name`.
    pub fn column(&self, name: &str) -> Option<&ColumnSchema> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The fingerprint of how this table's rows are encoded, and nothing of
    /// which replicas hold them: its columns (name, kind, whether NULL is
    /// taken, in order), owned, version, origin and retired columns, and
    /// codec format.
    pub fn encoding_print(&self) -> Fingerprint {
        let mut canon = Canon::default();
        for c in &self.columns {
            canon.part("column", &c.name);
            canon.part("kind", &c.kind.to_string());
            canon.part("nullable", if c.nullable { "yes" } else { "no" });
        }
        canon.list("owned", &self.owned);
        canon.part("version", self.version.as_deref().unwrap_or(""));
        canon.part("origin", self.origin.as_deref().unwrap_or(""));
        canon.part("retired", self.retired.as_deref().unwrap_or(""));
        canon.part("codec", &self.codec);
        canon.finish()
    }

    /// What decides what replicas hold of this table and how its rows
    /// travel, fingerprinted.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut canon = Canon::default();
        canon.part("table", &self.name);
        canon.part("mirror", self.mirror.as_str());
        canon.part("rule", &self.rule);
        for c in &self.columns {
            canon.part("column", &c.name);
            canon.part("kind", &c.kind.to_string());
            canon.part("nullable", if c.nullable { "yes" } else { "no" });
        }
        canon.list("key", &self.key);
        canon.list("owned", &self.owned);
        canon.part("version", self.version.as_deref().unwrap_or(""));
        canon.part("origin", self.origin.as_deref().unwrap_or(""));
        canon.part("retired", self.retired.as_deref().unwrap_or(""));
        canon.part("codec", &self.codec);
        for fk in &self.foreign_keys {
            canon.list("fk", &fk.child_columns);
            canon.part("fk parent", &fk.parent);
            canon.list("fk parent columns", &fk.parent_columns);
        }
        canon.finish()
    }
}

/// Every declared table, owned, with the foreign keys among them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schema {
    tables: Vec<TableSchema>,
}

impl Schema {
    /// The tables `engine` declares, in its order, with whichever of
    /// `foreign_keys` join two of them.
    pub fn new(engine: &Engine, foreign_keys: &[ForeignKey]) -> Schema {
        let declared = |name: &str| engine.codec(name).is_some();
        let among: Vec<ForeignKey> = foreign_keys
            .iter()
            .filter(|fk| declared(&fk.child) && declared(&fk.parent))
            .cloned()
            .collect();
        Schema {
            tables: engine
                .codecs()
                .iter()
                .map(|c| TableSchema::new(c.table(), c.format(), &among))
                .collect(),
        }
    }

    /// Every table, in the engine's order.
    pub fn tables(&self) -> &[TableSchema] {
        &self.tables
    }

    /// The table called `name`.
    pub fn table(&self, name: &str) -> Option<&TableSchema> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Every foreign key among the tables.
    pub fn foreign_keys(&self) -> Vec<ForeignKey> {
        self.tables
            .iter()
            .flat_map(|t| t.foreign_keys.iter().cloned())
            .collect()
    }

    /// The fingerprint of what decides which replicas hold which rows of
    /// `table`, and nothing of how they are encoded: its name, direction,
    /// rule, key (names and kinds), and each foreign key it points through
    /// with whether its parent goes to every replica (a link into such a
    /// table is not counted in what a held row points at). Two builds
    /// whose tables agree on it hold the same rows on every replica, so a
    /// deployment that changes only the encoding sends the rows again
    /// without planning them.
    pub fn plan_print(&self, table: &TableSchema) -> Fingerprint {
        let mut canon = Canon::default();
        canon.part("table", &table.name);
        canon.part(
            "down",
            if table.mirror.goes_down() {
                "yes"
            } else {
                "no"
            },
        );
        canon.part("rule", &table.rule);
        for k in &table.key {
            canon.part("key", k);
            let kind = table.column(k).map(|c| c.kind.to_string());
            canon.part("kind", kind.as_deref().unwrap_or(""));
        }
        for fk in &table.foreign_keys {
            canon.list("fk", &fk.child_columns);
            canon.part("fk parent", &fk.parent);
            canon.list("fk parent columns", &fk.parent_columns);
            let everywhere = self.table(&fk.parent).is_some_and(|p| p.rule == "all");
            canon.part(
                "fk parent everywhere",
                if everywhere { "yes" } else { "no" },
            );
        }
        canon.finish()
    }

    /// The tables' fingerprints together, in name order: equal for two
    /// schemas that differ only in what replicas cannot tell.
    pub fn fingerprint(&self) -> Fingerprint {
        let tables: Vec<(&str, Fingerprint)> = self
            .tables
            .iter()
            .map(|t| (t.name.as_str(), t.fingerprint()))
            .collect();
        Fingerprint::of_tables(tables.iter().map(|(name, print)| (*name, &print.0[..])))
    }
}

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

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

/// A rule in words, with what it names.
fn rule_text(rule: &Rule) -> String {
    match rule {
        Rule::All | Rule::Referenced | Rule::Origin => rule.as_str().to_string(),
        Rule::Replica(c) | Rule::Partition(c) => format!("{}({c})", rule.as_str()),
        Rule::Follows(cols) => format!("follows({})", cols.join(", ")),
        Rule::Group(g) => format!(
            "group(members={}, member=[{}], group={}, grants={}, replica={})",
            g.members,
            g.member.join(", "),
            g.group,
            g.grants,
            g.replica
        ),
    }
}

/// A canonical encoding, hashed as it is written: each part as its label
/// and its text, each behind its length (8 bytes, big-endian).
#[derive(Default)]
struct Canon(Sha256);

impl Canon {
    fn bytes(&mut self, bytes: &[u8]) {
        self.0.update((bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
    }

    fn part(&mut self, label: &str, text: &str) {
        self.bytes(label.as_bytes());
        self.bytes(text.as_bytes());
    }

    fn list(&mut self, label: &str, items: &[String]) {
        self.bytes(label.as_bytes());
        self.0.update((items.len() as u64).to_be_bytes());
        for item in items {
            self.bytes(item.as_bytes());
        }
    }

    fn finish(self) -> Fingerprint {
        Fingerprint(self.0.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::{ForeignKey, Schema};
    use crate::{Engine, Row};
    use sha2::Digest;

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "orders", down, replica = "unit_id", key(id))]
    struct Order {
        id: i64,
        unit_id: String,
        customer_id: Option<i64>,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "customers", down, referenced, key(id))]
    struct Customer {
        id: i64,
        name: String,
    }

    mod renamed {
        use crate::Row;

        // The same table as `Order`, declared by another struct.
        #[derive(Row, Debug, Clone, PartialEq)]
        #[row(table = "orders", down, replica = "unit_id", key(id))]
        pub struct Purchase {
            pub id: i64,
            pub unit_id: String,
            pub customer_id: Option<i64>,
        }

        // `orders` with its customer column taking a text.
        #[derive(Row, Debug, Clone, PartialEq)]
        #[row(table = "orders", down, replica = "unit_id", key(id))]
        pub struct OrderByName {
            pub id: i64,
            pub unit_id: String,
            pub customer_id: Option<String>,
        }

        // `orders` sent by partition instead of by replica.
        #[derive(Row, Debug, Clone, PartialEq)]
        #[row(table = "orders", down, partition = "unit_id", key(id))]
        pub struct OrderByPartition {
            pub id: i64,
            pub unit_id: String,
            pub customer_id: Option<i64>,
        }
    }

    fn fk() -> ForeignKey {
        ForeignKey::new("orders", &["customer_id"], "customers", &["id"])
    }

    fn schema<R: Row>(fks: &[ForeignKey]) -> Schema {
        let engine = Engine::builder()
            .table::<Customer>()
            .table::<R>()
            .build()
            .unwrap();
        Schema::new(&engine, fks)
    }

    #[test]
    fn what_replicas_cannot_tell_apart_fingerprints_alike() {
        let order = schema::<Order>(&[fk()]);
        // The struct's name is the host's, not the replica's.
        assert_eq!(
            order.fingerprint(),
            schema::<renamed::Purchase>(&[fk()]).fingerprint()
        );
        // A foreign key to an undeclared table is none of the schema's.
        let stray = ForeignKey::new("orders", &["unit_id"], "units", &["id"]);
        assert_eq!(
            order.fingerprint(),
            schema::<Order>(&[fk(), stray]).fingerprint()
        );
        assert_eq!(order.foreign_keys(), vec![fk()]);
    }

    #[test]
    fn a_change_replicas_would_see_changes_that_tables_fingerprint_only() {
        let order = schema::<Order>(&[fk()]);
        let customers = order.table("customers").unwrap().fingerprint();
        for (what, other) in [
            ("a column's kind", schema::<renamed::OrderByName>(&[fk()])),
            ("the rule", schema::<renamed::OrderByPartition>(&[fk()])),
            ("a foreign key", schema::<Order>(&[])),
        ] {
            let (a, b) = (
                order.table("orders").unwrap(),
                other.table("orders").unwrap(),
            );
            assert_ne!(a.fingerprint(), b.fingerprint(), "{what}");
            assert_ne!(order.fingerprint(), other.fingerprint(), "{what}");
            assert_eq!(
                other.table("customers").unwrap().fingerprint(),
                customers,
                "{what} changes only `orders`"
            );
        }
    }

    #[test]
    fn a_fingerprint_is_stable_from_build_to_build() {
        // Written down once: a change to the encoding shows here, since
        // every fingerprint a server stored would then differ from its
        // table's.
        let schema = schema::<Order>(&[fk()]);
        let customers = schema.table("customers").unwrap();
        assert_eq!(customers.rule, "referenced");
        // The encoding as the module documents it, written out by hand:
        // texts behind their lengths, a list's count before its items.
        fn part(bytes: &mut Vec<u8>, text: &str) {
            bytes.extend_from_slice(&(text.len() as u64).to_be_bytes());
            bytes.extend_from_slice(text.as_bytes());
        }
        let mut bytes = Vec::new();
        for text in [
            "table",
            "customers",
            "mirror",
            "down",
            "rule",
            "referenced",
            "column",
            "id",
            "kind",
            "i64",
            "nullable",
            "no",
            "column",
            "name",
            "kind",
            "text",
            "nullable",
            "no",
            "key",
        ] {
            part(&mut bytes, text);
        }
        bytes.extend_from_slice(&1u64.to_be_bytes());
        part(&mut bytes, "id");
        part(&mut bytes, "owned");
        bytes.extend_from_slice(&0u64.to_be_bytes());
        for text in ["version", "", "origin", "", "retired", "", "codec", "json"] {
            part(&mut bytes, text);
        }
        let by_hand: [u8; 32] = sha2::Sha256::digest(&bytes).into();
        assert_eq!(customers.fingerprint().0, by_hand);
        assert_eq!(
            customers.fingerprint().to_string(),
            "3f81bdc32de72fd10d1f000fb40806a2dd03d7b40b3900a361aa38eba9bbce28"
        );
    }

    mod written {
        use crate::Row;

        #[derive(Row, Debug, Clone, PartialEq)]
        #[row(table = "stock", both, replica = "unit_id", key(unit_id, product_id))]
        pub struct Stock {
            pub unit_id: String,
            pub product_id: i64,
            pub on_hand: i32,
            #[row(owned)]
            pub counted: Option<i32>,
        }

        // `stock` whose replicas own another column.
        #[derive(Row, Debug, Clone, PartialEq)]
        #[row(table = "stock", both, replica = "unit_id", key(unit_id, product_id))]
        pub struct StockOwnedOtherwise {
            pub unit_id: String,
            pub product_id: i64,
            #[row(owned)]
            pub on_hand: i32,
            pub counted: Option<i32>,
        }

        #[derive(Row, Debug, Clone, PartialEq)]
        #[row(table = "sales", up, key(id), key_without_origin)]
        pub struct Sale {
            pub id: String,
            #[row(origin)]
            pub unit_id: String,
            pub tags: Vec<String>,
            #[row(version)]
            pub version: i64,
        }
    }

    fn whole<S: Row>() -> Schema {
        let engine = Engine::builder()
            .table::<Customer>()
            .table::<Order>()
            .table::<S>()
            .table::<written::Sale>()
            .build()
            .unwrap();
        Schema::new(&engine, &[fk()])
    }

    #[test]
    fn a_description_gives_back_every_table_whole_and_adds_up_to_its_fingerprint() {
        let schema = whole::<written::Stock>();
        let described = schema.described();
        assert_eq!(Schema::from_described(&described), Ok(schema.clone()));
        let stock = described.tables.iter().find(|t| t.name == "stock").unwrap();
        assert_eq!(stock.owned, ["counted"]);
        let sales = described.tables.iter().find(|t| t.name == "sales").unwrap();
        assert_eq!(
            (sales.origin.as_str(), sales.version.as_str()),
            ("unit_id", "version")
        );
        assert!(sales.columns.iter().any(|c| c.kind == "array of text"));
        assert!(described
            .tables
            .iter()
            .all(|t| t.codec == "json" && !t.rule.is_empty()));
        assert!(schema.disagreements(&described).is_empty());
    }

    #[test]
    fn a_description_that_is_not_whole_or_contradicts_itself_is_refused_in_words() {
        let described = whole::<written::Stock>().described();
        let with = |change: &dyn Fn(&mut crate::envelope::ReplicaSchema)| {
            let mut changed = described.clone();
            change(&mut changed);
            Schema::from_described(&changed)
                .expect_err("refused")
                .join("; ")
        };
        let table = |d: &mut crate::envelope::ReplicaSchema, name: &str| -> usize {
            d.tables.iter().position(|t| t.name == name).unwrap()
        };
        for (change, says) in [
            (
                Box::new(|d: &mut crate::envelope::ReplicaSchema| {
                    let i = table(d, "orders");
                    d.tables[i].codec.clear();
                }) as Box<dyn Fn(&mut crate::envelope::ReplicaSchema)>,
                "table `orders`: described without its codec",
            ),
            (
                Box::new(|d| {
                    let i = table(d, "orders");
                    d.tables[i].mirror = "sideways".into();
                }),
                "travels `sideways`",
            ),
            (
                Box::new(|d| {
                    let i = table(d, "orders");
                    d.tables[i].columns[0].kind = "i128".into();
                }),
                "of kind `i128`, which no build writes",
            ),
            (
                Box::new(|d| {
                    let i = table(d, "stock");
                    d.tables[i].owned = vec!["shelf".into()];
                }),
                "table `stock`: its owned column `shelf` is not among its columns",
            ),
            (
                Box::new(|d| {
                    let i = table(d, "orders");
                    d.tables[i].foreign_keys[0].parent = "clients".into();
                }),
                "points at table `clients`, which is not described",
            ),
            (
                Box::new(|d| {
                    let i = table(d, "sales");
                    d.tables[i].codec = "xml".into();
                }),
                "its codec `xml` is neither json nor protobuf",
            ),
            (
                Box::new(|d| {
                    let i = table(d, "stock");
                    d.tables[i].retired = "gone".into();
                }),
                "add up to the fingerprint",
            ),
        ] {
            let said = with(&*change);
            assert!(said.contains(says), "{said}");
        }
    }

    #[test]
    fn a_build_that_owns_other_columns_than_the_server_says_which() {
        let server = whole::<written::Stock>().described();
        let build = whole::<written::StockOwnedOtherwise>();
        let said = build.disagreements(&server);
        assert_eq!(
            said,
            ["table `stock`: replicas own (counted) on the server, (on_hand) in this build"],
            "{said:?}"
        );
        // A server of an earlier build says nothing of it: nothing to
        // disagree on beyond columns, keys and directions.
        let mut earlier = server.clone();
        for t in &mut earlier.tables {
            t.codec.clear();
            t.owned.clear();
        }
        assert!(build.disagreements(&earlier).is_empty());
    }
}
