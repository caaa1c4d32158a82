//! What magic_sync's tests and benchmarks share: the shop schema every
//! strategy is declared over, the model of what each replica should hold,
//! a fleet of real SQLite replicas behind the real relay, a gate that holds
//! a replica's messages, and the benchmarks' fleet and figures. A crate of
//! its own, so each test binary and benchmark uses it as it uses any other.

// Fleets of connections, threads and files, for tests: nothing a Debug
// print would help with.
#![allow(missing_debug_implementations)]

pub mod apart;
pub mod bench;
pub mod fleet;
pub mod gate;
pub mod nats;
pub mod pgbench;
pub mod shop;
pub mod walk;
pub mod wanted;
pub mod wire;
