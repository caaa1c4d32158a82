//! The Python till (`bindings/python/examples/till.py`) against a real
//! server: it receives the products, sells with the standard library's
//! sqlite3, waits until what the server made of the sale (a receipt, by a
//! trigger as the sale is filed) came back, and reads it.

use crate::program::library_dir;
use crate::support::*;
use std::path::Path;
use std::process::Command;

#[test]
fn a_till_in_python_holds_its_share_and_reads_what_the_server_made_of_its_sale() {
    let bindings = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bindings/python");
    let server = Server::start();
    let secret = server.path("t1").with_extension("secret");
    std::fs::write(&secret, server.secret("t1")).unwrap();
    let library = library_dir().join(format!(
        "{}magic_sync_ffi{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    let ran = Command::new("python3")
        .arg(bindings.join("examples/till.py"))
        .args([&server.url, "t1"])
        .arg(&secret)
        .arg(&server.key)
        .arg(server.path("t1"))
        .arg("sale-1")
        .env("PYTHONPATH", &bindings)
        .env("MAGIC_SYNC_LIB", &library)
        .output()
        .expect("python3 (cargo xtask test installs it)");
    let (said, told) = (
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr),
    );
    assert!(
        ran.status.success(),
        "the Python till failed: {told}\n{said}"
    );
    let report: serde_json::Value = serde_json::from_str(said.trim()).unwrap();
    assert_eq!(report["products"], 50, "{report}");
    assert_eq!(
        report["receipt"],
        serde_json::json!(["sale-1", "15.00"]),
        "{report}"
    );
    assert_eq!(report["status"]["ready"], true, "{report}");
    assert_eq!(
        server.query("SELECT id || ':' || till || ':' || total FROM sales"),
        ["sale-1:t1:12.50"]
    );
    assert!(
        server.agrees("t1"),
        "the file holds what the server has for t1"
    );
}
