//! "From any language" (docs/any-language.md) shows the C and Python tills
//! the tests run, whole: this checks it shows them as they are, so the
//! page cannot go stale.

fn shown<'a>(page: &'a str, file: &str, language: &str) -> &'a str {
    let start = format!("<!-- {file} -->\n```{language}\n");
    let at = page
        .find(&start)
        .unwrap_or_else(|| panic!("the page shows {file} after its marker"))
        + start.len();
    &page[at..at + page[at..].find("```\n").expect("the block ends")]
}

#[test]
fn the_pages_tills_are_the_ones_the_tests_run() {
    let page = include_str!("../../../docs/any-language.md");
    assert!(
        shown(page, "crates/magic_sync_ffi/tests/c/till.c", "c") == include_str!("c/till.c"),
        "docs/any-language.md shows another till.c: copy the file into the page"
    );
    assert!(
        shown(page, "bindings/python/examples/till.py", "python")
            == include_str!("../../../bindings/python/examples/till.py"),
        "docs/any-language.md shows another till.py: copy the file into the page"
    );
}
