//! A till app written in C, compiled with the system's C compiler against
//! `include/magic_sync.h` and linked to the shared library: the header and
//! the library agree, and an app that is not Rust holds its share.

use crate::support::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where cargo put this package's shared library: beside this test's own
/// program (`target/<profile>/deps/`). `cargo test` builds it there and
/// copies it nowhere else; `cargo build` also copies it one folder up.
pub fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    let library = dir.join(format!(
        "{}magic_sync_ffi{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    assert!(
        library.exists(),
        "no shared library at {}",
        library.display()
    );
    dir
}

#[test]
fn a_till_in_c_holds_its_share() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let program = out.path().join("till");
    let lib = library_dir();
    let compiled = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-D_POSIX_C_SOURCE=200809L",
        ])
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c/till.c"))
        .arg("-o")
        .arg(&program)
        .arg("-L")
        .arg(&lib)
        .args(["-lmagic_sync_ffi", "-lpthread"])
        .output()
        .expect("a C compiler (cc)");
    assert!(
        compiled.status.success(),
        "the C program does not compile:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );

    let server = Server::start();
    let ran = Command::new(&program)
        .arg(server.path("t1"))
        .args(["t1", &server.url, server.secret("t1"), &server.key])
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .unwrap();
    let (said, told) = (
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr),
    );
    assert!(ran.status.success(), "the till failed: {told}\n{said}");
    let status: serde_json::Value = serde_json::from_str(said.lines().next().unwrap()).unwrap();
    assert_eq!(status["ready"], true, "{status}");
    assert_eq!(status["stopped"], serde_json::Value::Null, "{status}");
    assert!(
        said.contains("closed: no open replica has the handle"),
        "{said}"
    );
    assert!(
        server.agrees("t1"),
        "the file holds what the server has for t1"
    );
}
