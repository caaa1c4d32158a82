//! `magic-sync-replica`: a replica for any app. It keeps a SQLite file in
//! sync with the server over the socket transport, following the server's
//! description of the tables: the app reads what the server sends, and
//! writes its own records (up tables, owned columns) with any SQLite
//! driver; the replica sends them up.
//!
//! ```text
//! magic-sync-replica --server wss://sync.example.com --secret-file till-7.secret \
//!     --id till-7 --server-key <KEY> --db till.sqlite
//! magic-sync-replica --status [--json] --db till.sqlite
//! ```
//!
//! It runs until SIGTERM or Ctrl-C, finishing the message it applies. With
//! `--status` it says where the replica in `--db` stands, read-only,
//! beside a running replica or not.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command speaks to its operator"
)]

use clap::Parser;
use magic_sync::replica::Status;
use magic_sync_http::cli::{run_described, Operator, ReplicaArgs};
use std::path::PathBuf;
use std::process::ExitCode;

/// `--status`: where the replica in a file stands.
#[derive(Debug, clap::Parser)]
#[command(name = "magic-sync-replica")]
struct StatusArgs {
    /// Say where the replica stands, and exit.
    #[arg(long, required = true)]
    status: bool,
    /// As one JSON object.
    #[arg(long)]
    json: bool,
    /// The replica's SQLite file.
    #[arg(long)]
    db: PathBuf,
}

fn main() -> ExitCode {
    // `--status` takes the file alone; anything else is a replica to run.
    if std::env::args().any(|a| a == "--status") {
        return status(StatusArgs::parse());
    }
    run_described(&ReplicaArgs::parse(), &Operator::new(std::io::stderr()))
}

fn status(args: StatusArgs) -> ExitCode {
    let status = match magic_sync::replica::status_at(&args.db) {
        Ok(status) => status,
        Err(e) => {
            eprintln!(
                "magic-sync-replica: cannot read the replica at {}: {e}",
                args.db.display()
            );
            return ExitCode::FAILURE;
        }
    };
    match args.json {
        true => println!("{}", status.to_json()),
        false => println!("{}", words(&status)),
    }
    ExitCode::SUCCESS
}

fn words(s: &Status) -> String {
    let mut lines = vec![match (s.ready, s.snapshot_began, s.gap) {
        (_, _, Some(gap)) => {
            format!("in a gap at message {gap}: it waits for the server to provision it again")
        }
        (_, Some(began), None) => format!("being provisioned, since message {began}"),
        (true, None, None) => "ready".to_string(),
        (false, None, None) => "not provisioned yet".to_string(),
    }];
    if let Some(applied) = s.applied {
        lines.push(format!("last message applied: {applied}"));
    }
    lines.push(format!("writes not filed by the server yet: {}", s.unfiled));
    if s.refused > 0 {
        lines.push(format!("rows refused: {}", s.refused));
    }
    if s.forged > 0 {
        lines.push(format!(
            "messages refused as not the server's: {} (last: {})",
            s.forged,
            s.last_forgery.as_deref().unwrap_or("unknown")
        ));
    }
    lines.join("\n")
}
