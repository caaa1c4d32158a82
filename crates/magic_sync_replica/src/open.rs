//! Opening a replica's file: the SQLite it needs, the pragmas, the
//! declared tables and the bookkeeping made or widened, the foreign keys
//! checked against the declarations, and tables an earlier build left
//! dropped once the server said the configuration is whole. A description
//! from the server is taken here too: it decides the same tables.

use crate::engine::Engine;
use crate::envelope;
use crate::error::Mismatch;
use crate::shape::Shapes;
use crate::tables::{self, Tables};
use crate::{described, former, lite, snapshot, sql, state, trust, up, write_transaction};
use crate::{Error, ForeignKey, Replica, Result, Schema};
use rusqlite::{Connection, Transaction};
use std::path::Path;

/// How long the replica waits for a host's write transaction to end
/// before its own statement fails as busy (a transient error).
pub(crate) const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Replica {
    /// Opens (or creates) the replica database at `path` for the replica
    /// called `replica_id`: WAL mode, SQLite's own foreign keys off, every
    /// table `engine` declares (up tables too: the replica writes them), and
    /// the replica's bookkeeping. The foreign keys among the tables are the
    /// ones the server last described (none before it first did: it does
    /// with the first snapshot's end).
    pub fn open(path: impl AsRef<Path>, replica_id: &str, engine: &Engine) -> Result<Self> {
        Self::open_with_foreign_keys(path, replica_id, engine, Vec::new())
    }

    /// [`open`](Self::open), following `foreign_keys` among the declared
    /// tables until the server describes them: for a replica fed messages
    /// by hand, with no server to say (tests, tools). Once the server
    /// described the tables, its foreign keys stand and these are ignored.
    pub fn open_with_foreign_keys(
        path: impl AsRef<Path>,
        replica_id: &str,
        engine: &Engine,
        foreign_keys: Vec<ForeignKey>,
    ) -> Result<Self> {
        let shapes = Shapes::of(engine);
        check_foreign_keys(&shapes, &foreign_keys)?;
        up::check(&shapes)?;
        let conn = open_file(path)?;
        let told = described::load(&conn)?;
        let foreign_keys = match &told {
            Some(d) => described::foreign_keys(&shapes, d),
            None => foreign_keys,
        };
        let schema = Schema::new(engine, &foreign_keys);
        Self::assemble(conn, replica_id, Some(engine), shapes, schema, told)
    }

    /// Opens (or creates) the replica database at `path` for the replica
    /// called `replica_id`, with no declarations of its own: its tables,
    /// their columns, keys, directions and the foreign keys among them are
    /// what the server describes, and its rows travel as JSON. Until the
    /// server first describes them (a snapshot begins with it), it holds
    /// no table; opened again, it follows the last description it took.
    ///
    /// The host writes its own records (up tables, and the owned columns
    /// of two-way tables) with any SQLite driver once the tables are
    /// there; the replica notes each write, as for a Rust host. A table
    /// the server describes in a codec other than JSON, or otherwise
    /// beyond what the replica can hold, stops it with
    /// [`Error::Undescribable`], naming the table.
    pub fn open_described(path: impl AsRef<Path>, replica_id: &str) -> Result<Self> {
        let conn = open_file(path)?;
        let told = described::load(&conn)?;
        let (schema, shapes) = match &told {
            Some(d) => following(d)?,
            None => Default::default(),
        };
        Self::assemble(conn, replica_id, None, shapes, schema, told)
    }

    /// The replica on `conn`, its tables made where missing.
    fn assemble(
        mut conn: Connection,
        replica_id: &str,
        declared: Option<&Engine>,
        shapes: Shapes,
        schema: Schema,
        told: Option<envelope::ReplicaSchema>,
    ) -> Result<Self> {
        let foreign_keys = schema.foreign_keys();
        let tables = Tables::new(shapes.tables(), &foreign_keys);
        conn.set_prepared_statement_cache_capacity(statements(&shapes));
        let former = create_tables(&mut conn, &shapes, &tables, &foreign_keys, told.as_ref())?;
        let chain = state::load_chain(&conn)?;
        let trusted = trust::load(&conn)?.current;
        let mut replica = Replica {
            conn,
            id: replica_id.to_string(),
            declared: declared.cloned(),
            shapes,
            schema,
            described: told,
            tables,
            former,
            chain,
            trusted,
            forgeries: Default::default(),
            set_aside: Default::default(),
            early: Default::default(),
            patience: Default::default(),
            stopped: None,
        };
        // The server may have said this build's configuration is whole
        // while an older build ran here: what it took back then went.
        if !replica.former.is_empty() {
            let tx = write_transaction(&mut replica.conn)?;
            let dropped = drop_former(&tx, &replica.schema, &replica.former)?;
            tx.commit()?;
            if dropped {
                replica.former.clear();
            }
        }
        Ok(replica)
    }
}

/// Drops the tables of `former` when the server said the declarations
/// `schema` runs are whole here; returns whether it did.
pub(crate) fn drop_former(
    tx: &Transaction<'_>,
    schema: &Schema,
    former: &std::collections::BTreeSet<String>,
) -> Result<bool> {
    let whole = state::configuration(tx)?.as_deref() == Some(&schema.fingerprint().0[..]);
    if whole {
        former::drop_all(tx, former)?;
    }
    Ok(whole)
}

/// The declared tables, the bookkeeping and their indexes, in one
/// transaction; and the indexes a snapshot in progress set aside, built again.
/// Returns the tables an earlier build made to go down that `shapes` does
/// not hold (`told`: the server's last description).
fn create_tables(
    conn: &mut Connection,
    shapes: &Shapes,
    tables: &Tables,
    foreign_keys: &[ForeignKey],
    told: Option<&envelope::ReplicaSchema>,
) -> Result<std::collections::BTreeSet<String>> {
    let tx = write_transaction(conn)?;
    let former = make_tables(&tx, shapes, tables, foreign_keys, told)?;
    tx.commit()?;
    Ok(former)
}

/// [`create_tables`], in `tx`.
fn make_tables(
    tx: &Transaction<'_>,
    shapes: &Shapes,
    tables: &Tables,
    foreign_keys: &[ForeignKey],
    told: Option<&envelope::ReplicaSchema>,
) -> Result<std::collections::BTreeSet<String>> {
    for table in shapes.tables() {
        tx.execute_batch(&lite::create(table))?;
        add_columns(tx, table)?;
        if let Some(index) = tables::retired_index(table) {
            tx.execute_batch(&index)?;
        }
    }
    for sql in tables.iter() {
        tx.execute_batch(&sql.stale.create)?;
    }
    state::create(tx)?;
    up::create(tx, shapes)?;
    snapshot::carry_over(tx, tables)?;
    snapshot::build_set_aside(tx)?;
    for fk in foreign_keys {
        tx.execute_batch(&tables::foreign_key_index(fk))?;
    }
    former::open(tx, shapes, told)
}

/// Adds the columns a new build declares that `table`, made by an older
/// one, lacks: its rows stay, the new columns NULL in them until the server
/// sends the rows again (a deployment that changes a table's columns sends
/// it again). SQLite cannot add a NOT NULL column without a default, so
/// the new columns take NULL; the rows sent fill them.
fn add_columns(tx: &Transaction<'_>, table: &crate::shape::Table) -> Result<()> {
    let mut have = std::collections::HashSet::new();
    {
        let mut stmt = tx.prepare(&format!("PRAGMA table_info({})", sql::ident(&table.name)))?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            have.insert(row.get::<_, String>(1)?);
        }
    }
    let mut wanted: Vec<(&str, &str)> = table
        .columns
        .iter()
        .map(|c| (c.name.as_str(), lite::storage(c.kind)))
        .collect();
    if let Some(retired) = table.retired.as_deref() {
        wanted.push((retired, "INTEGER"));
    }
    for (name, storage) in wanted {
        if !have.contains(name) {
            tx.execute_batch(&format!(
                "ALTER TABLE {} ADD COLUMN {} {storage}",
                sql::ident(&table.name),
                sql::ident(name)
            ))?;
        }
    }
    Ok(())
}

/// What a description made of the replica's tables.
pub(crate) struct Retold {
    /// The tables as the replica holds them now, with the foreign keys
    /// among them.
    pub(crate) schema: Schema,
    /// Their statements.
    pub(crate) tables: Tables,
    /// For a replica that follows the description: its tables, and the
    /// tables it made to go down before that the description no longer
    /// names.
    pub(crate) shapes: Option<Shapes>,
    pub(crate) former: Option<std::collections::BTreeSet<String>>,
}

/// Keeps the server's description of the tables, and builds what it
/// decides: for a replica with declarations of its own, the foreign keys'
/// indexes and the statements that retire and purge; for one that follows
/// the description, its tables too, made or widened where they differ.
pub(crate) fn take_description(
    tx: &Transaction<'_>,
    declared: Option<&Engine>,
    shapes: &Shapes,
    described: &envelope::ReplicaSchema,
) -> Result<Retold> {
    let Some(engine) = declared else {
        let (schema, shapes) = following(described)?;
        described::save(tx, described)?;
        let foreign_keys = schema.foreign_keys();
        let tables = Tables::new(shapes.tables(), &foreign_keys);
        let former = make_tables(tx, &shapes, &tables, &foreign_keys, Some(described))?;
        return Ok(Retold {
            schema,
            tables,
            shapes: Some(shapes),
            former: Some(former),
        });
    };
    described::save(tx, described)?;
    let foreign_keys = described::foreign_keys(shapes, described);
    for fk in &foreign_keys {
        tx.execute_batch(&tables::foreign_key_index(fk))?;
    }
    Ok(Retold {
        schema: Schema::new(engine, &foreign_keys),
        tables: Tables::new(shapes.tables(), &foreign_keys),
        shapes: None,
        former: None,
    })
}

/// The schema and tables of a description, for a replica that follows it;
/// refused in words when it cannot.
fn following(described: &envelope::ReplicaSchema) -> Result<(Schema, Shapes)> {
    let schema = Schema::from_described(described).map_err(Error::Undescribable)?;
    let shapes = Shapes::described(&schema).map_err(Error::Undescribable)?;
    Ok((schema, shapes))
}

/// The oldest SQLite a replica runs on: its tables are `STRICT` (3.37).
/// The library links the system's SQLite (decision 169), so this is the
/// machine's to meet.
const OLDEST_SQLITE: (i32, &str) = (3_037_000, "3.37.0");

/// The file at `path`, opened as a replica's: WAL, SQLite's own foreign
/// keys off, waiting for the host's writes rather than failing.
fn open_file(path: impl AsRef<Path>) -> Result<Connection> {
    if rusqlite::version_number() < OLDEST_SQLITE.0 {
        return Err(Error::OldSqlite {
            found: rusqlite::version(),
            needed: OLDEST_SQLITE.1,
        });
    }
    let conn = Connection::open(path)?;
    // The host writes its records on connections of its own: wait for
    // them rather than fail.
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0))?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    described::create(&conn)?;
    Ok(conn)
}

/// Statements kept prepared: the replica's own (a few dozen) and a
/// handful per table. rusqlite keeps 16, fewer than a message and an
/// upload go through, so each was parsed again.
pub(crate) fn statements(shapes: &Shapes) -> usize {
    64 + 8 * shapes.tables().count()
}

/// Refuses foreign keys naming a table or a column that is not declared.
fn check_foreign_keys(shapes: &Shapes, foreign_keys: &[ForeignKey]) -> Result<()> {
    let mut problems = Vec::new();
    for fk in foreign_keys {
        let child = side(shapes, &fk.child, &fk.child_columns, &mut problems);
        let parent = side(shapes, &fk.parent, &fk.parent_columns, &mut problems);
        let arity = fk.child_columns.len() == fk.parent_columns.len();
        if child && parent && (!arity || fk.child_columns.is_empty()) {
            problems.push(Mismatch {
                table: fk.child.clone(),
                column: None,
                problem: format!(
                    "a foreign key to `{}` pairs {} columns with {}",
                    fk.parent,
                    fk.child_columns.len(),
                    fk.parent_columns.len()
                ),
            });
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Declarations(problems))
    }
}

/// Whether one side of a foreign key names a declared table and its columns;
/// records what it does not.
fn side(shapes: &Shapes, table: &str, columns: &[String], problems: &mut Vec<Mismatch>) -> bool {
    let Some(declared) = shapes.codec(table).map(|c| c.table()) else {
        problems.push(Mismatch {
            table: table.to_string(),
            column: None,
            problem: "a foreign key given to the replica names it, but no table is declared so"
                .into(),
        });
        return false;
    };
    let missing: Vec<&String> = columns
        .iter()
        .filter(|c| declared.column(c).is_none())
        .collect();
    for c in &missing {
        problems.push(Mismatch {
            table: table.to_string(),
            column: Some(c.to_string()),
            problem: "a foreign key given to the replica names it, but the declaration has no such column"
                .into(),
        });
    }
    missing.is_empty()
}
