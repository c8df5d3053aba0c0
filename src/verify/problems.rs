//! Everything that does not hold, as sentences for the report: what is wrong with each output
//! shard ([`check_outputs`], [`shard_problems`]) and with the samples as a whole and index.json's
//! claims about them ([`data_problems`]).

use super::members::{open_scanned, scan_problems};
use super::records::{digest_samples, Record, Side};
use super::report::{equalize_name, plural, Mismatches};
use super::setup::{IndexView, OutputShard, RunView, Setup};
use super::tally::{Kind, EXAMPLES};
use crate::plan::Equalize;
use crate::tar::{index_file, ShardIndex};

/// What checking a rank's output shards found.
#[derive(Default)]
pub(super) struct Checked {
    pub(super) records: Vec<Record>,
    pub(super) problems: Vec<String>,
    pub(super) bytes: u64,
}

/// Checks this rank's output shards (a sound tar, only samples, the sample count index.json
/// gives, ending with the end-of-archive blocks) and digests their samples.
pub(super) fn check_outputs(outputs: &[OutputShard], mine: std::ops::Range<usize>) -> Checked {
    let mut out = Checked::default();
    for i in mine {
        let shard = &outputs[i];
        if shard.size.is_none() {
            continue; // rank 0 reported it
        }
        let path = &shard.path;
        let idx = match index_file(path) {
            Ok(idx) => idx,
            Err(e) => {
                out.problems.push(format!("{e:#}"));
                continue;
            }
        };
        out.problems.extend(shard_problems(shard, &idx));
        let number = u32::try_from(i).expect("fewer than 2^32 output shards");
        let records = &mut out.records;
        let mut records_problems = Vec::new();
        let checked = open_scanned(path, false).and_then(|(mut stream, scan)| {
            let n = digest_samples(&mut stream, &idx.samples, |s, digest| {
                records.push(Record {
                    digest,
                    side: Side::Output,
                    index: 0,
                    shard: number,
                    offset: s.start,
                });
            })?;
            // With entries outside samples (reported above) the samples' end is not the
            // records' end.
            if idx.skipped.total() == 0 {
                stream.check_tail()?;
            }
            records_problems.extend(scan_problems(stream, &scan, &idx.samples)?);
            Ok(n)
        });
        out.problems.append(&mut records_problems);
        match checked {
            Ok(n) => out.bytes += n,
            Err(e) => out.problems.push(format!("{e:#}")),
        }
    }
    out
}

/// What is wrong with an output shard that indexed: the sample count index.json gives, entries
/// outside samples.
fn shard_problems(shard: &OutputShard, idx: &ShardIndex) -> Vec<String> {
    let path = shard.path.display();
    let mut problems = Vec::new();
    if let Some(entry) = &shard.listed {
        if entry.nsamples != idx.samples.len() as u64 {
            problems.push(format!(
                "{path}: index.json says nsamples {}, the shard holds {} samples",
                entry.nsamples,
                idx.samples.len()
            ));
        }
    }
    let k = idx.skipped;
    if k.total() > 0 {
        problems.push(format!(
            "{path}: holds entries that belong to no sample ({} directories, {} files without a key, {} links/special files, {} PAX global headers)",
            k.directories, k.keyless_files, k.other_entries, k.global_headers
        ));
    }
    problems
}

/// What the ranks found together, on rank 0.
pub(super) struct Found {
    pub(super) input_samples: u64,
    pub(super) output_samples: u64,
    pub(super) mismatches: Mismatches,
    pub(super) examples: Vec<(Kind, String)>,
    /// Keys of the equalized samples, when their count was plausible.
    pub(super) equalized_keys: Option<Vec<String>>,
}

/// The problems with the samples: mismatches, and index.json's claims about them.
pub(super) fn data_problems(setup: &Setup, index: Option<&IndexView>, f: &Found) -> Vec<String> {
    let run = index.and_then(|ix| ix.reshard.as_ref());
    // Samples no key-map group claimed (`--unmatched skip`) are missing by design: index.json
    // counts them, and the count must match exactly.
    let unmatched = run
        .and_then(|r| r.key_map.as_ref())
        .map_or(0, |k| k.unmatched);
    let mut problems = Vec::new();
    let m = without_unmatched(f.mismatches, setup.equalize, unmatched, &mut problems);
    if let Some(name) = run.and_then(|r| r.split.as_ref()).filter(|_| m.missing > 0) {
        // A split holds only its share of the input: the missing samples are in the others.
        problems.push(format!(
            "this is the split {name:?} of a --split output, which holds only that split's \
             samples: verify the whole output (the directory above it) against the input"
        ));
    }
    problems.extend(mismatch_problems(&m, &f.examples));
    if run.is_some_and(|r| r.splits.is_some()) {
        // What the mismatches mean for a `--split` output.
        if m.duplicated > 0 {
            problems.push(
                "the splits are not disjoint: an input sample is in more than one split (or twice in one)"
                    .into(),
            );
        }
        if m.missing > 0 {
            problems.push("the splits together are not the input: samples are in no split".into());
        }
    }
    if let Some(run) = run {
        problems.extend(claim_problems(setup.equalize, run, f, &m, unmatched));
    }
    problems
}

/// `m` less the `unmatched` samples absent by design (counted as left out with `--equalize
/// drop`, else as missing); a problem when fewer than that are absent.
fn without_unmatched(
    mut m: Mismatches,
    equalize: Equalize,
    unmatched: u64,
    problems: &mut Vec<String>,
) -> Mismatches {
    let absent = if equalize == Equalize::Drop {
        &mut m.left_out
    } else {
        &mut m.missing
    };
    if unmatched > 0 {
        if *absent < unmatched {
            problems.push(format!(
                "index.json says {unmatched} samples matched no key-map group and were left out, but only {absent} input samples are absent from the output",
                absent = *absent
            ));
        }
        *absent = absent.saturating_sub(unmatched);
    }
    m
}

/// One problem per kind of mismatch found, each with a few examples.
fn mismatch_problems(m: &Mismatches, examples: &[(Kind, String)]) -> Vec<String> {
    let with_examples = |head: String, kind: Kind| {
        let mut s = head;
        for (_, e) in examples.iter().filter(|e| e.0 == kind).take(EXAMPLES) {
            s += &format!("\n    - {e}");
        }
        s
    };
    let are = |n: u64| if n == 1 { " is" } else { "s are" };
    let (missing, extra, twice, moved) = (m.missing, m.not_in_input, m.duplicated, m.misplaced);
    let kinds = [
        (
            missing,
            Kind::Missing,
            format!(
                "{missing} input sample{} missing from the output",
                are(missing)
            ),
        ),
        (
            extra,
            Kind::NotInInput,
            format!("{extra} output sample{} not in the input", are(extra)),
        ),
        (
            twice,
            Kind::Duplicated,
            format!(
                "{twice} duplicated sample{} in the output (extra copies of input samples)",
                plural(twice)
            ),
        ),
        (
            moved,
            Kind::Misplaced,
            format!(
                "{moved} output sample{} not at the position the seeded order gives {} (same samples, another order)",
                are(moved),
                if moved == 1 { "it" } else { "them" }
            ),
        ),
    ];
    kinds
        .into_iter()
        .filter(|(n, _, _)| *n > 0)
        .map(|(_, kind, head)| with_examples(head, kind))
        .collect()
}

/// Where reshard's claims in index.json (the input's sample count, the dropped or repeated
/// samples) disagree with what was found.
fn claim_problems(
    equalize: Equalize,
    run: &RunView,
    f: &Found,
    m: &Mismatches,
    unmatched: u64,
) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(n) = run.samples.filter(|&n| n != f.input_samples) {
        problems.push(format!(
            "index.json says the input held {n} samples, but the input given holds {} (another input, or it changed since)",
            f.input_samples
        ));
    }
    if equalize == Equalize::None {
        if !run.dropped.is_empty() || !run.repeated.is_empty() {
            problems
                .push("index.json lists dropped or repeated samples but says equalize none".into());
        }
    } else {
        problems.extend(equalized_problem(equalize, run, f, m, unmatched));
    }
    problems
}

/// With `--equalize drop` or `pad`: whether the samples left out or repeated are as many as
/// index.json lists and the counts imply, and (when they are few) the very ones it lists.
fn equalized_problem(
    equalize: Equalize,
    run: &RunView,
    f: &Found,
    m: &Mismatches,
    unmatched: u64,
) -> Option<String> {
    let (name, found, listed, expected) = match equalize {
        Equalize::None => return None,
        Equalize::Drop => (
            "dropped",
            m.left_out,
            &run.dropped,
            f.input_samples
                .checked_sub(f.output_samples)
                .and_then(|d| d.checked_sub(unmatched)),
        ),
        Equalize::Pad => (
            "repeated",
            m.repeated,
            &run.repeated,
            f.output_samples.checked_sub(f.input_samples),
        ),
    };
    if found != listed.len() as u64 || expected != Some(found) {
        return Some(format!(
            "--equalize {}: {found} samples are {name}, index.json lists {}, and input and output counts ({} and {}) imply {}",
            equalize_name(equalize),
            listed.len(),
            f.input_samples,
            f.output_samples,
            expected.map_or_else(|| "an impossible count".to_string(), |e| e.to_string())
        ));
    }
    let keys = f.equalized_keys.as_ref().filter(|_| unmatched == 0)?;
    let (mut got, mut want) = (keys.clone(), listed.clone());
    got.sort();
    want.sort();
    if got == want {
        return None;
    }
    let stray: Vec<&String> = got
        .iter()
        .filter(|k| !want.contains(k))
        .take(EXAMPLES)
        .collect();
    Some(format!(
        "--equalize {}: the {name} samples are not the ones index.json lists (e.g. {stray:?})",
        equalize_name(equalize)
    ))
}
