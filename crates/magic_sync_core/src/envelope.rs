//! The envelopes of the wire contract, generated from `proto/magic_sync.proto`.
#![allow(missing_docs, missing_debug_implementations, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/magic_sync.v1.rs"));
