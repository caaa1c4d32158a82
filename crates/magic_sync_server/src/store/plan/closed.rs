//! A fresh replica's set in closed form: for each table, a condition on its
//! rows that says, in one query over the host's tables, whether the replica
//! wants the row. A snapshot streams its rows by these conditions before
//! anything is planned, and plans its record afterwards, in the same view
//! (`relay::snapshot`).
//!
//! The planner works the set out round by round into `_ms_f`: the rows the
//! rules give, then the parents of rows in it and the followers of rows in
//! it, until a round adds nothing. Table by table the same closure reads:
//! a table's rows are those its rule gives, the parents of its child
//! tables' rows, and the followers of its parent's rows. So a table's
//! condition names the conditions of the tables it depends on. Two
//! dependencies never need following:
//!
//! - the parents of rows in an `all` table's place: every row of it is
//!   there by its rule;
//! - the parents of a follower that nothing points at, through the link it
//!   follows: such a row is there only because its parent is.
//!
//! What is left is acyclic in most schemas, and each condition is a
//! semi-join PostgreSQL hashes. Where tables still depend on one another in
//! a cycle (a table pointing at itself, a follower that is a parent too),
//! their rows are found together by one recursive query, a round of the
//! planner per step of its recursion.

use crate::graph::{key_json, key_match, rule_for, Graph, Link};
use crate::row::Rule;
use crate::sql::{escaped, ident, literal};
use std::cell::Cell;

/// The longest condition built: past it (a schema whose tables share
/// parents many times over, each named again in every condition that
/// leans on it) the snapshot plans first instead.
const LONGEST: usize = 256 << 10;

/// Why a table's rows belong to a fresh replica, besides its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Parents of the rows of link `.0`'s child.
    ParentOf(usize),
    /// Followers, through link `.0`, of its parent's rows.
    Follows(usize),
}

/// Per table of the graph, in its order, the condition under which a row
/// `a` of it belongs to one fresh replica's set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Closed {
    conditions: Vec<String>,
}

impl Closed {
    /// The conditions for the replica `replica` of partition `partition`.
    /// `None` when they would be too long to send.
    pub fn new(graph: &Graph, replica: &str, partition: Option<&str>) -> Option<Closed> {
        let builder = Builder::new(graph, replica, partition);
        let mut conditions = Vec::with_capacity(graph.shapes.len());
        for t in 0..graph.shapes.len() {
            let condition = builder.condition(t, "a");
            if condition.len() > LONGEST {
                return None;
            }
            conditions.push(condition);
        }
        Some(Closed { conditions })
    }

    /// The condition on the row `a` of the graph's table `index`.
    pub fn condition(&self, index: usize) -> &str {
        &self.conditions[index]
    }
}

struct Builder<'a> {
    graph: &'a Graph,
    /// The replica's id and partition as SQL literals.
    replica: String,
    partition: String,
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
}

impl<'a> Builder<'a> {
    fn new(graph: &'a Graph, replica: &str, partition: Option<&str>) -> Builder<'a> {
        let index = |name: &str| {
            graph
                .shapes
                .iter()
                .position(|s| s.table.name == name)
                .expect("a link between tables of the graph")
        };
        // A follower that nothing points at is in the set only as its
        // parent's follower.
        let only_follows = |table: &str| {
            matches!(graph.shape(table).table.rule, Rule::Follows(_))
                && !graph.links.iter().any(|l| l.parent.name == table)
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
            replica: escaped(replica),
            partition: partition.map_or_else(|| "NULL::text".to_string(), escaped),
            sources,
            component,
            cyclic,
            drawn: Cell::new(0),
        }
    }

    fn draw(&self, prefix: &str) -> String {
        let n = self.drawn.get() + 1;
        self.drawn.set(n);
        format!("{prefix}{n}")
    }

    /// The table a source depends on.
    fn from(&self, source: Source) -> &'static str {
        match source {
            Source::ParentOf(l) => self.graph.links[l].child.name,
            Source::Follows(l) => self.graph.links[l].parent.name,
        }
    }

    fn index(&self, name: &str) -> usize {
        self.graph
            .shapes
            .iter()
            .position(|s| s.table.name == name)
            .expect("a table of the graph")
    }

    /// Whether the row `alias` of table `t` is in the set.
    fn condition(&self, t: usize, alias: &str) -> String {
        if self.cyclic[self.component[t]] {
            return self.in_cycle(t, alias);
        }
        let table = self.graph.shapes[t].table;
        let rule = rule_for(table, alias, &self.replica, &self.partition);
        let mut any: Vec<String> = rule.into_iter().collect();
        for &source in &self.sources[t] {
            any.push(self.through(source, alias));
        }
        match any.len() {
            0 => "false".into(),
            1 => any.remove(0),
            _ => format!("({})", any.join(" OR ")),
        }
    }

    /// Whether the row `alias` is in the set through `source`, whose table
    /// is not in a cycle with the row's.
    fn through(&self, source: Source, alias: &str) -> String {
        let other = self.draw("x");
        match source {
            Source::ParentOf(l) => {
                // Its key among what the child's rows point at.
                let link = &self.graph.links[l];
                let child = self.index(link.child.name);
                format!(
                    "({}) IN (SELECT {} FROM {} {other} WHERE {})",
                    columns(alias, link.parent.key),
                    columns(&other, &link.columns),
                    self.graph.shapes[child].relation,
                    self.condition(child, &other),
                )
            }
            Source::Follows(l) => {
                // What it points at, among the parent's rows.
                let link = &self.graph.links[l];
                let parent = self.index(link.parent.name);
                format!(
                    "({}) IN (SELECT {} FROM {} {other} WHERE {})",
                    columns(alias, &link.columns),
                    columns(&other, link.parent.key),
                    self.graph.shapes[parent].relation,
                    self.condition(parent, &other),
                )
            }
        }
    }

    /// Whether the row `alias` of table `t`, in a cycle of tables that
    /// depend on one another, is in the set: its key among those a
    /// recursive query over the whole cycle finds.
    fn in_cycle(&self, t: usize, alias: &str) -> String {
        let c = self.component[t];
        let w = self.draw("w");
        let mut bases = Vec::new();
        let mut steps: Vec<String> = Vec::new();
        for (m, shape) in self.graph.shapes.iter().enumerate() {
            if self.component[m] != c {
                continue;
            }
            let table = shape.table;
            let y = self.draw("x");
            // What it has from outside the cycle: its rule, and sources in
            // other components.
            let mut any: Vec<String> = rule_for(table, &y, &self.replica, &self.partition)
                .into_iter()
                .collect();
            for &source in &self.sources[m] {
                if self.component[self.index(self.from(source))] != c {
                    any.push(self.through(source, &y));
                }
            }
            if !any.is_empty() {
                bases.push(format!(
                    "SELECT {}::text, {} FROM {} {y} WHERE {}",
                    literal(table.name),
                    key_json(&y, table),
                    shape.relation,
                    any.join(" OR ")
                ));
            }
            // A step from a row found to the rows it brings of this table.
            for &source in &self.sources[m] {
                let from = self.index(self.from(source));
                if self.component[from] != c {
                    continue;
                }
                let z = self.draw("x");
                steps.push(self.step(source, m, from, &w, &z));
            }
        }
        if bases.is_empty() {
            return "false".into();
        }
        let table = self.graph.shapes[t].table;
        let recursive = match steps.is_empty() {
            true => String::new(),
            false => format!(
                " UNION SELECT e.t, e.k FROM {w} CROSS JOIN LATERAL ({}) e",
                steps.join(" UNION ALL ")
            ),
        };
        format!(
            "{} IN (WITH RECURSIVE {w} (t, k) AS ({}{recursive}) SELECT {w}.k FROM {w} WHERE {w}.t = {})",
            key_json(alias, table),
            bases.join(" UNION ALL "),
            literal(table.name),
        )
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

/// `alias.a, alias.b`.
fn columns(alias: &str, names: &[impl AsRef<str>]) -> String {
    names
        .iter()
        .map(|c| format!("{alias}.{}", ident(c.as_ref())))
        .collect::<Vec<_>>()
        .join(", ")
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
    use super::components;

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
