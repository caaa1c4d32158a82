//! Locating the PostgreSQL programs and other helpers on this machine.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable naming the directory of `initdb`, `pg_ctl`, `psql`, …
pub(crate) const PG_BIN_ENV: &str = "MAGIC_SYNC_PG_BIN";

/// How to get the PostgreSQL programs, for error messages.
pub(crate) const INSTALL_HINT: &str = "install PostgreSQL (Debian/Ubuntu: \
    `apt-get install postgresql`; Fedora: `dnf install postgresql-server`; \
    macOS: `brew install postgresql`), or set MAGIC_SYNC_PG_BIN to the directory \
    holding its programs (initdb, pg_ctl, …)";

/// Where [`find_bin_dir`] looks, for error messages.
pub(crate) const SEARCHED: &str =
    "$MAGIC_SYNC_PG_BIN, `pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH";

/// The first of: `$MAGIC_SYNC_PG_BIN`, `pg_config --bindir`, the newest
/// `/usr/lib/postgresql/<version>/bin`, the `PATH` entry holding `initdb`.
/// Only directories that hold `initdb` count, except for an explicit
/// `$MAGIC_SYNC_PG_BIN`, which is taken as given.
pub(crate) fn find_bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(PG_BIN_ENV).filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let has_initdb = |dir: &Path| dir.join("initdb").is_file();
    if let Some(dir) = pg_config_bindir().filter(|d| has_initdb(d)) {
        return Some(dir);
    }
    if let Some(dir) = newest_debian_bin_dir().filter(|d| has_initdb(d)) {
        return Some(dir);
    }
    find_in_path("initdb").and_then(|initdb| initdb.parent().map(Path::to_path_buf))
}

fn pg_config_bindir() -> Option<PathBuf> {
    let output = Command::new("pg_config").arg("--bindir").output().ok()?;
    if !output.status.success() {
        return None;
    }
    let dir = String::from_utf8(output.stdout).ok()?;
    let dir = dir.trim();
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

/// Debian and Ubuntu install each major version under `/usr/lib/postgresql/<major>`.
fn newest_debian_bin_dir() -> Option<PathBuf> {
    let entries = std::fs::read_dir("/usr/lib/postgresql").ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = version_key(&entry.file_name().to_string_lossy())?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, bin)| bin)
}

/// `"9.6"` → `[9, 6]`, `"15"` → `[15]`; `None` for anything else.
fn version_key(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

/// Full path of `program` in `PATH`, also looking in the sbin directories
/// that are missing from the `PATH` of non-login shells.
pub(crate) fn find_in_path(program: impl AsRef<OsStr>) -> Option<PathBuf> {
    let program = program.as_ref();
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::version_key;

    #[test]
    fn versions_order_numerically() {
        assert!(version_key("15") > version_key("9.6"));
        assert!(version_key("16") > version_key("15"));
        assert_eq!(version_key("15"), Some(vec![15]));
        assert_eq!(version_key("common"), None);
    }
}
