//! Who uploads which file of an `s3://` output: each writer (invariant 5: one writer per shard)
//! its own shards and their per-shard files (saved index, loader indexes) from the copy on its
//! own node, rank 0 the rest (the metadata it wrote). No rank reads another's files, so the
//! staging may be one directory every rank sees or one per node
//! ([`crate::job::destination::scratch`]) alike.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{Context, Result};

use super::{files_of, is_shard, with_layouts};
use crate::comm::{agree, broadcast_result, gather, Comm};
use crate::config::FinishSettings;
use crate::job::handoff::Planned;
use crate::output::{dali, energon, saved_index};
use crate::storage;

/// The per-shard files this rank wrote, relative to the output, whether or not each exists: its
/// shards as published, their saved indexes and loader indexes.
pub(crate) fn written(planned: &Planned, settings: &FinishSettings) -> Vec<String> {
    let names = &planned.placed.names;
    let text = |p: &Path| p.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for &s in &planned.laid.layout.shards {
        let (plain, published) = (names.plain(s), names.published(s, settings.compress));
        out.push(text(&saved_index::path_for(Path::new(&published), None)));
        out.push(published);
        if settings.loaders.dali {
            out.push(text(&dali::index_path(Path::new(&plain))));
        }
        if settings.loaders.energon.is_some() {
            out.push(text(&energon::tar_idx_path(Path::new(&plain))));
        }
    }
    out
}

/// Every file of the output and who uploads it, as every rank holds it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Deal {
    /// Every file, as (path relative to the output, size), sorted by path.
    pub(crate) files: Vec<(String, u64)>,
    /// The files their writers upload, by name: the writer's rank.
    pub(crate) writers: HashMap<String, usize>,
    /// Whether some rank reads its files from a copy on its own node (not rank 0's).
    pub(crate) per_node: bool,
}

impl Deal {
    /// From rank 0's `listing` of its copy and each writer's `own` files (by rank): a writer's
    /// file is its writer's, every other file rank 0's.
    pub(crate) fn of(listing: Vec<(String, u64)>, own: Vec<Vec<(String, u64)>>) -> Deal {
        let mut writers = HashMap::new();
        let mut files = Vec::new();
        for (rank, list) in own.into_iter().enumerate() {
            for (name, size) in list {
                writers.insert(name.clone(), rank);
                files.push((name, size));
            }
        }
        files.extend(listing.into_iter().filter(|f| !writers.contains_key(&f.0)));
        files.sort();
        Deal {
            files,
            writers,
            per_node: false,
        }
    }

    /// What `rank` uploads while every rank uploads, before rank 0's metadata: its written
    /// files, and for rank 0 also the other files beside the shards at the top (what was dealt
    /// as shards before). Not the saved indexes of shards at the top: written beside their
    /// shard once it is up, with its stamp ([`super::restamp_layout`]).
    pub(crate) fn mine(&self, rank: usize) -> Vec<&(String, u64)> {
        let shards = self
            .files
            .iter()
            .map(|f| f.0.as_str())
            .filter(|n| is_shard(n));
        let restamped = with_layouts(shards);
        self.files
            .iter()
            .filter(|f| match self.writers.get(&f.0) {
                Some(&w) => w == rank && (is_shard(&f.0) || !restamped.contains(&f.0)),
                None => rank == 0 && is_shard(&f.0),
            })
            .collect()
    }

    /// Whether rank 0 uploads `name` after every rank's share (metadata).
    pub(crate) fn is_metadata(&self, name: &str) -> bool {
        !is_shard(name) && !self.writers.contains_key(name)
    }
}

/// The deal, made on rank 0 from its listing of its `local` copy and every rank's written files
/// present in its own node's `copy`, and shared with every rank.
///
/// # Errors
/// A copy cannot be listed or examined.
pub(crate) fn deal(
    comm: &impl Comm,
    local: &Path,
    copy: &Path,
    written: &[String],
) -> Result<Deal> {
    let own = agree(comm, present(copy, written))?;
    let own = serde_json::to_vec(&own).expect("a list of names serializes");
    let gathered = gather(comm, 0, &own);
    let dealt = (comm.rank() == 0).then(|| {
        let own = gathered
            .iter()
            .map(|bytes| serde_json::from_slice(bytes).context("decoding a rank's files"))
            .collect::<Result<Vec<Vec<(String, u64)>>>>()?;
        let deal = Deal::of(files_of(local, true)?, own);
        Ok((deal.files, deal.writers.into_iter().collect::<Vec<_>>()))
    });
    let (files, writers) = broadcast_result(comm, 0, dealt)?;
    Ok(Deal {
        files,
        writers: writers.into_iter().collect(),
        per_node: comm.all_sum(&[u64::from(copy != local)])[0] > 0,
    })
}

/// Of the `names` under `copy`, those there, with their sizes.
fn present(copy: &Path, names: &[String]) -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    let seen: HashSet<&String> = names.iter().collect();
    for name in seen {
        let path = copy.join(name);
        match storage::source(&path).stat(&path) {
            Ok(s) if s.kind == storage::Kind::File => out.push((name.clone(), s.stamp.size)),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("{}: cannot stat", path.display())),
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, size: u64) -> (String, u64) {
        (name.to_string(), size)
    }

    #[test]
    fn writers_upload_their_own_files_and_rank_0_the_rest() {
        // Rank 0 sees only its node's copy: its shard, the metadata, a split shard of rank 1's
        // is on another node.
        let listing = vec![
            f(".reshard/a.tar.reshard-layout", 3),
            f("a.tar", 10),
            f("classes.txt", 1),
            f("index.json", 2),
        ];
        let own = vec![
            vec![f(".reshard/a.tar.reshard-layout", 3), f("a.tar", 10)],
            vec![
                f(".reshard/b.tar.reshard-layout", 3),
                f("b.tar", 20),
                f("b.idx", 4),
                f("val/.reshard/c.tar.reshard-layout", 3),
                f("val/c.tar", 5),
            ],
        ];
        let deal = Deal::of(listing, own);
        let names = |v: Vec<&(String, u64)>| v.into_iter().map(|f| f.0.clone()).collect::<Vec<_>>();
        assert_eq!(deal.files.len(), 9);
        assert_eq!(names(deal.mine(0)), ["a.tar", "classes.txt"]);
        // A split's shard is a shard: its saved index goes up after it, restamped.
        assert_eq!(names(deal.mine(1)), ["b.idx", "b.tar", "val/c.tar"]);
        assert!(deal.is_metadata("index.json") && !deal.is_metadata("val/c.tar"));
        assert!(!deal.is_metadata("classes.txt"));
    }
}
