//! Hints for command-line mistakes that clap reports without saying what the user meant.

use std::ffi::OsString;

/// A hint for clap's "unexpected argument" when the stray word is one of several paths after
/// `--input`, as the shell leaves an unquoted brace pattern (`--input data/train-{0..3}.tar`
/// becomes four words): the pattern must be quoted, or `--input` repeated.
pub(super) fn input_hint(e: &clap::Error, argv: &[OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(stray)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let at = 1 + argv
        .iter()
        .skip(1)
        .position(|a| a.to_str() == Some(stray))?;
    // Back over the words before it that are not flags, to the flag they follow.
    let run = (1..at)
        .rev()
        .take_while(|&i| !argv[i].to_string_lossy().starts_with('-'))
        .count();
    let flag = argv[at - run - 1].to_string_lossy();
    let separate = run > 0 && (flag == "--input" || flag == "-i");
    let attached = flag.starts_with("--input=") || (flag.starts_with("-i") && flag.len() > 2);
    if !(separate || attached) {
        return None;
    }
    let looks_like_shard = [".tar", ".tgz", ".tar.gz", ".tar.zst"]
        .iter()
        .any(|ext| stray.ends_with(ext))
        || {
            let path = std::path::Path::new(stray);
            crate::storage::source(path)
                .stat(path)
                .is_ok_and(|s| s.kind == crate::storage::Kind::File)
        };
    if !looks_like_shard {
        return None;
    }
    Some(format!(
        "hint: '{stray}' looks like another input path after --input, which takes one SPEC: an \
         unquoted brace pattern is expanded by the shell into separate words. Quote the pattern \
         (--input 'data/train-{{000000..000003}}.tar', reshard expands it) or repeat --input \
         before each path."
    ))
}
