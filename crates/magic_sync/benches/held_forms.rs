//! The record's form (issue 10, item 3): `sync.held` as migrations 003, 004
//! and 007 made it, against narrower forms of it, written by a snapshot and
//! read and written by steady passes, all in one run with today's form as
//! the baseline.
//!
//! cargo bench -p magic_sync --features postgres --bench held_forms
//!
//! The forms. Each is keyed row first (table, key, replica), has an index
//! on the replica, keeps a fifth of each page free (decisions 21 and 37) and
//! the same columns in the same order; only the types of the row's names
//! change:
//! - *today*: `replica text, table_name text, key jsonb`, made `LIKE
//!   sync.held` with its storage options, so it is the migrations' form;
//! - *key text*: names as today, the key as `text COLLATE "C"` (see below),
//!   to tell what the key's type is worth alone;
//! - *ids*: `replica int, table_id smallint`, ids from two small lookup
//!   tables (`forms.replicas`, `forms.tables`), the key still `jsonb`;
//! - *ids, key bytea* and *ids, key text*: the same, with the key as the
//!   bytes of its text, or as `text COLLATE "C"`. A key's text here is
//!   `jsonb`'s own (`[5, 2]`; decision 18's canonical text has no space),
//!   because the planner's keys are `jsonb` (built by `jsonb_build_array`,
//!   read from notes and from `ptrs`) and `k::text` is what it can turn
//!   them into per row: every statement below converts at the record's
//!   edge, and the planner's own tables keep `jsonb` keys. With ids, they
//!   carry the ids (the relay would know them from the start of a pass).
//!
//! 1. *Recording a snapshot* (MAGIC_SYNC_BENCH_REPEATS times, default 3,
//!    the fastest of each kept): one replica's million rows across the
//!    provisioning bench's five tables, staged in `_ms_f` as the relay's
//!    provisioning stages them (the same statements, on the same data), with
//!    `refs` counted as its closing batch counts them. Each write alone in a
//!    transaction of its own, into an empty table, after a checkpoint:
//!    (a) `INSERT ... SELECT` from the staged rows in their order, as the
//!    relay does today, (b) the same sorted in the primary key's order,
//!    (c) binary `COPY` from the client in the staged order, (d) the same
//!    sorted on the client (the sort timed with it). Time, rows per second,
//!    and bytes per row of the table and of its indexes.
//! 2. *Steady passes*: a record of 10 replicas holding 200,000 rows each
//!    (stores and products every replica holds, customers two neighbours
//!    share, orders and their lines each its own). Per round and form, in
//!    one transaction as a pass has them, the planner's and the closing
//!    batch's statements on `sync.held`, mirrored from `relay::plan` and
//!    `relay::held`: the holders of 10,000 random rows looked up by (table,
//!    key) (`question_changed`), 10,000 rows by (table, key, replica)
//!    (`question_granted`), then with hash and merge joins off as the
//!    closing batch has them: 5,000 rows taken back, 10,000 sent again
//!    (version, message, ruled, ptrs), 5,000 sent new, and `refs` moved on
//!    the parents of all three. The host reads beside them are left out:
//!    they are the same whatever the record's form. One round to warm up,
//!    then MAGIC_SYNC_BENCH_ROUNDS (default 7), the forms in a rotating
//!    order; medians, and HOT updates counted.
//!
//! Autovacuum is off on the forms' tables so that it never runs beside a
//! timed statement (the steady rounds change far fewer rows than its
//! thresholds anyway); each table is vacuumed and analysed once built.
//!
//! MAGIC_SYNC_BENCH_ROWS sets the snapshot's rows (default 1,000,000),
//! MAGIC_SYNC_BENCH_HELD the rows each replica holds in part 2 (default
//! 200,000), MAGIC_SYNC_BENCH_SEED the random rows' seed (printed);
//! MAGIC_SYNC_BENCH_EXPLAIN=1 prints the plan of every steady statement in
//! every form, once.

use anyhow::{ensure, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, SimpleQueryMessage};

// ---- The tables, the links and the forms ----

/// The provisioning bench's tables, parents first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Table {
    Stores,
    Products,
    Customers,
    Orders,
    Lines,
}

impl Table {
    const ALL: [Table; 5] = [
        Table::Stores,
        Table::Products,
        Table::Customers,
        Table::Orders,
        Table::Lines,
    ];

    fn name(self) -> &'static str {
        match self {
            Table::Stores => "stores",
            Table::Products => "products",
            Table::Customers => "customers",
            Table::Orders => "orders",
            Table::Lines => "lines",
        }
    }

    /// Its id in the narrower forms (`forms.tables`): parents first.
    fn id(self) -> i16 {
        self as i16 + 1
    }

    /// Whether its own rule sends its rows (stores and products are `all`,
    /// orders go by their unit); customers come as parents, lines follow.
    fn ruled(self) -> bool {
        !matches!(self, Table::Customers | Table::Lines)
    }
}

/// The links `sync.held` tracks (`ptrs`, `refs`): child, link name, parent.
/// Links into `all` tables (products, stores) are not tracked.
const LINKS: [(Table, &str, Table); 2] = [
    (Table::Orders, "customer_id", Table::Customers),
    (Table::Lines, "order_id", Table::Orders),
];

/// A candidate form of `sync.held`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Form {
    Today,
    Text,
    Ids,
    IdsBytea,
    IdsText,
}

impl Form {
    const ALL: [Form; 5] = [
        Form::Today,
        Form::Text,
        Form::Ids,
        Form::IdsBytea,
        Form::IdsText,
    ];

    fn label(self) -> &'static str {
        match self {
            Form::Today => "today: text, text, jsonb",
            Form::Text => "text, text, key text",
            Form::Ids => "ids, key jsonb",
            Form::IdsBytea => "ids, key bytea",
            Form::IdsText => "ids, key text",
        }
    }

    fn relation(self) -> &'static str {
        match self {
            Form::Today => "forms.today",
            Form::Text => "forms.text",
            Form::Ids => "forms.ids",
            Form::IdsBytea => "forms.ids_bytea",
            Form::IdsText => "forms.ids_text",
        }
    }

    /// A short name for the temporary tables that feed it.
    fn tag(self) -> &'static str {
        &self.relation()["forms.".len()..]
    }

    fn with_ids(self) -> bool {
        !matches!(self, Form::Today | Form::Text)
    }

    fn table_column(self) -> &'static str {
        if self.with_ids() {
            "table_id"
        } else {
            "table_name"
        }
    }

    fn replica_type(self) -> &'static str {
        if self.with_ids() {
            "int"
        } else {
            "text"
        }
    }

    fn table_type(self) -> &'static str {
        if self.with_ids() {
            "smallint"
        } else {
            "text"
        }
    }

    fn key_type(self) -> &'static str {
        match self {
            Form::Today | Form::Ids => "jsonb",
            Form::IdsBytea => "bytea",
            Form::Text | Form::IdsText => "text COLLATE \"C\"",
        }
    }

    /// The record's key for the planner's `jsonb` key `k`.
    fn key(self, k: &str) -> String {
        match self {
            Form::Today | Form::Ids => k.to_string(),
            Form::IdsBytea => format!("convert_to(({k})::text, 'UTF8')"),
            Form::Text | Form::IdsText => format!("({k})::text"),
        }
    }

    /// How the form names `replica`, as SQL.
    fn replica(self, replica: &Replica) -> String {
        if self.with_ids() {
            replica.id.to_string()
        } else {
            format!("'{}'", replica.name)
        }
    }

    /// How the form names `table`, as SQL.
    fn table(self, table: Table) -> String {
        if self.with_ids() {
            format!("{}::smallint", table.id())
        } else {
            format!("'{}'", table.name())
        }
    }

    /// How the form names a table whose name is the SQL text `name`.
    fn table_of_name(self, name: &str) -> String {
        if !self.with_ids() {
            return name.to_string();
        }
        let arms: String = Table::ALL
            .iter()
            .map(|t| format!(" WHEN '{}' THEN {}", t.name(), t.id()))
            .collect();
        format!("(CASE {name}{arms} END)::smallint")
    }

    /// The tracked links as a `VALUES` list (c, name, p), as
    /// `Graph::tracked_values` writes it.
    fn links(self) -> String {
        let rows: Vec<String> = LINKS
            .iter()
            .map(|(c, name, p)| format!("({}, '{name}', {})", self.table(*c), self.table(*p)))
            .collect();
        format!("(VALUES {}) AS l (c, name, p)", rows.join(", "))
    }

    /// The statement that makes the form's table; `options` are
    /// `sync.held`'s storage options.
    fn create(self, options: &str) -> String {
        if self == Form::Today {
            return format!(
                "CREATE TABLE forms.today (LIKE sync.held INCLUDING ALL) WITH ({options});"
            );
        }
        format!(
            "CREATE TABLE {rel} (
                 replica  {rt}     NOT NULL,
                 {tc} {tt} NOT NULL,
                 key      {key}    NOT NULL,
                 version  bigint   NOT NULL,
                 message  bigint   NOT NULL,
                 ruled    boolean  NOT NULL DEFAULT false,
                 ptrs     jsonb,
                 refs     integer  NOT NULL DEFAULT 0,
                 PRIMARY KEY ({tc}, key, replica)
             ) WITH ({options});
             CREATE INDEX ON {rel} (replica);",
            rel = self.relation(),
            rt = self.replica_type(),
            tc = self.table_column(),
            tt = self.table_type(),
            key = self.key_type(),
        )
    }

    /// The types of a row of the form, in its columns' order, for `COPY`.
    fn copy_types(self) -> Vec<Type> {
        let (replica, table) = if self.with_ids() {
            (Type::INT4, Type::INT2)
        } else {
            (Type::TEXT, Type::TEXT)
        };
        let key = match self {
            Form::Today | Form::Ids => Type::JSONB,
            Form::IdsBytea => Type::BYTEA,
            Form::Text | Form::IdsText => Type::TEXT,
        };
        vec![
            replica,
            table,
            key,
            Type::INT8,
            Type::INT8,
            Type::BOOL,
            Type::JSONB,
            Type::INT4,
        ]
    }
}

/// A replica as `forms.replicas` has it.
#[derive(Debug, Clone)]
struct Replica {
    id: i32,
    name: String,
}

/// Makes the forms' tables, empty, and the lookup tables of the narrower
/// ones, with the replicas named `names`.
async fn make_forms(client: &Client, names: &[String]) -> Result<Vec<Replica>> {
    let options: String = client
        .query_one(
            "SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = 'sync.held'::regclass",
            &[],
        )
        .await?
        .get::<_, Option<String>>(0)
        .context("sync.held has storage options (fillfactor, migration 004)")?;
    let mut sql = String::from(
        "CREATE SCHEMA forms;
         CREATE TABLE forms.replicas (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL UNIQUE);
         CREATE TABLE forms.tables (id smallint PRIMARY KEY, name text NOT NULL UNIQUE);",
    );
    for form in Form::ALL {
        sql.push_str(&form.create(&options));
        writeln!(
            sql,
            "ALTER TABLE {} SET (autovacuum_enabled = false);",
            form.relation()
        )?;
    }
    for t in Table::ALL {
        writeln!(
            sql,
            "INSERT INTO forms.tables VALUES ({}, '{}');",
            t.id(),
            t.name()
        )?;
    }
    client.batch_execute(&sql).await?;
    let mut replicas = Vec::new();
    for name in names {
        let id: i32 = client
            .query_one(
                "INSERT INTO forms.replicas (name) VALUES ($1) RETURNING id",
                &[name],
            )
            .await?
            .get(0);
        replicas.push(Replica {
            id,
            name: name.clone(),
        });
    }
    println!("sync.held's storage options, given to every form: {options}");
    Ok(replicas)
}

/// Bytes of the table and of its indexes.
async fn bytes(client: &Client, form: Form) -> Result<(i64, i64)> {
    let row = client
        .query_one(
            "SELECT pg_table_size($1::text::regclass), pg_indexes_size($1::text::regclass)",
            &[&form.relation()],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Runs `sql` (one statement, no parameters) and returns the rows it
/// returned or changed.
async fn count(client: &Client, sql: &str) -> Result<u64> {
    let mut n = 0;
    for message in client
        .simple_query(sql)
        .await
        .with_context(|| format!("running {sql}"))?
    {
        if let SimpleQueryMessage::CommandComplete(rows) = message {
            n = rows;
        }
    }
    Ok(n)
}

/// `sql`, timed, and the rows it returned or changed.
async fn timed(client: &Client, sql: &str) -> Result<(Duration, u64)> {
    let started = Instant::now();
    let n = count(client, sql).await?;
    Ok((started.elapsed(), n))
}

// ---- 1. Recording a snapshot ----

/// Rows per table for `total` rows in all, as the provisioning bench has them.
fn snapshot_sizes(total: i64) -> [(Table, i64); 5] {
    [
        (Table::Stores, (total / 1000).max(1)),
        (Table::Products, total * 99 / 1000),
        (Table::Customers, total / 10),
        (Table::Orders, total * 3 / 10),
        (Table::Lines, total / 2),
    ]
}

/// The provisioning bench's tables and data, every order the snapshot's
/// replica's.
fn host_tables(total: i64) -> String {
    let [(_, stores), (_, products), (_, customers), (_, orders), (_, lines)] =
        snapshot_sizes(total);
    format!(
        "CREATE TABLE stores (id bigint PRIMARY KEY, name text NOT NULL);
         CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL,
                                store_id bigint NOT NULL REFERENCES stores);
         CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text);
         CREATE TABLE orders (id bigint PRIMARY KEY, unit_id text NOT NULL, customer_id bigint REFERENCES customers,
                              placed_at timestamptz NOT NULL);
         CREATE TABLE lines (order_id bigint REFERENCES orders, line_no integer, product_id bigint NOT NULL REFERENCES products,
                             qty integer NOT NULL, PRIMARY KEY (order_id, line_no));
         INSERT INTO stores SELECT i, 'store ' || i FROM generate_series(1, {stores}) i;
         INSERT INTO products SELECT i, 'product number ' || i, (i % 1000) / 10.0, 1 + i % {stores} FROM generate_series(1, {products}) i;
         INSERT INTO customers SELECT i, 'customer ' || i, CASE WHEN i % 3 = 0 THEN NULL ELSE 'c' || i || '@example.com' END
             FROM generate_series(1, {customers}) i;
         INSERT INTO orders SELECT i, 'r1', 1 + i % {customers}, timestamptz '2026-11-30 09:00:00+00' + i * interval '1 second'
             FROM generate_series(1, {orders}) i;
         INSERT INTO lines SELECT 1 + i % {orders}, 1 + i / {orders}, 1 + i % {products}, 1 + i % 7
             FROM generate_series(0, {lines} - 1) i;
         ANALYZE;"
    )
}

/// `_ms_f` for replica `r1` as `Planner::provision` fills it (its
/// statements, written out for these tables, hashed as `Planner::bulk`
/// has them), with each row's `refs` counted as `held::closing` counts
/// them. `ord` keeps the order the rows came in.
const STAGE: &str = "
CREATE TEMP TABLE _ms_f (ord bigint GENERATED ALWAYS AS IDENTITY, r text, t text, k jsonb,
    round int NOT NULL, ptrs jsonb, via int NOT NULL DEFAULT -1, refs int NOT NULL DEFAULT 0);
SET enable_nestloop = off; SET enable_mergejoin = off;
INSERT INTO _ms_f (r, t, k, round, ptrs)
    SELECT 'r1', 'stores', jsonb_build_array(a.id), 0, NULL::jsonb FROM stores a;
INSERT INTO _ms_f (r, t, k, round, ptrs)
    SELECT 'r1', 'products', jsonb_build_array(a.id), 0, NULL::jsonb FROM products a;
INSERT INTO _ms_f (r, t, k, round, ptrs)
    SELECT 'r1', 'orders', jsonb_build_array(a.id), 0,
           jsonb_strip_nulls(jsonb_build_object('customer_id',
               CASE WHEN a.customer_id IS NULL THEN NULL ELSE jsonb_build_array(a.customer_id) END))
    FROM orders a WHERE a.unit_id = 'r1';
ANALYZE _ms_f;
INSERT INTO _ms_f (r, t, k, round, ptrs)
    SELECT x.r, 'customers', x.ptr, 1, a.ptrs
    FROM (SELECT DISTINCT n.r, n.ptrs -> 'customer_id' AS ptr FROM _ms_f n
          WHERE n.t = 'orders' AND n.round = 0 AND n.ptrs ? 'customer_id' AND n.via <> 0) x
    CROSS JOIN LATERAL (SELECT NULL::jsonb AS ptrs FROM customers a
                        WHERE a.id = (x.ptr ->> 0)::bigint OFFSET 0) a
    WHERE NOT EXISTS (SELECT 1 FROM _ms_f f WHERE f.r = x.r AND f.t = 'customers' AND f.k = x.ptr);
INSERT INTO _ms_f (r, t, k, round, ptrs, via)
    SELECT n.r, 'lines', jsonb_build_array(a.order_id, a.line_no), 1,
           jsonb_strip_nulls(jsonb_build_object('order_id',
               CASE WHEN a.order_id IS NULL THEN NULL ELSE jsonb_build_array(a.order_id) END)), 1
    FROM _ms_f n JOIN lines a ON a.order_id = (n.k ->> 0)::bigint
    WHERE n.t = 'orders' AND n.round = 0;
UPDATE _ms_f f SET refs = c.n
    FROM (SELECT f.r, l.p AS t, f.ptrs -> l.name AS k, count(*)::int AS n
          FROM _ms_f f JOIN (VALUES ('orders', 'customer_id', 'customers'), ('lines', 'order_id', 'orders'))
                            AS l (c, name, p) ON l.c = f.t
          WHERE f.ptrs ? l.name GROUP BY 1, 2, 3) c
    WHERE c.r = f.r AND c.t = f.t AND c.k = f.k;
RESET enable_nestloop; RESET enable_mergejoin;
ANALYZE _ms_f;";

/// The message every snapshot row is recorded with (the replica's last of
/// the pass).
const SNAPSHOT_MESSAGE: i64 = 7;

/// The staged rows in each form's types, as the relay's `_ms_f` would carry
/// them: `_snap_<form>`, in the staged order.
async fn stage_per_form(client: &Client, r1: &Replica) -> Result<()> {
    for form in Form::ALL {
        client
            .batch_execute(&format!(
                "CREATE TEMP TABLE _snap_{tag} AS
                     SELECT {r}::{rt} AS r, {t} AS t, f.k, 0::bigint AS version,
                            {SNAPSHOT_MESSAGE}::bigint AS message, f.round = 0 AS ruled, f.ptrs, f.refs
                     FROM _ms_f f ORDER BY f.ord;
                 ANALYZE _snap_{tag};",
                tag = form.tag(),
                r = form.replica(r1),
                rt = form.replica_type(),
                t = form.table_of_name("f.t"),
            ))
            .await?;
    }
    Ok(())
}

/// A staged row as the client holds it for `COPY`.
#[derive(Debug)]
struct Staged {
    table: Table,
    /// The key's values, for sorting in `jsonb`'s order.
    key: Vec<i64>,
    /// The key's text (`jsonb`'s).
    text: String,
    json: Value,
    ruled: bool,
    ptrs: Option<Value>,
    refs: i32,
}

async fn read_staged(client: &Client) -> Result<Vec<Staged>> {
    let rows = client
        .query(
            "SELECT f.t, f.k::text, f.round = 0, f.ptrs::text, f.refs FROM _ms_f f ORDER BY f.ord",
            &[],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let name: &str = row.get(0);
            let table = Table::ALL
                .into_iter()
                .find(|t| t.name() == name)
                .with_context(|| format!("a staged row of an unknown table `{name}`"))?;
            let text: String = row.get(1);
            let json: Value = serde_json::from_str(&text)?;
            let key = json
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_i64).collect())
                .unwrap_or_default();
            let ptrs = row
                .get::<_, Option<&str>>(3)
                .map(serde_json::from_str)
                .transpose()?;
            Ok(Staged {
                table,
                key,
                text,
                json,
                ruled: row.get(2),
                ptrs,
                refs: row.get(4),
            })
        })
        .collect()
}

/// How a snapshot's rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Write {
    Insert,
    InsertSorted,
    Copy,
    CopySorted,
}

impl Write {
    const ALL: [Write; 4] = [
        Write::Insert,
        Write::InsertSorted,
        Write::Copy,
        Write::CopySorted,
    ];

    fn label(self) -> &'static str {
        match self {
            Write::Insert => "(a) INSERT ... SELECT, staged order",
            Write::InsertSorted => "(b) INSERT ... SELECT ... ORDER BY the key",
            Write::Copy => "(c) COPY binary, staged order",
            Write::CopySorted => "(d) COPY binary, sorted on the client",
        }
    }
}

/// (a) and (b): from the staged rows, in one transaction.
async fn write_insert(client: &Client, form: Form, sorted: bool) -> Result<u64> {
    let key = form.key("f.k");
    let order = if sorted {
        format!("ORDER BY f.t, {key}, f.r")
    } else {
        String::new()
    };
    client.batch_execute("BEGIN").await?;
    let n = count(
        client,
        &format!(
            "INSERT INTO {rel} (replica, {tc}, key, version, message, ruled, ptrs, refs)
             SELECT f.r, f.t, {key}, f.version, f.message, f.ruled, f.ptrs, f.refs
             FROM _snap_{tag} f {order}",
            rel = form.relation(),
            tc = form.table_column(),
            tag = form.tag(),
        ),
    )
    .await?;
    client.batch_execute("COMMIT").await?;
    Ok(n)
}

/// (c) and (d): binary `COPY` from the client, sorted in the form's key
/// order first when `sorted`.
async fn write_copy(
    client: &Client,
    form: Form,
    r1: &Replica,
    staged: &[Staged],
    sorted: bool,
) -> Result<u64> {
    let mut rows: Vec<&Staged> = staged.iter().collect();
    if sorted {
        match form {
            // `jsonb` orders arrays of one length element by element.
            Form::Today => {
                rows.sort_by(|a, b| (a.table.name(), &a.key).cmp(&(b.table.name(), &b.key)))
            }
            Form::Ids => rows.sort_by(|a, b| (a.table, &a.key).cmp(&(b.table, &b.key))),
            Form::Text => rows.sort_by(|a, b| {
                (a.table.name(), a.text.as_bytes()).cmp(&(b.table.name(), b.text.as_bytes()))
            }),
            Form::IdsBytea | Form::IdsText => {
                rows.sort_by(|a, b| (a.table, a.text.as_bytes()).cmp(&(b.table, b.text.as_bytes())))
            }
        }
    }
    let sink = client
        .copy_in(&format!(
            "COPY {} (replica, {}, key, version, message, ruled, ptrs, refs) FROM STDIN (FORMAT binary)",
            form.relation(),
            form.table_column()
        ))
        .await?;
    let writer = BinaryCopyInWriter::new(sink, &form.copy_types());
    futures_util::pin_mut!(writer);
    let (version, message) = (0i64, SNAPSHOT_MESSAGE);
    for row in rows {
        let (id, name, bytes) = (row.table.id(), row.table.name(), row.text.as_bytes());
        let (replica, table): (&(dyn ToSql + Sync), &(dyn ToSql + Sync)) = if form.with_ids() {
            (&r1.id, &id)
        } else {
            (&r1.name, &name)
        };
        let key: &(dyn ToSql + Sync) = match form {
            Form::Today | Form::Ids => &row.json,
            Form::IdsBytea => &bytes,
            Form::Text | Form::IdsText => &row.text,
        };
        writer
            .as_mut()
            .write(&[
                replica, table, key, &version, &message, &row.ruled, &row.ptrs, &row.refs,
            ])
            .await?;
    }
    Ok(writer.finish().await?)
}

/// One snapshot write's figures.
#[derive(Debug, Clone, Copy)]
struct Written {
    took: Duration,
    rows: u64,
    table: i64,
    indexes: i64,
}

/// One write of the snapshot into `form`'s table, emptied and checkpointed
/// first.
async fn write_once(
    client: &Client,
    write: Write,
    form: Form,
    r1: &Replica,
    staged: &[Staged],
) -> Result<Written> {
    client
        .batch_execute(&format!("TRUNCATE {}; CHECKPOINT;", form.relation()))
        .await?;
    let started = Instant::now();
    let rows = match write {
        Write::Insert => write_insert(client, form, false).await?,
        Write::InsertSorted => write_insert(client, form, true).await?,
        Write::Copy => write_copy(client, form, r1, staged, false).await?,
        Write::CopySorted => write_copy(client, form, r1, staged, true).await?,
    };
    let took = started.elapsed();
    ensure!(
        rows == staged.len() as u64,
        "{} by {} wrote {rows} of {} rows",
        form.label(),
        write.label(),
        staged.len()
    );
    let (table, indexes) = bytes(client, form).await?;
    println!(
        "  {:<44} {:<26} {:>6.2} s",
        write.label(),
        form.label(),
        took.as_secs_f64()
    );
    Ok(Written {
        took,
        rows,
        table,
        indexes,
    })
}

/// Part 1: every write into every form, forms interleaved within each way
/// of writing, the whole `repeats` times; the fastest of each is kept (the
/// machine's noise only ever adds).
async fn snapshot(
    client: &Client,
    r1: &Replica,
    staged: &[Staged],
    repeats: usize,
) -> Result<BTreeMap<(Write, Form), Written>> {
    let mut results: BTreeMap<(Write, Form), Written> = BTreeMap::new();
    for _ in 0..repeats {
        for write in Write::ALL {
            for form in Form::ALL {
                let written = write_once(client, write, form, r1, staged).await?;
                let best = results.entry((write, form)).or_insert(written);
                if written.took < best.took {
                    *best = written;
                }
            }
        }
    }
    Ok(results)
}

fn print_snapshot(results: &BTreeMap<(Write, Form), Written>, total: u64) {
    println!("\nRecording a snapshot of {total} rows (one replica, 5 tables), seconds and rows/s; ratio of the time against today's form:\n");
    header("write");
    for write in Write::ALL {
        let base = results[&(write, Form::Today)].took.as_secs_f64();
        let cells: Vec<String> = Form::ALL
            .iter()
            .map(|form| {
                let w = results[&(write, *form)];
                let s = w.took.as_secs_f64();
                let ratio = if *form == Form::Today {
                    String::new()
                } else {
                    format!(", **{:.2}x**", s / base)
                };
                format!("{s:.2} s, {:.0}k/s{ratio}", w.rows as f64 / s / 1e3)
            })
            .collect();
        println!("| {} | {} |", write.label(), cells.join(" | "));
    }
    let base = results[&(Write::Insert, Form::Today)].took.as_secs_f64();
    println!(
        "\nThe same, the time against today's form written as the relay writes it now, (a):\n"
    );
    header("write");
    for write in Write::ALL {
        let cells: Vec<String> = Form::ALL
            .iter()
            .map(|form| format!("{:.2}x", results[&(write, *form)].took.as_secs_f64() / base))
            .collect();
        println!("| {} | {} |", write.label(), cells.join(" | "));
    }
    println!("\nBytes a row, table + indexes, after each write:\n");
    header("write");
    for write in Write::ALL {
        let cells: Vec<String> = Form::ALL
            .iter()
            .map(|form| {
                let w = results[&(write, *form)];
                let per = |b: i64| b as f64 / w.rows as f64;
                format!(
                    "{:.0} + {:.0} = {:.0}",
                    per(w.table),
                    per(w.indexes),
                    per(w.table + w.indexes)
                )
            })
            .collect();
        println!("| {} | {} |", write.label(), cells.join(" | "));
    }
}

fn header(first: &str) {
    let labels: Vec<&str> = Form::ALL.iter().map(|f| f.label()).collect();
    println!("| {first} | {} |", labels.join(" | "));
    println!("| --- |{}", " --- |".repeat(Form::ALL.len()));
}

// ---- 2. Steady passes ----

/// The steady record: each replica holds `per` rows, in the snapshot's
/// proportions: every store and product, a window of customers it shares
/// half with each neighbour, and orders and lines of its own.
#[derive(Debug, Clone, Copy)]
struct Fleet {
    replicas: usize,
    per: i64,
}

/// A row a replica holds (or is to hold): replica index, table, key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HeldRow {
    replica: usize,
    table: Table,
    key: Vec<i64>,
}

impl Fleet {
    fn stores(self) -> i64 {
        (self.per / 1000).max(1)
    }
    fn products(self) -> i64 {
        self.per * 99 / 1000
    }
    fn customers(self) -> i64 {
        self.per / 10
    }
    fn orders(self) -> i64 {
        self.per * 3 / 10
    }
    fn lines(self) -> i64 {
        self.per - self.stores() - self.products() - self.customers() - self.orders()
    }
    /// Replica `j`'s customers are `customer_base(j) + 1 ..= + customers`.
    fn customer_base(self, j: usize) -> i64 {
        j as i64 * self.customers() / 2
    }
    /// Replica `j`'s orders are `order_base(j) + 1 ..= + orders`.
    fn order_base(self, j: usize) -> i64 {
        j as i64 * self.orders()
    }
    /// The customer order `i` (0-based, of replica `j`) points at.
    fn customer_of(self, j: usize, i: i64) -> i64 {
        self.customer_base(j) + 1 + i % self.customers()
    }

    /// The `i`-th row replica `j` holds, `i` in `0..per`.
    fn held(self, j: usize, i: i64) -> HeldRow {
        let mut i = i;
        let row = |table, key| HeldRow {
            replica: j,
            table,
            key,
        };
        if i < self.stores() {
            return row(Table::Stores, vec![i + 1]);
        }
        i -= self.stores();
        if i < self.products() {
            return row(Table::Products, vec![i + 1]);
        }
        i -= self.products();
        if i < self.customers() {
            return row(Table::Customers, vec![self.customer_base(j) + 1 + i]);
        }
        i -= self.customers();
        if i < self.orders() {
            return row(Table::Orders, vec![self.order_base(j) + 1 + i]);
        }
        i -= self.orders();
        row(
            Table::Lines,
            vec![
                self.order_base(j) + 1 + i % self.orders(),
                1 + i / self.orders(),
            ],
        )
    }

    /// What the held row points at (`ptrs`), as recorded when built.
    fn ptrs(self, row: &HeldRow) -> Option<String> {
        match row.table {
            Table::Orders => {
                let i = row.key[0] - self.order_base(row.replica) - 1;
                Some(pointer("customer_id", self.customer_of(row.replica, i)))
            }
            Table::Lines => Some(pointer("order_id", row.key[0])),
            _ => None,
        }
    }

    /// The statements that record replica `j`'s rows in `form`, as its
    /// snapshot would have: table by table, parents' rounds first.
    fn record(self, form: Form, replica: &Replica, j: usize) -> String {
        let r = form.replica(replica);
        let message = 100 + j;
        let insert = |table: Table, key: &str, ptrs: &str, refs: &str, n: i64| {
            format!(
                "INSERT INTO {rel} (replica, {tc}, key, version, message, ruled, ptrs, refs)
                 SELECT {r}, {t}, {key}, 0, {message}, {ruled}, {ptrs}, {refs}
                 FROM generate_series(0, {last}) i;",
                rel = form.relation(),
                tc = form.table_column(),
                t = form.table(table),
                key = form.key(key),
                ruled = table.ruled(),
                last = n - 1,
            )
        };
        let (cb, ob, c, o, l) = (
            self.customer_base(j),
            self.order_base(j),
            self.customers(),
            self.orders(),
            self.lines(),
        );
        [
            insert(
                Table::Stores,
                "jsonb_build_array(i + 1)",
                "NULL::jsonb",
                "0",
                self.stores(),
            ),
            insert(
                Table::Products,
                "jsonb_build_array(i + 1)",
                "NULL::jsonb",
                "0",
                self.products(),
            ),
            insert(
                Table::Orders,
                &format!("jsonb_build_array({ob} + 1 + i)"),
                &format!(
                    "jsonb_build_object('customer_id', jsonb_build_array({cb} + 1 + i % {c}))"
                ),
                &format!("{} + (i < {})::int", l / o, l % o),
                o,
            ),
            insert(
                Table::Customers,
                &format!("jsonb_build_array({cb} + 1 + i)"),
                "NULL::jsonb",
                &format!("{} + (i < {})::int", o / c, o % c),
                c,
            ),
            insert(
                Table::Lines,
                &format!("jsonb_build_array({ob} + 1 + i % {o}, 1 + i / {o})"),
                &format!("jsonb_build_object('order_id', jsonb_build_array({ob} + 1 + i % {o}))"),
                "0",
                l,
            ),
        ]
        .concat()
    }
}

/// `ptrs` of a row pointing at `parent` through `link`, as `jsonb` text.
fn pointer(link: &str, parent: i64) -> String {
    format!("{{\"{link}\": [{parent}]}}")
}

/// A key's text, as `jsonb` writes it.
fn key_text(key: &[i64]) -> String {
    let items: Vec<String> = key.iter().map(i64::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// A row the closing batch records as sent.
#[derive(Debug, Clone)]
struct Sent {
    row: HeldRow,
    version: i64,
    held: bool,
    ptrs: Option<String>,
    hptrs: Option<String>,
}

/// A row the closing batch takes back.
#[derive(Debug, Clone)]
struct Taken {
    row: HeldRow,
    hptrs: Option<String>,
}

/// What one round asks of the record, the same for every form.
#[derive(Debug, Default)]
struct Round {
    /// Changed rows whose holders are looked up by (table, key).
    changed: Vec<(Table, Vec<i64>)>,
    /// Rows looked up by (table, key, replica).
    granted: Vec<HeldRow>,
    sent: Vec<Sent>,
    taken: Vec<Taken>,
}

/// Sizes of a round.
const LOOKUPS: usize = 10_000;
const RESENT: usize = 10_000;
const NEW: usize = 5_000;
const TAKEN: usize = 5_000;

/// Draws rounds: rows sent again or taken back are never drawn twice (so
/// what each points at is what the record says), new rows are new.
#[derive(Debug)]
struct Draw {
    fleet: Fleet,
    rng: StdRng,
    used: HashSet<HeldRow>,
    new: HashSet<HeldRow>,
    next_order: i64,
    version: i64,
}

impl Draw {
    fn new(fleet: Fleet, seed: u64) -> Draw {
        Draw {
            fleet,
            rng: StdRng::seed_from_u64(seed),
            used: HashSet::new(),
            new: HashSet::new(),
            next_order: 1_000_000_000,
            version: 1_000,
        }
    }

    fn any_held(&mut self) -> HeldRow {
        let j = self.rng.gen_range(0..self.fleet.replicas);
        let i = self.rng.gen_range(0..self.fleet.per);
        self.fleet.held(j, i)
    }

    /// A held row not drawn before to be sent again or taken back.
    fn unused(&mut self) -> HeldRow {
        loop {
            let row = self.any_held();
            if self.used.insert(row.clone()) {
                return row;
            }
        }
    }

    fn round(&mut self) -> Round {
        let mut round = Round::default();
        let mut seen = HashSet::new();
        while round.changed.len() < LOOKUPS {
            let row = self.any_held();
            if seen.insert((row.table, row.key.clone())) {
                round.changed.push((row.table, row.key));
            }
        }
        let mut seen = HashSet::new();
        while round.granted.len() < LOOKUPS {
            let row = self.any_held();
            if seen.insert(row.clone()) {
                round.granted.push(row);
            }
        }
        for _ in 0..RESENT {
            let sent = self.resent();
            round.sent.push(sent);
        }
        for n in 0..NEW {
            let sent = if n % 2 == 0 {
                self.new_order()
            } else {
                self.new_customer()
            };
            round.sent.push(sent);
        }
        for _ in 0..TAKEN {
            let row = self.unused();
            let hptrs = self.fleet.ptrs(&row);
            round.taken.push(Taken { row, hptrs });
        }
        round
    }

    /// A held row sent again at a new version, pointing elsewhere when it
    /// points at all.
    fn resent(&mut self) -> Sent {
        let row = self.unused();
        let f = self.fleet;
        let hptrs = f.ptrs(&row);
        let ptrs = match row.table {
            Table::Orders => Some(pointer(
                "customer_id",
                f.customer_of(row.replica, self.rng.gen_range(0..f.customers())),
            )),
            Table::Lines => Some(pointer(
                "order_id",
                f.order_base(row.replica) + 1 + self.rng.gen_range(0..f.orders()),
            )),
            _ => None,
        };
        self.version += 1;
        Sent {
            row,
            version: self.version,
            held: true,
            ptrs,
            hptrs,
        }
    }

    /// A new order of a replica's own, pointing at one of its customers.
    fn new_order(&mut self) -> Sent {
        let f = self.fleet;
        let j = self.rng.gen_range(0..f.replicas);
        self.next_order += 1;
        self.version += 1;
        Sent {
            row: HeldRow {
                replica: j,
                table: Table::Orders,
                key: vec![self.next_order],
            },
            version: self.version,
            held: false,
            ptrs: Some(pointer(
                "customer_id",
                f.customer_of(j, self.rng.gen_range(0..f.customers())),
            )),
            hptrs: None,
        }
    }

    /// A customer a replica did not hold (another's, or nobody's).
    fn new_customer(&mut self) -> Sent {
        let f = self.fleet;
        let all = f.customer_base(f.replicas) + f.customers();
        loop {
            let j = self.rng.gen_range(0..f.replicas);
            let id = 1 + self.rng.gen_range(0..all);
            let own = f.customer_base(j) + 1..=f.customer_base(j) + f.customers();
            let row = HeldRow {
                replica: j,
                table: Table::Customers,
                key: vec![id],
            };
            if own.contains(&id) || !self.new.insert(row.clone()) {
                continue;
            }
            self.version += 1;
            return Sent {
                row,
                version: self.version,
                held: false,
                ptrs: None,
                hptrs: None,
            };
        }
    }
}

/// The statements of a round, in the order a pass runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Step {
    Holders,
    Granted,
    Delete,
    Update,
    Insert,
    Refs,
}

impl Step {
    const ALL: [Step; 6] = [
        Step::Holders,
        Step::Granted,
        Step::Delete,
        Step::Update,
        Step::Insert,
        Step::Refs,
    ];

    fn label(self) -> String {
        match self {
            Step::Holders => format!("holders of {LOOKUPS} rows by (table, key)"),
            Step::Granted => format!("{LOOKUPS} rows by (table, key, replica)"),
            Step::Delete => format!("DELETE {TAKEN} taken back"),
            Step::Update => format!("UPDATE {RESENT} sent again"),
            Step::Insert => format!("INSERT {NEW} sent new"),
            Step::Refs => "UPDATE refs of their parents".into(),
        }
    }

    /// Whether it is one of the closing batch's statements.
    fn closing(self) -> bool {
        !matches!(self, Step::Holders | Step::Granted)
    }
}

/// How `form` names replicas and tables, as text to cast.
#[derive(Debug, Clone, Copy)]
struct Names<'a> {
    form: Form,
    replicas: &'a [Replica],
}

impl Names<'_> {
    fn replica(&self, j: usize) -> String {
        if self.form.with_ids() {
            self.replicas[j].id.to_string()
        } else {
            self.replicas[j].name.clone()
        }
    }

    fn table(&self, t: Table) -> String {
        if self.form.with_ids() {
            t.id().to_string()
        } else {
            t.name().to_string()
        }
    }

    /// Replicas, tables and keys of `rows`, column by column.
    fn columns<'r>(
        &self,
        rows: impl Iterator<Item = &'r HeldRow>,
    ) -> (Vec<String>, Vec<String>, Vec<String>) {
        let mut out = (Vec::new(), Vec::new(), Vec::new());
        for row in rows {
            out.0.push(self.replica(row.replica));
            out.1.push(self.table(row.table));
            out.2.push(key_text(&row.key));
        }
        out
    }
}

/// The planner's tables a round's statements read, made afresh in `form`'s
/// types (the planner makes again the tables it analysed).
async fn make_planner_tables(client: &Client, form: Form) -> Result<()> {
    let (rt, tt) = (form.replica_type(), form.table_type());
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS _ms_r, _ms_touched, _ms_grant, _ms_q, _ms_send, _ms_del;
             CREATE TEMP TABLE _ms_r (r {rt} PRIMARY KEY, part text, fresh boolean NOT NULL);
             CREATE TEMP TABLE _ms_touched (t {tt}, k jsonb, PRIMARY KEY (t, k));
             CREATE TEMP TABLE _ms_grant (r {rt}, t {tt}, k jsonb, PRIMARY KEY (r, t, k));
             CREATE TEMP TABLE _ms_q (r {rt}, t {tt}, k jsonb, version bigint NOT NULL,
                 hruled boolean NOT NULL, hptrs jsonb, refs int NOT NULL, PRIMARY KEY (r, t, k));
             CREATE TEMP TABLE _ms_send (r {rt}, t {tt}, k jsonb, version bigint NOT NULL,
                 held boolean NOT NULL, ruled boolean NOT NULL, ptrs jsonb, hptrs jsonb);
             CREATE TEMP TABLE _ms_del (r {rt}, t {tt}, k jsonb, hptrs jsonb);"
        ))
        .await?;
    Ok(())
}

/// Fills the planner's tables with `round`, and the replica list `_ms_r`.
async fn load(client: &Client, form: Form, replicas: &[Replica], round: &Round) -> Result<()> {
    make_planner_tables(client, form).await?;
    let (rt, tt) = (form.replica_type(), form.table_type());
    let names = Names { form, replicas };
    let listed: Vec<String> = (0..replicas.len()).map(|j| names.replica(j)).collect();
    client
        .execute(
            &format!(
                "INSERT INTO _ms_r (r, fresh) SELECT r::{rt}, false FROM unnest($1::text[]) r"
            ),
            &[&listed],
        )
        .await?;
    let (t, k): (Vec<String>, Vec<String>) = round
        .changed
        .iter()
        .map(|(t, k)| (names.table(*t), key_text(k)))
        .unzip();
    client
        .execute(
            &format!(
                "INSERT INTO _ms_touched SELECT t::{tt}, k::jsonb
                 FROM unnest($1::text[], $2::text[]) AS x (t, k)"
            ),
            &[&t, &k],
        )
        .await?;
    let (r, t, k) = names.columns(round.granted.iter());
    client
        .execute(
            &format!(
                "INSERT INTO _ms_grant SELECT r::{rt}, t::{tt}, k::jsonb
                 FROM unnest($1::text[], $2::text[], $3::text[]) AS x (r, t, k)"
            ),
            &[&r, &t, &k],
        )
        .await?;
    let sent = &round.sent;
    let (r, t, k) = names.columns(sent.iter().map(|s| &s.row));
    let version: Vec<i64> = sent.iter().map(|s| s.version).collect();
    let held: Vec<bool> = sent.iter().map(|s| s.held).collect();
    let ruled: Vec<bool> = sent.iter().map(|s| s.row.table.ruled()).collect();
    let ptrs: Vec<Option<&str>> = sent.iter().map(|s| s.ptrs.as_deref()).collect();
    let hptrs: Vec<Option<&str>> = sent.iter().map(|s| s.hptrs.as_deref()).collect();
    client
        .execute(
            &format!(
                "INSERT INTO _ms_send SELECT r::{rt}, t::{tt}, k::jsonb, v, h, ru, p::jsonb, hp::jsonb
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::bool[], $6::bool[],
                             $7::text[], $8::text[]) AS x (r, t, k, v, h, ru, p, hp)"
            ),
            &[&r, &t, &k, &version, &held, &ruled, &ptrs, &hptrs],
        )
        .await?;
    let (r, t, k) = names.columns(round.taken.iter().map(|d| &d.row));
    let hptrs: Vec<Option<&str>> = round.taken.iter().map(|d| d.hptrs.as_deref()).collect();
    client
        .execute(
            &format!(
                "INSERT INTO _ms_del SELECT r::{rt}, t::{tt}, k::jsonb, hp::jsonb
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS x (r, t, k, hp)"
            ),
            &[&r, &t, &k, &hptrs],
        )
        .await?;
    // The planner analyses its tables past 5,000 rows (`ANALYSE_ABOVE`).
    client
        .batch_execute("ANALYZE _ms_r, _ms_touched, _ms_grant, _ms_send, _ms_del")
        .await?;
    Ok(())
}

/// The statement of `step` in `form`, as `relay::plan` and `relay::held`
/// write it for `sync.held`.
fn statement(step: Step, form: Form, replicas: &[Replica]) -> String {
    let rel = form.relation();
    let tc = form.table_column();
    let replica_of = |r: &str| {
        format!("LATERAL (SELECT r.r, r.part, r.fresh FROM _ms_r r WHERE r.r = {r} OFFSET 0) r")
    };
    // Each replica written to, with its last message of the pass.
    let ids: Vec<String> = replicas.iter().map(|r| form.replica(r)).collect();
    let numbers: Vec<String> = (0..replicas.len()).map(|j| (500 + j).to_string()).collect();
    let messages = format!(
        "unnest(ARRAY[{}]::{}[], ARRAY[{}]::int8[]) AS m (r, number)",
        ids.join(", "),
        form.replica_type(),
        numbers.join(", ")
    );
    match step {
        // `question_changed`, less the host row read beside it.
        Step::Holders => format!(
            "INSERT INTO _ms_q (r, t, k, version, hruled, hptrs, refs)
             SELECT h.replica, c.t, c.k, h.version, h.ruled, h.ptrs, h.refs
             FROM _ms_touched c
             CROSS JOIN LATERAL (SELECT h.replica, h.version, h.ruled, h.ptrs, h.refs FROM {rel} h
                                 WHERE h.{tc} = c.t AND h.key = {key} OFFSET 0) h
             CROSS JOIN {replica}
             WHERE NOT r.fresh
             ON CONFLICT DO NOTHING",
            key = form.key("c.k"),
            replica = replica_of("h.replica"),
        ),
        // `question_granted`, the same.
        Step::Granted => format!(
            "INSERT INTO _ms_q (r, t, k, version, hruled, hptrs, refs)
             SELECT c.r, c.t, c.k, h.version, h.ruled, h.ptrs, h.refs
             FROM _ms_grant c
             CROSS JOIN {replica}
             CROSS JOIN LATERAL (SELECT h.version, h.ruled, h.ptrs, h.refs FROM {rel} h
                                 WHERE h.{tc} = c.t AND h.key = {key} AND h.replica = c.r OFFSET 0) h
             WHERE NOT r.fresh
             ON CONFLICT DO NOTHING",
            key = form.key("c.k"),
            replica = replica_of("c.r"),
        ),
        Step::Delete => format!(
            "DELETE FROM {rel} h USING _ms_del d
             WHERE h.{tc} = d.t AND h.key = {key} AND h.replica = d.r",
            key = form.key("d.k"),
        ),
        Step::Update => format!(
            "UPDATE {rel} h SET version = s.version, message = m.number, ruled = s.ruled, ptrs = s.ptrs
             FROM _ms_send s JOIN {messages} ON m.r = s.r
             WHERE s.held AND h.{tc} = s.t AND h.key = {key} AND h.replica = s.r",
            key = form.key("s.k"),
        ),
        Step::Insert => format!(
            "INSERT INTO {rel} (replica, {tc}, key, version, message, ruled, ptrs)
             SELECT s.r, s.t, {key}, s.version, m.number, s.ruled, s.ptrs
             FROM _ms_send s JOIN {messages} ON m.r = s.r
             WHERE NOT s.held
             ON CONFLICT (replica, {tc}, key)
             DO UPDATE SET version = EXCLUDED.version, message = EXCLUDED.message,
                           ruled = EXCLUDED.ruled, ptrs = EXCLUDED.ptrs",
            key = form.key("s.k"),
        ),
        Step::Refs => format!(
            "UPDATE {rel} h SET refs = h.refs + x.n
             FROM (SELECT r, t, k, sum(n)::int AS n FROM (
                       SELECT s.r, l.p AS t, s.ptrs -> l.name AS k, 1 AS n
                       FROM _ms_send s JOIN {links} ON l.c = s.t WHERE s.ptrs ? l.name
                       UNION ALL
                       SELECT s.r, l.p, s.hptrs -> l.name, -1
                       FROM _ms_send s JOIN {links} ON l.c = s.t WHERE s.held AND s.hptrs ? l.name
                       UNION ALL
                       SELECT d.r, l.p AS t, d.hptrs -> l.name AS k, -1 AS n
                       FROM _ms_del d JOIN {links} ON l.c = d.t WHERE d.hptrs ? l.name) a
                   GROUP BY r, t, k HAVING sum(n) <> 0) x
             WHERE h.{tc} = x.t AND h.key = {key} AND h.replica = x.r",
            links = form.links(),
            key = form.key("x.k"),
        ),
    }
}

/// What one step took in one round, with the rows it touched and, for the
/// updates, how many were HOT.
#[derive(Debug, Clone, Copy, Default)]
struct Took {
    took: Duration,
    rows: u64,
    updated: i64,
    hot: i64,
}

/// Updates and HOT updates of `form`'s table so far in this transaction.
async fn updates(client: &Client, form: Form) -> Result<(i64, i64)> {
    let row = client
        .query_one(
            "SELECT coalesce(n_tup_upd, 0), coalesce(n_tup_hot_upd, 0)
             FROM pg_stat_xact_user_tables WHERE relid = $1::text::regclass",
            &[&form.relation()],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// One round in `form`, in one transaction as a pass has it.
async fn pass(
    client: &Client,
    form: Form,
    replicas: &[Replica],
    round: &Round,
    explain: bool,
) -> Result<BTreeMap<Step, Took>> {
    load(client, form, replicas, round).await?;
    let mut took = BTreeMap::new();
    client.batch_execute("BEGIN").await?;
    for step in Step::ALL {
        if step == Step::Granted {
            client.batch_execute("TRUNCATE _ms_q").await?;
        }
        if step == Step::Delete {
            // As the closing batch has it.
            client
                .batch_execute("SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off;")
                .await?;
        }
        let sql = statement(step, form, replicas);
        if explain {
            let plan = client.simple_query(&format!("EXPLAIN {sql}")).await?;
            println!("\n{} / {:?}:", form.label(), step);
            for message in plan {
                if let SimpleQueryMessage::Row(row) = message {
                    println!("    {}", row.get(0).unwrap_or_default());
                }
            }
        }
        let before = updates(client, form).await?;
        let (d, rows) = timed(client, &sql).await?;
        let after = updates(client, form).await?;
        took.insert(
            step,
            Took {
                took: d,
                rows,
                updated: after.0 - before.0,
                hot: after.1 - before.1,
            },
        );
    }
    client.batch_execute("COMMIT").await?;
    Ok(took)
}

/// Builds the steady record in every form, replica after replica as their
/// snapshots would; returns the seconds each form took.
async fn build(client: &Client, fleet: Fleet, replicas: &[Replica]) -> Result<BTreeMap<Form, f64>> {
    let mut took = BTreeMap::new();
    for form in Form::ALL {
        client
            .batch_execute(&format!("TRUNCATE {}; CHECKPOINT;", form.relation()))
            .await?;
        let started = Instant::now();
        for (j, replica) in replicas.iter().enumerate() {
            client
                .batch_execute(&format!(
                    "BEGIN; {} COMMIT;",
                    fleet.record(form, replica, j)
                ))
                .await?;
        }
        took.insert(form, started.elapsed().as_secs_f64());
        // One statement each: VACUUM refuses a transaction block.
        client
            .batch_execute(&format!("VACUUM ANALYZE {}", form.relation()))
            .await?;
        client.batch_execute("CHECKPOINT").await?;
    }
    Ok(took)
}

/// What the rounds measured, per form and step.
type Steady = BTreeMap<(Form, Step), Vec<Took>>;

/// Part 2: one round to warm up, then `rounds`, the forms in a rotating
/// order so that the machine's drift falls on each alike. With `explain`,
/// the warm-up round prints each statement's plan.
async fn steady(
    client: &Client,
    replicas: &[Replica],
    draw: &mut Draw,
    rounds: usize,
    explain: bool,
) -> Result<Steady> {
    let mut results = Steady::new();
    for n in 0..=rounds {
        let round = draw.round();
        let mut line = format!("  round {n} of {rounds}, the six statements:");
        for i in 0..Form::ALL.len() {
            let form = Form::ALL[(i + n) % Form::ALL.len()];
            let took = pass(client, form, replicas, &round, n == 0 && explain).await?;
            let ms: f64 = took.values().map(|t| t.took.as_secs_f64() * 1e3).sum();
            write!(line, " {} {ms:.0} ms;", form.label())?;
            if n == 0 {
                continue;
            }
            for (step, t) in took {
                results.entry((form, step)).or_default().push(t);
            }
        }
        println!("{line}{}", if n == 0 { " (to warm up)" } else { "" });
    }
    Ok(results)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn print_steady(results: &Steady, fleet: Fleet, rounds: usize) {
    println!(
        "\nSteady passes on a record of {} replicas x {} rows: median of {rounds} rounds, ms; ratio against today's form:\n",
        fleet.replicas, fleet.per
    );
    header("statement (rows, median)");
    let ms = |form: Form, step: Step| {
        median(
            results[&(form, step)]
                .iter()
                .map(|t| t.took.as_secs_f64() * 1e3)
                .collect(),
        )
    };
    let sum = |form: Form, closing: Option<bool>| -> f64 {
        // The median of each round's sum, not the sum of medians.
        let n = results[&(form, Step::Holders)].len();
        median(
            (0..n)
                .map(|i| {
                    Step::ALL
                        .iter()
                        .filter(|s| match closing {
                            Some(c) => s.closing() == c,
                            None => true,
                        })
                        .map(|s| results[&(form, *s)][i].took.as_secs_f64() * 1e3)
                        .sum()
                })
                .collect(),
        )
    };
    let line = |label: String, value: &dyn Fn(Form) -> f64| {
        let base = value(Form::Today);
        let cells: Vec<String> = Form::ALL
            .iter()
            .map(|f| {
                let v = value(*f);
                if *f == Form::Today {
                    format!("{v:.1}")
                } else {
                    format!("{v:.1}, **{:.2}x**", v / base)
                }
            })
            .collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    for step in Step::ALL {
        let rows = median(
            results[&(Form::Today, step)]
                .iter()
                .map(|t| t.rows as f64)
                .collect(),
        );
        line(format!("{} ({rows:.0})", step.label()), &|f| ms(f, step));
    }
    line("the planner's two lookups".into(), &|f| sum(f, Some(false)));
    line("the closing batch's four".into(), &|f| sum(f, Some(true)));
    line("all six".into(), &|f| sum(f, None));
    let hot: Vec<String> = Form::ALL
        .iter()
        .map(|f| {
            let (mut updated, mut hot) = (0, 0);
            for step in [Step::Update, Step::Refs] {
                for t in &results[&(*f, step)] {
                    updated += t.updated;
                    hot += t.hot;
                }
            }
            format!(
                "{hot} of {updated} ({:.1}%)",
                hot as f64 * 100.0 / updated.max(1) as f64
            )
        })
        .collect();
    println!(
        "| HOT updates (n_tup_hot_upd), all rounds | {} |",
        hot.join(" | ")
    );
}

async fn print_sizes(client: &Client, title: &str) -> Result<()> {
    let mut cells = Vec::new();
    for form in Form::ALL {
        let rows: i64 = client
            .query_one(&format!("SELECT count(*) FROM {}", form.relation()), &[])
            .await?
            .get(0);
        let (table, indexes) = bytes(client, form).await?;
        let per = |b: i64| b as f64 / rows.max(1) as f64;
        cells.push(format!(
            "{:.0} + {:.0} = {:.0}",
            per(table),
            per(indexes),
            per(table + indexes)
        ));
    }
    println!("| {title} | {} |", cells.join(" | "));
    Ok(())
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().replace('_', "").parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<()> {
    let total = env_u64("MAGIC_SYNC_BENCH_ROWS", 1_000_000) as i64;
    let fleet = Fleet {
        replicas: 10,
        per: env_u64("MAGIC_SYNC_BENCH_HELD", 200_000) as i64,
    };
    let rounds = env_u64("MAGIC_SYNC_BENCH_ROUNDS", 7) as usize;
    let repeats = env_u64("MAGIC_SYNC_BENCH_REPEATS", 3).max(1) as usize;
    let explain = std::env::var("MAGIC_SYNC_BENCH_EXPLAIN").is_ok_and(|v| v == "1");
    let seed = env_u64("MAGIC_SYNC_BENCH_SEED", rand::random::<u32>() as u64);
    println!("the record's form: a snapshot of {total} rows, then steady passes over {} x {} held rows (MAGIC_SYNC_BENCH_SEED={seed})", fleet.replicas, fleet.per);

    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await?;
    let mut names = vec!["r1".to_string()];
    names.extend((1..=fleet.replicas).map(|j| format!("r{j:03}")));
    let replicas = make_forms(&client, &names).await?;
    let (r1, fleet_replicas) = (&replicas[0], &replicas[1..]);

    println!("\n1. recording a snapshot");
    client.batch_execute(&host_tables(total)).await?;
    client.batch_execute(STAGE).await?;
    stage_per_form(&client, r1).await?;
    let staged = read_staged(&client).await?;
    let written = snapshot(&client, r1, &staged, repeats).await?;
    print_snapshot(&written, staged.len() as u64);
    drop(staged);

    println!("\n2. steady passes");
    let built = build(&client, fleet, fleet_replicas).await?;
    println!(
        "  built in {}",
        Form::ALL
            .iter()
            .map(|f| format!("{:.1} s ({})", built[f], f.label()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("\nThe steady record's bytes a row, table + indexes:\n");
    header("when");
    print_sizes(&client, "built, vacuumed").await?;
    let mut draw = Draw::new(fleet, seed);
    let results = steady(&client, fleet_replicas, &mut draw, rounds, explain).await?;
    print_steady(&results, fleet, rounds);
    println!();
    header("when");
    print_sizes(&client, "after the rounds").await?;
    Ok(())
}
