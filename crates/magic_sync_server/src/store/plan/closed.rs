//! A fresh replica's set in closed form: for each table, one query of the
//! rows of it the replica wants, over the host's tables. A snapshot streams
//! its rows by these queries before anything is planned, and plans its
//! record afterwards, in the same view (`relay::snapshot`).
//!
//! The planner works the set out round by round into `_ms_f`: the rows the
//! rules give, then the parents of rows in it and the followers of rows in
//! it, until a round adds nothing. Table by table the same closure reads:
//! a table's rows are those its rule gives, the parents of its child
//! tables' rows, and the followers of its parent's rows. So a table's query
//! reads the rows of the tables it depends on. Three dependencies never
//! need following:
//!
//! - the parents of rows in an `all` table's place: every row of it is
//!   there by its rule;
//! - the parents of a follower's rows, through the link it follows, when
//!   its rows come no other way (nothing else it follows, nothing that
//!   brings its rows as parents): such a row is there only because its
//!   parent is;
//! - the parents of a child's rows its rule gives, when that rule implies
//!   the parent's (`Graph::implied`: a branch's accounts point at the
//!   branch, which the same partition rule gives): a query reading its
//!   parents reads only its other rows.
//!
//! What is left is acyclic in most schemas. Where tables still depend on
//! one another in a cycle (a table pointing at itself, a follower that is a
//! parent too), their rows are found together by one recursive query, a
//! round of the planner per step of its recursion.
//!
//! Each table's closed form is worked out once per view for all that
//! depends on it. Named inline, a parent's query would hold its child
//! tables' queries, and theirs their own: in a deep graph (countries over
//! cities over addresses over customers over rentals) the small tables at
//! its top would run the work of every table below them, once per table
//! above it. Instead, what other queries read of a table's rows (the
//! columns their links point through, its key for its followers, nothing
//! more, each combination once) is kept first, in the order the tables
//! depend on one another, in a temporary table of the snapshot's view
//! ([`Kept`]), and the queries that depend on it read that table. A table
//! streams by its own query, which reads kept tables and the host's
//! tables: its own level's work. So no table's query runs more than twice,
//! once for what depends on it and once for its stream. A table read by
//! one query only, of a table nothing reads, is named in that query
//! instead: the same two runs, without a temporary table (see `keeps`).
//! The keys a cycle's recursion finds are kept when more than one
//! statement reads them. A table every row of which goes (`all`) is read
//! in place: a copy of it costs what reading it does.
//!
//! Each query reads as the planner does, and is run with joins hashed
//! (`HASH_ONLY`), so no guess of PostgreSQL's about sizes can make it
//! quadratic: a table's own rule is a filter over the table; parents, and
//! the members of a group, are looked up by their key, each once; followers
//! are joined to their parents' keys in bulk. A row that comes more than
//! one way comes once: the parts of a table's query are disjoint.

use super::HASH_ONLY;
use crate::graph::{key_json, key_match, Graph, Link};
use crate::row::{Rule, Table};
use crate::sql::{escaped, ident, literal, qualified};
use crate::value::Kind;
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;

/// The longest query built: past it (a schema of very many tables a query
/// reads, or a cycle of very many) the snapshot plans first instead.
const LONGEST: usize = 256 << 10;

/// Why a table's rows belong to a fresh replica, besides its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Parents of the rows of link `.0`'s child.
    ParentOf(usize),
    /// Followers, through link `.0`, of its parent's rows.
    Follows(usize),
}

/// What a snapshot works out once, before its first row, for the queries
/// that read it: a temporary table of its view, dropped at the view's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kept {
    /// The temporary table.
    pub table: String,
    /// The statement that makes and fills it.
    pub make: String,
}

/// Per table of the graph, in its order, the query of the rows of it one
/// fresh replica wants (every column, as `a.*` gives them), each once;
/// `None` for a table it wants nothing of. The queries read the tables
/// [`Closed::kept`] makes, which are made first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Closed {
    /// To be made first, in order: what the queries read of the tables
    /// they depend on.
    kept: Vec<Kept>,
    queries: Vec<Option<String>>,
    /// Per table, whether its query is its rule's filter and nothing else
    /// (a replica or partition rule, no parents, no followers): the same
    /// rows, in the same view, as the planner's first round takes of it.
    filter_only: Vec<bool>,
}

impl Closed {
    /// The queries for the replica `replica` of partition `partition`.
    /// `None` when they would be too long to send.
    pub fn new(graph: &Graph, replica: &str, partition: Option<&str>) -> Option<Closed> {
        let builder = Builder::new(graph, replica, partition);
        let queries = (0..graph.shapes.len()).map(|t| builder.rows(t)).collect();
        let filter_only = graph
            .shapes
            .iter()
            .enumerate()
            .map(|(t, shape)| {
                matches!(shape.table.rule, Rule::Replica(_) | Rule::Partition(_))
                    && builder.sources[t].is_empty()
            })
            .collect();
        match builder.too_long.get() {
            true => None,
            false => Some(Closed {
                kept: builder.kept.into_inner(),
                queries,
                filter_only,
            }),
        }
    }

    /// The temporary tables the queries read, in the order they are to be
    /// made (each after those it reads), in the view the queries run in.
    pub fn kept(&self) -> &[Kept] {
        &self.kept
    }

    /// The tables whose query is their rule's filter alone and read nothing
    /// of `read` (rows read per table, in the graph's order): the planner
    /// has nothing to find in them by their rule.
    pub fn ruled_out(&self, graph: &Graph, read: &[u64]) -> BTreeSet<&'static str> {
        graph
            .shapes
            .iter()
            .zip(&self.filter_only)
            .zip(read)
            .filter(|((_, only), read)| **only && **read == 0)
            .map(|((shape, _), _)| shape.table.name)
            .collect()
    }

    /// The rows of the graph's table `index` the replica wants, as a
    /// relation its columns are selected from.
    pub fn rows(&self, index: usize) -> &Option<String> {
        &self.queries[index]
    }

    /// The settings its queries run under: every join hashed (the
    /// look-ups by key are lateral, and stay as they are).
    pub const SETTINGS: &'static str = HASH_ONLY;
}

struct Builder<'a> {
    graph: &'a Graph,
    /// The replica's id and partition.
    replica: &'a str,
    partition: Option<&'a str>,
    /// Per table, what its rows come from besides its rule.
    sources: Vec<Vec<Source>>,
    /// Per table, its strongly connected component: tables that depend on
    /// one another share one.
    component: Vec<usize>,
    /// Per component, whether it is a cycle (more than one table, or one
    /// depending on itself).
    cyclic: Vec<bool>,
    /// Per table, the columns of its rows that queries of other components
    /// read (the child's columns of a link whose parent depends on it, the
    /// key a follower's link points at), each once; none for a table
    /// nobody depends on.
    read: Vec<Vec<String>>,
    /// Per table, whether what other queries read of it is kept (see
    /// `keeps`).
    keeps: Vec<bool>,
    /// Aliases drawn so far.
    drawn: Cell<usize>,
    /// Per table, its query once built.
    built: RefCell<Vec<Option<Option<String>>>>,
    /// Per component in a cycle, the relation of the rows its recursion
    /// finds (their tables' names and keys), once built.
    found: RefCell<Vec<Option<Option<String>>>>,
    /// The tables kept so far, each after those it reads.
    kept: RefCell<Vec<Kept>>,
    /// Whether a query grew past `LONGEST`: the rest are not built.
    too_long: Cell<bool>,
}

impl<'a> Builder<'a> {
    fn new(graph: &'a Graph, replica: &'a str, partition: Option<&'a str>) -> Builder<'a> {
        let index = |name: &str| {
            graph
                .shapes
                .iter()
                .position(|s| s.table.name == name)
                .expect("a link between tables of the graph")
        };
        let sources = sources(graph, index);
        let depends: Vec<Vec<usize>> = sources
            .iter()
            .map(|s| {
                s.iter()
                    .map(|source| match *source {
                        Source::ParentOf(l) => index(graph.links[l].child.name),
                        Source::Follows(l) => index(graph.links[l].parent.name),
                    })
                    .collect()
            })
            .collect();
        let component = components(&depends);
        let count = component.iter().max().map_or(0, |c| c + 1);
        let mut cyclic = vec![false; count];
        for (t, deps) in depends.iter().enumerate() {
            for &d in deps {
                if component[d] == component[t] {
                    cyclic[component[t]] = true;
                }
            }
        }
        let read = read(graph, &sources, &depends, &component);
        let keeps = keeps(graph, &depends, &component, &cyclic);
        Builder {
            graph,
            replica,
            partition,
            sources,
            component,
            cyclic,
            read,
            keeps,
            drawn: Cell::new(0),
            built: RefCell::new(vec![None; graph.shapes.len()]),
            found: RefCell::new(vec![None; count]),
            kept: RefCell::new(Vec::new()),
            too_long: Cell::new(false),
        }
    }

    fn draw(&self, prefix: &str) -> String {
        let n = self.drawn.get() + 1;
        self.drawn.set(n);
        format!("{prefix}{n}")
    }

    /// The table a source depends on.
    fn from(&self, source: Source) -> usize {
        let name = match source {
            Source::ParentOf(l) => self.graph.links[l].child.name,
            Source::Follows(l) => self.graph.links[l].parent.name,
        };
        self.index(name)
    }

    fn index(&self, name: &str) -> usize {
        self.graph
            .shapes
            .iter()
            .position(|s| s.table.name == name)
            .expect("a table of the graph")
    }

    /// The rows of table `t` in the set, each once; `None` when there are
    /// none.
    fn rows(&self, t: usize) -> Option<String> {
        if let Some(built) = &self.built.borrow()[t] {
            return built.clone();
        }
        if self.too_long.get() {
            return None;
        }
        let rows = match self.cyclic[self.component[t]] {
            true => self.rows_in_cycle(t),
            false => self.rows_from(t, &self.sources[t], true),
        };
        if !self.fits(rows.as_deref()) {
            return None;
        }
        if let (Some(rows), true) = (&rows, self.keeps[t]) {
            self.keep(t, rows);
        }
        self.built.borrow_mut()[t] = Some(rows.clone());
        rows
    }

    /// Whether `query` is short enough to send; past `LONGEST`, nothing
    /// more is built.
    fn fits(&self, query: Option<&str>) -> bool {
        if query.is_some_and(|q| q.len() > LONGEST) {
            self.too_long.set(true);
        }
        !self.too_long.get()
    }

    /// Keeps the columns of table `t`'s rows (`rows`) other queries read,
    /// each combination once.
    fn keep(&self, t: usize, rows: &str) {
        let shape = &self.graph.shapes[t];
        let read = &self.read[t];
        // With its key, each row is there once already.
        let once = match shape.table.key.iter().all(|k| read.iter().any(|c| c == k)) {
            true => "",
            false => "DISTINCT ",
        };
        let columns: Vec<String> = read.iter().map(|c| format!("a.{}", ident(c))).collect();
        let table = kept_name(t);
        let make = format!(
            "CREATE TEMP TABLE {table} ON COMMIT DROP AS SELECT {once}{} FROM ({rows}) a",
            columns.join(", ")
        );
        self.kept.borrow_mut().push(Kept { table, make });
    }

    /// The rows of table `t` in the set, as a relation other queries read
    /// its columns `read[t]` from: its kept table, or its query.
    fn relation(&self, t: usize) -> Option<String> {
        let rows = self.rows(t)?;
        Some(match self.keeps[t] {
            true => kept_name(t),
            false => format!("({rows})"),
        })
    }

    /// The rows of table `t` its rule gives and `sources` bring (none of
    /// them in a cycle with it), each once, in disjoint parts: the rows its
    /// rule's filter keeps; then, of the others, those looked up by key (a
    /// group's members, the parents of child tables' rows, and the
    /// followers too when there are such); or else the followers, joined to
    /// their parents' keys. Without the first part unless `ruled`: the rows
    /// that come only some other way.
    fn rows_from(&self, t: usize, sources: &[Source], ruled: bool) -> Option<String> {
        let shape = &self.graph.shapes[t];
        let (table, rel) = (shape.table, &shape.relation);
        if matches!(table.rule, Rule::All) {
            return Some(format!("SELECT a.* FROM {rel} a"));
        }
        let filter = self.filter(table, "a");
        let mut keys: Vec<String> = self.members(t).into_iter().collect();
        let mut followers: Vec<(&Link, String)> = Vec::new();
        for &source in sources {
            match source {
                Source::ParentOf(l) => keys.extend(self.pointed_at(l)),
                Source::Follows(l) => {
                    let link = &self.graph.links[l];
                    followers.extend(self.parent_keys(l).map(|parents| (link, parents)));
                }
            }
        }
        if followers.len() > 1 || (!followers.is_empty() && !keys.is_empty()) {
            // Followers that come another way too: looked up by key like
            // the rest, each once.
            for (link, parents) in followers.drain(..) {
                let y = self.draw("x");
                let p = self.draw("p");
                keys.push(format!(
                    "SELECT {} FROM {rel} {y} JOIN ({parents}) {p} ON {}",
                    as_keys(&y, table.key, &shape.key_types),
                    on(&y, &link.columns, &p),
                ));
            }
        }
        let not_ruled = filter
            .as_ref()
            .map(|f| format!(" WHERE ({f}) IS NOT TRUE"))
            .unwrap_or_default();
        let mut parts = Vec::new();
        if let (Some(filter), true) = (&filter, ruled) {
            parts.push(format!("SELECT a.* FROM {rel} a WHERE {filter}"));
        }
        if !keys.is_empty() {
            let o = self.draw("o");
            parts.push(format!(
                "SELECT a.* FROM (SELECT DISTINCT * FROM ({}) k) {o} \
                 CROSS JOIN LATERAL (SELECT * FROM {rel} a WHERE {} OFFSET 0) a{not_ruled}",
                keys.join(" UNION ALL "),
                on("a", table.key, &o),
            ));
        }
        if let Some((link, parents)) = followers.pop() {
            // Each parent's key once already: the parent's rows are.
            let p = self.draw("p");
            parts.push(format!(
                "SELECT a.* FROM {rel} a JOIN ({parents}) {p} ON {}{not_ruled}",
                on("a", &link.columns, &p),
            ));
        }
        match parts.is_empty() {
            true => None,
            false => Some(parts.join(" UNION ALL ")),
        }
    }

    /// The keys (`c0`, `c1`, ...) of the rows link `l`'s child rows in the
    /// set point at, as the parent's key types.
    fn pointed_at(&self, l: usize) -> Option<String> {
        let link = &self.graph.links[l];
        let c = self.index(link.child.name);
        let x = self.draw("x");
        let mut present: Vec<String> = link
            .columns
            .iter()
            .map(|c| format!("{x}.{} IS NOT NULL", ident(c)))
            .collect();
        // The parents of the rows its rule gives are the parent's by its
        // own rule: only the child's other rows are looked at, read without
        // their rule's part where the child's query is named in place.
        let implied = self.graph.implied(link);
        let child = match implied && !self.keeps[c] && !self.cyclic[self.component[c]] {
            true => {
                self.rows(c)?;
                format!("({})", self.rows_from(c, &self.sources[c], false)?)
            }
            false => {
                let child = self.relation(c)?;
                if implied {
                    let ruled = self.filter(link.child, &x).expect("a ruled table");
                    present.push(format!("({ruled}) IS NOT TRUE"));
                }
                child
            }
        };
        let parent = self.graph.shape(link.parent.name);
        Some(format!(
            "SELECT {} FROM {child} {x} WHERE {}",
            as_keys(&x, &link.columns, &parent.key_types),
            present.join(" AND ")
        ))
    }

    /// The keys (`c0`, `c1`, ...) of the parent's rows in the set, through
    /// link `l`, as the parent has them: compared with the follower's
    /// columns as the foreign key compares them, never cast to the
    /// follower's types (a key out of their range is no error, it is no
    /// follower's).
    fn parent_keys(&self, l: usize) -> Option<String> {
        let link = &self.graph.links[l];
        let index = self.index(link.parent.name);
        let parent = self.relation(index)?;
        let x = self.draw("x");
        Some(format!(
            "SELECT {} FROM {parent} {x}",
            as_keys(&x, link.parent.key, &self.graph.shapes[index].key_types)
        ))
    }

    /// The keys (`c0`, `c1`, ...) of table `t`'s rows its group rule gives
    /// the replica; `None` for a table without one.
    fn members(&self, t: usize) -> Option<String> {
        let shape = &self.graph.shapes[t];
        let table = shape.table;
        let Rule::Group(g) = table.rule else {
            return None;
        };
        let (m, gr) = (self.draw("m"), self.draw("g"));
        Some(format!(
            "SELECT {} FROM {} {m} JOIN {} {gr} ON {gr}.{grp} = {m}.{grp} WHERE {gr}.{}::text = {}",
            as_keys(&m, g.member, &shape.key_types),
            qualified(table.schema, g.members),
            qualified(table.schema, g.grants),
            ident(g.replica),
            escaped(self.replica),
            grp = ident(g.group),
        ))
    }

    /// Whether the row `alias` of `table` goes to the replica by its own
    /// rule's filter (a replica or a partition rule); `None` for a table
    /// whose rule is no filter (every row, a group, none of its own). As the
    /// planner's rule says, but with the replica's id and partition known:
    /// a column compared as it is, where it can be, rather than as its text
    /// (no value turned into text per row of a table read whole, and its
    /// index usable).
    fn filter(&self, table: &Table, alias: &str) -> Option<String> {
        match table.rule {
            Rule::Replica(column) => Some(equals(table, alias, column, Some(self.replica))),
            Rule::Partition(column) => Some(equals(table, alias, column, self.partition)),
            _ => None,
        }
    }

    /// The rows of table `t`, in a cycle of tables that depend on one
    /// another: looked up by the keys a recursive query over the whole
    /// cycle finds.
    fn rows_in_cycle(&self, t: usize) -> Option<String> {
        let found = self.found(self.component[t])?;
        let shape = &self.graph.shapes[t];
        let (f, o) = (self.draw("w"), self.draw("o"));
        Some(format!(
            "SELECT a.* FROM (SELECT {f}.k FROM {found} {f} WHERE {f}.t = {}) {o} \
             CROSS JOIN LATERAL (SELECT * FROM {} a WHERE {} OFFSET 0) a",
            literal(shape.table.name),
            shape.relation,
            key_match("a", shape, &format!("{o}.k")),
        ))
    }

    /// The rows the recursion over the cycle `c` finds, each once (`t`, its
    /// table's name; `k`, its key), as a relation: kept when more than one
    /// statement would run it (the cycle holds more than one table, or
    /// another query reads its table), inline otherwise (a table pointing
    /// at itself that nothing reads).
    fn found(&self, c: usize) -> Option<String> {
        if let Some(found) = &self.found.borrow()[c] {
            return found.clone();
        }
        let recursion = self.recursion(c);
        let found = match recursion {
            Some(recursion) if self.fits(Some(&recursion)) => {
                let mut members = (0..self.graph.shapes.len()).filter(|&m| self.component[m] == c);
                let alone = members.clone().count() == 1;
                match !alone || members.any(|m| !self.read[m].is_empty()) {
                    true => {
                        let table = cycle_name(c);
                        let make =
                            format!("CREATE TEMP TABLE {table} ON COMMIT DROP AS {recursion}");
                        self.kept.borrow_mut().push(Kept {
                            table: table.clone(),
                            make,
                        });
                        Some(table)
                    }
                    false => Some(format!("({recursion})")),
                }
            }
            _ => None,
        };
        self.found.borrow_mut()[c] = Some(found.clone());
        found
    }

    /// The recursive query over the cycle `c`: from the rows its tables
    /// have from outside it, a step per dependency within it, until a step
    /// finds nothing new.
    fn recursion(&self, c: usize) -> Option<String> {
        let w = self.draw("w");
        let mut bases = Vec::new();
        let mut steps = Vec::new();
        for (m, shape) in self.graph.shapes.iter().enumerate() {
            if self.component[m] != c {
                continue;
            }
            // What it has from outside the cycle: its rule, and sources in
            // other components.
            let outside: Vec<Source> = self.sources[m]
                .iter()
                .copied()
                .filter(|&s| self.component[self.from(s)] != c)
                .collect();
            if let Some(rows) = self.rows_from(m, &outside, true) {
                let y = self.draw("x");
                bases.push(format!(
                    "SELECT {}::text, {} FROM ({rows}) {y}",
                    literal(shape.table.name),
                    key_json(&y, shape.table),
                ));
            }
            // A step from a row found to the rows it brings of this table.
            for &source in &self.sources[m] {
                let from = self.from(source);
                if self.component[from] != c {
                    continue;
                }
                let z = self.draw("x");
                steps.push(self.step(source, m, from, &w, &z));
            }
        }
        if bases.is_empty() {
            return None;
        }
        // `UNION` keeps each row found once, the bases' among them (each
        // its table's own).
        let recursive = match steps.is_empty() {
            true => String::new(),
            false => format!(
                " UNION SELECT e.t, e.k FROM {w} CROSS JOIN LATERAL ({}) e",
                steps.join(" UNION ALL ")
            ),
        };
        Some(format!(
            "WITH RECURSIVE {w} (t, k) AS ({}{recursive}) SELECT {w}.t, {w}.k FROM {w}",
            bases.join(" UNION ALL ")
        ))
    }

    /// The rows of table `to` that `source` brings from a row `w` (its
    /// table and key) of table `from` found in the recursion.
    fn step(&self, source: Source, to: usize, from: usize, w: &str, z: &str) -> String {
        let to_table = self.graph.shapes[to].table;
        let from_shape = &self.graph.shapes[from];
        match source {
            Source::ParentOf(l) => {
                // The parent the child row points at.
                let link: &Link = &self.graph.links[l];
                let pointer = link.pointer(z);
                format!(
                    "SELECT {}::text AS t, {pointer} AS k FROM {} {z} \
                     WHERE {w}.t = {} AND {} AND {pointer} IS NOT NULL",
                    literal(to_table.name),
                    from_shape.relation,
                    literal(from_shape.table.name),
                    key_match(z, from_shape, &format!("{w}.k")),
                )
            }
            Source::Follows(l) => {
                // The rows following the parent row.
                let link = &self.graph.links[l];
                format!(
                    "SELECT {}::text AS t, {} AS k FROM {} {z} WHERE {w}.t = {} AND {}",
                    literal(to_table.name),
                    key_json(z, to_table),
                    self.graph.shapes[to].relation,
                    literal(from_shape.table.name),
                    link.points_at(z, &format!("{w}.k")),
                )
            }
        }
    }
}

/// Per table of `graph` (`index` gives a table's place), what its rows come
/// from besides its rule, but for the dependencies that bring nothing:
///
/// - the parents of rows in an `all` table's place, and anything more of
///   it: every row of it is there by its rule;
/// - the parents of a follower's rows, through the link it follows, when
///   that link is the only way its rows come (a follower with no other
///   parent to follow, whose own parents of further rows do not count
///   either): each such row is there only because its parent is. Dropping
///   one may leave another follower with its link alone, so this goes on
///   until none does (rentals that follow an item and are pointed at only
///   by payments that follow them: neither the rentals' items nor the
///   payments' rentals need looking for);
/// - the parents of a child's rows when its rule implies the parent's
///   (`Graph::implied`) and nothing else brings it rows: every row of it
///   points at a row the parent has by its own rule (a branch's accounts
///   need no scan for their branch).
fn sources(graph: &Graph, index: impl Fn(&str) -> usize) -> Vec<Vec<Source>> {
    let mut sources = vec![Vec::new(); graph.shapes.len()];
    for (i, link) in graph.links.iter().enumerate() {
        if !matches!(link.parent.rule, Rule::All) {
            sources[index(link.parent.name)].push(Source::ParentOf(i));
        }
        if link.follows {
            sources[index(link.child.name)].push(Source::Follows(i));
        }
    }
    for (t, shape) in graph.shapes.iter().enumerate() {
        if matches!(shape.table.rule, Rule::All) {
            // Every row: nothing else can add one.
            sources[t].clear();
        }
    }
    loop {
        let mut dropped = false;
        for (i, link) in graph.links.iter().enumerate() {
            let (child, parent) = (index(link.child.name), index(link.parent.name));
            let only_way = link.follows && sources[child] == [Source::Follows(i)];
            // A child whose rows all come by a rule that implies its
            // parent's brings the parent no row.
            let only_ruled = sources[child].is_empty() && graph.implied(link);
            if (only_way || only_ruled) && sources[parent].contains(&Source::ParentOf(i)) {
                sources[parent].retain(|&s| s != Source::ParentOf(i));
                dropped = true;
            }
        }
        if !dropped {
            return sources;
        }
    }
}

/// Per table of `graph`, the columns of its rows that the queries of
/// tables in other components (`component`) read, through the `sources`
/// each table depends on (`depends`, the tables they read, alongside): the
/// child's columns of a link whose parent depends on it, the key a
/// follower's link points at. Within a component, the recursion reads rows
/// from the tables themselves.
fn read(
    graph: &Graph,
    sources: &[Vec<Source>],
    depends: &[Vec<usize>],
    component: &[usize],
) -> Vec<Vec<String>> {
    let mut read: Vec<Vec<String>> = vec![Vec::new(); graph.shapes.len()];
    for (t, sources) in sources.iter().enumerate() {
        for (&source, &d) in sources.iter().zip(&depends[t]) {
            if component[d] == component[t] {
                continue;
            }
            let columns: Vec<String> = match source {
                Source::ParentOf(l) => graph.links[l].columns.clone(),
                Source::Follows(l) => graph.links[l]
                    .parent
                    .key
                    .iter()
                    .map(|c| c.to_string())
                    .collect(),
            };
            for column in columns {
                if !read[d].contains(&column) {
                    read[d].push(column);
                }
            }
        }
    }
    read
}

/// Per table of `graph`, whether what the queries of other components
/// (`component`) read of it is kept, from what each table's query reads
/// (`depends`). A table's query runs once to stream it, and once more in
/// each statement that names it: its readers' queries, and for a reader
/// kept, the statement that keeps it too. Named no more than once besides
/// its own stream, it is named in place (a table kept costs that one run
/// all the same, and a temporary table besides); named more often, it is
/// kept, so that no table's query runs more than twice. The rows of an
/// `all` table are read in place: a copy costs what reading it does. A
/// table read by the recursion of a cycle is kept, whatever the cycle's
/// recursion makes of it.
fn keeps(graph: &Graph, depends: &[Vec<usize>], component: &[usize], cyclic: &[bool]) -> Vec<bool> {
    let n = graph.shapes.len();
    // Runs of each table's query, its own stream first.
    let mut runs = vec![1usize; n];
    let mut keeps = vec![false; n];
    // Readers before what they read: a component's number is higher than
    // those of the components it depends on.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&t| std::cmp::Reverse(component[t]));
    for t in order {
        keeps[t] = runs[t] > 2 && !matches!(graph.shapes[t].table.rule, Rule::All);
        let named = match keeps[t] || cyclic[component[t]] {
            true => 2,
            false => runs[t],
        };
        for &d in &depends[t] {
            if component[d] != component[t] {
                runs[d] += named;
            }
        }
    }
    keeps
}

/// The temporary table of what other queries read of the graph's table
/// `t`.
fn kept_name(t: usize) -> String {
    format!("_ms_closed_{t}")
}

/// The temporary table of the rows the recursion over cycle `c` finds.
fn cycle_name(c: usize) -> String {
    format!("_ms_closed_cycle_{c}")
}

/// Whether the column `column` of the row `alias` reads as `value` (the
/// planner's `column::text = value`). An integer column is compared with
/// the integer `value` is the text of; a `value` that is no integer's text
/// (`03`, `u1`) is no such column's, and neither is a missing one.
fn equals(table: &Table, alias: &str, column: &str, value: Option<&str>) -> String {
    let Some(value) = value else {
        return "false".into();
    };
    let integer = table
        .column(column)
        .is_some_and(|c| matches!(c.kind, Kind::Int16 | Kind::Int32 | Kind::Int64));
    match integer {
        true => match value.parse::<i64>() {
            Ok(n) if n.to_string() == value => format!("{alias}.{} = {n}", ident(column)),
            _ => "false".into(),
        },
        false => format!("{alias}.{}::text = {}", ident(column), escaped(value)),
    }
}

/// `alias.a::type AS c0, alias.b::type AS c1`: columns as keys of the given
/// types, named as a key set's columns are.
fn as_keys(alias: &str, names: &[impl AsRef<str>], types: &[String]) -> String {
    names
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (c, ty))| format!("{alias}.{}::{ty} AS c{i}", ident(c.as_ref())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `alias.a = keys.c0 AND alias.b = keys.c1`: the columns `names` of the
/// row `alias` are the key set's row `keys`.
fn on(alias: &str, names: &[impl AsRef<str>], keys: &str) -> String {
    names
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{alias}.{} = {keys}.c{i}", ident(c.as_ref())))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The strongly connected components of `depends` (Tarjan's), numbered from
/// zero: tables that depend on one another, directly or not, share one.
fn components(depends: &[Vec<usize>]) -> Vec<usize> {
    struct Walk<'a> {
        depends: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        component: Vec<usize>,
        components: usize,
    }
    impl Walk<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in &self.depends[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    self.component[w] = self.components;
                    if w == v {
                        break;
                    }
                }
                self.components += 1;
            }
        }
    }
    let n = depends.len();
    let mut walk = Walk {
        depends,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        component: vec![0; n],
        components: 0,
    };
    for v in 0..n {
        if walk.index[v].is_none() {
            walk.visit(v);
        }
    }
    walk.component
}

#[cfg(test)]
mod tests {
    use super::{components, equals, kept_name, Closed};
    use crate::graph::{Graph, Link, Shape};
    use crate::row::{Mirror, Rule, Table};
    use crate::value::Kind;
    use magic_sync_core::columns::Column;

    const fn column(name: &'static str, kind: Kind) -> Column {
        Column {
            name,
            kind,
            nullable: false,
            checked: false,
        }
    }

    static TILLS: Table = Table {
        name: "tills",
        schema: "public",
        rust_type: "Till",
        mirror: Mirror::Down,
        rule: Rule::Replica("branch"),
        columns: &[column("branch", Kind::Int32), column("code", Kind::Text)],
        key: &["branch"],
        owned: &[],
        version: None,
        origin: None,
        retired: None,
        lane: None,
    };

    #[test]
    fn an_integer_column_is_compared_with_the_integer_a_replica_id_is_the_text_of() {
        assert_eq!(
            equals(&TILLS, "a", "branch", Some("3")),
            r#"a."branch" = 3"#
        );
        assert_eq!(
            equals(&TILLS, "a", "branch", Some("-12")),
            r#"a."branch" = -12"#
        );
        // No integer prints as these: no row's column reads as them.
        for id in ["03", "+3", " 3", "u1", "", "99999999999999999999"] {
            assert_eq!(equals(&TILLS, "a", "branch", Some(id)), "false", "{id:?}");
        }
        assert_eq!(equals(&TILLS, "a", "branch", None), "false");
        // Any other column is compared as its text, the value quoted.
        assert_eq!(
            equals(&TILLS, "a", "code", Some("it's")),
            r#"a."code"::text = E'it''s'"#
        );
    }

    #[test]
    fn tables_that_depend_on_one_another_share_a_component() {
        // 0 <- 1 <-> 2, 3 alone, 4 on itself.
        let depends = vec![vec![], vec![0, 2], vec![1], vec![], vec![4]];
        let c = components(&depends);
        assert_eq!(c[1], c[2]);
        assert_ne!(c[0], c[1]);
        assert_ne!(c[3], c[0]);
        assert_ne!(c[3], c[1]);
        assert_ne!(c[4], c[3]);
        let distinct: std::collections::BTreeSet<_> = c.iter().collect();
        assert_eq!(distinct.len(), 4);
    }

    /// A down table of `rule` and `columns`, keyed by `id`.
    const fn table(name: &'static str, rule: Rule, columns: &'static [Column]) -> Table {
        Table {
            name,
            schema: "public",
            rust_type: name,
            mirror: Mirror::Down,
            rule,
            columns,
            key: &["id"],
            owned: &[],
            version: None,
            origin: None,
            retired: None,
            lane: None,
        }
    }

    static COUNTRY: Table = table("country", Rule::Referenced, &[column("id", Kind::Int32)]);
    static CITY: Table = table(
        "city",
        Rule::Referenced,
        &[column("id", Kind::Int32), column("country_id", Kind::Int32)],
    );
    static ADDRESS: Table = table(
        "address",
        Rule::Referenced,
        &[column("id", Kind::Int32), column("city_id", Kind::Int32)],
    );
    static CUSTOMER: Table = table(
        "customer",
        Rule::Replica("unit"),
        &[
            column("id", Kind::Int32),
            column("unit", Kind::Text),
            column("address_id", Kind::Int32),
        ],
    );
    static RENTAL: Table = table(
        "rental",
        Rule::Follows(&["customer_id"]),
        &[
            column("id", Kind::Int32),
            column("customer_id", Kind::Int32),
        ],
    );
    static PAYMENT: Table = table(
        "payment",
        Rule::Follows(&["rental_id"]),
        &[column("id", Kind::Int32), column("rental_id", Kind::Int32)],
    );

    fn link(child: &'static Table, column: &str, parent: &'static Table, follows: bool) -> Link {
        Link {
            child,
            parent,
            name: column.into(),
            columns: vec![column.into()],
            types: vec!["integer".into()],
            follows,
        }
    }

    /// country ← city ← address ← customer ← rental ← payment: a chain of
    /// referenced tables over a replica's customers, their rentals and the
    /// payments for those.
    fn chain() -> Graph {
        graph(
            &[&COUNTRY, &CITY, &ADDRESS, &CUSTOMER, &RENTAL, &PAYMENT],
            vec![
                link(&CITY, "country_id", &COUNTRY, false),
                link(&ADDRESS, "city_id", &CITY, false),
                link(&CUSTOMER, "address_id", &ADDRESS, false),
                link(&RENTAL, "customer_id", &CUSTOMER, true),
                link(&PAYMENT, "rental_id", &RENTAL, true),
            ],
            "integer",
        )
    }

    /// The graph of `tables`, in that order, and `links`, every key and
    /// link column of type `types`.
    fn graph(tables: &[&'static Table], links: Vec<Link>, types: &str) -> Graph {
        Graph {
            shapes: tables
                .iter()
                .map(|t| Shape {
                    table: t,
                    relation: format!(r#""public"."{}""#, t.name),
                    key_types: vec![types.into()],
                    self_referencing: false,
                    rule_type: None,
                })
                .collect(),
            links: links
                .into_iter()
                .map(|mut link| {
                    link.types = vec![types.into()];
                    link
                })
                .collect(),
        }
    }

    #[test]
    fn a_deep_chain_reads_what_is_kept_below_it_and_never_a_query_twice_over() {
        let graph = chain();
        let closed = Closed::new(&graph, "u1", None).expect("short queries");
        let [country, city, address, customer, rental, payment] = [0, 1, 2, 3, 4, 5];
        // Read by rentals and addresses, customers are kept; addresses,
        // read by cities that countries read, are kept too. Cities (read by
        // countries alone) and rentals (by payments alone, which nothing
        // reads) are named in place.
        let kept: Vec<&str> = closed.kept().iter().map(|k| k.table.as_str()).collect();
        assert_eq!(kept, [kept_name(customer), kept_name(address)]);
        // What is kept of them: the columns their readers read, each
        // combination once where the key is not among them.
        assert!(
            closed.kept()[0]
                .make
                .contains(r#"SELECT a."address_id", a."id" FROM"#),
            "{}",
            closed.kept()[0].make
        );
        assert!(
            closed.kept()[1]
                .make
                .contains(r#"SELECT DISTINCT a."city_id" FROM"#),
            "{}",
            closed.kept()[1].make
        );
        let query = |t: usize| closed.rows(t).clone().expect("rows");
        // Countries read the cities in place, which read the addresses
        // kept: nothing of the customers below.
        assert!(query(country).contains(&kept_name(address)));
        assert!(!query(country).contains(r#""customer""#));
        assert!(query(city).contains(&kept_name(address)));
        // Customers are their rule's filter: a rental is there only as
        // its customer's follower, a payment as its rental's, so neither
        // brings a parent.
        assert_eq!(
            query(customer),
            r#"SELECT a.* FROM "public"."customer" a WHERE a."unit"::text = E'u1'"#
        );
        assert!(query(rental).contains(&kept_name(customer)));
        assert!(query(payment).contains(r#""rental""#));
        assert!(!query(payment).contains(r#""customer" a WHERE"#));
    }

    static BRANCH: Table = table(
        "branch",
        Rule::Partition("id"),
        &[column("id", Kind::Int32)],
    );
    static ACCOUNT: Table = table(
        "account",
        Rule::Partition("branch_id"),
        &[column("id", Kind::Int32), column("branch_id", Kind::Int32)],
    );
    static HISTORY: Table = table(
        "history",
        Rule::Partition("branch_id"),
        &[
            column("id", Kind::Int32),
            column("branch_id", Kind::Int32),
            column("account_id", Kind::Int32),
        ],
    );

    /// branch ← account ← history, and history → branch: pgbench's
    /// shape, every table by the partition its branch is.
    fn bank(types: &str) -> Graph {
        graph(
            &[&BRANCH, &ACCOUNT, &HISTORY],
            vec![
                link(&ACCOUNT, "branch_id", &BRANCH, false),
                link(&HISTORY, "branch_id", &BRANCH, false),
                link(&HISTORY, "account_id", &ACCOUNT, false),
            ],
            types,
        )
    }

    #[test]
    fn a_branch_reads_only_the_accounts_its_rule_does_not_give_for_their_branches() {
        let graph = bank("integer");
        let implied: Vec<bool> = graph.links.iter().map(|l| graph.implied(l)).collect();
        // An account's branch is its partition; a history row's account
        // is any branch's.
        assert_eq!(implied, [true, true, false]);
        let closed = Closed::new(&graph, "b1", Some("1")).expect("short queries");
        let query = |t: usize| closed.rows(t).clone().expect("rows");
        let [branch, account, history] = [0, 1, 2];
        let ruled_accounts = r#""public"."account" a WHERE a."branch_id" = 1"#;
        assert!(
            query(account).contains(ruled_accounts),
            "{}",
            query(account)
        );
        // The branches of the accounts history brings, and of no other:
        // not branch 1's accounts again, nor history (all of it branch 1's).
        assert!(query(branch).contains(r#""account""#), "{}", query(branch));
        assert!(!query(branch).contains(ruled_accounts), "{}", query(branch));
        let kept: Vec<&str> = closed.kept().iter().map(|k| k.make.as_str()).collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert!(
            kept[0].contains(r#"SELECT DISTINCT a."account_id" FROM"#),
            "{kept:?}"
        );
        assert_eq!(
            query(history),
            r#"SELECT a.* FROM "public"."history" a WHERE a."branch_id" = 1"#
        );
        // Where equal keys may print apart, nothing is implied.
        for types in ["text", "numeric", "character varying"] {
            let graph = bank(types);
            assert!(!graph.links.iter().any(|l| graph.implied(l)), "{types}");
        }
    }
}
