//! The foundation's tests against a real PostgreSQL: the sync schema, the
//! triggers and their notes, the start-up checks, the table graph, and codec
//! round trips through real PostgreSQL and SQLite rows. One binary, so the
//! throwaway cluster starts once.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test says what it saw, for whoever reads its output"
)]

use magic_sync_testkit::shop;

mod catalog;
mod codecs;
mod install;
mod notes;
mod policy;
mod schema;
mod startup;
mod tls;
mod types;
