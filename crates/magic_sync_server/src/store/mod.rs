//! What the server keeps in the `sync` schema, and every statement that
//! reads or writes it: no other module of the server names a `sync`
//! relation (a test below holds them to it). The rest of the server decides
//! and calls these; the store says how it is kept.
//!
//! - the schema itself: [`migrations`]; the installation's `epoch`; the
//!   [`keys`] the server signs with; the replicas' [`credentials`] the
//!   transport checks;
//! - the declarations: [`tables`] (what each build declared),
//!   `deployment` (what a changed declaration owes, chunk by chunk);
//! - the fleet: `replicas` (live, partition, chain, told what),
//!   `snapshots` (waiting, under way, ended), `digests`;
//! - the down path: `notes` (the triggers' statement), `plan` (the
//!   planner: the difference per replica, in the pass's scratch tables),
//!   `held` (what each replica holds, and why), `outbox` (messages
//!   waiting, sent, acknowledged), `acks`, `checkpoints` (reading one's
//!   own writes), [`quarantine`] and `parked` (what cannot go, set
//!   aside), [`wake`] (dozing until a commit);
//! - the up path: `filing` (the inbox of refused rows, backlogs, what was
//!   answered and filed);
//! - what an operator reads: [`reads`] (re-exported as `crate::ops`) and
//!   the runner's [`figures`];
//! - the record by rule: `cohorts`, what many replicas hold alike.

pub(crate) mod acks;
pub mod broker_keys;
pub(crate) mod by_rule;
pub(crate) mod checkpoints;
pub(crate) mod cohorts;
pub mod credentials;
pub(crate) mod deployment;
pub(crate) mod digests;
pub(crate) mod epoch;
pub mod figures;
pub(crate) mod filing;
pub(crate) mod held;
pub mod keys;
pub mod migrations;
pub(crate) mod notes;
pub(crate) mod outbox;
pub(crate) mod parked;
pub(crate) mod plan;
pub mod quarantine;
pub mod reads;
pub(crate) mod replicas;
pub(crate) mod snapshots;
pub mod tables;
pub mod wake;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// Every `.rs` file under `dir`.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("the crate's sources are readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Where `line` names a relation or function of the `sync` schema
    /// outside a comment: `sync.` followed by a lower-case name, not part
    /// of a longer identifier (`magic_sync.proto`, `std::sync`).
    fn names_sync(line: &str) -> bool {
        let code = line.trim_start();
        if code.starts_with("//") {
            return false;
        }
        code.match_indices("sync.").any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = code[at + 5..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                && after.is_some_and(|c| c.is_ascii_lowercase())
        })
    }

    #[test]
    fn the_check_finds_a_statement_and_passes_over_the_rest() {
        assert!(names_sync(r#"    "SELECT id FROM sync.replicas","#));
        assert!(names_sync("INSERT INTO sync.notes (table_name)"));
        assert!(!names_sync("    // rows in `sync.held`"));
        assert!(!names_sync("use std::sync::Arc;"));
        assert!(!names_sync(r#"include!("magic_sync.v1.rs");"#));
    }

    #[test]
    fn only_the_store_names_the_sync_schema() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let store = root.join("store");
        let mut files = Vec::new();
        sources(&root, &mut files);
        assert!(files.len() > 20, "found the crate's sources: {files:?}");
        let mut found = Vec::new();
        for file in files.iter().filter(|f| !f.starts_with(&store)) {
            let text = std::fs::read_to_string(file).expect("a source file is text");
            for (n, line) in text.lines().enumerate() {
                if names_sync(line) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(
            found.is_empty(),
            "statements on the sync schema outside store/ (move them into a store module):\n{}",
            found.join("\n")
        );
    }
}
