//! Times `--energon`'s `index.sqlite` on synthetic rows, without any tar data: P writer threads
//! (standing in for P ranks) write their shards' rows as a run's writers do, then one thread
//! merges them into `index.sqlite` as rank 0 does. Issue 27, part 3.
//!
//! ```text
//! cargo run --release --example energon_index -- DIR ROWS SHARDS WRITERS
//! cargo run --release --example energon_index -- /tmp/eidx 10000000 1000 4
//! ```
//!
//! Each sample has two parts (`jpg`, `json`) and a 20-byte key (in shuffled order: the unique
//! index on keys is then filled at random places, as after a real shuffle), like a captioned
//! image dataset.
//! Prints the seconds of each phase; DIR is emptied first and left with the result.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use reshard::config::EnergonDataset;
use reshard::output::energon;
use reshard::output::members::{Part, SampleParts};
use reshard::plan::ShardPlan;

/// A bijection on u64 (splitmix64's finalizer): keys in shuffled order, as a run's are.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The synthetic rows of shard `s` of `plan`: unique keys in no particular order.
fn rows(plan: &ShardPlan, s: u64) -> Vec<SampleParts> {
    let mut at = 0;
    plan.shard_positions(s)
        .map(|p| {
            let (jpg, json) = (1000 + p % 5000, 100 + p % 300);
            let start = at;
            at += 512 + jpg.next_multiple_of(512) + 512 + json.next_multiple_of(512);
            let part = |ext: &str, data, size| Part {
                path: format!("{p:016}.{ext}"),
                ext: ext.to_string(),
                data,
                size,
            };
            SampleParts {
                key: format!("img/{:016x}", mix(p)),
                start,
                len: at - start,
                parts: vec![
                    part("jpg", start + 512, jpg),
                    part("json", start + 1024 + jpg.next_multiple_of(512), json),
                ],
            }
        })
        .collect()
}

/// CPU seconds of the calling thread: on a shared machine, the time a dedicated core would take.
fn cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, n, shards, writers] = args.as_slice() else {
        bail!("usage: energon_index DIR ROWS SHARDS WRITERS");
    };
    let dir = Path::new(dir);
    let (n, shards, writers): (u64, u64, usize) = (n.parse()?, shards.parse()?, writers.parse()?);
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let plan = ShardPlan::by_count(n, shards, writers);
    let names: Vec<String> = (0..shards).map(|s| format!("shard-{s:06}.tar")).collect();

    let started = Instant::now();
    let writer_cpu = std::thread::scope(|scope| -> Result<f64> {
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                let (plan, names) = (&plan, &names);
                scope.spawn(move || -> Result<f64> {
                    for s in plan.writer_shards(w).into_iter().flatten() {
                        let path = dir.join(&names[s as usize]);
                        energon::write_shard(dir, &path, s, &rows(plan, s), true)?;
                    }
                    Ok(cpu_seconds())
                })
            })
            .collect();
        let mut busiest: f64 = 0.0;
        for h in handles {
            busiest = busiest.max(h.join().expect("a writer thread panicked")?);
        }
        Ok(busiest)
    })?;
    let written = started.elapsed().as_secs_f64();

    let counts: Vec<u64> = (0..shards)
        .map(|s| plan.shard_positions(s).end - plan.shard_positions(s).start)
        .collect();
    let merging = Instant::now();
    let merge_cpu = cpu_seconds();
    energon::write_meta(
        dir,
        &energon::Meta {
            names: &names,
            counts: &counts,
            parts: &energon::unsplit_parts(&names),
            dataset: &EnergonDataset::Crude,
            key_index: true,
        },
    )?;
    let merged = merging.elapsed().as_secs_f64();
    let merge_cpu = cpu_seconds() - merge_cpu;
    println!(
        "rows {n} shards {shards} writers {writers}: wall: writers {written:.2} s, merge on rank 0 {merged:.2} s, total {:.2} s; CPU: busiest writer {writer_cpu:.2} s, merge {merge_cpu:.2} s, sum {:.2} s",
        written + merged,
        writer_cpu + merge_cpu
    );
    Ok(())
}
