//! What an operator sees (`magic_sync::ops`), read from a real fleet in a
//! known state: every figure exact. One binary, so the throwaway cluster
//! starts once.

use magic_sync_testkit::fleet;

mod errors;
mod known;
mod reads;
