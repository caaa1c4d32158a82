//! What a host mounts in its own binary, beside the declarations only it
//! knows: `deploy`, what starting its build would change or where the last
//! deployment stands, and `indexes`, the indexes the relay's start-up check
//! would demand of its build.

use crate::{emit, show, Error, Outcome};
use clap::Args;
use std::io::Write;
use tokio_postgres::Client;

/// `deploy`, for a host to mount in its own binary: only the host knows
/// its declarations. With `--dry-run` it prints what starting this build
/// would change (tables reused, added, planned again, sent again, taken
/// back, with the rows each moves) and changes nothing; without, where the
/// last deployment stands. The relay does the deployment itself when the
/// new build starts.
#[derive(Debug, Clone, Default, Args)]
pub struct Deploy {
    /// Print what starting this build would change, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON (stable field names) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs [`Deploy`] for the build whose declarations are `engine`, on a
/// connection of its own.
pub async fn deploy(
    client: &mut Client,
    engine: &magic_sync::Engine,
    args: &Deploy,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    if args.dry_run {
        let read = magic_sync::deploy::dry_run(client, engine)
            .await
            .map_err(Error::Deployment)?;
        emit(out, args.json, &read, show::dry_run)?;
    } else {
        let read = magic_sync::deploy::progress(client)
            .await
            .map_err(Error::Deployment)?;
        emit(out, args.json, &read, |d: &Vec<_>| show::deployment(d))?;
    }
    Ok(Outcome::Fine)
}

/// `indexes`, for a host to mount in its own binary beside [`Deploy`]:
/// prints the `CREATE INDEX` statements the relay's start-up check would
/// demand of this build's declarations (the columns a `follows` table
/// follows its parent by, a group rule's members and grants), each with
/// what the relay looks up through it, and ends as
/// [`Outcome::WaitsForFix`] (exit 2) when any is missing, so a deploy
/// script can stop before the relay would refuse to start.
#[derive(Debug, Clone, Default, Args)]
pub struct Indexes {
    /// Print JSON (stable field names) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One index [`Indexes`] found missing, as its JSON prints it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Missing {
    /// The table's schema.
    pub schema: String,
    /// The table.
    pub table: String,
    /// The columns the index must lead with.
    pub columns: Vec<String>,
    /// What the relay looks up through it.
    pub why: String,
    /// The statement that makes it.
    pub sql: String,
}

/// Runs [`Indexes`] for the build whose declarations are `engine`.
pub async fn indexes(
    client: &Client,
    engine: &magic_sync::Engine,
    args: &Indexes,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    let missing: Vec<Missing> = magic_sync::check::missing_indexes(engine, client)
        .await
        .map_err(Error::Catalogue)?
        .into_iter()
        .map(|m| Missing {
            sql: format!("{};", m.create_sql()),
            schema: m.schema,
            table: m.table,
            columns: m.columns,
            why: m.why,
        })
        .collect();
    emit(out, args.json, &missing, |m: &Vec<Missing>| {
        show::indexes(m)
    })?;
    Ok(Outcome::of(!missing.is_empty()))
}
