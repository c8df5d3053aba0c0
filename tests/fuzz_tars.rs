//! Fuzzing as a test (issue 36): seeded mutations of small real shards (GNU tar gnu and posix,
//! bsdtar pax, tarfile ustar/gnu/pax, webdataset's TarWriter) — bit flips, zeroed and random
//! runs, truncation, header fields edited to plausible wrong values (checksums mostly fixed up),
//! blocks swapped, repeated or dropped. For each mutant: exit 0 only with exactly the (member
//! name, bytes) multiset Python's tarfile reads from it; otherwise a refusal naming the file and
//! a byte offset; never a panic, never a hang. `examples/fuzz-campaign.sh` runs longer campaigns.

use crate::util::fuzz::{mutants, property_holds};
use crate::util::{skip, test_python, Dir};

#[test]
fn mutated_shards_move_as_tarfile_reads_them_or_are_refused() {
    let test = "mutated_shards_move_as_tarfile_reads_them_or_are_refused";
    if test_python().is_none() {
        skip(test, "needs RESHARD_TEST_PYTHON (webdataset)");
        return;
    }
    // examples/fuzz-campaign.sh sets these for a longer campaign.
    let env = |k: &str, default: u64| std::env::var(k).map_or(default, |v| v.parse().unwrap());
    let (seed, count) = (env("RESHARD_FUZZ_SEED", 36), env("RESHARD_FUZZ_COUNT", 240));
    let np = std::env::var("RESHARD_FUZZ_NP")
        .ok()
        .map(|v| v.parse().unwrap());
    let dir = Dir::new("fuzz-np1");
    let cases = mutants(&dir, "mutants", seed, count as usize);
    let (moved, refused) = property_holds(&dir, np, &cases);
    eprintln!("{test}: {moved} moved, {refused} refused");
    // Not vacuous: both answers occur.
    assert!(
        moved > 20 && refused > 20,
        "{moved} moved, {refused} refused"
    );
}

#[test]
fn mutated_shards_hold_the_property_at_two_ranks() {
    let test = "mutated_shards_hold_the_property_at_two_ranks";
    if test_python().is_none() {
        skip(test, "needs RESHARD_TEST_PYTHON (webdataset)");
        return;
    }
    let dir = Dir::new("fuzz-np2");
    let cases = mutants(&dir, "mutants", 3602, 30);
    let (moved, refused) = property_holds(&dir, Some(2), &cases);
    eprintln!("{test}: {moved} moved, {refused} refused");
    assert!(moved > 0 && refused > 0, "{moved} moved, {refused} refused");
}
