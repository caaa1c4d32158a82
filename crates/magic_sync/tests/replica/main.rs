//! The replica side of the down path, against real SQLite files: the chain,
//! how rows apply, retiring and purging, snapshots, and the digest. No
//! PostgreSQL: messages are built here the way the server builds them.

mod chain;
mod digest;
mod looping;
mod retire;
mod rows;
mod snapshot;
mod status;
mod support;
mod trust;
mod up;
