//! The README's two quick-start blocks are the facade's two examples, word for word (and
//! `cargo xtask ci` compiles them in a project of their own that depends only on
//! `ratebucket`).

fn block_after(readme: &str, marker: &str) -> String {
    let rest = readme.split(marker).nth(1).unwrap_or_else(|| panic!("README has no {marker}"));
    rest.split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("no rust block after {marker}"))
        .to_owned()
}

#[test]
fn the_readme_quick_start_is_the_facades_examples() {
    let readme = include_str!("../../../README.md");
    assert_eq!(
        block_after(readme, "<!-- quickstart:real -->"),
        include_str!("../examples/quickstart.rs"),
        "update README.md's quick start from crates/ratebucket/examples/quickstart.rs"
    );
    assert_eq!(
        block_after(readme, "<!-- quickstart:sim -->"),
        include_str!("../examples/quickstart_sim.rs"),
        "update README.md's quick start from crates/ratebucket/examples/quickstart_sim.rs"
    );
}
