//! Rank 0's narration: a progress bar on a terminal, plain periodic lines otherwise, and the
//! timing of each phase for the summary.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::size::human_bytes;

/// Progress of the data exchange, in bytes moved by all ranks. Silent on ranks other than 0.
pub struct Progress {
    bar: Option<ProgressBar>,
    lines: bool,
    total: u64,
    start: Instant,
    last_line: Instant,
}

const LINE_EVERY: Duration = Duration::from_secs(5);

impl Progress {
    pub fn new(enabled: bool, total: u64) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = (enabled && tty).then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "exchange [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar
        });
        let now = Instant::now();
        Progress {
            bar,
            lines: enabled && !tty,
            total,
            start: now,
            last_line: now,
        }
    }

    /// Records that `done` bytes of the total have moved.
    pub fn update(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        } else if self.lines && self.last_line.elapsed() >= LINE_EVERY {
            self.last_line = Instant::now();
            let secs = self.start.elapsed().as_secs_f64();
            let rate = done as f64 / secs.max(1e-9);
            let eta = (self.total.saturating_sub(done)) as f64 / rate.max(1.0);
            eprintln!(
                "reshard: exchange {} / {} ({:.0}%), {}/s, ETA {:.0} s",
                human_bytes(done),
                human_bytes(self.total),
                100.0 * done as f64 / self.total.max(1) as f64,
                human_bytes(rate as u64),
                eta
            );
        }
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// Wall time of each named phase, in order.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct PhaseTimes {
    /// (phase, seconds), in order.
    pub phases: Vec<(&'static str, f64)>,
    #[serde(skip)]
    current: Option<(&'static str, Instant)>,
}

impl PhaseTimes {
    /// Ends the running phase (if any) and starts `name`.
    pub fn start(&mut self, name: &'static str) {
        self.stop();
        self.current = Some((name, Instant::now()));
    }

    /// Ends the running phase.
    pub fn stop(&mut self) {
        if let Some((name, t)) = self.current.take() {
            self.phases.push((name, t.elapsed().as_secs_f64()));
        }
    }

    pub fn total(&self) -> f64 {
        self.phases.iter().map(|p| p.1).sum()
    }
}

/// This process's peak resident set size in bytes (VmHWM), if the platform reports it.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
