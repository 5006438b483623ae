//! The README's quick start is the quickstart example, word for word.

#[test]
fn the_readme_quick_start_is_the_example() {
    let readme = include_str!("../../../README.md");
    let example = include_str!("../examples/quickstart.rs");
    let section = readme
        .split("## Quick start")
        .nth(1)
        .expect("README has a quick start");
    let block = section
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the quick start has a rust block");
    assert_eq!(
        block, example,
        "update README.md's quick start from the example"
    );
}
