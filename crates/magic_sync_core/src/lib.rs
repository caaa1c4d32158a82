//! The protocol core of magic_sync: what server and replica agree on, with no
//! I/O. Values and rows, the codecs, the wire contract and its envelopes, the
//! chain a replica follows, the seal the server checks, and the packing of a
//! replica's rows into messages. Neither PostgreSQL nor SQLite nor an async
//! runtime is a dependency: everything here is a plain function or a value,
//! tested with `cargo test -p magic_sync_core` and no database.
//!
//! Hosts reach all of it through the `magic_sync` crate, which re-exports
//! these modules under the same names.

// The derive names the runtime crate as `::magic_sync`; inside this crate's
// own tests that is this crate.
extern crate self as magic_sync;

pub mod backoff;
pub mod bounds;
pub mod chain;
pub mod codec;
pub mod columns;
pub mod digest;
pub mod engine;
pub mod envelope;
pub mod error;
pub mod ids;
pub mod link;
pub mod logbook;
pub mod pack;
pub mod row;
pub mod schema;
pub mod seal;
pub mod sign;
pub mod sql;
pub mod value;
pub mod wire;

pub use codec::Codec;
pub use engine::Engine;
pub use error::Mismatch;
pub use ids::{EpochId, MessageNo, ReplicaId};
pub use magic_sync_derive::{Columns, Row};
pub use row::{Columns, Mirror, Row, Rule, Table};
pub use value::{Kind, Numeric, Value};
