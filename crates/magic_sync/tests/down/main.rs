//! The down path end to end: a real PostgreSQL server, the relay, the
//! in-process network, and replicas on real SQLite files. One binary, so the
//! throwaway cluster starts once.

mod deploy;
mod fleet;
#[path = "../foundation/shop.rs"]
mod shop;
#[path = "../foundation/wanted.rs"]
mod wanted;

mod cost;
mod gate;
mod isolation;
mod keys;
mod relay;
mod scenarios;
mod snapshot;
mod up;
mod walk;
