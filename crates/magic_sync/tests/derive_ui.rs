//! Compile-time behaviour of `#[derive(Row)]` / `#[derive(Columns)]`: every
//! declaration mistake is a pinned error, and the full vocabulary compiles.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
