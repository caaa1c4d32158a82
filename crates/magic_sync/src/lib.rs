//! magic_sync: keeps SQLite replicas in sync with one PostgreSQL database by
//! comparing states instead of replaying a log.
//!
//! This crate is the one a host depends on. It re-exports three crates
//! under the names hosts use:
//!
//! - `magic_sync_core` (always): values, rows, codecs, the wire contract,
//!   the chain, seals and signatures, packing, the [`Engine`]: no I/O;
//! - `magic_sync_server` (feature `postgres`): the `sync` schema, checks and
//!   triggers, the relay, filing, [`ops`], the server's runner;
//! - `magic_sync_replica` (feature `sqlite`): [`replica`], the replica's runner.
//!
//! The features are additive. [`Error`] is the server's; a replica's is
//! [`replica::Error`]. See `docs/` in the repository for how it works.
//!
//! An engine is the list of declared tables. A host may stamp what it knows
//! of a sender on every row it uploads to a table, before the row is filed:
//!
//! ```
//! use magic_sync::{Engine, Row};
//!
//! #[derive(Row, Debug, Clone, PartialEq)]
//! #[row(table = "sales", up, key(id), key_without_origin)]
//! struct Sale {
//!     id: String,
//!     #[row(origin)]
//!     till: String,
//!     store: Option<i64>,
//! }
//!
//! // The host knows which store each till is in.
//! let engine = Engine::builder()
//!     .table::<Sale>()
//!     .stamp::<Sale>(|till, row| {
//!         let store = if till.starts_with("north-") { 1 } else { 2 };
//!         row.insert("store".into(), store.into());
//!         Ok(())
//!     })
//!     .build()?;
//! # assert_eq!(engine.tables().count(), 1);
//! # Ok::<(), magic_sync::core::error::Error>(())
//! ```

extern crate self as magic_sync;

pub mod run;

/// The protocol core, whole.
pub use magic_sync_core as core;
// The protocol core, under the names hosts have always used.
pub use magic_sync_core::{
    backoff, chain, codec, digest, engine, envelope, ids, row, seal, sign, sql, value, wire,
};

#[cfg(feature = "postgres")]
pub use magic_sync_server::{
    catalog, check, deploy, error, file, ops, pg, relay, schema, session, store, tls, trigger,
};
#[cfg(feature = "postgres")]
pub use magic_sync_server::{Error, Handling, Result};

#[cfg(feature = "sqlite")]
pub use magic_sync_replica as replica;
#[cfg(feature = "sqlite")]
pub use magic_sync_replica::lite;

pub use codec::Codec;
pub use engine::Engine;
pub use ids::{EpochId, MessageNo, ReplicaId};
pub use magic_sync_core::{Columns, Kind, Mirror, Numeric, Row, Rule, Table, Value};
