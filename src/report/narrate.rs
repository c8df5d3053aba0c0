//! Progress lines: rank 0 tells the user which phase a job is in, and the words they count
//! with. A leaf, so that every job (`run`, `verify`) narrates alike.

/// Prints `reshard: {msg}` to stderr when `lead` (rank 0); other ranks stay quiet, so each
/// phase is announced once however many ranks run.
pub(crate) fn narrate(lead: bool, msg: std::fmt::Arguments<'_>) {
    if lead {
        crate::errln!("reshard: {msg}");
    }
}

/// `n` and the noun, plural unless `n` is 1: `1 shard`, `3 shards`, `1 input shard`.
pub(crate) fn count(n: impl Into<u64>, noun: &str) -> String {
    match n.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_plural_but_for_one() {
        assert_eq!(count(1u64, "shard"), "1 shard");
        assert_eq!(count(0u64, "rank"), "0 ranks");
        assert_eq!(count(3u64, "input shard"), "3 input shards");
    }
}
