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

use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::axis::Axis;
use super::mixing::Mixing;
use crate::storage;

/// Pixels (PNG) or user units (SVG).
pub(crate) const SIZE: (u32, u32) = (1200, 900);

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
pub(crate) struct Picture<'a> {
    pub(crate) title: String,
    /// Per output shard.
    pub(crate) shard_bytes: &'a [u64],
    pub(crate) shard_samples: &'a [u64],
    pub(crate) mixing: &'a Mixing,
}

/// The picture's format, from the file name's extension.
///
/// # Errors
/// Neither `.svg` nor `.png`.
pub(crate) fn format_of(path: &Path) -> Result<&'static str> {
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
            .find_map(|p| crate::sys::read_machine_file(Path::new(p)).ok())
            .is_some_and(|bytes| {
                // Registered fonts live for the whole process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
            })
    })
}

/// Draws `picture` to `path` (SVG or PNG, by its extension), in memory and then written through
/// the storage seam (so `--plot` may name any location an output may). Returns a warning when no
/// font was found and the picture has no text.
///
/// # Errors
/// An unknown extension, or the file cannot be written.
pub(crate) fn draw(path: &Path, picture: &Picture<'_>) -> Result<Option<String>> {
    let text = font_ready();
    let drawn = match format_of(path)? {
        "svg" => svg(picture, text),
        _ => png(picture, text),
    };
    let bytes = drawn.map_err(|e| anyhow!("--plot {}: cannot draw: {e}", path.display()))?;
    storage::write_unsynced(path, &bytes)
        .with_context(|| format!("--plot {}: cannot write", path.display()))?;
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

/// The picture as an SVG document.
fn svg(picture: &Picture<'_>, text: bool) -> std::result::Result<Vec<u8>, String> {
    let mut doc = String::new();
    paint(
        SVGBackend::with_string(&mut doc, SIZE).into_drawing_area(),
        picture,
        text,
    )?;
    Ok(doc.into_bytes())
}

/// The picture as a PNG file (RGB, 8 bits a channel).
fn png(picture: &Picture<'_>, text: bool) -> std::result::Result<Vec<u8>, String> {
    let mut rgb = vec![0u8; SIZE.0 as usize * SIZE.1 as usize * 3];
    paint(
        BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area(),
        picture,
        text,
    )?;
    let mut file = Vec::new();
    let mut encoder = ::png::Encoder::new(&mut file, SIZE.0, SIZE.1);
    encoder.set_color(::png::ColorType::Rgb);
    encoder.set_depth(::png::BitDepth::Eight);
    encoder
        .write_header()
        .and_then(|mut w| w.write_image_data(&rgb))
        .map_err(err)?;
    Ok(file)
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Width of the colour scale beside the matrices.
const SCALE_WIDTH: u32 = 110;
/// Tick labels and axis names, in pixels (plotters' default shrinks with the panel).
const LABEL: (&str, u32) = ("sans-serif", 13);
const AXIS_NAME: (&str, u32) = ("sans-serif", 14);

/// The panels: two histograms above, the two matrices and their colour scale below.
fn paint<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, p: &Picture<'_>, text: bool) -> Drawn {
    root.fill(&WHITE).map_err(err)?;
    let body = if text {
        root.titled(&p.title, ("sans-serif", 24)).map_err(err)?
    } else {
        root.clone()
    };
    let (top, bottom) = body.split_vertically(SIZE.1 * 2 / 5);
    let hist = top.split_evenly((1, 2));
    let (unit, unit_name) = byte_unit(p.shard_bytes.iter().copied().max().unwrap_or(0));
    let caption = format!("output shards by size ({unit_name})");
    bars(&hist[0], &caption, &histogram(p.shard_bytes), unit, text)?;
    let caption = "output shards by samples";
    bars(&hist[1], caption, &histogram(p.shard_samples), 1.0, text)?;
    let m = p.mixing;
    let actual = |r: usize, c: usize| m.share(r, c);
    let uniform = |_: usize, c: usize| m.uniform_share(c);
    let top_share = (0..m.rows)
        .flat_map(|r| (0..m.cols).map(move |c| actual(r, c).max(uniform(r, c))))
        .fold(f64::MIN_POSITIVE, f64::max);
    let (matrices, scale) = bottom.split_horizontally(bottom.dim_in_pixel().0 - SCALE_WIDTH);
    let panels = matrices.split_evenly((1, 2));
    let caption = "share of each output shard's samples by input shard";
    matrix(&panels[0], caption, m, &actual, top_share, text)?;
    let caption = "the same for a uniform random permutation";
    matrix(&panels[1], caption, m, &uniform, top_share, text)?;
    colour_scale(&scale, top_share, text)?;
    root.present().map_err(err)
}

/// The unit the byte histogram's axis counts in (a power of 1024) and its name: its ticks are
/// round numbers of it (250 KiB, not 253.91 KiB).
fn byte_unit(largest: u64) -> (f64, &'static str) {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut k = 0;
    while k + 1 < units.len() && largest >= 1024u64.pow(k as u32 + 1) {
        k += 1;
    }
    (1024f64.powi(k as i32), units[k])
}

/// A histogram: (first value, values per bin, count) over at most 30 equal bins of whole values.
fn histogram(values: &[u64]) -> Vec<(u64, u64, u64)> {
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
        .map(|(i, &n)| (lo + i as u64 * width, width, n))
        .collect()
}

/// Where a bin's bar goes, in `unit`s: the values it counts, each whole value `v` taking
/// `v - 0.5 .. v + 0.5`, so that a tick at a whole value sits in the middle of its bar.
fn extent(&(first, width, _): &(u64, u64, u64), unit: f64) -> (f64, f64) {
    (
        (first as f64 - 0.5) / unit,
        (first as f64 + width as f64 - 0.5) / unit,
    )
}

/// A tick label: as many decimals as the axis's step needs (41, 2.5, 0.25).
fn tick_label(v: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{v:.decimals$}")
}

fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    bins: &[(u64, u64, u64)],
    unit: f64,
    text: bool,
) -> Drawn {
    // A bin's width of room on either side: a single bin (equal shards) stays readable.
    let (Some(first), Some(last)) = (bins.first(), bins.last()) else {
        return Ok(());
    };
    let room = first.1 as f64 / unit;
    let x = Axis::round(
        extent(first, unit).0 - room..extent(last, unit).1 + room,
        6,
        unit == 1.0,
    );
    let top = bins.iter().map(|b| b.2).max().unwrap_or(1) as f64 * 1.1 + 1.0;
    let y = Axis::round(0.0..top, 6, true);
    let mut builder = ChartBuilder::on(area);
    // Room on the right for the last tick's label, which is centred on its tick.
    builder.margin(12).margin_right(36);
    if text {
        builder
            .caption(caption, ("sans-serif", 17))
            .x_label_area_size(32)
            .y_label_area_size(48);
    }
    let (x_step, y_step) = (x.tick_step(), y.tick_step());
    let mut chart = builder.build_cartesian_2d(x, y).map_err(err)?;
    if text {
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|v| tick_label(*v, x_step))
            .y_label_formatter(&|v| tick_label(*v, y_step))
            .y_desc("shards")
            .label_style(LABEL)
            .axis_desc_style(AXIS_NAME)
            .draw()
            .map_err(err)?;
    }
    let fill = RGBColor(70, 110, 170).filled();
    chart
        .draw_series(bins.iter().map(|b| {
            let (a, z) = extent(b, unit);
            // A gap between neighbouring bars.
            let gap = (z - a) * 0.04;
            Rectangle::new([(a + gap, 0.0), (z - gap, b.2 as f64)], fill)
        }))
        .map_err(err)?;
    Ok(())
}

/// A matrix cell's colour: white (no share) to dark blue (`t` = 1, the largest share).
fn shade(t: f64) -> RGBColor {
    let t = t.clamp(0.0, 1.0);
    let mix = |full: f64, dark: f64| (full - (full - dark) * t) as u8;
    RGBColor(mix(255.0, 20.0), mix(255.0, 60.0), mix(255.0, 140.0))
}

/// The matrix: a row per output shard bin (shard 0 at the top), a column per input shard bin,
/// drawn over the shards it holds, each cell shaded by [`shade`] of its share over `top`.
fn matrix<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    m: &Mixing,
    value: &dyn Fn(usize, usize) -> f64,
    top: f64,
    text: bool,
) -> Drawn {
    let mut builder = ChartBuilder::on(area);
    builder.margin(12).margin_right(24);
    if text {
        builder
            .caption(caption, ("sans-serif", 17))
            .x_label_area_size(40)
            .y_label_area_size(56);
    }
    let x = Axis::shards(m.inputs, 8, false);
    let y = Axis::shards(m.outputs, 8, true);
    let mut chart = builder.build_cartesian_2d(x, y).map_err(err)?;
    if text {
        // The tick is in the middle of the shard it names.
        let shard = |v: &f64| format!("{}", v.floor());
        chart
            .configure_mesh()
            .disable_mesh()
            .x_label_formatter(&shard)
            .y_label_formatter(&shard)
            .x_desc("input shard")
            .y_desc("output shard")
            .label_style(LABEL)
            .axis_desc_style(AXIS_NAME)
            .draw()
            .map_err(err)?;
    }
    let span = |bin: usize, bins: usize, n: u64| {
        let s = Mixing::shards_of(bin, bins, n);
        (s.start as f64, s.end as f64)
    };
    let cells = (0..m.rows).flat_map(|r| (0..m.cols).map(move |c| (r, c)));
    chart
        .draw_series(cells.map(|(r, c)| {
            let (x0, x1) = span(c, m.cols, m.inputs);
            let (y0, y1) = span(r, m.rows, m.outputs);
            Rectangle::new([(x0, y0), (x1, y1)], shade(value(r, c) / top).filled())
        }))
        .map_err(err)?;
    Ok(())
}

/// The matrices' colour scale: the shades from no share to `top`, ticked in percent.
fn colour_scale<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, top: f64, text: bool) -> Drawn {
    let percent = top * 100.0;
    let y = Axis::round(0.0..percent, 8, false);
    let step = y.tick_step();
    let mut builder = ChartBuilder::on(area);
    // As tall as the matrices' plotting areas: below their captions, above their x labels; a
    // bar of 24 pixels, its labels to the left.
    builder
        .margin_top(40)
        .margin_bottom(52)
        .margin_left(4)
        .margin_right(SCALE_WIDTH - 4 - 66 - 24);
    if text {
        builder.y_label_area_size(66);
    }
    let mut chart = builder.build_cartesian_2d(0.0..1.0, y).map_err(err)?;
    if text {
        chart
            .configure_mesh()
            .disable_mesh()
            .disable_x_axis()
            .y_label_formatter(&|v| format!("{}%", tick_label(*v, step)))
            .y_desc("share of an output shard")
            .label_style(LABEL)
            .axis_desc_style(AXIS_NAME)
            .draw()
            .map_err(err)?;
    }
    const STEPS: usize = 64;
    chart
        .draw_series((0..STEPS).map(|i| {
            let (a, b) = (i as f64 / STEPS as f64, (i + 1) as f64 / STEPS as f64);
            let t = (a + b) / 2.0;
            Rectangle::new([(0.0, a * percent), (1.0, b * percent)], shade(t).filled())
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
        let last = h.last().unwrap();
        assert!(h.len() <= 30 && h[0].0 == 10 && last.0 + last.1 > 40);
        assert_eq!(histogram(&[5, 5]), vec![(5, 1, 2)]);
        // A bar of whole value 41 is centred on 41.
        assert_eq!(extent(&(41, 1, 10), 1.0), (40.5, 41.5));
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
            let written = String::from_utf8(svg(&p, text).unwrap()).unwrap();
            assert!(written.starts_with("<svg") && written.contains("<rect"));
            let file = png(&p, text).unwrap();
            let info = ::png::Decoder::new(&file[..]).read_info().unwrap();
            assert_eq!((info.info().width, info.info().height), SIZE);
        }
        // Written through the seam: on a file system, and where std::fs cannot reach.
        let on_disk = dir.path().join("p.png");
        draw(&on_disk, &p).unwrap();
        assert!(std::fs::read(&on_disk).unwrap().starts_with(b"\x89PNG"));
        let in_memory = Path::new("mem://picture/p.svg");
        draw(in_memory, &p).unwrap();
        let doc = crate::storage::memory::get(in_memory).expect("written");
        assert!(doc.starts_with(b"<svg"));
        assert!(format_of(Path::new("x.SVG")).is_ok());
        assert!(format_of(Path::new("x.pdf")).is_err());
    }
}
