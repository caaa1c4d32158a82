//! Packing: each replica's rows into messages under the transport's size
//! limit, in an order that keeps every replica consistent between any two
//! messages.
//!
//! Upserts come first, parents' tables before their children's; then
//! deletes, children's tables before their parents'. So a replica that has
//! applied any prefix of its messages never holds a row without the rows it
//! points at: a parent arrives before the child that needs it, and goes only
//! after the child that needed it went or was re-pointed.
//!
//! A message never ends between a table's upserts and its deletes (a unique
//! value moving from one row to another needs both in one transaction), nor
//! inside a table that points at itself (its rows are not ordered parents
//! first). Everything else may be split wherever the size limit says. Inside
//! one message, which a replica applies in one transaction, the deletes go
//! first (children's tables first), then the upserts (parents' first).

use crate::envelope::{to_replica::Body, Down, EndSnapshot, ReplicaSchema, RowData, TableRows};
use std::collections::{HashMap, HashSet};

/// A message body ready to be numbered and sealed.
#[derive(Debug)]
pub struct Packed {
    /// The replica it is for.
    pub replica: String,
    /// The encoded `Down` or `EndSnapshot` it carries.
    pub body: Vec<u8>,
    /// The last message of its replica's stream ([`Packer::end_all`] ended
    /// it): every stream's last message of a pass shares one number.
    pub last: bool,
}

#[derive(Debug, Default)]
struct Open {
    /// Rows to let go of, children's tables first.
    deletes: Vec<TableRows>,
    /// Rows to hold, parents' tables first.
    upserts: Vec<TableRows>,
    bytes: usize,
    /// Tables the message may not end inside of.
    spans: HashSet<String>,
}

/// The messages being filled, one per replica.
#[derive(Debug)]
pub struct Packer {
    limit: usize,
    open: HashMap<String, Open>,
    /// Per replica, the tables with both upserts and deletes in this plan:
    /// asked by borrowed names, for every row.
    both: HashMap<String, HashSet<String>>,
    self_referencing: HashSet<String>,
    done: Vec<Packed>,
    done_bytes: usize,
    /// The replicas given a message so far.
    streams: HashSet<String>,
}

/// Bytes a field adds besides its content: a tag and a length.
const FIELD: usize = 6;

impl Packer {
    pub fn new(
        limit: usize,
        both: HashSet<(String, String)>,
        self_referencing: HashSet<String>,
    ) -> Self {
        Packer {
            limit,
            open: HashMap::new(),
            both: both.into_iter().fold(HashMap::new(), |mut by, (r, t)| {
                by.entry(r).or_insert_with(HashSet::new).insert(t);
                by
            }),
            self_referencing,
            done: Vec::new(),
            done_bytes: 0,
            streams: HashSet::new(),
        }
    }

    /// Adds a row for `replica` to hold. Returns the row's size when it is
    /// larger than any message may be.
    pub fn upsert(&mut self, replica: &str, table: &str, row: RowData) {
        let size = row.key.len() + row.data.len() + 2 * FIELD;
        let protect = self.self_referencing.contains(table) || self.has_both(replica, table);
        let open = self.make_room(replica, size);
        entry(&mut open.upserts, table).upserts.push(row);
        open.bytes += size;
        if protect {
            span(open, table);
        }
    }

    /// Adds a row for `replica` to let go of.
    pub fn delete(&mut self, replica: &str, table: &str, key: Vec<u8>) {
        let size = key.len() + FIELD;
        let protect = self.self_referencing.contains(table);
        let open = self.make_room(replica, size);
        entry(&mut open.deletes, table).deletes.push(key);
        open.bytes += size;
        if protect {
            span(open, table);
        }
    }

    /// The upserts of `table` are all added.
    pub fn upserts_done(&mut self, table: &str) {
        for (replica, open) in &mut self.open {
            if !self.both.get(replica).is_some_and(|t| t.contains(table)) {
                open.spans.remove(table);
            }
        }
    }

    /// Whether `replica` has both upserts and deletes of `table` in this plan.
    fn has_both(&self, replica: &str, table: &str) -> bool {
        self.both.get(replica).is_some_and(|t| t.contains(table))
    }

    /// The deletes of `table` are all added.
    pub fn deletes_done(&mut self, table: &str) {
        for open in self.open.values_mut() {
            open.spans.remove(table);
        }
    }

    /// The open message of `replica`, ended first when `size` more bytes
    /// would take it past the limit and it may end here.
    fn make_room(&mut self, replica: &str, size: usize) -> &mut Open {
        let full = self
            .open
            .get(replica)
            .is_some_and(|o| o.bytes > 0 && o.spans.is_empty() && o.bytes + size > self.limit);
        if full {
            self.end(replica);
        }
        self.open.entry(replica.to_string()).or_default()
    }

    /// Ends the open message of `replica`, if it has one with rows.
    pub fn end(&mut self, replica: &str) {
        let Some(open) = self.open.get_mut(replica) else {
            return;
        };
        if open.bytes == 0 {
            return;
        }
        // Within one message (one transaction on the replica) every delete
        // goes first, children's first, so a row let go of is not kept for a
        // child that goes in the same message, and a unique value it held is
        // free for the upserts that follow.
        let mut tables = std::mem::take(&mut open.deletes);
        tables.append(&mut open.upserts);
        let down = Down { tables };
        open.bytes = 0;
        self.push(replica, Body::Down(down));
    }

    /// Ends every open message: each is the last of its replica's stream,
    /// since a message is ended early only when more rows come for it.
    pub fn end_all(&mut self) {
        let replicas: Vec<String> = self.open.keys().cloned().collect();
        for r in replicas {
            let before = self.done.len();
            self.end(&r);
            if let Some(ended) = self.done.get_mut(before) {
                ended.last = true;
            }
        }
    }

    /// Gives each of `replicas` that was given no message an empty one,
    /// the last of its stream: it says the replica was sent the pass in
    /// messages of its own (a member of a cohort whose every row of the
    /// pass was kept from it), rather than in the cohort's.
    pub fn end_empty(&mut self, replicas: &[String]) {
        for r in replicas {
            if !self.streams.contains(r) {
                self.push(r, Body::Down(Down { tables: Vec::new() }));
                self.done.last_mut().expect("just pushed").last = true;
            }
        }
    }

    /// Adds a message describing the tables, `described`, for `replica`
    /// (after ending its open message).
    pub fn describe(&mut self, replica: &str, described: &ReplicaSchema) {
        self.end(replica);
        self.push(replica, Body::Described(described.clone()));
    }

    /// Adds the end of a snapshot of `tables` for `replica` (after ending
    /// its open message), taken under the declarations `schema` (their
    /// fingerprint).
    pub fn end_snapshot(&mut self, replica: &str, tables: Vec<String>, described: &ReplicaSchema) {
        self.end(replica);
        self.push(
            replica,
            Body::EndSnapshot(EndSnapshot {
                tables,
                schema: described.fingerprint.clone(),
                described: Some(described.clone()),
            }),
        );
    }

    fn push(&mut self, replica: &str, body: Body) {
        if !self.streams.contains(replica) {
            self.streams.insert(replica.to_string());
        }
        let mut bytes = Vec::new();
        body.encode(&mut bytes);
        self.done_bytes += bytes.len();
        self.done.push(Packed {
            replica: replica.to_string(),
            body: bytes,
            last: false,
        });
    }

    /// Bytes of the messages ended and not taken yet.
    pub fn pending_bytes(&self) -> usize {
        self.done_bytes
    }

    /// Takes the messages ended so far, in the order they ended.
    pub fn take(&mut self) -> Vec<Packed> {
        self.done_bytes = 0;
        std::mem::take(&mut self.done)
    }
}

/// Marks `table` as one `open` may not end inside of.
fn span(open: &mut Open, table: &str) {
    if !open.spans.contains(table) {
        open.spans.insert(table.to_string());
    }
}

fn entry<'d>(tables: &'d mut Vec<TableRows>, table: &str) -> &'d mut TableRows {
    let i = match tables.iter().position(|t| t.table == table) {
        Some(i) => i,
        None => {
            tables.push(TableRows {
                table: table.to_string(),
                ..Default::default()
            });
            tables.len() - 1
        }
    };
    &mut tables[i]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::ToReplica;
    use prost::Message;

    fn row(key: &str, size: usize) -> RowData {
        RowData {
            key: key.as_bytes().to_vec(),
            data: vec![b'x'; size],
        }
    }

    fn bodies(packer: &mut Packer) -> Vec<Down> {
        packer
            .take()
            .into_iter()
            .map(|p| {
                match ToReplica::decode(p.body.as_slice())
                    .expect("a body is a ToReplica field")
                    .body
                {
                    Some(Body::Down(d)) => d,
                    other => panic!("expected rows, got {other:?}"),
                }
            })
            .collect()
    }

    #[test]
    fn messages_end_at_the_limit() {
        let mut p = Packer::new(1000, HashSet::new(), HashSet::new());
        for i in 0..10 {
            p.upsert("u1", "products", row(&format!("[{i}]"), 300));
        }
        p.end_all();
        let downs = bodies(&mut p);
        assert_eq!(downs.len(), 4, "three rows of ~310 bytes fit in 1000");
        assert!(downs.iter().all(|d| d.tables[0].upserts.len() <= 3));
    }

    #[test]
    fn a_table_with_upserts_and_deletes_is_never_split() {
        let both = HashSet::from([("u1".to_string(), "products".to_string())]);
        let mut p = Packer::new(1000, both, HashSet::new());
        for i in 0..10 {
            p.upsert("u1", "products", row(&format!("[{i}]"), 300));
        }
        p.upserts_done("products");
        p.delete("u1", "products", b"[99]".to_vec());
        p.deletes_done("products");
        p.upsert("u1", "products", row("[100]", 300));
        p.end_all();
        let downs = bodies(&mut p);
        assert_eq!(downs.len(), 2);
        assert_eq!(downs[0].tables[0].deletes, vec![b"[99]".to_vec()]);
        assert_eq!(downs[0].tables[1].upserts.len(), 10, "the deletes go first");
    }

    #[test]
    fn replicas_fill_messages_of_their_own() {
        let mut p = Packer::new(1000, HashSet::new(), HashSet::new());
        p.upsert("u1", "products", row("[1]", 10));
        p.upsert("u2", "products", row("[1]", 10));
        p.end_snapshot("u2", vec!["products".into()], &Default::default());
        p.end_all();
        let packed = p.take();
        let order: Vec<(&str, bool)> = packed
            .iter()
            .map(|m| {
                let body = ToReplica::decode(m.body.as_slice()).unwrap().body;
                (
                    m.replica.as_str(),
                    matches!(body, Some(Body::EndSnapshot(_))),
                )
            })
            .collect();
        assert_eq!(order, [("u2", false), ("u2", true), ("u1", false)]);
    }

    #[test]
    fn the_last_message_of_each_replicas_stream_and_only_it_is_marked_last() {
        let mut p = Packer::new(1000, HashSet::new(), HashSet::new());
        for i in 0..7 {
            p.upsert("u1", "products", row(&format!("[{i}]"), 300));
        }
        p.upsert("u2", "products", row("[1]", 10));
        let early: Vec<bool> = p.take().iter().map(|m| m.last).collect();
        assert_eq!(
            early,
            [false, false],
            "ended early, as more rows came for u1"
        );
        p.end_all();
        let mut marked: Vec<(String, bool)> =
            p.take().into_iter().map(|m| (m.replica, m.last)).collect();
        marked.sort();
        assert_eq!(marked, [("u1".to_string(), true), ("u2".to_string(), true)]);
    }

    #[test]
    fn a_replica_given_nothing_may_be_given_an_empty_last_message() {
        let mut p = Packer::new(1000, HashSet::new(), HashSet::new());
        for i in 0..4 {
            p.upsert("u1", "products", row(&format!("[{i}]"), 300));
        }
        p.end_all();
        p.end_empty(&["u1".to_string(), "u2".to_string()]);
        let packed = p.take();
        let last: Vec<(&str, bool)> = packed
            .iter()
            .map(|m| (m.replica.as_str(), m.last))
            .collect();
        assert_eq!(
            last,
            [("u1", false), ("u1", true), ("u2", true)],
            "u1 had messages of its own; u2 gets one, empty"
        );
        let empty = ToReplica::decode(packed[2].body.as_slice()).unwrap().body;
        assert_eq!(empty, Some(Body::Down(Down { tables: Vec::new() })));
    }
}
