//! Issue 23: the documentation states nothing the code can contradict unnoticed. The code map in
//! docs/design.md names every source file and only those, the flags reference names exactly the
//! flags `run --help` lists, every relative link leads to a file, and README.md keeps the two
//! commands CI relies on and stays a newcomer's page.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use crate::util::Dir;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The text of the section `## TITLE` of a Markdown file, up to the next `## `.
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("no section {title:?}"));
    let body = &text[start + title.len() + 5..];
    body.find("\n## ").map_or(body, |end| &body[..end])
}

/// The words between backticks.
fn quoted(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

/// Every `.rs` file under `dir` (relative to the repository), recursively.
fn rust_files(dir: &str, out: &mut BTreeSet<String>) {
    for entry in fs::read_dir(root().join(dir)).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            rust_files(&format!("{dir}{name}/"), out);
        } else if name.ends_with(".rs") {
            out.insert(format!("{dir}{name}"));
        }
    }
}

/// The files the code map names: nested bullets, a bullet whose first word is `DIR/` holding
/// the files its own text and its children name.
fn code_map() -> BTreeSet<String> {
    let design = read("docs/design.md");
    let mut bullets: Vec<(usize, String)> = Vec::new();
    for line in section(&design, "Code layout").lines() {
        let text = line.trim_start();
        let depth = (line.len() - text.len()) / 2;
        match text.strip_prefix("- ") {
            Some(rest) => bullets.push((depth, rest.to_string())),
            None if !text.is_empty() => {
                if let Some(last) = bullets.last_mut() {
                    last.1 = format!("{} {text}", last.1);
                }
            }
            None => {}
        }
    }
    let mut dirs: Vec<String> = Vec::new();
    let mut files = BTreeSet::new();
    for (depth, text) in bullets {
        dirs.truncate(depth);
        let base = dirs.last().cloned().unwrap_or_else(|| "src/".into());
        let outside = |w: &str| depth == 0 && (w.starts_with("tests/") || w.starts_with("spack/"));
        let path = |w: &str| {
            if outside(w) {
                w.to_string()
            } else {
                format!("{base}{w}")
            }
        };
        let first = quoted(&text).next().unwrap_or("");
        let own = if text.starts_with('`') && first.ends_with('/') {
            path(first)
        } else {
            base.clone()
        };
        dirs.push(own.clone());
        for word in quoted(&text).filter(|w| w.ends_with(".rs") && !w.contains(['*', ' '])) {
            files.insert(format!("{own}{word}"));
        }
    }
    files
}

#[test]
fn the_code_map_names_every_source_file_and_only_those() {
    let mut actual = BTreeSet::new();
    rust_files("src/", &mut actual);
    rust_files("tests/util/", &mut actual);
    let listed = code_map();
    let unlisted: Vec<_> = actual.difference(&listed).collect();
    let missing: Vec<_> = listed.difference(&actual).collect();
    assert!(
        unlisted.is_empty() && missing.is_empty(),
        "docs/design.md's code layout does not list {unlisted:?} and lists files that do not exist: {missing:?}"
    );
    // The phase table names files that exist.
    let design = read("docs/design.md");
    for word in quoted(section(&design, "Where each phase lives")) {
        if word.ends_with(".rs") || word.ends_with('/') {
            let rel = word.strip_prefix("src/").unwrap_or(word);
            assert!(
                root().join("src").join(rel).exists(),
                "the phase table names {word}"
            );
        }
    }
}

#[test]
fn the_flags_reference_names_the_flags_of_run_help() {
    let dir = Dir::new("docs-flags");
    let help = dir.command().args(["run", "--help"]).assert_success();
    let long = |text: &str| -> BTreeSet<String> {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(str::to_string)
            .collect()
    };
    let helped: BTreeSet<String> = help
        .stdout
        .lines()
        .filter(|l| l.starts_with("  -") || l.starts_with("      --"))
        .flat_map(|l| long(l.split('<').next().unwrap()))
        .filter(|f| f != "--help")
        .collect();
    let guide = read("docs/guide.md");
    let documented: BTreeSet<String> = section(&guide, "Flags reference")
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .flat_map(|l| long(l.split(" | ").next().unwrap()))
        .collect();
    assert!(helped.len() > 30, "{helped:?}");
    assert_eq!(
        helped, documented,
        "run --help (left) and docs/guide.md's flags reference (right) differ"
    );
}

#[test]
fn the_readme_keeps_what_ci_and_newcomers_rely_on() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines");
    // .ci/run runs the README's test command: the same line in both.
    let ci = read(".ci/run");
    let line = ci
        .lines()
        .find(|l| l.starts_with("TEST_COMMAND='") && l.ends_with("# README test command"))
        .expect(".ci/run's marked TEST_COMMAND line");
    let command = line.split('\'').nth(1).unwrap();
    assert!(
        readme.lines().any(|l| l == command),
        "README.md lacks the test command line {command:?}"
    );
    assert!(readme.lines().any(|l| l == "examples/quickstart.sh"));
    // The install step writes the page of every command `reshard man` has one for.
    let dir = Dir::new("docs-readme");
    let refused = dir.command().args(["man", "nothing"]).assert_code(2);
    let values = refused
        .stderr
        .split("[possible values: ")
        .nth(1)
        .and_then(|v| v.split(']').next())
        .unwrap_or_else(|| refused.fail("no possible values"));
    let pages: Vec<&str> = values.split(", ").collect();
    let install = readme
        .lines()
        .find_map(|l| l.strip_prefix("for c in "))
        .and_then(|l| l.split("; do").next())
        .expect("README.md's loop over the man pages");
    assert_eq!(install.split(' ').collect::<Vec<_>>(), pages);
    assert!(readme.contains("(docs/guarantees.md)"));
    // Every relative link of the Markdown files leads somewhere.
    for doc in [
        "README.md",
        "CONTRIBUTING.md",
        "docs/guide.md",
        "docs/design.md",
    ] {
        let text = read(doc);
        let base = Path::new(doc).parent().unwrap();
        for link in text
            .split("](")
            .skip(1)
            .map(|l| l.split(')').next().unwrap())
        {
            let target = link.split('#').next().unwrap();
            if target.is_empty() || target.contains("://") {
                continue;
            }
            assert!(
                root().join(base).join(target).exists(),
                "{doc} links to {link}, which does not exist"
            );
        }
    }
}
