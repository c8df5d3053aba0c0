//! The house rules of `src/`, checked on the source itself: no import cycles between files, no
//! function longer than about a page, MPI only in `comm/mpi.rs`, `unsafe` only in `sys.rs`,
//! `comm/hydra.rs` and `comm/mpi.rs`, test hooks only in `hooks.rs`. A newcomer can then trust the file names.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/` but `main.rs`, with its module path (`crate::tar::index`).
fn modules() -> Vec<(String, PathBuf)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(&src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            match parts.last().map(String::as_str) {
                Some("main") if parts.len() == 1 => continue,
                Some("lib") if parts.len() == 1 => parts.clear(),
                Some("mod") => {
                    parts.pop();
                }
                _ => {}
            }
            let name = std::iter::once("crate".to_string())
                .chain(parts)
                .collect::<Vec<_>>()
                .join("::");
            out.push((name, path));
        }
    }
    out.sort();
    out
}

/// A file's code without its unit tests (by convention the `#[cfg(test)]` module at the end) and
/// without comments.
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    let body = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    body.lines()
        .map(|l| match l.find("//") {
            Some(at) if !l[..at].contains('"') => &l[..at],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a `use` tree names, expanded: `a::{b, c::{d, self}}` gives `a::b`, `a::c::d`, `a::c`.
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(&tree);
        return vec![path.split("as").next().unwrap().to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.len() - 1];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            if p == "self" {
                vec![prefix.trim_end_matches("::").to_string()]
            } else {
                expand_use(&format!("{prefix}{p}"))
            }
        })
        .collect()
}

/// Every path a file's code names: its `use` trees, and `crate::`/`super::` paths in the code.
fn named_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if before.is_none_or(|c| c.is_whitespace()) {
            paths.extend(expand_use(&after[..end]));
        }
        rest = &after[end.min(after.len())..];
    }
    for root in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(root) {
            let boundary = rest[..at]
                .chars()
                .last()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if boundary {
                paths.push(tail[..len].trim_end_matches(':').to_string());
            }
            rest = &tail[len..];
        }
    }
    paths
}

/// `path` made absolute from the module `me` (`super::x`, `self::x`, a child module `x::y`).
fn absolute(path: &str, me: &str, known: &BTreeSet<String>) -> Option<String> {
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<&str> = me.split("::").collect();
    match segs.first().copied() {
        Some("crate") => return Some(segs.join("::")),
        Some("self") => {
            segs.remove(0);
        }
        Some("super") => {
            while segs.first() == Some(&"super") {
                segs.remove(0);
                base.pop();
            }
        }
        Some(first) if known.contains(&format!("{me}::{first}")) => {}
        _ => return None, // std, another crate, or a local name
    }
    base.extend(segs);
    Some(base.join("::"))
}

/// The file an absolute path lands in: its longest module prefix, followed through `pub use`
/// re-exports to the module that defines the item.
fn resolve(path: &str, known: &BTreeSet<String>, reexports: &BTreeMap<String, String>) -> String {
    let segs: Vec<&str> = path.split("::").collect();
    for n in (1..=segs.len()).rev() {
        let module = segs[..n].join("::");
        if known.contains(&module) {
            if let Some(item) = segs.get(n) {
                if let Some(target) = reexports.get(&format!("{module}::{item}")) {
                    if target != path {
                        return resolve(target, known, reexports);
                    }
                }
            }
            return module;
        }
    }
    "crate".to_string()
}

#[test]
fn src_files_import_each_other_without_cycles() {
    let mods = modules();
    let known: BTreeSet<String> = mods.iter().map(|m| m.0.clone()).collect();
    // `pub use` re-exports: crate::tar::Codec -> crate::tar::codec::Codec.
    let mut reexports = BTreeMap::new();
    for (me, path) in &mods {
        let code = code(path);
        for line in code.split(';') {
            let line = line.trim();
            let Some(tree) = line.strip_prefix("pub use ") else {
                continue;
            };
            for p in expand_use(tree) {
                if let Some(abs) = absolute(&p, me, &known) {
                    let name = abs.rsplit("::").next().unwrap().to_string();
                    reexports.insert(format!("{me}::{name}"), abs);
                }
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (me, path) in &mods {
        for p in named_paths(&code(path)) {
            let Some(abs) = absolute(&p, me, &known) else {
                continue;
            };
            let to = resolve(&abs, &known, &reexports);
            // A module declares its children and may re-export them; that is not an import.
            let child = to.starts_with(&format!("{me}::"));
            if &to != me && to != "crate" && !child {
                edges.entry(me.clone()).or_default().insert(to);
            }
        }
    }
    // Depth-first search for a back edge.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for n in edges.get(m).into_iter().flatten() {
            match state.get(n).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == n).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(n.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(n, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for (me, _) in &mods {
        if state.get(me).copied().unwrap_or(0) == 0 {
            let cycle = visit(me, &edges, &mut state, &mut Vec::new());
            assert!(
                cycle.is_none(),
                "import cycle: {}",
                cycle.unwrap().join(" -> ")
            );
        }
    }
}

#[test]
fn no_function_is_longer_than_a_page() {
    let mut long = Vec::new();
    for (_, path) in modules() {
        let code = code(&path);
        let lines: Vec<&str> = code.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let l = lines[i];
            let indent = l.len() - l.trim_start().len();
            let t = l.trim_start();
            let is_fn = ["fn ", "pub fn ", "pub(super) fn ", "pub(crate) fn "]
                .iter()
                .any(|p| t.starts_with(p));
            if is_fn && !t.ends_with(';') {
                let close = format!("{}}}", " ".repeat(indent));
                let end = (i + 1..lines.len())
                    .find(|&j| lines[j] == close)
                    .unwrap_or(i);
                if end - i > 100 {
                    long.push(format!("{}:{} ({} lines)", path.display(), i + 1, end - i));
                }
                i = end;
            }
            i += 1;
        }
    }
    assert!(long.is_empty(), "functions over 100 lines: {long:?}");
}

/// Files under `src/` whose code (tests and comments left out) contains `needle`.
fn files_with(needle: &str) -> Vec<String> {
    modules()
        .into_iter()
        .filter(|(_, p)| code(p).contains(needle))
        .map(|(m, _)| m)
        .collect()
}

#[test]
fn mpi_unsafe_and_test_hooks_each_live_in_one_place() {
    assert_eq!(files_with("use mpi::"), ["crate::comm::mpi"]);
    for m in files_with("unsafe ") {
        assert!(
            m == "crate::sys" || m == "crate::comm::mpi" || m == "crate::comm::hydra",
            "unsafe code in {m}: every syscall goes through crate::sys"
        );
    }
    for m in files_with("\"RESHARD_") {
        assert_eq!(m, "crate::hooks", "a test hook read outside crate::hooks");
    }
}
