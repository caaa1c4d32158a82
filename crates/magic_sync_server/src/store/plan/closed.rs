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
//! names the queries of the tables it depends on. Two dependencies never
//! need following:
//!
//! - the parents of rows in an `all` table's place: every row of it is
//!   there by its rule;
//! - the parents of a follower that nothing points at, through the link it
//!   follows: such a row is there only because its parent is.
//!
//! What is left is acyclic in most schemas. Where tables still depend on
//! one another in a cycle (a table pointing at itself, a follower that is a
//! parent too), their rows are found together by one recursive query, a
//! round of the planner per step of its recursion.
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

/// The longest query built: past it (a schema whose tables share parents
/// many times over, each named again in every query that leans on it) the
/// snapshot plans first instead.
const LONGEST: usize = 256 << 10;

/// Why a table's rows belong to a fresh replica, besides its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Parents of the rows of link `.0`'s child.
    ParentOf(usize),
    /// Followers, through link `.0`, of its parent's rows.
    Follows(usize),
}

/// Per table of the graph, in its order, the query of the rows of it one
/// fresh replica wants (every column, as `a.*` gives them), each once;
/// `None` for a table it wants nothing of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Closed {
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
                queries,
                filter_only,
            }),
        }
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
    /// Aliases drawn so far.
    drawn: Cell<usize>,
    /// Per table, its query once built (the same text wherever it is
    /// named: its aliases are its own).
    built: RefCell<Vec<Option<Option<String>>>>,
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
        // A follower that nothing points at, following one parent, is in
        // the set only as that parent's follower.
        let only_follows = |table: &str| {
            matches!(graph.shape(table).table.rule, Rule::Follows(_))
                && !graph.links.iter().any(|l| l.parent.name == table)
                && graph
                    .links
                    .iter()
                    .filter(|l| l.follows && l.child.name == table)
                    .count()
                    == 1
        };
        let mut sources = vec![Vec::new(); graph.shapes.len()];
        for (i, link) in graph.links.iter().enumerate() {
            // Parents that are there anyway: every row of an `all` table, the
            // parent of a row that is there only as its follower.
            let there_anyway = matches!(link.parent.rule, Rule::All)
                || (link.follows && only_follows(link.child.name));
            if !there_anyway {
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
        Builder {
            graph,
            replica,
            partition,
            sources,
            component,
            cyclic,
            drawn: Cell::new(0),
            built: RefCell::new(vec![None; graph.shapes.len()]),
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
            false => self.rows_from(t, &self.sources[t]),
        };
        if rows.as_ref().is_some_and(|r| r.len() > LONGEST) {
            self.too_long.set(true);
            return None;
        }
        self.built.borrow_mut()[t] = Some(rows.clone());
        rows
    }

    /// The rows of table `t` its rule gives and `sources` bring (none of
    /// them in a cycle with it), each once, in disjoint parts: the rows its
    /// rule's filter keeps; then, of the others, those looked up by key (a
    /// group's members, the parents of child tables' rows, and the
    /// followers too when there are such); or else the followers, joined to
    /// their parents' keys.
    fn rows_from(&self, t: usize, sources: &[Source]) -> Option<String> {
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
        if let Some(filter) = &filter {
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
            let p = self.draw("p");
            parts.push(format!(
                "SELECT a.* FROM {rel} a JOIN (SELECT DISTINCT * FROM ({parents}) k) {p} ON {}{not_ruled}",
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
        let child = self.rows(self.index(link.child.name))?;
        let parent = self.graph.shape(link.parent.name);
        let x = self.draw("x");
        let present: Vec<String> = link
            .columns
            .iter()
            .map(|c| format!("{x}.{} IS NOT NULL", ident(c)))
            .collect();
        Some(format!(
            "SELECT {} FROM ({child}) {x} WHERE {}",
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
        let parent = self.rows(index)?;
        let x = self.draw("x");
        Some(format!(
            "SELECT {} FROM ({parent}) {x}",
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
        let c = self.component[t];
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
            if let Some(rows) = self.rows_from(m, &outside) {
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
        let shape = &self.graph.shapes[t];
        let recursive = match steps.is_empty() {
            true => String::new(),
            false => format!(
                " UNION SELECT e.t, e.k FROM {w} CROSS JOIN LATERAL ({}) e",
                steps.join(" UNION ALL ")
            ),
        };
        let o = self.draw("o");
        Some(format!(
            "SELECT a.* FROM (WITH RECURSIVE {w} (t, k) AS ({}{recursive}) \
             SELECT DISTINCT {w}.k FROM {w} WHERE {w}.t = {}) {o} \
             CROSS JOIN LATERAL (SELECT * FROM {} a WHERE {} OFFSET 0) a",
            bases.join(" UNION ALL "),
            literal(shape.table.name),
            shape.relation,
            key_match("a", shape, &format!("{o}.k")),
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
    use super::{components, equals};
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
}
