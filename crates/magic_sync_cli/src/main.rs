//! `magic-sync`: see the library's documentation. Connects with
//! `DATABASE_URL` (TLS as its `sslmode` says; `PGSSLROOTCERT` names root
//! certificates to verify the server against), which is never printed.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command speaks to its operator"
)]

use clap::Parser;
use magic_sync_cli::{run, Cli, EXIT_ERROR};
use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    magic_sync_cli::logs();
    match main_with(&cli).await {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("magic-sync: {message}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

async fn main_with(cli: &Cli) -> Result<u8, String> {
    if !cli.command.needs_database() {
        let mut out = std::io::stdout().lock();
        let outcome = magic_sync_cli::run_offline(&cli.command, cli.json, &mut out)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(outcome.exit_code());
    }
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| "DATABASE_URL is not set: it names the server's database".to_string())?;
    // Errors are told without the URL: it may hold a password.
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|_| "DATABASE_URL is not a connection string PostgreSQL reads".to_string())?;
    let roots = std::env::var_os(magic_sync::tls::ROOT_CERTIFICATES).is_some();
    if let Some(caveat) = magic_sync::tls::caveat(&config, roots) {
        eprintln!("warning: {caveat}");
    }
    let tls = magic_sync::tls::tls().map_err(|e| e.to_string())?;
    let (mut client, connection) = config
        .connect(tls)
        .await
        .map_err(|e| format!("connecting to the database: {e}"))?;
    let connection = tokio::spawn(connection);
    let mut out = std::io::stdout().lock();
    let outcome = run(&cli.command, cli.json, &mut client, &mut out)
        .await
        .map_err(|e| e.to_string())?;
    drop(client);
    let _ = connection.await;
    Ok(outcome.exit_code())
}
