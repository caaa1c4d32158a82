//! What an operator sees (`magic_sync::ops`), read from a real fleet in a
//! known state: every figure exact. One binary, so the throwaway cluster
//! starts once.

// The down path's fleet, shared as the down tests share the shop: this
// binary uses part of it.
#[path = "../down/fleet.rs"]
#[allow(dead_code)]
mod fleet;
#[path = "../down/gate.rs"]
#[allow(dead_code)]
mod gate;
#[path = "../foundation/shop.rs"]
#[allow(dead_code)]
mod shop;
#[path = "../foundation/wanted.rs"]
mod wanted;

mod errors;
mod known;
mod reads;
