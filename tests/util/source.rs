//! The source of a crate read as a house, for tests/house.rs: its files parsed with `syn` into
//! modules, the imports between them (through `use`, paths and macro calls, re-exports
//! followed), the rooms (folders and files) those imports join, and the floors they stand on.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// One source file: its module path (`crate::tar::index`) and its syntax tree.
pub struct Module {
    pub name: String,
    pub path: PathBuf,
    pub file: syn::File,
}

/// The files of one crate: `src/` (the library; `main.rs` is parsed but is no module of it) or
/// `tests/` (the integration test crate rooted at `tests/tests.rs`).
pub struct Crate {
    pub label: &'static str,
    pub modules: Vec<Module>,
    /// Parsed for the per-file rules, outside the module tree (`src/main.rs`).
    pub others: Vec<Module>,
    /// Unit tests in files of their own (`#[cfg(test)] mod tests;` beside the code, as
    /// `lock/tests.rs`): not part of the release house, held only to the pages.
    pub unit_tests: Vec<Module>,
}

pub fn parse(path: &Path) -> syn::File {
    let text = fs::read_to_string(path).unwrap();
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.rs` file under `dir` with its module path; `root` is the crate root's file name.
pub fn load(label: &'static str, root: &str) -> Crate {
    let top = Path::new(env!("CARGO_MANIFEST_DIR")).join(label);
    let (mut modules, mut others) = (Vec::new(), Vec::new());
    let mut stack = vec![top.clone()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&top).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into()).collect();
            let file = parse(&path);
            if parts == ["main"] {
                others.push(Module {
                    name: "main".into(),
                    path,
                    file,
                });
                continue;
            }
            if parts == [root] {
                parts.clear();
            } else if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            let name = std::iter::once("crate".to_string())
                .chain(parts)
                .collect::<Vec<_>>();
            modules.push(Module {
                name: name.join("::"),
                path,
                file,
            });
        }
    }
    modules.sort_by(|a, b| a.name.cmp(&b.name));
    let test_only = test_only_files(&modules);
    let (unit_tests, modules) = modules.into_iter().partition(|m| {
        test_only
            .iter()
            .any(|t| m.name == *t || m.name.starts_with(&format!("{t}::")))
    });
    Crate {
        label,
        modules,
        others,
        unit_tests,
    }
}

/// The modules declared `#[cfg(test)] mod NAME;` (their body in a file of its own).
pub fn test_only_files(modules: &[Module]) -> Vec<String> {
    let mut out = Vec::new();
    for m in modules {
        for item in &m.file.items {
            if let syn::Item::Mod(x) = item {
                if x.content.is_none() && is_cfg_test(&x.attrs) {
                    out.push(format!("{}::{}", m.name, x.ident));
                }
            }
        }
    }
    out
}

pub fn crates() -> [Crate; 2] {
    [load("src", "lib"), load("tests", "tests")]
}

/// `#[cfg(test)]` (unit tests in `src/`: not part of the release house).
pub fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// The paths a `use` tree names, each with the name it brings into scope (`None` for a glob).
pub fn use_paths(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => {
            out.push((prefix.clone(), prefix.last().cloned()));
        }
        syn::UseTree::Name(n) => {
            let mut p = prefix.clone();
            p.push(n.ident.to_string());
            out.push((p, Some(n.ident.to_string())));
        }
        syn::UseTree::Rename(r) => {
            let mut p = prefix.clone();
            if r.ident != "self" {
                p.push(r.ident.to_string());
            }
            out.push((p, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_paths(t, prefix, out)),
    }
}

/// What a file's release code names: its `use` paths (and which are `pub`), every other path,
/// including `a::b` sequences inside macro calls.
#[derive(Default)]
pub struct Names {
    pub uses: Vec<(Vec<String>, Option<String>, bool)>,
    pub paths: Vec<Vec<String>>,
}

impl<'a> Visit<'a> for Names {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let public = !matches!(u.vis, syn::Visibility::Inherited);
        let mut found = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut found);
        let leading = u.leading_colon.is_some();
        for (p, alias) in found {
            // `use ::x::y` names another crate: never one of ours.
            if !leading {
                self.uses.push((p, alias, public));
            }
        }
    }
    fn visit_path(&mut self, p: &'a syn::Path) {
        if p.leading_colon.is_none() {
            self.paths
                .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        visit::visit_path(self, p);
    }
    fn visit_macro(&mut self, m: &'a syn::Macro) {
        token_paths(m.tokens.clone(), &mut self.paths);
        visit::visit_macro(self, m);
    }
}

/// `a::b::c` sequences in a macro's tokens (string literals are single tokens, never paths).
pub fn token_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    fn flush(current: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if current.len() > 1 {
            out.push(std::mem::take(current));
        }
        current.clear();
    }
    let mut current: Vec<String> = Vec::new();
    let mut colons = 0;
    for t in tokens {
        match t {
            TokenTree::Ident(i) if current.is_empty() || colons == 2 => {
                current.push(i.to_string());
                colons = 0;
            }
            TokenTree::Punct(p) if p.as_char() == ':' && !current.is_empty() && colons < 2 => {
                colons += 1;
            }
            TokenTree::Group(g) => {
                flush(&mut current, out);
                colons = 0;
                token_paths(g.stream(), out);
            }
            other => {
                flush(&mut current, out);
                colons = 0;
                if let TokenTree::Ident(i) = other {
                    current.push(i.to_string());
                }
            }
        }
    }
    flush(&mut current, out);
}

/// `path` made absolute from the module `me`: `crate::`, `self::`, `super::`, a child module, or
/// a name a `use` of the file brought into scope (`aliases`). `None`: std, another crate, a local.
pub fn absolute(
    path: &[String],
    me: &str,
    known: &BTreeSet<String>,
    aliases: &BTreeMap<String, String>,
) -> Option<String> {
    let mut segs: Vec<&str> = path.iter().map(String::as_str).collect();
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
        Some(first) if aliases.contains_key(first) => {
            let mut out = aliases[first].clone();
            for s in &segs[1..] {
                out = format!("{out}::{s}");
            }
            return Some(out);
        }
        Some(first) if known.contains(&format!("{me}::{first}")) => {}
        _ => return None,
    }
    base.extend(segs);
    Some(base.join("::"))
}

/// The module an absolute path lands in: its longest module prefix, followed through `pub use`
/// re-exports to the module that defines the item.
pub fn resolve(
    path: &str,
    known: &BTreeSet<String>,
    reexports: &BTreeMap<String, String>,
) -> String {
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

/// Which module imports which, file by file, within one crate.
pub fn import_graph(krate: &Crate) -> BTreeMap<String, BTreeSet<String>> {
    let known: BTreeSet<String> = krate.modules.iter().map(|m| m.name.clone()).collect();
    let names: Vec<(&Module, Names)> = krate
        .modules
        .iter()
        .map(|m| {
            let mut n = Names::default();
            n.visit_file(&m.file);
            (m, n)
        })
        .collect();
    let no_aliases = BTreeMap::new();
    // `pub use` re-exports: crate::tar::Codec -> crate::tar::codec::Codec.
    let mut reexports = BTreeMap::new();
    for (m, n) in &names {
        for (p, alias, public) in &n.uses {
            if let (true, Some(alias)) = (public, alias) {
                if let Some(abs) = absolute(p, &m.name, &known, &no_aliases) {
                    reexports.insert(format!("{}::{alias}", m.name), abs);
                }
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, n) in &names {
        let me = &m.name;
        let mut aliases = BTreeMap::new();
        for (p, alias, _) in &n.uses {
            if let (Some(alias), Some(abs)) = (alias, absolute(p, me, &known, &no_aliases)) {
                aliases.insert(alias.clone(), abs);
            }
        }
        let used = n.uses.iter().map(|u| &u.0).chain(&n.paths);
        for p in used {
            let Some(abs) = absolute(p, me, &known, &aliases) else {
                continue;
            };
            let to = resolve(&abs, &known, &reexports);
            // A module declares its children and may re-export them: that is not an import.
            let child = to.starts_with(&format!("{me}::"));
            if &to != me && to != "crate" && !child {
                edges.entry(me.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// The rooms an import between two modules joins: below their closest common folder, the room
/// (sub-folder or file) holding each. `None` when one holds the other (a file and its folder's
/// `mod.rs`).
pub fn rooms(from: &str, to: &str) -> Option<(String, String)> {
    let (a, b): (Vec<&str>, Vec<&str>) = (from.split("::").collect(), to.split("::").collect());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if common == a.len() || common == b.len() {
        return None;
    }
    Some((a[..=common].join("::"), b[..=common].join("::")))
}

/// The same imports between rooms: `crate::output::manifest -> crate::report::gpu` is
/// `crate::output -> crate::report`; inside a folder, its files and sub-folders are the rooms.
pub fn room_graph(
    files: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in files {
        for to in tos {
            if let Some((a, b)) = rooms(from, to) {
                edges.entry(a).or_default().insert(b);
            }
        }
    }
    edges
}

/// A circle in `edges`, as the list of its nodes with the first repeated at the end.
pub fn find_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
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
                    let mut circle = stack[at..].to_vec();
                    circle.push(n.clone());
                    return Some(circle);
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
    for m in edges.keys() {
        if state.get(m).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(m, edges, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The floor of each room in an acyclic graph: 0 for a room that imports none of the others,
/// else one above the highest room it imports.
pub fn floors(
    edges: &BTreeMap<String, BTreeSet<String>>,
    rooms: &BTreeSet<String>,
) -> BTreeMap<String, usize> {
    fn floor(
        r: &str,
        e: &BTreeMap<String, BTreeSet<String>>,
        memo: &mut BTreeMap<String, usize>,
    ) -> usize {
        if let Some(&f) = memo.get(r) {
            return f;
        }
        let f = e
            .get(r)
            .into_iter()
            .flatten()
            .map(|n| floor(n, e, memo) + 1)
            .max()
            .unwrap_or(0);
        memo.insert(r.to_string(), f);
        f
    }
    let mut memo = BTreeMap::new();
    rooms
        .iter()
        .map(|r| (r.clone(), floor(r, edges, &mut memo)))
        .collect()
}

/// The rooms directly inside `scope` (`crate`, `crate::job`) by floor, top floor first, each
/// with the rooms it imports; checks that every arrow runs down.
pub fn draw(scope: &str, modules: &[String], edges: &BTreeMap<String, BTreeSet<String>>) -> String {
    let depth = scope.split("::").count();
    let inside = |m: &String| m.starts_with(&format!("{scope}::"));
    let room = |m: &String| m.split("::").take(depth + 1).collect::<Vec<_>>().join("::");
    let rooms: BTreeSet<String> = modules.iter().filter(|m| inside(m)).map(room).collect();
    let here: BTreeMap<String, BTreeSet<String>> = edges
        .iter()
        .filter(|(from, _)| rooms.contains(*from))
        .map(|(from, to)| {
            (
                from.clone(),
                to.iter().filter(|t| rooms.contains(*t)).cloned().collect(),
            )
        })
        .collect();
    let floor = floors(&here, &rooms);
    let short = |r: &str| {
        let name = r.rsplit("::").next().unwrap().to_string();
        if modules.iter().any(|m| m.starts_with(&format!("{r}::"))) {
            name + "/"
        } else {
            name
        }
    };
    let top = floor.values().copied().max().unwrap_or(0);
    let mut out = format!("{scope}: {} rooms on {} floors\n", rooms.len(), top + 1);
    for f in (0..=top).rev() {
        let mut line = Vec::new();
        for r in rooms.iter().filter(|r| floor[*r] == f) {
            let to: Vec<String> = here
                .get(r)
                .into_iter()
                .flatten()
                .map(|t| short(t))
                .collect();
            for t in here.get(r).into_iter().flatten() {
                assert!(
                    floor[t] < f,
                    "{r} imports {t}, which is not below it: an arrow runs up"
                );
            }
            line.push(if to.is_empty() {
                short(r)
            } else {
                format!("{} -> {}", short(r), to.join(" "))
            });
        }
        out += &format!("  floor {f:2}: {}\n", line.join(" | "));
    }
    out
}
