//! What the server keeps in the `sync` schema, and the statements that own
//! it: the schema's migrations, the replicas' credentials the transport
//! checks, and the keys the server signs with. (The relay's record, outbox
//! and planner statements are still beside the steps that run them, in
//! `relay/`; see docs/crates.md.)

pub mod credentials;
pub mod keys;
pub mod migrations;
pub mod quarantine;
pub mod tables;
pub mod wake;
