//! The server side of magic_sync, on PostgreSQL: the `sync` schema and its
//! migrations, the start-up checks and the triggers that note every change,
//! the relay (observe → plan → load → record → publish), filing what
//! replicas send up, the operator's reads, and the runner that drives them.
//!
//! Hosts reach all of it through the `magic_sync` crate (feature
//! `postgres`), which re-exports these modules under the same names.

pub mod catalog;
pub mod check;
pub mod deploy;
pub mod error;
pub mod file;
pub(crate) mod graph;
pub mod pg;
pub mod relay;
pub mod run;
pub mod session;
pub mod store;
pub mod tls;
pub mod trigger;

use magic_sync_core::{backoff, digest, engine, envelope, row, seal, sql, value, wire};

pub use error::{Error, Handling, Result};
/// The `sync` schema's migrations, under the name hosts have always used.
pub use store::migrations as schema;
pub use store::reads as ops;
