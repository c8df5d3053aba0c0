//! Rank 0's narration: a progress bar on a terminal (or when asked for), plain periodic lines
//! otherwise, and the timing of each phase for the summary.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};

use crate::config::{ProgressConfig, ProgressMode};
use crate::size::human_bytes;

/// Rank 0's progress display for one phase: `index` (shards and bytes) or `exchange` (bytes).
/// Silent on ranks other than 0.
pub(crate) struct Progress {
    display: Display,
    what: &'static str,
    /// Bytes, and for the index the number of shards, of the whole phase.
    total: u64,
    items: Option<u64>,
    start: Instant,
}

/// How the progress is shown, decided on rank 0.
enum Display {
    Bar(ProgressBar),
    Lines { every: Duration, last: Instant },
    Quiet,
}

impl Progress {
    /// A display for `what` on rank 0 (`lead`): bytes out of `total`, and for a phase that counts
    /// shards too, `items` of them.
    pub(crate) fn new(
        cfg: ProgressConfig,
        lead: bool,
        what: &'static str,
        total: u64,
        items: Option<u64>,
    ) -> Self {
        let now = Instant::now();
        let tty = std::io::stderr().is_terminal();
        let display = match (lead, cfg.mode) {
            (false, _) | (_, ProgressMode::None) => Display::Quiet,
            (_, ProgressMode::Bar) | (_, ProgressMode::Auto) if tty => bar(what, total, true),
            // Forced through a launcher's pipe, which passes the carriage returns on.
            (_, ProgressMode::Bar) => bar(what, total, false),
            (_, ProgressMode::Auto | ProgressMode::Lines) => Display::Lines {
                every: cfg.interval,
                last: now,
            },
        };
        Progress {
            display,
            what,
            total,
            items,
            start: now,
        }
    }

    /// Records that `done` bytes of the total have moved.
    pub(crate) fn update(&mut self, done: u64) {
        self.update_items(done, None);
    }

    /// Records `done` bytes and `items` shards done.
    pub(crate) fn update_items(&mut self, done: u64, items: Option<u64>) {
        let of_items = match (items, self.items) {
            (Some(n), Some(total)) => format!("{n} / {total} shards, "),
            _ => String::new(),
        };
        match &mut self.display {
            Display::Bar(bar) => {
                bar.set_position(done);
                let note = crate::throttle::progress_note();
                bar.set_message(format!("{of_items}{}", note.trim_start_matches(", ")));
            }
            Display::Lines { every, last } if last.elapsed() >= *every => {
                *last = Instant::now();
                let secs = self.start.elapsed().as_secs_f64();
                let rate = done as f64 / secs.max(1e-9);
                let eta = (self.total.saturating_sub(done)) as f64 / rate.max(1.0);
                crate::errln!(
                    "reshard: {} {of_items}{} / {} ({:.0}%), {}/s, ETA {:.0} s{}",
                    self.what,
                    human_bytes(done),
                    human_bytes(self.total),
                    100.0 * done as f64 / self.total.max(1) as f64,
                    human_bytes(rate as u64),
                    eta,
                    crate::throttle::progress_note()
                );
            }
            _ => {}
        }
    }

    pub(crate) fn finish(&mut self) {
        if let Display::Bar(bar) = std::mem::replace(&mut self.display, Display::Quiet) {
            bar.finish_and_clear();
        }
    }
}

/// A bar on stderr: through the terminal's own handling when it is one, else written as is.
fn bar(what: &str, total: u64, tty: bool) -> Display {
    let target = if tty {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::term_like(Box::new(PipedTerm))
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{what:<8} [{{bar:40}}] {{binary_bytes}}/{{binary_total_bytes}} {{msg}} {{binary_bytes_per_sec}} ETA {{eta}}"
        ))
        .expect("valid template")
        .progress_chars("=> "),
    );
    Display::Bar(bar)
}

/// Stderr when it is a pipe that ends at a terminal (a launcher's): a one-line bar needs only a
/// carriage return and "erase line".
#[derive(Debug)]
struct PipedTerm;

impl TermLike for PipedTerm {
    fn width(&self) -> u16 {
        100
    }

    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn write_line(&self, s: &str) -> std::io::Result<()> {
        crate::sys::stderr_line(s);
        Ok(())
    }

    fn write_str(&self, s: &str) -> std::io::Result<()> {
        write!(std::io::stderr(), "{s}")
    }

    fn clear_line(&self) -> std::io::Result<()> {
        write!(std::io::stderr(), "\r\x1b[2K")
    }

    fn flush(&self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Wall time of each named phase, in order.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct PhaseTimes {
    /// (phase, seconds), in order.
    pub(crate) phases: Vec<(&'static str, f64)>,
    #[serde(skip)]
    current: Option<(&'static str, Instant)>,
    /// `RESHARD_TRACE_PHASES`: the finer phases, on every rank.
    #[serde(skip)]
    trace: Option<PhaseTrace>,
}

impl PhaseTimes {
    /// Times for `rank`, traced phase by phase if `RESHARD_TRACE_PHASES` is set.
    pub(crate) fn for_rank(rank: usize) -> Self {
        PhaseTimes {
            trace: PhaseTrace::from_env(rank),
            ..PhaseTimes::default()
        }
    }

    /// Ends the running phase (if any) and starts `name`.
    pub(crate) fn start(&mut self, name: &'static str) {
        self.start_with(name, name);
    }

    /// Starts `name`, whose first part the trace calls `part`.
    pub(crate) fn start_with(&mut self, name: &'static str, part: &'static str) {
        self.stop();
        self.current = Some((name, Instant::now()));
        self.detail(part);
    }

    /// Starts `name` as a part of the running phase: only the trace sees it.
    pub(crate) fn detail(&mut self, name: &'static str) {
        if let Some(trace) = &mut self.trace {
            trace.start(name);
        }
    }

    /// Ends the running phase.
    pub(crate) fn stop(&mut self) {
        if let Some((name, t)) = self.current.take() {
            self.phases.push((name, t.elapsed().as_secs_f64()));
        }
        if let Some(trace) = &mut self.trace {
            trace.stop();
        }
    }

    pub(crate) fn total(&self) -> f64 {
        self.phases.iter().map(|p| p.1).sum()
    }
}

/// `RESHARD_TRACE_PHASES`: each rank's own figures per phase, finer than [`PhaseTimes`] (which
/// are rank 0's wall times of five groups). A line per phase on stderr:
/// `reshard: trace: rank R phase NAME: wall W s, cpu C s, peak P KiB, resident R KiB` —
/// the peak is this phase's alone (the kernel's peak restarts at each phase), the CPU time is
/// the whole process's (every thread), so both hold on a machine other jobs share.
#[derive(Debug, Clone)]
pub struct PhaseTrace {
    rank: usize,
    current: Option<(&'static str, Instant, f64)>,
}

impl PhaseTrace {
    /// A trace for `rank` if `RESHARD_TRACE_PHASES` is set.
    pub(crate) fn from_env(rank: usize) -> Option<Self> {
        crate::hooks::trace_phases().then(|| PhaseTrace::new(rank))
    }

    /// A trace for `rank` (`examples/metadata_scale.rs` traces its phases alike).
    pub fn new(rank: usize) -> Self {
        PhaseTrace {
            rank,
            current: None,
        }
    }

    /// Ends the running phase (if any) and starts `name`.
    pub fn start(&mut self, name: &'static str) {
        self.stop();
        crate::sys::restart_peak_rss();
        self.current = Some((name, Instant::now(), crate::sys::cpu_seconds()));
    }

    /// Ends the running phase and prints its line.
    pub fn stop(&mut self) {
        let Some((name, t, cpu)) = self.current.take() else {
            return;
        };
        let kib = |b: Option<u64>| b.unwrap_or(0) / 1024;
        crate::sys::stderr_line(&format!(
            "reshard: trace: rank {} phase {name}: wall {:.3} s, cpu {:.3} s, peak {} KiB, resident {} KiB",
            self.rank,
            t.elapsed().as_secs_f64(),
            crate::sys::cpu_seconds() - cpu,
            kib(crate::sys::restart_peak_rss()),
            kib(crate::sys::resident()),
        ));
    }
}
