//! The order of the output: what `--order`, `--descending`, `--missing`, `--stratify-by` and
//! `--key-map` ask for, and which of them fit together.

use std::path::PathBuf;

use anyhow::{bail, Result};

use super::sizing::Equalize;
use crate::key_map::Unmatched;

/// `--order`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum OrderBy {
    /// The seeded global permutation.
    #[default]
    Shuffle,
    /// The sample key, in byte order.
    Key,
    /// The content of the member with extension `ext`, read as `kind`.
    Content { ext: String, kind: ValueKind },
}

/// How a member's content is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueKind {
    /// A decimal integer (i64), surrounding whitespace ignored.
    Int,
    /// A decimal float; NaN is refused.
    Float,
    /// The bytes, surrounding ASCII whitespace trimmed.
    Str,
}

impl std::str::FromStr for OrderBy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shuffle" => return Ok(OrderBy::Shuffle),
            "key" => return Ok(OrderBy::Key),
            _ => {}
        }
        let usage = "expected shuffle, key or content:EXT[:int|float|str] (e.g. content:cls:int)";
        let Some(rest) = s.strip_prefix("content:") else {
            return Err(format!("{usage}, got {s:?}"));
        };
        let (ext, kind) = match rest.rsplit_once(':') {
            Some((e, "int")) => (e, ValueKind::Int),
            Some((e, "float")) => (e, ValueKind::Float),
            Some((e, "str")) => (e, ValueKind::Str),
            _ => (rest, ValueKind::Str),
        };
        let ext = ext.trim_start_matches('.');
        if ext.is_empty() || ext.contains(':') {
            return Err(format!("{usage}, got {s:?}"));
        }
        Ok(OrderBy::Content {
            ext: ext.to_string(),
            kind,
        })
    }
}

/// `--missing`: a sample without the member an order or stratification reads, or with content
/// that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum Missing {
    /// An error naming the input file and the sample key.
    #[default]
    Error,
    /// Placed after all others (ascending or descending); as a stratum of its own.
    Last,
}

/// Everything that decides the order of the output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct OrderSpec {
    pub(crate) by: OrderBy,
    pub(crate) descending: bool,
    pub(crate) missing: Missing,
    /// `--stratify-by EXT`.
    pub(crate) stratify_by: Option<String>,
    /// `--label-limit`: the largest member read for a label or an order.
    pub(crate) label_limit: u64,
    pub(crate) key_map: Option<PathBuf>,
    pub(crate) unmatched: Unmatched,
}

impl OrderSpec {
    /// Every order flag with its value, as a user types them (`--order shuffle --missing error
    /// --label-limit 65536`): for what `--resume` records, so that a renamed field changes
    /// nothing.
    pub(crate) fn flags(&self) -> String {
        let mut s = format!("--order {}", self.describe().replace(" descending", ""));
        if self.descending {
            s += " --descending";
        }
        s += match self.missing {
            Missing::Error => " --missing error",
            Missing::Last => " --missing last",
        };
        if let Some(ext) = &self.stratify_by {
            s += &format!(" --stratify-by {ext}");
        }
        s += &format!(" --label-limit {}", self.label_limit);
        if let Some(map) = &self.key_map {
            s += &format!(" --key-map {}", map.display());
        }
        s += &format!(" --unmatched {}", self.unmatched.flag());
        s
    }

    /// The extension of the member whose content must be read while indexing.
    pub(crate) fn member(&self) -> Option<&str> {
        match &self.by {
            OrderBy::Content { ext, .. } => Some(ext),
            _ => self.stratify_by.as_deref(),
        }
    }

    /// Whether sample keys are needed (an order by key, or a key map).
    pub(crate) fn needs_keys(&self) -> bool {
        self.by == OrderBy::Key || self.key_map.is_some()
    }

    /// The plain seeded shuffle, which needs no sort.
    pub(crate) fn is_shuffle(&self) -> bool {
        self.by == OrderBy::Shuffle && self.stratify_by.is_none() && self.key_map.is_none()
    }

    /// For the manifest: `shuffle`, `key`, `content:cls:int descending`, ….
    pub(crate) fn describe(&self) -> String {
        let mut s = match &self.by {
            OrderBy::Shuffle => "shuffle".to_string(),
            OrderBy::Key => "key".to_string(),
            OrderBy::Content { ext, kind } => format!(
                "content:{ext}:{}",
                match kind {
                    ValueKind::Int => "int",
                    ValueKind::Float => "float",
                    ValueKind::Str => "str",
                }
            ),
        };
        if self.descending {
            s.push_str(" descending");
        }
        s
    }
}

/// Checks that the flags that shape the order fit together.
///
/// # Errors
/// A message naming the conflicting flags.
pub(crate) fn validate(spec: &OrderSpec, bytes_balanced: bool, equalize: Equalize) -> Result<()> {
    if spec.descending && spec.by == OrderBy::Shuffle {
        bail!("--descending needs --order key or --order content:EXT");
    }
    if spec.stratify_by.is_some() {
        if spec.by != OrderBy::Shuffle {
            bail!("--stratify-by shuffles within each label: use it with --order shuffle (the default)");
        }
        if spec.key_map.is_some() {
            bail!("--stratify-by and --key-map cannot be combined");
        }
        if bytes_balanced {
            bail!("--stratify-by deals samples to shards by count: it cannot be combined with --balance bytes");
        }
        if equalize == Equalize::Pad {
            // A repeated sample could land next to its original in one shard, which readers
            // that group members by key would merge.
            bail!("--stratify-by with --equalize pad could put a sample twice in one shard: use --equalize drop (or none) for equal shards");
        }
    }
    if spec.key_map.is_some() && bytes_balanced {
        bail!("--key-map sizes each group by count: it cannot be combined with --balance bytes");
    }
    if spec.missing == Missing::Last && spec.member().is_none() {
        bail!("--missing applies to --order content:EXT and --stratify-by EXT");
    }
    if spec.unmatched != Unmatched::Error && spec.key_map.is_none() {
        bail!("--unmatched applies to --key-map");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_flags_parse() {
        assert_eq!("key".parse::<OrderBy>(), Ok(OrderBy::Key));
        assert_eq!(
            "content:cls:int".parse::<OrderBy>(),
            Ok(OrderBy::Content {
                ext: "cls".into(),
                kind: ValueKind::Int
            })
        );
        assert_eq!(
            "content:seg.json".parse::<OrderBy>(),
            Ok(OrderBy::Content {
                ext: "seg.json".into(),
                kind: ValueKind::Str
            })
        );
        assert!("content:".parse::<OrderBy>().is_err());
        assert!("size".parse::<OrderBy>().is_err());
    }
}
