//! Helpers of the operations tests (issue 17): pictures checked by their format and size, and
//! the progress lines of a run's stderr.

use std::fs::{self, File};
use std::path::Path;

use super::tar::tar_of;
use super::{have_python, Dir};

/// Width and height of a PNG, decoded by the `png` crate (which checks its structure).
pub fn png_size(path: &Path) -> (u32, u32) {
    let (_, info) = decode_png(path);
    (info.width, info.height)
}

/// The pixels of the PNG at `path` and what they are, decoded by the `png` crate.
fn decode_png(path: &Path) -> (Vec<u8>, png::OutputInfo) {
    let file = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(file)
        .read_info()
        .unwrap_or_else(|e| panic!("{}: not a PNG: {e}", path.display()));
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader
        .next_frame(&mut pixels)
        .unwrap_or_else(|e| panic!("{}: a broken PNG: {e}", path.display()));
    (pixels, info)
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

/// Pixels of the matrices in the bottom half of a `verify --plot` PNG (1200 x 900: histograms
/// above, the output's mixing matrix bottom left, a uniform permutation's bottom right), counted
/// by shade: `(shaded, dark)` for the left and the right panel. A cell is shaded from white
/// (no share) to dark blue (the largest share); text and axes are grey or black, never bluer
/// than red.
pub fn matrix_shades(path: &Path) -> [(usize, usize); 2] {
    let (pixels, info) = decode_png(path);
    let channels = info.color_type.samples();
    let (w, h) = (info.width as usize, info.height as usize);
    let mut counts = [(0, 0); 2];
    for y in h / 2..h {
        for x in 0..w {
            let p = &pixels[(y * w + x) * channels..][..3];
            let (r, b) = (i32::from(p[0]), i32::from(p[2]));
            if b > r + 4 {
                let c = &mut counts[usize::from(x >= w / 2)];
                c.0 += 1;
                c.1 += usize::from(r < 100);
            }
        }
    }
    counts
}

/// Inputs whose keys sort in input order, reshuffled (`shuffle`) and sorted (`--order key`) into
/// 9 shards at np 3, each drawn by `verify --plot` as a 1200 x 900 PNG: the [`matrix_shades`] of
/// both pictures. `--order key` takes each output shard from one or two input shards, a shuffle
/// from all of them.
pub fn verify_pictures_of_a_shuffle_and_a_key_order(dir: &Dir) -> Vec<[(usize, usize); 2]> {
    for i in 0..7 {
        let names: Vec<String> = (0..70).map(|j| format!("k{i}{j:03}.bin")).collect();
        let body = vec![b'x'; 700];
        let members: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &body[..])).collect();
        dir.create_bytes(format!("ordered/part-{i}.tar"), &tar_of(&members));
    }
    let mut shades = Vec::new();
    for (out, order) in [("out", "shuffle"), ("sorted", "key")] {
        dir.mpi(3)
            .args([
                "run", "--input", "ordered", "--output", out, "--shards", "9",
            ])
            .args(["--seed", "2", "--order", order])
            .assert_success();
        let png = format!("{out}.png");
        let verify = dir
            .mpi(2)
            .args([
                "verify", "--input", "ordered", "--output", out, "--plot", &png,
            ])
            .assert_success();
        verify.stderr_has(&format!("drew the output to {png}"));
        // And says in words whether the order looks like a uniform random permutation.
        verify.stderr_has(match order {
            "shuffle" => "verify: mixing: looks uniformly mixed (chi-square",
            _ => "verify: mixing: not uniformly mixed",
        });
        let png = dir.join(png);
        verify.check(png_size(&png) == (1200, 900), "a 1200 x 900 PNG");
        let size = fs::metadata(&png).unwrap().len();
        verify.check(
            (10_000..5_000_000).contains(&size),
            &format!("a PNG of {size} bytes"),
        );
        shades.push(matrix_shades(&png));
    }
    shades
}
