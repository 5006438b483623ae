//! The house checks its own shape, as rust-analyzer's tidy test does: no library file over
//! 600 lines, `Arbiter` and `Limiter` at most 25 public methods each, no `use super::*`
//! outside tests, every inherent `impl` in the file that declares its type, and every
//! file opening with its `//!` line. Run by `cargo test` (and so by `cargo xtask ci`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The most lines a library source file may have.
const MAX_LINES: usize = 600;

/// The most public methods `Arbiter` and `Limiter` may have.
const MAX_PUBLIC_METHODS: usize = 25;

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, in order (build output skipped).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// One library crate's source files (under `src/` of a crate with a `lib.rs`), each with
/// whether it holds tests only (`tests.rs`, or under a `tests/` directory).
fn library_sources() -> Vec<(String, PathBuf, bool)> {
    let mut sources = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|dir| dir.join("src/lib.rs").is_file())
        .collect();
    crates.sort();
    for dir in crates {
        let name = dir.file_name().expect("a name").to_string_lossy().into_owned();
        let src = dir.join("src");
        for file in rust_files(&src) {
            let relative = file.strip_prefix(&src).expect("under src");
            let test_only = relative.file_name().is_some_and(|n| n == "tests.rs")
                || relative.components().any(|c| c.as_os_str() == "tests");
            sources.push((name.clone(), file, test_only));
        }
    }
    sources
}

/// `path` parsed, or a test failure naming it.
fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).expect("readable");
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", shown(path)))
}

/// `path` as shown in a failure: relative to the workspace.
fn shown(path: &Path) -> String {
    let root = root().canonicalize().expect("the root");
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    path.strip_prefix(&root).unwrap_or(&path).display().to_string()
}

/// Fails with every violation found, one per line.
fn none(what: &str, violations: Vec<String>) {
    assert!(violations.is_empty(), "{what}:\n  {}", violations.join("\n  "));
}

/// Whether `attrs` compile their item for tests only: `#[cfg(test)]`, or `test` required
/// among others (`#[cfg(all(test, not(loom)))]`).
fn cfg_test(attrs: &[syn::Attribute]) -> bool {
    fn requires_test(meta: &syn::Meta) -> bool {
        match meta {
            syn::Meta::Path(path) => path.is_ident("test"),
            syn::Meta::List(list) if list.path.is_ident("all") => list
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .is_ok_and(|all| all.iter().any(requires_test)),
            _ => false,
        }
    }
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| requires_test(&m))
    })
}

/// The name of the type an `impl` is for (its path's last segment).
fn self_name(item: &syn::ItemImpl) -> Option<String> {
    match &*item.self_ty {
        syn::Type::Path(path) => Some(path.path.segments.last()?.ident.to_string()),
        _ => None,
    }
}

/// What the checks need from one file: the types it declares, its inherent impls (with
/// their public methods), and its glob imports of the parent outside tests.
#[derive(Default)]
struct Shape {
    declared: Vec<String>,
    impls: Vec<(String, usize)>,
    parent_globs: usize,
    in_test: usize,
}

impl<'ast> Visit<'ast> for Shape {
    fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
        self.declared.push(item.ident.to_string());
    }

    fn visit_item_enum(&mut self, item: &'ast syn::ItemEnum) {
        self.declared.push(item.ident.to_string());
    }

    fn visit_item_union(&mut self, item: &'ast syn::ItemUnion) {
        self.declared.push(item.ident.to_string());
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        let test = cfg_test(&item.attrs);
        self.in_test += usize::from(test);
        syn::visit::visit_item_mod(self, item);
        self.in_test -= usize::from(test);
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if item.trait_.is_none()
            && self.in_test == 0
            && let Some(name) = self_name(item)
        {
            let public = item.items.iter().filter(|i| {
                matches!(i, syn::ImplItem::Fn(f) if matches!(f.vis, syn::Visibility::Public(_)))
            });
            self.impls.push((name, public.count()));
        }
        syn::visit::visit_item_impl(self, item);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if self.in_test == 0
            && let syn::UseTree::Path(path) = &item.tree
            && path.ident == "super"
            && matches!(*path.tree, syn::UseTree::Glob(_))
        {
            self.parent_globs += 1;
        }
    }
}

/// Each library file's shape, with its crate and whether it holds tests only.
fn shapes() -> Vec<(String, PathBuf, bool, Shape)> {
    library_sources()
        .into_iter()
        .map(|(krate, path, test_only)| {
            let mut shape = Shape::default();
            shape.visit_file(&parse(&path));
            (krate, path, test_only, shape)
        })
        .collect()
}

#[test]
fn no_library_file_is_over_600_lines() {
    let mut long = Vec::new();
    for (_, path, test_only, _) in shapes() {
        let lines = std::fs::read_to_string(&path).expect("readable").lines().count();
        if !test_only && lines > MAX_LINES {
            long.push(format!("{}: {lines} lines (at most {MAX_LINES})", shown(&path)));
        }
    }
    none("library files too long: split what they hold into types of their own", long);
}

#[test]
fn arbiter_and_limiter_keep_to_25_public_methods() {
    let mut counted = HashMap::new();
    for (krate, path, _, shape) in shapes() {
        for (name, public) in shape.impls {
            let key = match (krate.as_str(), name.as_str()) {
                ("ratebucket-core", "Arbiter") | ("ratebucket-rt", "Limiter") => name,
                _ => continue,
            };
            let entry = counted.entry(key).or_insert((0, Vec::new()));
            entry.0 += public;
            entry.1.push(shown(&path));
        }
    }
    assert_eq!(counted.len(), 2, "Arbiter and Limiter are found: {counted:?}");
    let too_many: Vec<String> = counted
        .into_iter()
        .filter(|(_, (public, _))| *public > MAX_PUBLIC_METHODS)
        .map(|(name, (public, files))| {
            format!("{name}: {public} public methods (at most {MAX_PUBLIC_METHODS}) in {files:?}")
        })
        .collect();
    none("types with too many public methods: give the rest a type of their own", too_many);
}

#[test]
fn no_parent_is_glob_imported_outside_tests() {
    let globs = shapes()
        .into_iter()
        .filter(|(_, _, test_only, shape)| !test_only && shape.parent_globs > 0)
        .map(|(_, path, _, _)| format!("{}: `use super::*`", shown(&path)))
        .collect();
    none("name what a module uses from its parent", globs);
}

#[test]
fn an_inherent_impl_lives_in_the_file_that_declares_its_type() {
    let shapes = shapes();
    let mut declared: HashMap<(&str, &str), Vec<&Path>> = HashMap::new();
    for (krate, path, _, shape) in &shapes {
        for name in &shape.declared {
            declared.entry((krate, name)).or_default().push(path);
        }
    }
    let mut elsewhere = Vec::new();
    for (krate, path, _, shape) in &shapes {
        for (name, _) in &shape.impls {
            let Some(files) = declared.get(&(krate.as_str(), name.as_str())) else {
                // A type of another crate cannot have an inherent impl here.
                continue;
            };
            if !files.contains(&path.as_path()) {
                let home: Vec<String> = files.iter().map(|f| shown(f)).collect();
                elsewhere.push(format!("{}: `impl {name}`, declared in {home:?}", shown(path)));
            }
        }
    }
    none("an impl away from its type's declaration", elsewhere);
}

#[test]
fn every_file_opens_with_its_module_doc() {
    let root = root();
    let mut files = Vec::new();
    for dir in ["crates", "xtask", "fuzz"] {
        files.extend(rust_files(&root.join(dir)));
    }
    assert!(files.len() > 100, "the workspace's files are found: {}", files.len());
    let bare: Vec<String> = files
        .iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).expect("readable");
            !text.lines().next().is_some_and(|first| first.starts_with("//!"))
        })
        .map(|path| format!("{}: no `//!` line first", shown(path)))
        .collect();
    none("every file opens with a line saying what lives there", bare);
}
