//! [`Picture`]: what `reshard plan --plot` and `reshard verify --plot` draw, as SVG or PNG: the
//! histograms of output shard sizes (bytes and samples), and the mixing matrix (output shard x
//! input shard, shaded by the share of the output shard's samples that come from the input
//! shard) next to what a uniform random permutation gives.
//!
//! Text needs a TrueType font, read from the system at the first picture (DejaVu Sans,
//! Liberation Sans or FreeSans, where Linux distributions install them) so that the binary links
//! no font library. Without one the picture is drawn without text, and the caller is told.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::mixing::Mixing;
use crate::size::human_bytes;

/// Pixels (PNG) or user units (SVG).
pub const SIZE: (u32, u32) = (1200, 900);

/// Where Linux distributions (Debian, RHEL, Arch, SUSE) and macOS keep a sans-serif TrueType font.
const FONTS: [&str; 7] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// What one picture shows.
pub struct Picture<'a> {
    pub title: String,
    /// Per output shard.
    pub shard_bytes: &'a [u64],
    pub shard_samples: &'a [u64],
    pub mixing: &'a Mixing,
}

/// The picture's format, from the file name's extension.
///
/// # Errors
/// Neither `.svg` nor `.png`.
pub fn format_of(path: &Path) -> Result<&'static str> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("svg") => Ok("svg"),
        Some("png") => Ok("png"),
        _ => bail!(
            "--plot {}: expected a file name ending in .svg or .png",
            path.display()
        ),
    }
}

/// Registers a system font for text, once; false when there is none.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        FONTS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .is_some_and(|bytes| {
                // Registered fonts live for the whole process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
            })
    })
}

/// Draws `picture` to `path` (SVG or PNG, by its extension). Returns a warning when no font was
/// found and the picture has no text.
///
/// # Errors
/// An unknown extension, or the file cannot be written.
pub fn draw(path: &Path, picture: &Picture<'_>) -> Result<Option<String>> {
    let text = font_ready();
    let wrote = match format_of(path)? {
        "svg" => paint(
            SVGBackend::new(path, SIZE).into_drawing_area(),
            picture,
            text,
        ),
        _ => paint(
            BitMapBackend::new(path, SIZE).into_drawing_area(),
            picture,
            text,
        ),
    };
    wrote.map_err(|e| anyhow!("--plot {}: cannot draw: {e}", path.display()))?;
    Ok((!text).then(|| {
        format!(
            "{}: drawn without text: no TrueType font found (looked for {}); install \
             fonts-dejavu-core (Debian) or dejavu-sans-fonts (RHEL)",
            path.display(),
            FONTS[0]
        )
    }))
}

type Drawn = std::result::Result<(), String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The four panels: two histograms above, the two matrices below.
fn paint<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, p: &Picture<'_>, text: bool) -> Drawn {
    root.fill(&WHITE).map_err(err)?;
    let body = if text {
        root.titled(&p.title, ("sans-serif", 24)).map_err(err)?
    } else {
        root.clone()
    };
    let (top, bottom) = body.split_vertically(SIZE.1 * 2 / 5);
    let hist = top.split_evenly((1, 2));
    let bytes = histogram(p.shard_bytes);
    let samples = histogram(p.shard_samples);
    let caption = "output shards by size (bytes)";
    bars(&hist[0], caption, &bytes, &|v| human_bytes(v as u64), text)?;
    let caption = "output shards by samples";
    bars(&hist[1], caption, &samples, &|v| format!("{v:.0}"), text)?;
    let m = p.mixing;
    let actual = |r: usize, c: usize| m.share(r, c);
    let uniform = |_: usize, c: usize| m.uniform_share(c);
    let top_share = (0..m.rows)
        .flat_map(|r| (0..m.cols).map(move |c| actual(r, c).max(uniform(r, c))))
        .fold(f64::MIN_POSITIVE, f64::max);
    let panels = bottom.split_evenly((1, 2));
    let caption = "share of each output shard's samples by input shard";
    matrix(&panels[0], caption, m, &actual, top_share, text)?;
    let caption = "the same for a uniform random permutation";
    matrix(&panels[1], caption, m, &uniform, top_share, text)?;
    root.present().map_err(err)
}

/// A histogram: (bin start, bin end, count) over at most 30 equal bins.
fn histogram(values: &[u64]) -> Vec<(f64, f64, u64)> {
    let (Some(&lo), Some(&hi)) = (values.iter().min(), values.iter().max()) else {
        return Vec::new();
    };
    let bins = (hi - lo + 1).min(30);
    let width = (hi - lo + 1).div_ceil(bins);
    let mut counts = vec![0u64; bins as usize];
    for &v in values {
        counts[((v - lo) / width) as usize] += 1;
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let start = lo + i as u64 * width;
            (start as f64, (start + width) as f64, n)
        })
        .collect()
}

fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    bins: &[(f64, f64, u64)],
    show: &dyn Fn(f64) -> String,
    text: bool,
) -> Drawn {
    // A bin's width of room on either side: a single bin (equal shards) stays readable.
    let width = bins.first().map_or(1.0, |b| b.1 - b.0);
    let x0 = bins.first().map_or(0.0, |b| b.0) - width;
    let x1 = bins.last().map_or(1.0, |b| b.1) + width;
    // Counts on an integer axis: whole-number ticks only.
    let top = bins.iter().map(|b| b.2).max().unwrap_or(1) * 11 / 10 + 1;
    let mut builder = ChartBuilder::on(area);
    builder.margin(12);
    if text {
        builder
            .caption(caption, ("sans-serif", 17))
            .x_label_area_size(32)
            .y_label_area_size(48);
    }
    let mut chart = builder.build_cartesian_2d(x0..x1, 0u64..top).map_err(err)?;
    if text {
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE)
            .x_labels(5)
            .x_label_formatter(&|v| show(*v))
            .y_desc("shards")
            .draw()
            .map_err(err)?;
    }
    let fill = RGBColor(70, 110, 170).filled();
    chart
        .draw_series(
            bins.iter()
                // A gap between neighbouring bars.
                .map(|&(a, b, n)| {
                    let gap = (b - a) * 0.04;
                    Rectangle::new([(a + gap, 0), (b - gap, n)], fill)
                }),
        )
        .map_err(err)?;
    Ok(())
}

/// The matrix: a row per output shard bin (shard 0 at the top), a column per input shard bin,
/// each cell shaded from white (no share) to dark blue (`top`).
fn matrix<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    m: &Mixing,
    value: &dyn Fn(usize, usize) -> f64,
    top: f64,
    text: bool,
) -> Drawn {
    let (rows, cols) = (m.rows as f64, m.cols as f64);
    let mut builder = ChartBuilder::on(area);
    builder.margin(12);
    if text {
        builder
            .caption(caption, ("sans-serif", 17))
            .x_label_area_size(40)
            .y_label_area_size(56);
    }
    let mut chart = builder
        .build_cartesian_2d(0.0..cols, 0.0..rows)
        .map_err(err)?;
    if text {
        let input = |v: &f64| {
            Mixing::shards_of(*v as usize, m.cols, m.inputs)
                .start
                .to_string()
        };
        let output = |v: &f64| {
            let bin = (rows - v).max(0.0) as usize;
            Mixing::shards_of(bin.min(m.rows), m.rows, m.outputs)
                .start
                .to_string()
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(m.cols.min(8))
            .y_labels(m.rows.min(8))
            .x_label_formatter(&input)
            .y_label_formatter(&output)
            .x_desc("input shard")
            .y_desc("output shard")
            .draw()
            .map_err(err)?;
    }
    let cells = (0..m.rows).flat_map(|r| (0..m.cols).map(move |c| (r, c)));
    chart
        .draw_series(cells.map(|(r, c)| {
            let t = (value(r, c) / top).clamp(0.0, 1.0);
            let shade = |full: f64, dark: f64| (full - (full - dark) * t) as u8;
            let color = RGBColor(shade(255.0, 20.0), shade(255.0, 60.0), shade(255.0, 140.0));
            let y = rows - r as f64;
            Rectangle::new([(c as f64, y - 1.0), (c as f64 + 1.0, y)], color.filled())
        }))
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_cover_every_value() {
        let h = histogram(&[10, 10, 11, 40]);
        assert_eq!(h.iter().map(|b| b.2).sum::<u64>(), 4);
        assert!(h.len() <= 30 && h[0].0 == 10.0 && h.last().unwrap().1 > 40.0);
        assert_eq!(histogram(&[5, 5]), vec![(5.0, 6.0, 2)]);
        assert!(histogram(&[]).is_empty());
    }

    #[test]
    fn draws_with_and_without_text() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Mixing::new(100, 7);
        for o in 0..100 {
            m.add(o, (o * 3) % 7);
        }
        let bytes: Vec<u64> = (0..100).map(|i| 1000 + i * 37).collect();
        let samples: Vec<u64> = (0..100).map(|i| 10 + i % 3).collect();
        let p = Picture {
            title: "test".into(),
            shard_bytes: &bytes,
            shard_samples: &samples,
            mixing: &m,
        };
        for text in [false, true] {
            if text && !font_ready() {
                crate::hooks::skip(
                    "drawing with text",
                    "no TrueType font found (apt-get install fonts-dejavu-core)",
                );
                continue;
            }
            let svg = dir.path().join(format!("p{text}.svg"));
            paint(SVGBackend::new(&svg, SIZE).into_drawing_area(), &p, text).unwrap();
            let written = std::fs::read_to_string(&svg).unwrap();
            assert!(written.starts_with("<svg") && written.contains("<rect"));
            let png = dir.path().join(format!("p{text}.png"));
            paint(BitMapBackend::new(&png, SIZE).into_drawing_area(), &p, text).unwrap();
            assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
        }
        assert!(format_of(Path::new("x.SVG")).is_ok());
        assert!(format_of(Path::new("x.pdf")).is_err());
    }
}
