//! The loader indexes of one output shard (`--energon`, `--dali-index`), written by its writer
//! once the shard is complete: one header-only pass over it ([`members`]), then each loader's
//! files ([`energon`], [`dali`]).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use crate::config::LoaderIndexes;
use crate::output::{dali, energon, members};
use crate::storage;
use crate::tar::key::LoaderNames;
use crate::tar::Sample;

/// Writes the loader indexes `loaders` asks for of shard number `shard`, the plain tar at
/// `path` in the staging directory `staging`, whose samples are `layout` (in file order).
///
/// # Errors
/// A member a loader cannot index (named with the shard and byte offset), a shard whose samples
/// are not the ones laid out, or a file that cannot be written.
pub(crate) fn write_shard(
    loaders: &LoaderIndexes,
    staging: &Path,
    path: &Path,
    shard: u64,
    layout: &[Sample],
) -> Result<()> {
    if loaders.energon.is_none() && !loaders.dali {
        return Ok(());
    }
    let names = LoaderNames {
        energon: loaders.energon.is_some(),
        dali: loaders.dali,
    };
    let samples = members::read_samples(path, names, layout)?;
    if loaders.energon.is_some() {
        energon::write_shard(staging, path, shard, &samples, loaders.energon_key_index)?;
    }
    if loaders.dali {
        let idx = dali::index_path(path);
        storage::sink(&idx)
            .create_stream(&idx)
            .and_then(|mut f| f.write_all(dali::index_text(&samples).as_bytes()))
            .with_context(|| format!("{}: cannot write", idx.display()))?;
    }
    Ok(())
}
