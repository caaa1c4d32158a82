//! The Python till (`bindings/python/examples/till.py`) against a real
//! server: it receives the products, sells with the standard library's
//! sqlite3 while the replica's loop runs and the server changes prices
//! under it, waits until what the server made of its sales (receipts, by a
//! trigger as each sale is filed) came back, and reads them.

use crate::program::library_dir;
use crate::support::*;
use magic_sync_testkit::until_within;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const SALES: usize = 100;
const PRICE_CHANGES: i64 = 300;

#[test]
fn a_till_in_python_writes_while_its_replica_runs_and_reads_what_the_server_made_of_its_sales() {
    let bindings = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bindings/python");
    let server = Server::start();
    let secret = server.path("t1").with_extension("secret");
    std::fs::write(&secret, server.secret("t1")).unwrap();
    let library = library_dir().join(format!(
        "{}magic_sync_ffi{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    let mut till = Command::new("python3")
        .arg(bindings.join("examples/till.py"))
        .args([&server.url, "t1"])
        .arg(&secret)
        .arg(&server.key)
        .arg(server.path("t1"))
        .arg(SALES.to_string())
        .env("PYTHONPATH", &bindings)
        .env("MAGIC_SYNC_LIB", &library)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (cargo xtask test installs it)");

    std::thread::scope(|scope| {
        // The server changes prices while the till sells: the replica's
        // loop applies them as the app writes the same file.
        let changing = scope.spawn(|| {
            server.runtime.block_on(async {
                for i in 0..PRICE_CHANGES {
                    server
                        .client
                        .execute(
                            "UPDATE products SET name = 'product ' || id || ' at ' || $1::bigint \
                             WHERE id = $1::bigint % 50 + 1",
                            &[&i],
                        )
                        .await
                        .unwrap();
                }
            })
        });

        let mut report = String::new();
        BufReader::new(till.stdout.take().unwrap())
            .read_line(&mut report)
            .unwrap();
        if report.is_empty() {
            let mut told = String::new();
            std::io::Read::read_to_string(&mut till.stderr.take().unwrap(), &mut told).unwrap();
            panic!("the Python till ended without its report: {told}");
        }
        let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
        assert_eq!(report["products"], 50, "{report}");
        assert_eq!(report["receipts"][0], SALES, "{report}");
        assert_eq!(report["integrity"], "ok", "{report}");
        assert_eq!(report["status"]["ready"], true, "{report}");
        assert_eq!(
            server.query("SELECT count(*)::text FROM sales WHERE till = 't1' AND total = 12.50"),
            [SALES.to_string()]
        );

        // Once the price changes end, the file holds what the server has
        // for t1, receipts included, while the till still runs.
        changing.join().unwrap();
        let receipts = "SELECT sale_id || ':' || total_with_tax FROM receipts ORDER BY sale_id";
        server.runtime.block_on(until_within(
            "t1 to hold what the server has",
            std::time::Duration::from_secs(60),
            async || server.agreeing("t1").await,
        ));
        assert_eq!(read(&server.path("t1"), receipts), server.query(receipts));
    });

    drop(till.stdin.take());
    let ran = till.wait_with_output().unwrap();
    assert!(
        ran.status.success(),
        "the Python till failed: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
}
