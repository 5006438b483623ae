//! `cargo xtask readme`: compiles the README's quick start in a new project outside the
//! workspace that depends only on `ratebucket`, and runs its fake-provider half.

use std::path::Path;
use std::process::Command;

/// Where the scratch project is made (inside the workspace's target directory, which is
/// not a workspace member, so the project stands alone).
const DIR: &str = "target/readme-check";

/// Runs the check.
pub(crate) fn run() -> Result<(), String> {
    let root = std::env::current_dir().map_err(|e| e.to_string())?;
    let readme = std::fs::read_to_string(root.join("README.md")).map_err(|e| e.to_string())?;
    let real = block_after(&readme, "<!-- quickstart:real -->")?;
    let sim = block_after(&readme, "<!-- quickstart:sim -->")?;
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
    let target = root.join("target");
    for args in [
        &["build", "--bins"][..],
        &["run", "--quiet", "--bin", "sim"][..],
    ] {
        eprintln!("$ (in {DIR}) cargo {}", args.join(" "));
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(args)
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .map_err(|e| format!("could not run cargo: {e}"))?;
        if !status.success() {
            return Err(format!(
                "the README quick start does not build or run on its own: `cargo {}` in {DIR} failed",
                args.join(" ")
            ));
        }
    }
    Ok(())
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
