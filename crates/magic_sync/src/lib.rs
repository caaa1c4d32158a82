//! magic_sync: keeps SQLite replicas in sync with one PostgreSQL database by
//! comparing states instead of replaying a log.
//!
//! See `docs/` in the repository for how it works.

extern crate self as magic_sync;

pub mod engine;
pub mod error;
pub mod run;

// The protocol core, under the names hosts have always used.
pub use magic_sync_core::{chain, codec, digest, envelope, ids, row, seal, sql, value, wire};

#[cfg(feature = "postgres")]
pub mod catalog;
#[cfg(feature = "postgres")]
pub mod check;
#[cfg(feature = "postgres")]
pub mod file;
#[cfg(feature = "postgres")]
pub mod ops;
#[cfg(feature = "postgres")]
pub mod pg;
#[cfg(feature = "postgres")]
pub mod relay;
#[cfg(feature = "postgres")]
pub mod schema;
#[cfg(feature = "postgres")]
pub mod session;
#[cfg(feature = "postgres")]
pub mod trigger;

#[cfg(feature = "sqlite")]
pub mod lite;
#[cfg(feature = "sqlite")]
pub mod replica;

pub use codec::Codec;
pub use engine::Engine;
pub use error::{Error, Result};
pub use ids::MessageNo;
pub use magic_sync_core::{Columns, Kind, Mirror, Numeric, Row, Rule, Table, Value};
