//! Issue 17: running on a cluster. A summary that fits a screen at 64 ranks, progress under a
//! launcher for indexing and the exchange, what a plan costs a parallel filesystem, and the
//! pictures of `plan --plot` and `verify --plot`.

use std::fs;
use std::time::Duration;

use crate::util::ops::{
    progress_lines, spack_package, svg_elements, svg_texts,
    verify_pictures_of_a_shuffle_and_a_key_order,
};
use crate::util::verifier::assert_same_output;
use crate::util::Dir;

#[test]
fn the_summary_of_64_ranks_fits_a_screen() {
    let dir = Dir::new("ops-64");
    dir.generate(
        "in",
        &["--shards", "64", "--samples", "640", "--mean-size", "1KiB"],
    );
    // 64 oversubscribed ranks on a couple of cores: about 30 s here.
    let out = dir
        .mpi(64)
        .args(["run", "--input", "in", "--output", "out", "--shards", "64"])
        .args(["--seed", "3", "--report", "report.json"])
        .timeout(Duration::from_secs(300))
        .assert_success();
    let lines = out.stdout.lines().count();
    out.check(lines <= 30, &format!("the summary has {lines} lines"));
    // 64 ranks, most of them holding one input shard and writing one output shard, give the
    // bytes one rank gives.
    dir.command()
        .args(["run", "--input", "in", "--output", "one", "--shards", "64"])
        .args(["--seed", "3"])
        .assert_success();
    assert_same_output(&dir.join("one"), &dir.join("out"), &["ranks"]);
    for needle in [
        "with 64 ranks",
        "slowest reader: rank ",
        "slowest writer: rank ",
        "largest: rank ",
        "(every rank: --report)",
    ] {
        out.check(out.stdout.contains(needle), &format!("no {needle:?}"));
    }
    let report: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let per_rank = report["per_rank"].as_array().unwrap();
    out.check(per_rank.len() == 64, "the report lists every rank");
    out.check(
        per_rank.iter().all(|r| r["read_seconds"].is_f64()),
        "every rank's read time is in the report",
    );
    let spread = &report["rank_spread"]["peak_rss"];
    out.check(
        spread["max"].as_u64() >= spread["median"].as_u64()
            && spread["max_rank"].as_u64() < Some(64),
        "the report has the spread of peak RSS",
    );
}

#[test]
fn progress_shows_under_mpirun_for_index_and_exchange() {
    let dir = Dir::new("ops-progress");
    dir.generate(
        "in",
        &["--shards", "6", "--samples", "600", "--mean-size", "4KiB"],
    );
    let run = |out: &str, progress: &[&str]| {
        dir.mpi(2)
            .args(["run", "--input", "in", "--output", out, "--shards", "5"])
            // A small budget: many exchange rounds, each reported.
            .args(["--seed", "4", "--mem-limit", "1MiB"])
            .args(progress)
            .assert_success()
    };
    let lines = run(
        "lines",
        &["--progress", "lines", "--progress-interval", "0"],
    );
    let index = progress_lines(&lines.stderr, "index");
    lines.check(
        index
            .last()
            .is_some_and(|l| l.contains("6 / 6 shards") && l.contains("(100%)")),
        "index progress ends at every shard",
    );
    let exchange = progress_lines(&lines.stderr, "exchange");
    lines.check(exchange.len() >= 2, "one exchange progress line per round");
    lines.check(
        exchange
            .last()
            .is_some_and(|l| l.contains("(100%)") && l.contains("/s")),
        "exchange progress ends at 100 % with a rate",
    );
    let none = run("none", &["--progress", "none"]);
    none.check(
        progress_lines(&none.stderr, "index").is_empty()
            && progress_lines(&none.stderr, "exchange").is_empty(),
        "--progress none printed progress",
    );
    // Forced through mpirun's pipe, the bar is drawn with carriage returns.
    let bar = run("bar", &["--progress", "bar"]);
    bar.check(
        bar.stderr.contains("\r\x1b[2Kindex") && bar.stderr.contains("exchange"),
        "no bar drawn",
    );
    assert_same_output(&dir.join("lines"), &dir.join("none"), &[]);
    assert_same_output(&dir.join("lines"), &dir.join("bar"), &[]);
    dir.command()
        .args([
            "run", "--input", "in", "--output", "x", "--shards", "2", "--seed", "1",
        ])
        .arg("--progress-interval=-1")
        .assert_code(2)
        .stderr_has("--progress-interval");
}

#[test]
fn index_progress_counts_the_bytes_of_shards_not_yet_done() {
    let dir = Dir::new("ops-index-bytes");
    // Two large shards, both read on one rank: shards only are done at the very end.
    dir.generate(
        "in",
        &["--shards", "2", "--samples", "800", "--mean-size", "16KiB"],
    );
    let res = dir
        .mpi(1)
        .args(["run", "--input", "in", "--output", "out", "--shards", "2"])
        .args([
            "--seed",
            "4",
            "--progress",
            "lines",
            "--progress-interval",
            "0",
        ])
        // Each indexing thread stops halfway through its shard for a while.
        .env("RESHARD_TEST_PAUSE_INDEX", "1.5")
        .assert_success();
    let index = progress_lines(&res.stderr, "index");
    let midway: Vec<&&str> = index
        .iter()
        .take_while(|l| l.contains("index 0 / 2 shards"))
        .filter(|l| !l.contains("0 / 2 shards, 0 B /"))
        .collect();
    res.check(
        !midway.is_empty(),
        "a progress line with bytes read before the first shard was done",
    );
    res.check(
        midway.iter().all(|l| !l.contains("ETA unknown")),
        "an ETA once bytes were read",
    );
    res.check(
        index
            .last()
            .is_some_and(|l| l.contains("2 / 2 shards") && l.contains("(100%)")),
        "index progress ends at every shard and byte",
    );
}

#[test]
fn plan_counts_inodes_and_warns_about_tiny_shards() {
    let dir = Dir::new("ops-inodes");
    dir.generate(
        "in",
        &["--shards", "4", "--samples", "400", "--mean-size", "1KiB"],
    );
    let plan = |shards: &str| {
        dir.mpi(2)
            .args(["plan", "--input", "in", "--shards", shards, "--seed", "1"])
            .assert_success()
    };
    let many = plan("40");
    many.check(
        many.stdout.contains("inodes: 83"),
        "40 shards: 2 x 40 + 3 inodes",
    );
    many.check(
        many.stdout.contains("warning: 40 shards of")
            && many.stdout.contains("the whole dataset is only"),
        "40 tiny shards of a small dataset: warned, naming the dataset's size as the cause",
    );
    let few = plan("4");
    few.check(few.stdout.contains("inodes: 11"), "4 shards: 11 inodes");
    few.check(!few.stdout.contains("warning"), "a warning for 4 shards");
    let json = dir
        .command()
        .args([
            "plan", "--input", "in", "--shards", "40", "--seed", "1", "--json",
        ])
        .assert_success();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    json.check(
        v["storage"]["inodes"] == 83 && v["storage"]["warnings"].as_array().unwrap().len() == 1,
        "the JSON plan has the inodes and the warning",
    );
}

#[test]
fn plan_and_verify_draw_pictures() {
    let dir = Dir::new("ops-plot");
    dir.generate(
        "in",
        &[
            "--shards",
            "7",
            "--samples",
            "500",
            "--mean-size",
            "2KiB",
            "--skew",
            "1",
        ],
    );
    let plan = dir
        .mpi(2)
        .args(["plan", "--input", "in", "--shards", "9", "--seed", "2"])
        .args(["--plot", "plan.svg"])
        .assert_success();
    plan.stderr_has("drew the plan to plan.svg");
    let svg = dir.join("plan.svg");
    let size = fs::metadata(&svg).unwrap().len();
    plan.check(
        (10_000..5_000_000).contains(&size),
        &format!("an SVG of {size} bytes"),
    );
    if let Some((rects, texts)) = svg_elements(&dir, &svg) {
        // 9 x 7 cells in each of the two matrices, plus the histograms' bars.
        plan.check(rects >= 2 * 63 + 2, &format!("{rects} rectangles"));
        plan.check(texts >= 5, &format!("{texts} texts: titles and labels"));
    }

    let shades = verify_pictures_of_a_shuffle_and_a_key_order(&dir);
    // (shaded, dark) pixels of the output's matrix and of the uniform one.
    let [[shuffled, uniform], [sorted, uniform_sorted]] = [shades[0], shades[1]];
    println!("shuffle: {shuffled:?} against {uniform:?}; key order: {sorted:?} against {uniform_sorted:?}");
    // A shuffle takes every output shard from every input shard, like the uniform matrix: every
    // cell is shaded in both, about as many pixels.
    assert!(
        shuffled.0 * 10 >= uniform.0 * 9 && uniform.0 > 0,
        "shuffle: {shuffled:?} shaded pixels against the uniform {uniform:?}"
    );
    // Key order leaves most cells empty (white) and fills a diagonal band completely (dark),
    // which no cell of the uniform matrix is.
    assert!(
        sorted.0 * 2 < uniform_sorted.0,
        "key order: {sorted:?} shaded pixels, the uniform {uniform_sorted:?}"
    );
    // (Each panel's colour scale has a dark end, the uniform panel's only dark pixels.)
    assert!(
        sorted.1 * 3 > sorted.0 && sorted.1 > 4 * uniform_sorted.1,
        "key order: {sorted:?} dark pixels, the uniform {uniform_sorted:?}"
    );
    // A shuffle's shares scatter around the uniform ones: only the largest are dark.
    assert!(
        shuffled.1 * 4 < shuffled.0,
        "shuffle: {shuffled:?} dark pixels"
    );

    // A picture of a run is verify's; a format must be known.
    let refused: [&[&str]; 2] = [
        &[
            "run", "--input", "in", "--output", "o2", "--shards", "2", "--seed", "1", "--plot",
            "p.svg",
        ],
        &[
            "plan", "--input", "in", "--shards", "2", "--seed", "1", "--plot", "p.pdf",
        ],
    ];
    for args in refused {
        dir.command().args(args).assert_code(2).stderr_has("--plot");
    }
    dir.command()
        .args([
            "verify", "--input", "in", "--output", "out", "--plot", "v.jpg",
        ])
        .assert_code(2)
        .stderr_has(".svg or .png");
}

/// Issue 23: the samples histogram labels whole values (shards of 41 samples show at 41, not
/// between 41 and 42), the byte histogram round numbers of a unit, the matrices have a colour
/// scale, and no label runs off the picture.
#[test]
fn plot_labels_are_whole_round_and_inside_the_picture() {
    let dir = Dir::new("ops-plot-labels");
    dir.generate(
        "in",
        &["--shards", "16", "--samples", "410", "--mean-size", "1KiB"],
    );
    dir.command()
        .args(["plan", "--input", "in", "--shards", "10", "--seed", "2"])
        .args(["--plot", "p.svg"])
        .assert_success();
    let texts = svg_texts(&dir.join("p.svg"));
    let says = |s: &str| texts.iter().any(|t| t.text == s);
    let all: Vec<&str> = texts.iter().map(|t| t.text.as_str()).collect();
    // The samples histogram (the right half) has one bar, of the 10 shards of 41 samples; its
    // label is under its middle.
    let svg = fs::read_to_string(dir.join("p.svg")).unwrap();
    let bars = svg_bars(&svg, "#466EAA");
    let bar = bars
        .iter()
        .find(|b| b.0 > 600.0 && b.2 > 0.0)
        .unwrap_or_else(|| panic!("no bar in the samples histogram: {bars:?}"));
    let middle = bar.0 + bar.1 / 2.0;
    assert!(
        texts
            .iter()
            .any(|t| t.text == "41" && t.x > 600.0 && (t.x - middle).abs() <= 2.0),
        "no label 41 under the middle of the bar of 41 samples (x {middle}): {all:?}"
    );
    for edge in ["40.5", "41.5", "42.0"] {
        assert!(!says(edge), "a bin edge is labelled {edge}: {all:?}");
    }
    assert!(says("output shards by size (KiB)"), "{all:?}");
    // The colour scale: named, ticked in percent from 0%.
    assert!(says("share of an output shard") && says("0%"), "{all:?}");
    assert!(
        texts.iter().filter(|t| t.text.ends_with('%')).count() >= 3,
        "{all:?}"
    );
    // Centred labels fit their panel (plotters cuts off what runs over): half a label (at most
    // 0.6 em a character) either side of x. The histograms share the top 2/5 of the picture,
    // the matrices and the 110-pixel colour scale the rest.
    for t in texts
        .iter()
        .filter(|t| !t.rotated && t.anchor == "middle" && t.y > 30.0)
    {
        let edges: &[f64] = if t.y < 360.0 {
            &[0.0, 600.0, 1200.0]
        } else {
            &[0.0, 545.0, 1090.0, 1200.0]
        };
        let panel = edges.windows(2).find(|w| t.x < w[1]).unwrap();
        let half = t.text.chars().count() as f64 * t.size * 0.3;
        assert!(
            t.x - half >= panel[0] && t.x + half <= panel[1],
            "{:?} at x {} runs out of its panel {panel:?}",
            t.text,
            t.x
        );
    }
}

/// The `<rect>`s of `fill` in an SVG that plotters wrote, as (x, width, height).
fn svg_bars(svg: &str, fill: &str) -> Vec<(f64, f64, f64)> {
    svg.lines()
        .filter(|l| l.starts_with("<rect") && l.contains(&format!("fill=\"{fill}\"")))
        .map(|l| {
            let num = |name: &str| -> f64 {
                let at = l.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
                l[at..].split('"').next().unwrap().parse().unwrap()
            };
            (num("x"), num("width"), num("height"))
        })
        .collect()
}

#[test]
fn the_spack_package_builds_against_the_site_mpi() {
    let dir = Dir::new("ops-spack");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = fs::read_to_string(root.join("spack/repo.yaml")).unwrap();
    assert!(repo.contains("namespace: reshard"), "{repo}");
    let Some(pkg) = spack_package(&dir, &root.join("spack/packages/reshard/package.py")) else {
        return;
    };
    assert_eq!(
        pkg["classes"]["Reshard"],
        serde_json::json!(["CargoPackage"])
    );
    let deps: Vec<&str> = pkg["depends_on"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d[0].as_str().unwrap())
        .collect();
    // The Rust version Spack asks for is the one Cargo.toml declares.
    let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let rust = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap()
        .trim_matches('"');
    for want in ["mpi", "llvm+clang", "c", &format!("rust@{rust}:")] {
        assert!(deps.contains(&want), "no depends_on({want:?}) in {deps:?}");
    }
    // MPI is linked, the compilers only build.
    for dep in pkg["depends_on"].as_array().unwrap() {
        let build_only = dep[1]["type"] == "build";
        assert_eq!(build_only, dep[0] != "mpi", "{dep}");
    }
    assert_eq!(pkg["build_args"], serde_json::json!(["--locked"]));
    assert!(pkg["versions"].as_array().unwrap().contains(&"main".into()));
    assert!(pkg["methods"]
        .as_array()
        .unwrap()
        .contains(&"setup_build_environment".into()));
}
