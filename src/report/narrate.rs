//! Progress lines: rank 0 tells the user which phase a job is in. A leaf, so that every job
//! (`run`, `verify`) narrates alike.

/// Prints `reshard: {msg}` to stderr when `lead` (rank 0); other ranks stay quiet, so each
/// phase is announced once however many ranks run.
pub fn narrate(lead: bool, msg: std::fmt::Arguments<'_>) {
    if lead {
        crate::errln!("reshard: {msg}");
    }
}
