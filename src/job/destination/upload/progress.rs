//! The upload's progress line: every rank counts what it uploaded, rank 0 reports the sums as
//! the exchange reports its data.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::comm::Comm;
use crate::config::{ProgressConfig, ProgressMode};
use crate::progress::Progress;

/// This rank's uploads so far, for the progress line: shards and bytes up, and whether they
/// ended (done or failed).
#[derive(Default)]
pub(super) struct Sent {
    shards: AtomicU64,
    bytes: AtomicU64,
    ended: AtomicBool,
}

impl Sent {
    pub(super) fn add(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
        self.shards.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }
}

/// Rank 0 reports the upload of `todo` (every rank's shards still to upload) as the exchange
/// reports its data, shard by shard, until every rank's uploads ended; every rank takes part
/// in the sums.
pub(super) fn report_progress<'a>(
    comm: &impl Comm,
    cfg: ProgressConfig,
    todo: impl Iterator<Item = &'a (String, u64)>,
    sent: &Sent,
) {
    let (shards, bytes) = todo.fold((0, 0), |(n, b), f| (n + 1, b + f.1));
    let mut progress = (cfg.mode != ProgressMode::None)
        .then(|| Progress::new(cfg, comm.rank() == 0, "upload", bytes, Some(shards)));
    let tick = cfg
        .interval
        .clamp(Duration::from_millis(20), Duration::from_millis(250));
    loop {
        let ended = sent.ended.load(Ordering::SeqCst);
        let mine = [
            sent.shards.load(Ordering::SeqCst),
            sent.bytes.load(Ordering::SeqCst),
            u64::from(ended),
        ];
        let sums = comm.all_sum_idle(&mine, Duration::from_millis(5));
        if let Some(p) = progress.as_mut() {
            p.update_items(sums[1], Some(sums[0]));
        }
        if sums[2] == comm.size() as u64 {
            break;
        }
        std::thread::sleep(tick);
    }
    if let Some(p) = progress.as_mut() {
        p.finish();
    }
}
