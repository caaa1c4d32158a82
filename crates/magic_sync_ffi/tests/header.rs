//! The header in `include/` is what cbindgen makes of the code: an app
//! compiled against it calls the functions the library has, with the
//! arguments they take. `MAGIC_SYNC_BLESS=1 cargo test -p magic_sync_ffi
//! --test header` writes it anew after a change to the ABI.

use std::path::Path;

#[test]
fn the_header_is_what_the_code_declares() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen reads the library")
        .write(&mut made);
    let made = String::from_utf8(made).unwrap();
    let kept = dir.join("include/magic_sync.h");
    if std::env::var_os("MAGIC_SYNC_BLESS").is_some() {
        std::fs::write(&kept, &made).unwrap();
    }
    let on_disk = std::fs::read_to_string(&kept).unwrap_or_default();
    assert!(
        on_disk == made,
        "include/magic_sync.h is not what the code declares: run \
         `MAGIC_SYNC_BLESS=1 cargo test -p magic_sync_ffi --test header` and commit it"
    );
}
