//! magic_sync: keeps SQLite replicas in sync with one PostgreSQL database by
//! comparing states instead of replaying a log.
//!
//! See `docs/` in the repository for how it works.

extern crate self as magic_sync;

pub mod base64;
pub mod chain;
pub mod codec;
pub mod digest;
pub mod engine;
pub mod envelope;
pub mod error;
pub mod row;
pub mod run;
pub mod seal;
pub mod sql;
pub mod value;
pub mod wire;

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
pub use magic_sync_derive::{Columns, Row};
pub use row::{Columns, Mirror, Row, Rule, Table};
pub use value::{Kind, Numeric, Value};
