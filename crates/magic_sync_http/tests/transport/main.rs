//! The transport end to end: a relay, its hub on a loopback socket, and
//! replicas on SQLite files of their own, each over a real WebSocket; one
//! binary, so the throwaway cluster starts once.

mod binary;
mod edges;
mod floods;
mod intake;
mod mitm;
mod refusals;
mod socket;
mod strangers;
mod support;
