//! The transport end to end: a relay, its hub on a loopback socket, and
//! replicas on SQLite files of their own, each over a real WebSocket; one
//! binary, so the throwaway cluster starts once.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test says what it saw, for whoever reads its output"
)]

mod binary;
mod edges;
mod floods;
mod intake;
mod mitm;
mod refusals;
mod socket;
mod strangers;
mod support;
