//! The triggers that note every change of a mirrored row, as the engine
//! writes them, and the check that they are still there and unchanged.
//!
//! Each noted table gets one function of its own (`sync.note_<schema>_<table>`)
//! with its columns spelled out, so a write pays for no dynamic SQL, and two
//! triggers: `magic_sync_note` (after every insert, update and delete, per
//! row) and `magic_sync_no_truncate` (before TRUNCATE, refusing it). Both are
//! `ENABLE ALWAYS`, so `session_replication_role = replica` does not silence
//! them.
//!
//! [`ensure`] installs or repairs them as a deploy step of its own, without
//! freezing the application's writes; [`verify`] is the start-up check.

use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::error::{Error, Result, TriggerProblem};
use crate::row::{Rule, Table};
use crate::sql::{ident, literal, qualified};
use tokio_postgres::Client;

mod ensure;

pub use ensure::{ensure, Ensured, InstallSettings, Installed};

/// The row trigger's name.
pub const NOTE_TRIGGER: &str = "magic_sync_note";
/// The TRUNCATE trigger's name.
pub const TRUNCATE_TRIGGER: &str = "magic_sync_no_truncate";
/// The function every TRUNCATE trigger calls.
pub const REFUSE_TRUNCATE: &str = "refuse_truncate";

const REFUSE_TRUNCATE_BODY: &str = "
BEGIN
    RAISE EXCEPTION 'magic_sync: TRUNCATE of mirrored table \"%\" is refused: it would remove rows without a note for the replicas; DELETE them instead', TG_ARGV[0]
        USING ERRCODE = 'feature_not_supported';
END
";

// pg_trigger.tgtype bits.
const ROW: i32 = 1;
const BEFORE: i32 = 2;
const INSERT: i32 = 4;
const DELETE: i32 = 8;
const UPDATE: i32 = 16;
const TRUNCATE: i32 = 32;

/// One table the engine notes changes of: a declared table that goes down,
/// or a group table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Noted {
    /// The name notes carry.
    pub table: String,
    /// Its schema.
    pub schema: String,
    /// Key columns, in declared order.
    pub key: Vec<String>,
    /// Columns whose change is a change the replicas must hear of.
    pub watched: Vec<String>,
    /// Columns a note keeps as the row had them before the change (its
    /// `parents`): those pointing at other declared tables, and the column
    /// its rule reads (`replica`, `partition`). With them a note says what
    /// the row was, which rows it pointed at and who its rule gave it to.
    pub before: Vec<String>,
    /// Its partitions, at any depth, as (schema, name).
    pub partitions: Vec<(String, String)>,
}

impl Noted {
    /// The name of this table's note function (without schema).
    pub fn function(&self) -> String {
        let name = format!("note_{}_{}", self.schema, self.table);
        if name.len() <= 63 {
            return name;
        }
        let hash = crate::digest::fnv1a(format!("{}.{}", self.schema, self.table).as_bytes());
        let mut cut = 63 - 17;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}_{hash:016x}", &name[..cut])
    }

    /// The body of the note function.
    pub fn body(&self) -> String {
        use crate::store::notes::{note, Op};
        let insert = |op, key: &str, parents: &str| note(&self.table, op, key, parents);
        let key = |rec: &str| columns_call("jsonb_build_array", rec, &self.key, false);
        let parents = |rec: &str| self.before_of(rec);
        let row = |rec: &str, cols: &[String]| columns_call("ROW", rec, cols, false);
        let insert_new = insert(Op::Insert, &key("NEW"), "NULL");
        let delete_old = insert(Op::Delete, &key("OLD"), &parents("OLD"));
        format!(
            "
BEGIN
    IF TG_OP = 'INSERT' THEN
        {insert_new};
    ELSIF TG_OP = 'DELETE' THEN
        {delete_old};
    ELSIF {old_key} IS DISTINCT FROM {new_key} THEN
        {delete_old};
        {insert_new};
    ELSIF {old_watched} IS DISTINCT FROM {new_watched} THEN
        {update};
    END IF;
    RETURN NULL;
END
",
            old_key = row("OLD", &self.key),
            new_key = row("NEW", &self.key),
            old_watched = row("OLD", &self.watched),
            new_watched = row("NEW", &self.watched),
            update = insert(Op::Update, &key("NEW"), &parents("OLD")),
        )
    }

    /// The columns [`before`](Self::before) names, of the row `rec`, as the
    /// `jsonb` object a note keeps in `parents`.
    pub(crate) fn before_of(&self, rec: &str) -> String {
        if self.before.is_empty() {
            "'{}'::jsonb".to_string()
        } else {
            columns_call("jsonb_build_object", rec, &self.before, true)
        }
    }

    fn relations(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once((self.schema.as_str(), self.table.as_str())).chain(
            self.partitions
                .iter()
                .map(|(s, n)| (s.as_str(), n.as_str())),
        )
    }

    /// The SQL that (re)installs this table's function.
    pub fn function_sql(&self) -> String {
        format!(
            "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $magic_sync${}$magic_sync$;\n",
            qualified("sync", &self.function()),
            self.body()
        )
    }

    /// The SQL that (re)installs this table's function and triggers. It
    /// takes SHARE ROW EXCLUSIVE locks on the table and its partitions
    /// (`CREATE OR REPLACE TRIGGER`, not `DROP TRIGGER`, which would take
    /// ACCESS EXCLUSIVE and hold up readers too).
    pub fn install_sql(&self) -> String {
        let function = qualified("sync", &self.function());
        let relation = qualified(&self.schema, &self.table);
        let mut sql = format!(
            "{}CREATE OR REPLACE TRIGGER {note} AFTER INSERT OR UPDATE OR DELETE ON {relation} FOR EACH ROW EXECUTE FUNCTION {function}();\n",
            self.function_sql(),
            note = ident(NOTE_TRIGGER),
        );
        for (schema, name) in self.relations() {
            let rel = qualified(schema, name);
            sql.push_str(&format!(
                "ALTER TABLE {rel} ENABLE ALWAYS TRIGGER {note};\n\
                 CREATE OR REPLACE TRIGGER {trunc} BEFORE TRUNCATE ON {rel} FOR EACH STATEMENT EXECUTE FUNCTION {refuse}({table});\n\
                 ALTER TABLE {rel} ENABLE ALWAYS TRIGGER {trunc};\n",
                note = ident(NOTE_TRIGGER),
                trunc = ident(TRUNCATE_TRIGGER),
                refuse = qualified("sync", REFUSE_TRUNCATE),
                table = literal(&self.table),
            ));
        }
        sql
    }
}

/// `f(REC."a", REC."b")`, or with names: `f('a', REC."a", ...)`.
fn columns_call(function: &str, rec: &str, columns: &[String], named: bool) -> String {
    let args: Vec<String> = columns
        .iter()
        .map(|c| {
            if named {
                format!("{}, {rec}.{}", literal(c), ident(c))
            } else {
                format!("{rec}.{}", ident(c))
            }
        })
        .collect();
    format!("{function}({})", args.join(", "))
}

fn push_unique(list: &mut Vec<String>, item: &str) {
    if !list.iter().any(|x| x == item) {
        list.push(item.to_string());
    }
}

fn noted_table(table: &Table, catalog: &Catalog) -> Noted {
    let mut before = catalog.pointing_columns(table.name);
    if let Rule::Replica(c) | Rule::Partition(c) = table.rule {
        push_unique(&mut before, c);
    }
    let mut watched: Vec<String> = Vec::new();
    for c in table.columns.iter().filter(|c| !table.owns(c.name)) {
        push_unique(&mut watched, c.name);
    }
    for c in &before {
        push_unique(&mut watched, c);
    }
    match &table.rule {
        Rule::Replica(c) | Rule::Partition(c) => push_unique(&mut watched, c),
        Rule::Follows(cs) => cs.iter().for_each(|c| push_unique(&mut watched, c)),
        _ => {}
    }
    Noted {
        table: table.name.to_string(),
        schema: table.schema.to_string(),
        key: table.key.iter().map(|k| k.to_string()).collect(),
        watched,
        before,
        partitions: catalog
            .relation(table.schema, table.name)
            .map(|r| r.partitions.clone())
            .unwrap_or_default(),
    }
}

/// Every table the engine notes changes of, as the catalogue has them.
pub fn noted(engine: &Engine, catalog: &Catalog) -> Vec<Noted> {
    let mut out: Vec<Noted> = engine
        .down_tables()
        .map(|t| noted_table(t, catalog))
        .collect();
    for g in engine.group_tables() {
        let key: Vec<String> = g.key.iter().map(|k| k.to_string()).collect();
        out.push(Noted {
            table: g.name.to_string(),
            schema: g.schema.to_string(),
            watched: key.clone(),
            key,
            before: Vec::new(),
            partitions: catalog
                .relation(g.schema, g.name)
                .map(|r| r.partitions.clone())
                .unwrap_or_default(),
        });
    }
    out
}

/// The SQL that installs every trigger `engine` needs, as it writes them.
pub fn sql(engine: &Engine, catalog: &Catalog) -> String {
    let mut sql = refuse_truncate_sql();
    for n in noted(engine, catalog) {
        sql.push_str(&n.install_sql());
    }
    sql
}

/// Installs or repairs the triggers: [`ensure`] with the default
/// [`InstallSettings`]. The `sync` schema must be current.
pub async fn install(engine: &Engine, client: &mut Client) -> Result<Ensured> {
    ensure(engine, client, &InstallSettings::default()).await
}

/// The SQL that installs the function every TRUNCATE trigger calls.
fn refuse_truncate_sql() -> String {
    format!(
        "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $magic_sync${REFUSE_TRUNCATE_BODY}$magic_sync$;\n",
        qualified("sync", REFUSE_TRUNCATE)
    )
}

const INSTALLED: &str = "
SELECT n.nspname::text, c.relname::text, t.tgname::text, t.tgenabled::text, t.tgtype::int4,
       pn.nspname::text, p.proname::text, p.prosrc, t.tgqual IS NOT NULL,
       t.tgnargs::int4, encode(t.tgargs, 'escape'), cardinality(t.tgattr::int2[])
FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_proc p ON p.oid = t.tgfoid
JOIN pg_namespace pn ON pn.oid = p.pronamespace
JOIN unnest($1::text[], $2::text[]) AS wanted(s, r) ON n.nspname = wanted.s AND c.relname = wanted.r
WHERE t.tgname IN ('magic_sync_note', 'magic_sync_no_truncate')";

struct Found {
    enabled: String,
    tgtype: i32,
    function: (String, String),
    source: String,
    has_when: bool,
    args: Vec<String>,
    columns: i32,
}

struct Expected<'a> {
    tgtype: i32,
    function: String,
    source: &'a str,
    args: Vec<String>,
}

/// How a trigger differs from what the engine writes, which decides what
/// repairing it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Missing, disabled, not `ENABLE ALWAYS`, calling another function or
    /// firing on other events: writes may have gone unnoted meanwhile.
    Silenced,
    /// Present and firing as the engine's, with other arguments.
    Changed,
    /// Only its function's body differs (another version of the engine, or
    /// of the declarations, wrote it): writes were noted, in that version's
    /// way. Replacing the function takes no lock on the table.
    Body,
}

/// One trigger not as the engine writes it.
#[derive(Debug, Clone)]
pub(crate) struct Finding {
    /// The noted table it belongs to: an index into the list inspected.
    pub table: usize,
    /// Whether it is the row trigger that notes (else the TRUNCATE trigger).
    pub notes: bool,
    pub fault: Fault,
    pub problem: TriggerProblem,
}

/// What is wrong with `found`, the trigger as installed, against what the
/// engine writes. What changes how the trigger fires is named before a
/// body that differs, so a [`Fault::Body`] means nothing else is wrong.
fn compare(found: Option<&Found>, expected: &Expected<'_>) -> Option<(Fault, String)> {
    let Some(f) = found else {
        return Some((
            Fault::Silenced,
            "is missing: install the triggers (magic_sync::trigger::ensure)".into(),
        ));
    };
    if f.enabled == "D" {
        return Some((
            Fault::Silenced,
            "is disabled: ENABLE ALWAYS it again".into(),
        ));
    }
    if f.function != ("sync".to_string(), expected.function.clone()) {
        return Some((
            Fault::Silenced,
            format!(
                "calls {}.{}() instead of sync.{}()",
                f.function.0, f.function.1, expected.function
            ),
        ));
    }
    if f.tgtype != expected.tgtype || f.has_when || f.columns > 0 {
        return Some((
            Fault::Silenced,
            "fires on other events than the engine's: reinstall the triggers".into(),
        ));
    }
    if f.enabled != "A" {
        return Some((Fault::Silenced, "is not ENABLE ALWAYS: writes under session_replication_role = replica would go unnoted".into()));
    }
    if f.args != expected.args {
        return Some((
            Fault::Changed,
            format!("takes arguments {:?}, expected {:?}", f.args, expected.args),
        ));
    }
    if f.source.trim() != expected.source.trim() {
        return Some((
            Fault::Body,
            format!(
                "function sync.{}() differs from what the engine writes: reinstall the triggers",
                expected.function
            ),
        ));
    }
    None
}

/// Every trigger of `noted` (on each table and each of its partitions) that
/// is not as the engine writes it. Reads the catalogue only: no lock on any
/// table.
pub(crate) async fn inspect(noted: &[Noted], client: &Client) -> Result<Vec<Finding>> {
    let mut schemas = Vec::new();
    let mut names = Vec::new();
    for n in noted {
        for (s, r) in n.relations() {
            schemas.push(s.to_string());
            names.push(r.to_string());
        }
    }
    let mut found = std::collections::HashMap::new();
    for row in client.query(INSTALLED, &[&schemas, &names]).await? {
        let args: String = row.get(10);
        let args: Vec<String> = args
            .split("\\000")
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect();
        let key: (String, String, String) = (row.get(0), row.get(1), row.get(2));
        found.insert(
            key,
            Found {
                enabled: row.get(3),
                tgtype: row.get(4),
                function: (row.get(5), row.get(6)),
                source: row.get(7),
                has_when: row.get(8),
                args,
                columns: row.get::<_, Option<i32>>(11).unwrap_or(0),
            },
        );
    }
    let mut findings = Vec::new();
    for (table, n) in noted.iter().enumerate() {
        let body = n.body();
        let note = Expected {
            tgtype: ROW | INSERT | DELETE | UPDATE,
            function: n.function(),
            source: &body,
            args: Vec::new(),
        };
        let truncate = Expected {
            tgtype: BEFORE | TRUNCATE,
            function: REFUSE_TRUNCATE.to_string(),
            source: REFUSE_TRUNCATE_BODY,
            args: vec![n.table.clone()],
        };
        for (schema, rel) in n.relations() {
            for (name, expected) in [(NOTE_TRIGGER, &note), (TRUNCATE_TRIGGER, &truncate)] {
                let key = (schema.to_string(), rel.to_string(), name.to_string());
                if let Some((fault, problem)) = compare(found.get(&key), expected) {
                    findings.push(Finding {
                        table,
                        notes: name == NOTE_TRIGGER,
                        fault,
                        problem: TriggerProblem {
                            relation: format!("{schema}.{rel}"),
                            trigger: name.to_string(),
                            problem,
                        },
                    });
                }
            }
        }
    }
    Ok(findings)
}

/// Checks every trigger the engine needs: present, enabled, as it would write it.
pub async fn verify(engine: &Engine, client: &Client, catalog: &Catalog) -> Result<()> {
    let problems: Vec<TriggerProblem> = inspect(&noted(engine, catalog), client)
        .await?
        .into_iter()
        .map(|f| f.problem)
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Triggers(problems))
    }
}
