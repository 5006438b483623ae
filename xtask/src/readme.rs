//! `cargo xtask readme`: compiles the README's quick start in a new project outside the
//! workspace that depends only on `ratebucket`, runs its fake-provider half, and compiles
//! every other Rust block of the README in a second project.

use std::path::Path;
use std::process::Command;

/// Where the scratch project is made (inside the workspace's target directory, which is
/// not a workspace member, so the project stands alone).
const DIR: &str = "target/readme-check";

/// Where the README's other Rust blocks are compiled, one binary each.
const BLOCKS_DIR: &str = "target/readme-blocks";

/// The quick start's markers: their blocks are compiled (and run) on their own.
const QUICKSTART: [&str; 2] = ["<!-- quickstart:real -->", "<!-- quickstart:sim -->"];

/// Runs the check.
pub(crate) fn run() -> Result<(), String> {
    let root = std::env::current_dir().map_err(|e| e.to_string())?;
    let readme = std::fs::read_to_string(root.join("README.md")).map_err(|e| e.to_string())?;
    let real = block_after(&readme, QUICKSTART[0])?;
    let sim = block_after(&readme, QUICKSTART[1])?;
    let dir = root.join(DIR);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src/bin")).map_err(|e| e.to_string())?;
    let facade = root.join("crates/ratebucket");
    let manifest = format!(
        "[package]\nname = \"readme-check\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [dependencies]\nratebucket = {{ path = {:?}, features = [\"sim\"] }}\n\n[workspace]\n",
        facade.display().to_string()
    );
    write(&dir.join("Cargo.toml"), &manifest)?;
    write(&dir.join("src/main.rs"), &real)?;
    write(&dir.join("src/bin/sim.rs"), &sim)?;
    // The workspace's lock file, so the project builds the versions the workspace tested.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).map_err(|e| e.to_string())?;
    for args in [&["build", "--bins"][..], &["run", "--quiet", "--bin", "sim"][..]] {
        cargo_in(&root, DIR, args).map_err(|args| {
            format!("the README quick start does not build or run on its own: `cargo {args}` in {DIR} failed")
        })?;
    }
    blocks(&root, &readme)
}

/// Compiles every Rust block of the README but the quick start's, each as a binary of a
/// project depending on the workspace's crates: a block with no `fn main` becomes the body
/// of an `async fn main` on tokio that returns any error (so it may use `.await` and `?`).
fn blocks(root: &Path, readme: &str) -> Result<(), String> {
    let quickstart: Vec<String> =
        QUICKSTART.iter().map(|marker| block_after(readme, marker)).collect::<Result<_, _>>()?;
    let others: Vec<(usize, &str)> = rust_blocks(readme)
        .into_iter()
        .filter(|(_, block)| !quickstart.iter().any(|q| q == block))
        .collect();
    let dir = root.join(BLOCKS_DIR);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src/bin")).map_err(|e| e.to_string())?;
    let crates = root.join("crates");
    let path = |name: &str| format!("{:?}", crates.join(name).display().to_string());
    let manifest = format!(
        "[package]\nname = \"readme-blocks\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [dependencies]\n\
         ratebucket = {{ path = {}, features = [\"sim\", \"blocking\", \"reqwest\", \"tower\"] }}\n\
         ratebucket-openai = {{ path = {} }}\n\
         ratebucket-redis = {{ path = {} }}\n\
         tokio = {{ version = \"1\", features = [\"macros\", \"rt-multi-thread\"] }}\n\n[workspace]\n",
        path("ratebucket"),
        path("ratebucket-openai"),
        path("ratebucket-redis"),
    );
    write(&dir.join("Cargo.toml"), &manifest)?;
    // A binary with no block would leave `cargo build --bins` nothing to do; keep one.
    write(&dir.join("src/main.rs"), "fn main() {}\n")?;
    for (line, block) in &others {
        write(&dir.join(format!("src/bin/line_{line}.rs")), &as_program(block))?;
    }
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).map_err(|e| e.to_string())?;
    eprintln!(
        "the README's other Rust blocks (lines {}):",
        others.iter().map(|(line, _)| line.to_string()).collect::<Vec<_>>().join(", ")
    );
    cargo_in(root, BLOCKS_DIR, &["build", "--bins"]).map_err(|args| {
        format!("a README block does not compile: `cargo {args}` in {BLOCKS_DIR} failed (its binary is named after the line the block starts on)")
    })
}

/// Each ```` ```rust ```` block of `readme`, with the line its code starts on.
fn rust_blocks(readme: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let mut rest = readme;
    let mut offset = 0;
    while let Some(start) = rest.find("```rust\n") {
        let code = start + "```rust\n".len();
        let Some(len) = rest[code..].find("```") else {
            break;
        };
        let line = readme[..offset + code].matches('\n').count() + 1;
        found.push((line, &rest[code..code + len]));
        offset += code + len + 3;
        rest = &rest[code + len + 3..];
    }
    found
}

/// A block as a program: as written if it has a `main`, else the body of one.
fn as_program(block: &str) -> String {
    if block.contains("fn main") {
        return block.to_owned();
    }
    let body: String = block.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "#![allow(unused)]\n\n#[tokio::main]\nasync fn main() -> Result<(), Box<dyn std::error::Error>> {{\n{body}    Ok(())\n}}\n"
    )
}

/// Runs `cargo args` in `dir` (under `root`), with the workspace's target directory; the
/// command line on failure.
fn cargo_in(root: &Path, dir: &str, args: &[&str]) -> Result<(), String> {
    eprintln!("$ (in {dir}) cargo {}", args.join(" "));
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .current_dir(root.join(dir))
        .env("CARGO_TARGET_DIR", root.join("target"))
        .status();
    match status {
        Ok(status) if status.success() => Ok(()),
        _ => Err(args.join(" ")),
    }
}

fn block_after(readme: &str, marker: &str) -> Result<String, String> {
    readme
        .split(marker)
        .nth(1)
        .and_then(|rest| rest.split("```rust\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .map(str::to_owned)
        .ok_or_else(|| format!("README.md has no rust block after {marker}"))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
