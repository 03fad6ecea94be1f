//! The floors of `src/`, checked from the source text: a module may import only from floors below
//! its own, so the request flows one way and a newcomer can read the crate top-down. The order is
//! written once, here, and `ARCHITECTURE.md` draws the same picture.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Lowest floor first. A module may use modules of lower floors only (not its own floor: two
/// modules side by side never know each other).
const FLOORS: &[&[&str]] = &[
    // Pure: the rate-limit math, time sources, the generated protos, the metric registry.
    &["algorithm", "clock", "duration", "pb", "telemetry"],
    // Which rule applies; where counters live.
    &["rules", "store"],
    // The policy over a store: deadline, failure modes, deny cache.
    &["limiter"],
    // The faces: gRPC, the admin HTTP listener, responses.
    &["service"],
    // Rules under review (`test`, `diff`, `explain`): the service's own code over the memory store.
    &["review"],
    // The command line and environment, mapped onto the plain values the floors below take.
    &["settings"],
    // The composition root: builds everything from `Settings`, runs listeners and watchers.
    &["server"],
    // The binary's own commands (`ask`: a client of a running replica), then the binary.
    &["ask"],
    &["main"],
];

/// Narrower rules inside the floors: (path prefix under `src/`, module it must never use, why).
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "store/redis",
        "clock",
        "the Redis path reads Redis TIME only: replicas' clocks drift",
    ),
    ("rules", "pb", "nothing below service knows protobuf"),
    ("store", "pb", "nothing below service knows protobuf"),
    ("limiter", "pb", "nothing below service knows protobuf"),
    ("algorithm", "pb", "nothing below service knows protobuf"),
];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|floor| floor.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/store/redis/mod.rs` → `store`).
fn module_of(relative: &Path) -> String {
    let first = relative
        .components()
        .next()
        .expect("non-empty path")
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    first.trim_end_matches(".rs").to_owned()
}

/// The source without comments (doc comments mention paths that are not imports).
fn code_only(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string literal would be cut too; harmless, it only drops text.
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The top-level modules named after `root::` (`crate::` inside the library, `portcullis::` in
/// the binary), including inside `root::{a, b::c}` groups.
fn imported_modules(code: &str, root: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find(root) {
        let preceded_by_ident = rest[..at].chars().next_back().is_some_and(is_ident);
        rest = &rest[at + root.len()..];
        if preceded_by_ident {
            continue;
        }
        let trimmed = rest.trim_start();
        if let Some(group) = trimmed.strip_prefix('{') {
            // Top-level names of the group: split at commas outside nested braces.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        push_first_ident(&item, &mut found);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            push_first_ident(&item, &mut found);
        } else {
            push_first_ident(trimmed, &mut found);
        }
    }
    found
}

fn push_first_ident(text: &str, out: &mut BTreeSet<String>) {
    let name: String = text
        .trim_start()
        .chars()
        .take_while(|&c| is_ident(c))
        .collect();
    if !name.is_empty() && name != "self" {
        out.insert(name);
    }
}

struct Import {
    file: PathBuf,
    module: String,
    target: String,
}

fn imports() -> Vec<Import> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src").to_path_buf();
        let module = module_of(&relative);
        if module == "lib" {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&file).expect("read source"));
        // The binary's files reach the library as `portcullis::`.
        let root = if module == "main" || module == "ask" {
            "portcullis::"
        } else {
            "crate::"
        };
        for target in imported_modules(&code, root) {
            out.push(Import {
                file: relative.clone(),
                module: module.clone(),
                target,
            });
        }
    }
    out
}

#[test]
fn every_module_has_a_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&src).expect("read src") {
        let path = entry.expect("entry").path();
        let module = module_of(path.strip_prefix(&src).expect("under src"));
        if module == "lib" {
            continue;
        }
        assert!(
            floor_of(&module).is_some(),
            "src/{module} is on no floor: add it to FLOORS in tests/local/floors.rs and to ARCHITECTURE.md"
        );
    }
}

#[test]
fn no_module_imports_its_own_floor_or_one_above() {
    let mut wrong = Vec::new();
    for import in imports() {
        if import.target == import.module {
            continue;
        }
        let (Some(from), Some(to)) = (floor_of(&import.module), floor_of(&import.target)) else {
            // Not a module of ours (a macro path, say); `every_module_has_a_floor` covers ours.
            continue;
        };
        if to >= from {
            wrong.push(format!(
                "src/{} ({}, floor {from}) uses {} (floor {to})",
                import.file.display(),
                import.module,
                import.target
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the floors (see ARCHITECTURE.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn narrower_rules_hold() {
    let mut wrong = Vec::new();
    for import in imports() {
        for (prefix, banned, why) in FORBIDDEN {
            let path = import.file.to_string_lossy().replace('\\', "/");
            if path.starts_with(prefix) && import.target == *banned {
                wrong.push(format!("src/{path} uses {banned}: {why}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_import_reader_sees_grouped_and_nested_paths() {
    let code = "use crate::{algorithm::{Check, Limit}, store::Store};\n\
                fn f() { crate::pb::x(); let y = notcrate::z; }\n\
                use crate::{self as me, rules};";
    let found = imported_modules(code, "crate::");
    let expected: BTreeSet<String> = ["algorithm", "store", "pb", "rules"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, expected);
}

/// The files of one folder that `file` (not a `mod.rs`) uses: `super::name` and
/// `crate::<its folder>::name`, where `name` is a sibling file.
fn sibling_uses(src: &Path, file: &Path) -> BTreeSet<String> {
    let dir = file.parent().expect("a folder");
    let siblings: BTreeSet<String> = std::fs::read_dir(dir)
        .expect("read folder")
        .filter_map(|e| {
            let path = e.expect("entry").path();
            let name = path.file_stem()?.to_str()?.to_owned();
            let is_module = path.extension().is_some_and(|x| x == "rs") || path.is_dir();
            (is_module && name != "mod").then_some(name)
        })
        .collect();
    let code = code_only(&std::fs::read_to_string(file).expect("read source"));
    let folder = dir
        .strip_prefix(src)
        .expect("under src")
        .to_string_lossy()
        .replace('/', "::");
    let mut used = imported_modules(&code, "super::");
    if !folder.is_empty() {
        used.extend(imported_modules(&code, &format!("crate::{folder}::")));
    }
    let own = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    used.into_iter()
        .filter(|name| siblings.contains(name) && name != own)
        .collect()
}

/// No two files side by side in one folder use each other, directly or round a longer loop: a
/// reader can start from a file and find everything it needs below it. (A folder's `mod.rs`
/// declares its files and may use them; they may use what it defines.)
#[test]
fn no_import_circle_between_files_of_one_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut edges: std::collections::BTreeMap<PathBuf, BTreeSet<PathBuf>> = Default::default();
    for file in files
        .iter()
        .filter(|f| !f.ends_with("mod.rs") && !f.ends_with("lib.rs"))
    {
        let dir = file.parent().expect("a folder");
        let targets = sibling_uses(&src, file)
            .into_iter()
            .map(|name| {
                let plain = dir.join(format!("{name}.rs"));
                if plain.exists() {
                    plain
                } else {
                    dir.join(name).join("mod.rs")
                }
            })
            .collect();
        edges.insert(file.clone(), targets);
    }
    // Depth-first search for a cycle, reporting the loop.
    fn visit(
        node: &PathBuf,
        edges: &std::collections::BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        path: &mut Vec<PathBuf>,
        done: &mut BTreeSet<PathBuf>,
    ) -> Option<Vec<PathBuf>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            return Some(path[at..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(cycle) = visit(node, &edges, &mut Vec::new(), &mut done) {
            let names: Vec<String> = cycle
                .iter()
                .map(|p| p.strip_prefix(&src).unwrap_or(p).display().to_string())
                .collect();
            panic!("an import circle: {}", names.join(" -> "));
        }
    }
}
