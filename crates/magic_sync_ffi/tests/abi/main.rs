//! The C ABI as an app calls it: a real server on loopback, a real SQLite
//! file, the library's functions called from this thread, and a C program
//! compiled against the header.
#![allow(
    unsafe_code,
    reason = "the tests call the C ABI as an app does, through raw pointers"
)]

mod calls;
mod program;
mod python;
mod support;
