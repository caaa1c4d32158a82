//! A till of the demo's shop: the replica's loop over the network
//! transport, as any host's replica binary runs it (a host's is this with
//! its own declarations). With `--sell-every-ms` it also plays a till's
//! host: it records sales and counts stock.

use magic_sync_http::cli::{open, ReplicaCommand};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Parser)]
#[command(about = "A till of magic_sync's demo shop")]
pub struct Args {
    #[command(flatten)]
    replica: ReplicaCommand,
    /// Record a sale (and count a product's stock) this often, in ms.
    #[arg(long)]
    sell_every_ms: Option<u64>,
    /// Stop selling after this many sales.
    #[arg(long, default_value_t = u64::MAX)]
    sales: u64,
    /// Close the connection and stop once standard input closes (how the
    /// demo stops its tills).
    #[arg(long)]
    until_stdin_closes: bool,
}

/// Runs the till `args` name until its input closes (with
/// `--until-stdin-closes`) or its database fails.
pub fn run(args: Args) -> ExitCode {
    crate::logs();
    let (mut replica, socket) = match open(&args.replica, crate::engine()) {
        Ok(opened) => opened,
        Err(e) => {
            eprintln!("magic-sync-replica: {e}");
            return ExitCode::FAILURE;
        }
    };
    let socket = std::sync::Arc::new(socket);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (socket, done, args) = (socket.clone(), done.clone(), args.replica.clone());
        std::thread::spawn(move || {
            magic_sync::run::process::tell(&*socket, &done, &args.id, &args.server);
        });
    }
    if args.until_stdin_closes {
        let socket = socket.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            socket.close();
        });
    }
    if let Some(every) = args.sell_every_ms {
        let (db, id, nudger, sales) = (
            args.replica.db.clone(),
            args.replica.id.clone(),
            socket.nudger(),
            args.sales,
        );
        std::thread::spawn(move || {
            if let Err(e) = sell(&db, &id, Duration::from_millis(every), sales, &nudger) {
                eprintln!("magic-sync-replica `{id}`: selling: {e}");
            }
        });
    }
    match magic_sync::run::replica::replica(&mut replica, &*socket) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("magic-sync-replica `{}`: {e}", args.replica.id);
            ExitCode::FAILURE
        }
    }
}

/// A till's host: sells a product now and then, and counts its stock,
/// on a connection of its own; each write nudges the loop.
fn sell(
    db: &std::path::Path,
    till: &str,
    every: Duration,
    sales: u64,
    nudger: &magic_sync_http::client::Nudger,
) -> Result<(), rusqlite::Error> {
    let conn = rusqlite::Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(30))?;
    // Sales go on from where an earlier run stopped.
    let mut made: u64 =
        conn.query_row("SELECT count(*) FROM sales WHERE till = ?1", [till], |r| {
            r.get::<_, i64>(0)
        })? as u64;
    let mut sold = 0;
    while sold < sales {
        std::thread::sleep(every);
        // Only once the till holds its products (its snapshot applied).
        let product: Option<(i64, String)> = conn
            .query_row(
                "SELECT id, price FROM products ORDER BY random() LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .ok();
        let Some((product, price)) = product else {
            continue;
        };
        made += 1;
        sold += 1;
        conn.execute(
            "INSERT INTO sales (id, till, product_id, total) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![format!("{till}-{made}"), till, product, price],
        )?;
        conn.execute(
            "UPDATE stock SET counted = coalesce(counted, on_hand) - 1
             WHERE till = ?1 AND product_id = ?2",
            rusqlite::params![till, product],
        )?;
        nudger.nudge();
    }
    Ok(())
}
