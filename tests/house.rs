//! The house rules, checked on the source itself, `src/` and `tests/` alike: no import circle
//! between files or between folders, no function longer than a page (100 lines) and no file
//! longer than a page of files (900 lines); and in `src/`: MPI only in `comm/mpi.rs`, `unsafe`
//! only in `sys.rs` and around MPI calls in `comm/mpi.rs`, test hooks read only in `hooks.rs`,
//! storage only through its seam, and no phase of the job importing another phase. A newcomer
//! can then trust the file names. CONTRIBUTING.md states the same rules.
//!
//! Files are parsed with `syn` ([`crate::util::source`]), so a comment or a string that looks
//! like code never counts, and paths inside macro calls (`assert!(crate::x::y())`) do.
//! `the_house_drawn_from_the_code` prints the house: rooms (folders and files), the floors they
//! stand on, and their imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

use crate::util::source::{
    crates, draw, find_circle, import_graph, is_cfg_test, room_graph, use_paths, Crate, Module,
    Names,
};

/// The longest a function may be, in lines from `fn` to its closing brace.
const PAGE: usize = 100;

/// The longest a file may be, in lines, its unit tests included.
const FILE_PAGE: usize = 900;

/// Files over [`FILE_PAGE`], each with why and who brings it under. The rule fails when a file
/// not listed is longer and when a listed one no longer is, so the list can only shrink.
const OVER_THE_PAGE: [(&str, &str); 1] = [(
    "tests/util/verifier.rs",
    "its tar walk changes with the tar entry types work (issue 36); split after it lands \
         (the walk from the checks against index.json)",
)];

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
                "crate::sys" => true,
                "crate::comm::mpi" => mpi_only,
                _ => false,
            };
            if !allowed {
                wrong.push(format!(
                    "{file}:{line}: unsafe outside src/sys.rs and the MPI calls of \
                     src/comm/mpi.rs (every syscall goes through crate::sys)"
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

#[test]
fn no_file_is_longer_than_a_page() {
    let allowed: BTreeMap<&str, &str> = OVER_THE_PAGE.into_iter().collect();
    let mut wrong = Vec::new();
    for krate in crates() {
        for m in krate
            .modules
            .iter()
            .chain(&krate.others)
            .chain(&krate.unit_tests)
        {
            let file = m.path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap();
            let file = file.display().to_string();
            let lines = std::fs::read_to_string(&m.path).unwrap().lines().count();
            match (lines > FILE_PAGE, allowed.contains_key(file.as_str())) {
                (true, false) => wrong.push(format!(
                    "{file}: {lines} lines (at most {FILE_PAGE}: split it by concern, or its \
                     tests into a file of their own)"
                )),
                (false, true) => wrong.push(format!(
                    "{file}: {lines} lines, under the page: take it off OVER_THE_PAGE"
                )),
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The phases of `reshard run`, as rooms of `src/job/`: each imports the hand-offs
/// (`job/handoff.rs`), the interrupt, the output's life (`job/destination/`, whose own phases,
/// publish and upload, import no other phase) and the rest of the crate, never another phase;
/// only `job/mod.rs`, the sequence, calls them all.
const PHASES: [&str; 6] = [
    "expand", "walk", "planning", "exchange", "finish", "summary",
];

/// The rooms of `src/job/` that every phase may use, phases excluded.
const SHARED: [&str; 3] = ["handoff", "interrupt", "destination"];

/// What room of `src/job/` a module is in: `crate::job::planning::place` is in `planning`;
/// `crate::job` itself (the sequence) in none.
fn job_room(module: &str) -> Option<&str> {
    module.strip_prefix("crate::job::")?.split("::").next()
}

#[test]
fn no_phase_imports_another_phases_internals() {
    let [src, _] = crates();
    let rooms: BTreeSet<String> = src
        .modules
        .iter()
        .filter_map(|m| job_room(&m.name).map(String::from))
        .collect();
    let known: BTreeSet<String> = PHASES
        .iter()
        .chain(&SHARED)
        .map(|r| r.to_string())
        .collect();
    assert_eq!(
        rooms, known,
        "src/job/ has rooms this rule does not know: name each a phase (PHASES) or shared (SHARED)"
    );
    let mut wrong = Vec::new();
    for (from, tos) in import_graph(&src) {
        let Some(a) = job_room(&from) else { continue };
        for to in tos {
            match job_room(&to) {
                Some(b) if b != a && PHASES.contains(&b) => wrong.push(format!(
                    "{from} imports {to}: a phase (or the destination) uses another phase only \
                     through the hand-offs of src/job/handoff.rs"
                )),
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
