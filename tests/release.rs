//! What a user's build carries: none of the test hooks of `src/hooks.rs` (`RESHARD_TEST_*`:
//! injected panics, stalls, kills, pauses). They are compiled only with the `test-hooks` feature,
//! which only the tests turn on, through a dev-dependency of the package on itself; resolver 2
//! adds that feature to builds that include dev-dependencies (`cargo test`, `cargo clippy
//! --all-targets`) and to no other (`cargo build --release`, `cargo install`).
//!
//! Building a release binary here would take minutes, so the release side is checked on the
//! manifest and the source (docs/performance.md has the check on a release binary, by hand); the test
//! side on the binary these tests run.

use std::fs;
use std::path::Path;

use crate::util::reshard_exe;

/// The package's directory.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
    out
}

/// The lines of `block`, an item that starts at column 0 with the line `head` right after the
/// line `attr` (rustfmt'd, so it ends at the first following line that is exactly `}`): their
/// numbers (from 1) in `text`.
fn item_lines(text: &str, attr: &str, head: &str) -> std::ops::RangeInclusive<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let start = (1..lines.len())
        .find(|&i| lines[i] == head && lines[i - 1] == attr)
        .unwrap_or_else(|| panic!("src/hooks.rs has no `{attr}` `{head}`"));
    let end = (start..lines.len())
        .find(|&i| lines[i] == "}")
        .expect("the item ends");
    start + 1..=end + 1
}

#[test]
fn only_the_tests_turn_the_test_hooks_on() {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let line = |start: &str| manifest.lines().find(|l| l.starts_with(start));
    assert_eq!(line("test-hooks ="), Some("test-hooks = []"), "the feature");
    if let Some(default) = line("default =") {
        assert!(!default.contains("test-hooks"), "on by default: {default}");
    }
    let dev = manifest
        .split("[dev-dependencies]")
        .nth(1)
        .expect("dev-dependencies");
    let dev = dev.split("\n[").next().unwrap();
    assert!(
        dev.lines()
            .any(|l| l == r#"reshard = { path = ".", features = ["test-hooks"] }"#),
        "the tests' dev-dependency on reshard with its test hooks"
    );
    let normal = manifest.split("[dev-dependencies]").next().unwrap();
    assert!(
        !normal.contains("\"test-hooks\""),
        "only the dev-dependency may turn test-hooks on"
    );
}

#[test]
fn every_test_hook_is_compiled_only_with_its_feature() {
    let hooks = root().join("src/hooks.rs");
    let text = fs::read_to_string(&hooks).unwrap();
    let armed = item_lines(
        &text,
        r#"#[cfg(feature = "test-hooks")]"#,
        "mod test_hooks {",
    );
    let disarmed = item_lines(
        &text,
        r#"#[cfg(not(feature = "test-hooks"))]"#,
        "mod test_hooks {",
    );
    for path in rust_files(&root().join("src")) {
        let text = fs::read_to_string(&path).unwrap();
        // Unit tests (the `#[cfg(test)] mod tests` at a file's end) are never in a binary.
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        for (i, line) in code.lines().enumerate() {
            let code_part = line.split("//").next().unwrap();
            if !code_part.contains("RESHARD_TEST_") {
                continue;
            }
            assert!(
                path == hooks && armed.contains(&(i + 1)),
                "{}:{}: a test hook outside `#[cfg(feature = \"test-hooks\")] mod test_hooks` of src/hooks.rs: {line}",
                path.display(),
                i + 1
            );
        }
    }
    // Where the hooks are off they do nothing: no variable read, no file touched.
    let lines: Vec<&str> = text.lines().collect();
    for n in disarmed {
        let line = lines[n - 1];
        for doing in ["std::env", "std::fs", "env::var", "fs::", "sys::", "panic!"] {
            assert!(
                !line.contains(doing),
                "src/hooks.rs:{n}: a hook does something without its feature: {line}"
            );
        }
    }
}

#[test]
fn the_binary_the_tests_run_has_the_test_hooks() {
    let exe = fs::read(reshard_exe()).unwrap();
    for var in [
        "RESHARD_TEST_KILL",
        "RESHARD_TEST_PAUSE_FINISH",
        "RESHARD_TEST_HANG_FINALIZE",
    ] {
        assert!(
            exe.windows(var.len()).any(|w| w == var.as_bytes()),
            "{} lacks {var}: `cargo test` built it without the test-hooks feature",
            reshard_exe().display()
        );
    }
}
