//! A till of the demo's shop: the replica's loop over the network
//! transport, as any host's replica binary runs it (a host's is this with
//! its own declarations). With `--sell-every-ms` it also plays a till's
//! host: it records sales and counts stock. `demo till` reaches the server
//! over a socket; `demo till-broker` reads its mailbox on a NATS broker.

use magic_sync::replica::Replica;
use magic_sync::run::process::{Connecting, Identity, Operator};
use magic_sync::run::replica::Nudger;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// What the till's host does beside the loop.
#[derive(Debug, clap::Args)]
pub struct Host {
    /// Record a sale (and count a product's stock) this often, in ms.
    #[arg(long)]
    sell_every_ms: Option<u64>,
    /// Stop selling after this many sales.
    #[arg(long, default_value_t = u64::MAX)]
    sales: u64,
    /// Close the link and stop once standard input closes (how the demo
    /// stops its tills).
    #[arg(long)]
    until_stdin_closes: bool,
}

/// A till over a socket to the server.
#[derive(Debug, clap::Parser)]
#[command(about = "A till of magic_sync's demo shop, over a socket to the server")]
pub struct Args {
    #[command(flatten)]
    replica: magic_sync_http::cli::ReplicaCommand,
    #[command(flatten)]
    host: Host,
}

/// A till reading its mailbox on a NATS broker.
#[derive(Debug, clap::Parser)]
#[command(about = "A till of magic_sync's demo shop, through a NATS broker")]
pub struct BrokerArgs {
    #[command(flatten)]
    replica: magic_sync_nats::cli::ReplicaCommand,
    #[command(flatten)]
    host: Host,
}

/// Runs the till `args` name until its input closes (with
/// `--until-stdin-closes`) or its database fails, telling `operator` how
/// it goes.
pub fn run(args: Args, operator: &Operator) -> ExitCode {
    crate::logs();
    match magic_sync_http::cli::open(&args.replica, Some(crate::engine())) {
        Ok((replica, socket)) => {
            let nudger = socket.nudger();
            let r = &args.replica;
            serve(
                replica,
                Arc::new(socket),
                nudger,
                &r.identity,
                &r.server,
                &args.host,
                operator,
            )
        }
        Err(e) => {
            operator.say(format_args!("shop-till: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// [`run`], through the broker.
pub fn run_broker(args: BrokerArgs, operator: &Operator) -> ExitCode {
    crate::logs();
    match magic_sync_nats::cli::open(&args.replica, crate::engine()) {
        Ok((replica, mailbox)) => {
            let nudger = mailbox.nudger();
            let r = &args.replica;
            serve(
                replica,
                Arc::new(mailbox),
                nudger,
                &r.identity,
                &r.broker,
                &args.host,
                operator,
            )
        }
        Err(e) => {
            operator.say(format_args!("shop-till: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// The host beside the loop, then the loop until the link closes.
fn serve<L: Connecting>(
    mut replica: Replica,
    link: Arc<L>,
    nudger: Nudger,
    who: &Identity,
    address: &str,
    host: &Host,
    operator: &Operator,
) -> ExitCode {
    let id = who.id.as_str();
    if host.until_stdin_closes {
        let link = link.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            link.close();
        });
    }
    if let Some(every) = host.sell_every_ms {
        let (db, id, sales, operator) =
            (who.db.clone(), id.to_string(), host.sales, operator.clone());
        std::thread::spawn(move || {
            if let Err(e) = sell(&db, &id, Duration::from_millis(every), sales, &nudger) {
                operator.say(format_args!("shop-till `{id}`: selling: {e}"));
            }
        });
    }
    // SIGTERM or Ctrl-C closes the link, as in any replica process.
    magic_sync::run::process::run(&mut replica, link, id, address, operator)
}

/// A till's host: sells a product now and then, and counts its stock,
/// on a connection of its own; each write nudges the loop.
fn sell(
    db: &std::path::Path,
    till: &str,
    every: Duration,
    sales: u64,
    nudger: &Nudger,
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
