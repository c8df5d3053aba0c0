//! The house rules, checked on the source itself, `src/` and `tests/` alike: no import circle
//! between files or between folders, no function longer than about a page; and in `src/`: MPI
//! only in `comm/mpi.rs`, `unsafe` only in `sys.rs`, `comm/hydra.rs` and around MPI calls in
//! `comm/mpi.rs`, test hooks read only in `hooks.rs`. A newcomer can then trust the file names.
//!
//! Files are parsed with `syn`, so a comment or a string that looks like code never counts, and
//! paths inside macro calls (`assert!(crate::x::y())`) do. `the_house_drawn_from_the_code` prints
//! the house: rooms (folders and files), the floors they stand on, and their imports.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// The longest a function may be, in lines from `fn` to its closing brace.
const PAGE: usize = 100;

/// One source file: its module path (`crate::tar::index`) and its syntax tree.
struct Module {
    name: String,
    path: PathBuf,
    file: syn::File,
}

/// The files of one crate: `src/` (the library; `main.rs` is parsed but is no module of it) or
/// `tests/` (the integration test crate rooted at `tests/tests.rs`).
struct Crate {
    label: &'static str,
    modules: Vec<Module>,
    /// Parsed for the per-file rules, outside the module tree (`src/main.rs`).
    others: Vec<Module>,
    /// Unit tests in files of their own (`#[cfg(test)] mod tests;` beside the code, as
    /// `lock/tests.rs`): not part of the release house, held only to the pages.
    unit_tests: Vec<Module>,
}

fn parse(path: &Path) -> syn::File {
    let text = fs::read_to_string(path).unwrap();
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.rs` file under `dir` with its module path; `root` is the crate root's file name.
fn load(label: &'static str, root: &str) -> Crate {
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
fn test_only_files(modules: &[Module]) -> Vec<String> {
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

fn crates() -> [Crate; 2] {
    [load("src", "lib"), load("tests", "tests")]
}

/// `#[cfg(test)]` (unit tests in `src/`: not part of the release house).
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// The paths a `use` tree names, each with the name it brings into scope (`None` for a glob).
fn use_paths(
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
struct Names {
    uses: Vec<(Vec<String>, Option<String>, bool)>,
    paths: Vec<Vec<String>>,
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
fn token_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
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
fn absolute(
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

/// Which module imports which, file by file, within one crate.
fn import_graph(krate: &Crate) -> BTreeMap<String, BTreeSet<String>> {
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
fn rooms(from: &str, to: &str) -> Option<(String, String)> {
    let (a, b): (Vec<&str>, Vec<&str>) = (from.split("::").collect(), to.split("::").collect());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if common == a.len() || common == b.len() {
        return None;
    }
    Some((a[..=common].join("::"), b[..=common].join("::")))
}

/// The same imports between rooms: `crate::output::manifest -> crate::report::gpu` is
/// `crate::output -> crate::report`; inside a folder, its files and sub-folders are the rooms.
fn room_graph(files: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
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
fn find_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
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

#[test]
fn files_and_folders_import_each_other_without_circles() {
    for krate in crates() {
        let files = import_graph(&krate);
        if let Some(c) = find_circle(&files) {
            panic!(
                "{}/: import circle between files: {}",
                krate.label,
                c.join(" -> ")
            );
        }
        if let Some(c) = find_circle(&room_graph(&files)) {
            panic!(
                "{}/: import circle between folders: {}",
                krate.label,
                c.join(" -> ")
            );
        }
    }
}

/// Every function with a body, with the line of its `fn` and of its closing brace.
#[derive(Default)]
struct Functions {
    found: Vec<(String, usize, usize)>,
    owner: Option<String>,
}

impl Functions {
    fn add(&mut self, name: &syn::Ident, sig: &syn::Signature, body: &syn::Block) {
        let name = match &self.owner {
            Some(o) => format!("{o}::{name}"),
            None => name.to_string(),
        };
        let start = sig.fn_token.span.start().line;
        let end = body.brace_token.span.close().start().line;
        self.found.push((name, start, end));
    }
}

impl<'a> Visit<'a> for Functions {
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        self.add(&f.sig.ident, &f.sig, &f.block);
        visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        self.add(&f.sig.ident, &f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'a syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.add(&f.sig.ident, &f.sig, body);
        }
        visit::visit_trait_item_fn(self, f);
    }
    fn visit_item_impl(&mut self, i: &'a syn::ItemImpl) {
        let owner = match &*i.self_ty {
            syn::Type::Path(t) => t.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.owner, owner);
        visit::visit_item_impl(self, i);
        self.owner = outer;
    }
}

#[test]
fn no_function_is_longer_than_a_page() {
    let mut long = Vec::new();
    for krate in crates() {
        for m in krate
            .modules
            .iter()
            .chain(&krate.others)
            .chain(&krate.unit_tests)
        {
            let mut f = Functions::default();
            f.visit_file(&m.file);
            for (name, start, end) in f.found {
                if end - start > PAGE {
                    let file = m.path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap();
                    long.push(format!(
                        "{}:{start}: fn {name} is {} lines (at most {PAGE}: split it into helpers)",
                        file.display(),
                        end - start
                    ));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {PAGE} lines:\n{}",
        long.join("\n")
    );
}

/// The `unsafe` of a file's release code: each site's line and whether it is only MPI calls
/// (an `unsafe` block whose statements all call `mpi::ffi::…`).
#[derive(Default)]
struct Unsafe {
    sites: Vec<(usize, bool)>,
}

fn calls_mpi_only(block: &syn::Block) -> bool {
    block.stmts.iter().all(|s| match s {
        syn::Stmt::Expr(syn::Expr::Call(c), _) => match &*c.func {
            syn::Expr::Path(p) => {
                let segs: Vec<String> = p
                    .path
                    .segments
                    .iter()
                    .map(|s| s.ident.to_string())
                    .collect();
                segs.len() > 2 && segs[..2] == ["mpi", "ffi"]
            }
            _ => false,
        },
        _ => false,
    })
}

impl<'a> Visit<'a> for Unsafe {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            visit::visit_item_mod(self, m);
        }
    }
    fn visit_expr_unsafe(&mut self, u: &'a syn::ExprUnsafe) {
        let line = u.unsafe_token.span.start().line;
        self.sites.push((line, calls_mpi_only(&u.block)));
        visit::visit_expr_unsafe(self, u);
    }
    fn visit_signature(&mut self, s: &'a syn::Signature) {
        if let Some(u) = s.unsafety {
            self.sites.push((u.span.start().line, false));
        }
    }
    fn visit_item_impl(&mut self, i: &'a syn::ItemImpl) {
        if let Some(u) = i.unsafety {
            self.sites.push((u.span.start().line, false));
        }
        visit::visit_item_impl(self, i);
    }
    fn visit_item_trait(&mut self, t: &'a syn::ItemTrait) {
        if let Some(u) = t.unsafety {
            self.sites.push((u.span.start().line, false));
        }
        visit::visit_item_trait(self, t);
    }
    fn visit_item_foreign_mod(&mut self, f: &'a syn::ItemForeignMod) {
        self.sites
            .push((f.abi.extern_token.span.start().line, false));
    }
}

/// String literals of a file's release code that start with `RESHARD_` (the test hooks' names),
/// also inside macro calls; doc comments left out.
#[derive(Default)]
struct HookNames {
    lines: Vec<usize>,
}

impl HookNames {
    fn check(&mut self, value: &str, line: usize) {
        if value.starts_with("RESHARD_") {
            self.lines.push(line);
        }
    }
    fn tokens(&mut self, tokens: TokenStream) {
        for t in tokens {
            match t {
                TokenTree::Literal(l) => {
                    if let Ok(s) = syn::parse_str::<syn::LitStr>(&l.to_string()) {
                        self.check(&s.value(), l.span().start().line);
                    }
                }
                TokenTree::Group(g) => self.tokens(g.stream()),
                _ => {}
            }
        }
    }
}

impl<'a> Visit<'a> for HookNames {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            visit::visit_item_mod(self, m);
        }
    }
    fn visit_attribute(&mut self, _: &'a syn::Attribute) {}
    fn visit_lit_str(&mut self, s: &'a syn::LitStr) {
        self.check(&s.value(), s.span().start().line);
    }
    fn visit_macro(&mut self, m: &'a syn::Macro) {
        self.tokens(m.tokens.clone());
    }
}

#[test]
fn mpi_unsafe_test_hooks_and_pacing_each_live_in_one_place() {
    let [src, _] = crates();
    let mut wrong = Vec::new();
    for m in src.modules.iter().chain(&src.others) {
        let file = m
            .path
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .display();
        let mut names = Names::default();
        names.visit_file(&m.file);
        let declares_mpi = m
            .file
            .items
            .iter()
            .any(|i| matches!(i, syn::Item::Mod(x) if x.ident == "mpi"));
        // `mpi::x` in code, any `use mpi…` (a lone `mpi` in code is a local variable).
        let uses_mpi = names.uses.iter().any(|u| u.0[0] == "mpi")
            || names.paths.iter().any(|p| p.len() > 1 && p[0] == "mpi");
        if uses_mpi && !declares_mpi && m.name != "crate::comm::mpi" {
            wrong.push(format!(
                "{file}: uses the mpi crate: MPI lives in src/comm/mpi.rs"
            ));
        }
        let mut u = Unsafe::default();
        u.visit_file(&m.file);
        for (line, mpi_only) in u.sites {
            let allowed = match m.name.as_str() {
                "crate::sys" | "crate::comm::hydra" => true,
                "crate::comm::mpi" => mpi_only,
                _ => false,
            };
            if !allowed {
                wrong.push(format!(
                    "{file}:{line}: unsafe outside src/sys.rs, src/comm/hydra.rs and the MPI \
                     calls of src/comm/mpi.rs (every syscall goes through crate::sys)"
                ));
            }
        }
        // The rate limits pace storage's bytes in its wrapper (storage/paced.rs), not beside
        // the phases' calls, where a path left out goes unpaced and one paced twice counts twice.
        let pacing = |p: &[String]| {
            p.windows(2)
                .any(|w| w[0] == "throttle" && (w[1] == "pace" || w[1] == "charge"))
        };
        let paces =
            names.paths.iter().any(|p| pacing(p)) || names.uses.iter().any(|u| pacing(&u.0));
        if paces && !m.name.starts_with("crate::storage") {
            wrong.push(format!(
                "{file}: calls throttle::pace or throttle::charge: the rate limits wrap the \
                 storage seam (src/storage/paced.rs)"
            ));
        }
        let mut hooks = HookNames::default();
        hooks.visit_file(&m.file);
        if m.name != "crate::hooks" {
            for line in hooks.lines {
                wrong.push(format!(
                    "{file}:{line}: a test hook read outside src/hooks.rs"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The floor of each room in an acyclic graph: 0 for a room that imports none of the others,
/// else one above the highest room it imports.
fn floors(
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
fn draw(scope: &str, modules: &[String], edges: &BTreeMap<String, BTreeSet<String>>) -> String {
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

/// Prints the house of `src/` and of `tests/` (`cargo test --test integration house:: --
/// --nocapture`): each folder's rooms on their floors, arrows (imports) pointing down only.
#[test]
fn the_house_drawn_from_the_code() {
    for krate in crates() {
        let files = import_graph(&krate);
        let rooms = room_graph(&files);
        assert!(
            find_circle(&rooms).is_none(),
            "{}/ has an import circle",
            krate.label
        );
        let names: Vec<String> = krate.modules.iter().map(|m| m.name.clone()).collect();
        let mut folders: BTreeSet<String> = BTreeSet::new();
        for n in &names {
            if names.iter().any(|m| m.starts_with(&format!("{n}::"))) {
                folders.insert(n.clone());
            }
        }
        println!(
            "{}/ (arrows are imports; every arrow runs down)",
            krate.label
        );
        for folder in &folders {
            print!("{}", draw(folder, &names, &rooms));
        }
    }
}

/// The rules read code, not text: a path in a comment or a string is no import, a renamed `use`
/// (`basket as b`, which substring matching once cut at its "as") and a path inside a macro call
/// are; a hook name in a comment or a doc is not read, one in a macro call is.
#[test]
fn the_rules_read_code_not_comments_or_strings() {
    let code = r#"
        // use crate::fake::comment;
        /// "RESHARD_IN_A_DOC" and crate::fake::doc
        use crate::alias::{basket as b, self};
        fn f() {
            let s = "crate::fake::string"; // "RESHARD_IN_A_COMMENT"
            b::x();
            assert!(crate::in_macro::y(), "{}", env("RESHARD_IN_A_MACRO"));
        }
    "#;
    let module = |name: &str, code: &str| Module {
        name: name.into(),
        path: PathBuf::from(name),
        file: syn::parse_file(code).unwrap(),
    };
    let names = [
        "crate::alias",
        "crate::alias::basket",
        "crate::fake",
        "crate::in_macro",
    ];
    let mut modules: Vec<Module> = names.iter().map(|n| module(n, "")).collect();
    modules.push(module("crate::me", code));
    let krate = Crate {
        label: "snippet",
        modules,
        others: Vec::new(),
        unit_tests: Vec::new(),
    };
    let edges = import_graph(&krate);
    let want: BTreeSet<String> = ["crate::alias", "crate::alias::basket", "crate::in_macro"]
        .map(String::from)
        .into();
    assert_eq!(edges["crate::me"], want);
    let mut hooks = HookNames::default();
    hooks.visit_file(&krate.modules[4].file);
    assert_eq!(
        hooks.lines,
        [8],
        "only the hook name inside assert! is read"
    );
}

/// Where release code reaches the file system past the storage seam: `std::fs` or
/// `std::os::unix::fs` named in a `use` or a path, or a `Path` method that asks the file system
/// (`exists`, `is_dir`, …), or SQLite opening a database file (`rusqlite::Connection::open`).
/// Unit tests (`#[cfg(test)]`) are left out: their fixtures are files.
#[derive(Default)]
struct FsReach {
    lines: Vec<(usize, String)>,
}

fn is_fs_path(p: &[String]) -> bool {
    p.starts_with(&["std".to_string(), "fs".to_string()])
        || p.starts_with(&["std", "os", "unix", "fs"].map(String::from))
}

impl<'a> Visit<'a> for FsReach {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let mut found = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut found);
        for (p, _) in found.into_iter().filter(|(p, _)| is_fs_path(p)) {
            self.lines
                .push((u.use_token.span.start().line, p.join("::")));
        }
    }
    fn visit_path(&mut self, p: &'a syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        // SQLite opens its database file itself, past any backend.
        let sqlite_open = segments.first().is_some_and(|s| s == "rusqlite")
            && segments.last().is_some_and(|s| s.starts_with("open"));
        if is_fs_path(&segments) || sqlite_open {
            let line = p.segments[0].ident.span().start().line;
            self.lines.push((line, segments.join("::")));
        }
        visit::visit_path(self, p);
    }
    fn visit_expr_method_call(&mut self, c: &'a syn::ExprMethodCall) {
        const ASKS_THE_FS: [&str; 7] = [
            "exists",
            "try_exists",
            "is_dir",
            "is_file",
            "read_dir",
            "canonicalize",
            "symlink_metadata",
        ];
        let name = c.method.to_string();
        // `x.kind.is_file()` asks a kind already known (a tar member's, a storage::Stat's).
        let of_a_kind = matches!(&*c.receiver, syn::Expr::Field(f)
            if matches!(&f.member, syn::Member::Named(n) if n == "kind"));
        if ASKS_THE_FS.contains(&name.as_str()) && !of_a_kind {
            self.lines
                .push((c.method.span().start().line, format!("Path::{name}")));
        }
        visit::visit_expr_method_call(self, c);
    }
}

/// Files of `src/` whose release code still reaches the file system directly, not through
/// `storage::Source`/`storage::Sink` (the POSIX backend itself, `src/storage/posix.rs`, may; the
/// staging type, `src/job/destination/staging.rs`, goes through the sink like every phase). Every entry says why it is here; the rule fails when a file
/// not listed reaches the file system and when a listed file no longer does, so the list can
/// only shrink.
const FS_NOT_YET_ROUTED: [(&str, &str); 3] = [
    (
        "src/sys.rs",
        "the layer under storage::posix (its libc calls take the std::fs::File the backend \
         opened) and the machine's own files, which no storage backend holds: /proc, \
         /dev/urandom, system fonts",
    ),
    (
        "src/hooks.rs",
        "test hooks' marker files, compiled only with the test-hooks feature: an integration \
         test and the rank it pauses meet in a local file, whatever the output's backend",
    ),
    (
        "src/output/energon.rs",
        "SQLite opens index.sqlite and the per-shard row files itself and needs a local file; \
         every other energon file goes through the seam (on object storage these two would be \
         built in local scratch and uploaded)",
    ),
];

#[test]
fn storage_is_reached_through_the_seam() {
    let [src, _] = crates();
    let seam = ["src/storage/posix.rs"];
    let allowed: BTreeMap<&str, &str> = FS_NOT_YET_ROUTED.into_iter().collect();
    let (mut wrong, mut reaching) = (Vec::new(), BTreeSet::new());
    for m in src.modules.iter().chain(&src.others) {
        let file = m
            .path
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .display()
            .to_string();
        let mut reach = FsReach::default();
        reach.visit_file(&m.file);
        if reach.lines.is_empty() || seam.contains(&file.as_str()) {
            continue;
        }
        reaching.insert(file.clone());
        if !allowed.contains_key(file.as_str()) {
            for (line, what) in reach.lines {
                wrong.push(format!(
                    "{file}:{line}: {what}: reach storage through crate::storage (Source, Sink)"
                ));
            }
        }
    }
    for file in allowed.keys().filter(|f| !reaching.contains(**f)) {
        wrong.push(format!(
            "{file}: no longer reaches the file system directly: take it off FS_NOT_YET_ROUTED"
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
