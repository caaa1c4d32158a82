//! A table's fingerprint and how it is made: SHA-256 over a canonical
//! encoding in which every part stands behind its length. A table has
//! three prints, each over what decides one thing: the whole of what
//! replicas hold of it and how its rows travel, how its rows are encoded
//! alone, and which replicas hold which rows alone. A schema's print
//! joins its tables' prints in name order.

use super::{Schema, TableSchema};
use sha2::{Digest, Sha256};
use std::fmt;

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

impl TableSchema {
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

impl Schema {
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
