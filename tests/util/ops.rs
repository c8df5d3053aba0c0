//! Helpers of the operations tests (issue 17): pictures checked by their format and size, and
//! the progress lines of a run's stderr.

use std::fs::File;
use std::path::Path;

use super::{have_python, Dir};

/// Width and height of a PNG, decoded by the `png` crate (which checks its structure).
pub fn png_size(path: &Path) -> (u32, u32) {
    let file = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(file)
        .read_info()
        .unwrap_or_else(|e| panic!("{}: not a PNG: {e}", path.display()));
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader
        .next_frame(&mut pixels)
        .unwrap_or_else(|e| panic!("{}: a broken PNG: {e}", path.display()));
    (info.width, info.height)
}

/// Checks that `path` is well-formed XML whose root is an SVG element, with Python's parser,
/// and returns how many `rect` and `text` elements it holds.
pub fn svg_elements(dir: &Dir, path: &Path) -> Option<(usize, usize)> {
    if !have_python("svg_elements") {
        return None;
    }
    let script = "import sys, xml.etree.ElementTree as E\n\
                  root = E.parse(sys.argv[1]).getroot()\n\
                  assert root.tag.endswith('svg'), root.tag\n\
                  tags = [e.tag.split('}')[-1] for e in root.iter()]\n\
                  print(tags.count('rect'), tags.count('text'))";
    let out = dir
        .program("python3")
        .args(["-c", script])
        .arg(path)
        .assert_success();
    let mut counts = out.stdout.split_whitespace().map(|n| n.parse().unwrap());
    Some((counts.next().unwrap(), counts.next().unwrap()))
}

/// The progress lines of `phase` (`index`, `exchange`) in a run's stderr.
pub fn progress_lines<'a>(stderr: &'a str, phase: &str) -> Vec<&'a str> {
    let start = format!("reshard: {phase} ");
    stderr
        .lines()
        .filter(|l| l.starts_with(&start) && l.contains("ETA"))
        .collect()
}
