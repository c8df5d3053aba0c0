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

/// What `spack/packages/reshard/package.py` declares, read by Python's `ast` (no Spack needed):
/// `{"classes": {name: [bases]}, "depends_on": [[spec, {keyword: value}]], "versions": [...],
/// "build_args": [...], "methods": [...]}`.
pub fn spack_package(dir: &Dir, package: &Path) -> Option<serde_json::Value> {
    if !have_python("spack_package") {
        return None;
    }
    let script = r#"
import ast, json, sys
tree = ast.parse(open(sys.argv[1]).read(), sys.argv[1])
out = {"classes": {}, "depends_on": [], "versions": [], "build_args": [], "methods": []}
def value(node):
    return ast.literal_eval(node)
for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
    out["classes"][cls.name] = [ast.unparse(b) for b in cls.bases]
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "depends_on":
                kw = {k.arg: value(k.value) for k in node.keywords}
                out["depends_on"].append([value(node.args[0]), kw])
            elif node.func.id == "version":
                out["versions"].append(value(node.args[0]))
        if isinstance(node, ast.FunctionDef):
            out["methods"].append(node.name)
            if node.name == "build_args":
                for ret in [r for r in ast.walk(node) if isinstance(r, ast.Return)]:
                    out["build_args"] = value(ret.value)
print(json.dumps(out))
"#;
    let out = dir
        .program("python3")
        .args(["-c", script])
        .arg(package)
        .assert_success();
    Some(serde_json::from_str(&out.stdout).expect("the script prints JSON"))
}

/// One `<text>` element of an SVG that plotters wrote: where, how large, and what it says.
#[derive(Debug)]
pub struct SvgText {
    pub x: f64,
    pub y: f64,
    pub size: f64,
    pub anchor: String,
    pub rotated: bool,
    pub text: String,
}

/// The `<text>` elements of the SVG at `path` (plotters writes the start tag, the text and the
/// end tag on lines of their own).
pub fn svg_texts(path: &Path) -> Vec<SvgText> {
    let svg = std::fs::read_to_string(path).unwrap();
    let attr = |tag: &str, name: &str| -> Option<String> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(tag[at..].split('"').next()?.to_string())
    };
    svg.split("<text")
        .skip(1)
        .map(|t| {
            let (tag, rest) = t.split_once('>').unwrap();
            let num = |name| attr(tag, name).map_or(0.0, |v| v.parse().unwrap());
            SvgText {
                x: num("x"),
                y: num("y"),
                size: num("font-size"),
                anchor: attr(tag, "text-anchor").unwrap_or_default(),
                rotated: tag.contains("rotate("),
                text: rest.split("</text>").next().unwrap().trim().to_string(),
            }
        })
        .collect()
}
