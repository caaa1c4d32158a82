//! What the server keeps in the `sync` schema, and the statements that own
//! it: the schema's migrations, and the replicas' credentials the transport
//! checks. (The relay's record, outbox and planner statements are still
//! beside the steps that run them, in `relay/`; see docs/crates.md.)

pub mod credentials;
pub mod migrations;
