//! The README's whole host is `examples/host.rs`, which the tests build:
//! this checks the README shows it as it is, so it cannot go stale.

#[test]
fn the_readmes_host_is_the_example_the_tests_build() {
    let readme = include_str!("../../../README.md");
    let example = include_str!("../examples/host.rs");
    let start = "<!-- examples/host.rs -->\n```rust\n";
    let at = readme
        .find(start)
        .expect("the README shows examples/host.rs after its marker")
        + start.len();
    let shown = &readme[at..at + readme[at..].find("```\n").expect("the block ends")];
    assert!(
        shown == example,
        "the README's host differs from examples/host.rs: copy the file into the README"
    );
}
