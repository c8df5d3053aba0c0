//! Phases "index" and "plan": the collectives that turn the input shards into every sample's
//! output place before any data moves. Each rank reads the headers of its share ([`index`]),
//! duplicate keys are found across all shards ([`duplicates`]), every sample gets its output
//! position ([`place`], with [`split`] for `--split` and [`runs`] for `--stratify-by`), and every
//! shard is laid out by its writer ([`layout`]). What they compute lives in [`crate::plan`],
//! which is pure; here are the exchanges between ranks around it. They hand on
//! [`crate::job::handoff::Index`], [`crate::job::handoff::Placed`] and
//! [`crate::job::handoff::Laid`].

pub mod duplicates;
pub(crate) mod index;
pub mod layout;
pub(crate) mod place;
pub(crate) mod runs;
pub(crate) mod split;
