//! `--key-map FILE` (AIStore dsort's external key map): which named group of output shards each
//! sample goes to, by its key.
//!
//! Two formats, told apart by the first non-blank byte:
//! - JSON `{"fish-%06d.tar": ["regex", ...], ...}`: a sample goes to the group one of whose
//!   patterns matches somewhere in its key (anchor with `^…$` for a whole-key match). A key
//!   matching patterns of two groups is an error.
//! - Lines `key<TAB>template`: exact keys. Each rank reads 1/P of the file and the lines travel
//!   to the ranks that own their keys, which answer every rank's look-ups ([`lines`]), so time,
//!   reads and memory stay O(N/P) per rank however long the map is.
//!
//! Groups are ordered by template (byte order), the same on every rank. A template holds one
//! `%d`, `%Nd` or `%0Nd` for the shard's number within its group (`%%` is a literal `%`), and
//! names a `.tar` file (`.tar` is appended when missing).

mod lines;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use regex::bytes::RegexSet;

use crate::comm::{agree_once, Comm};
use crate::storage::{self, Sequential};

/// A shard name template: `fish-%06d.tar` names shard 7 of its group `fish-000007.tar`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    /// The template as the key map wrote it.
    pub(crate) text: String,
    before: String,
    after: String,
    width: usize,
    zero: bool,
}

impl Template {
    /// # Errors
    /// No `%d` directive, more than one, another `%` directive, or a `/` in the name.
    pub(crate) fn parse(text: &str) -> Result<Template> {
        let bad = |why: &str| anyhow::anyhow!("shard name template {text:?}: {why}");
        if text.contains('/')
            || text.starts_with('.')
            || text.trim() != text
            || text.chars().any(char::is_control)
        {
            return Err(bad(
                "names a file in the output directory: not empty, no '/', no control characters, not starting with '.' or ending in blanks",
            ));
        }
        let mut parts: Vec<String> = vec![String::new()];
        let mut spec = None;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                parts.last_mut().unwrap().push(c);
                continue;
            }
            if chars.peek() == Some(&'%') {
                chars.next();
                parts.last_mut().unwrap().push('%');
                continue;
            }
            let mut digits = String::new();
            while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                digits.push(d);
                chars.next();
            }
            if chars.next() != Some('d') {
                return Err(bad("only %d, %Nd and %0Nd are understood (%% for a '%')"));
            }
            if spec.is_some() {
                return Err(bad("more than one %d"));
            }
            let zero = digits.starts_with('0');
            let width = if digits.is_empty() {
                0
            } else {
                digits.parse().map_err(|_| bad("width out of range"))?
            };
            if width > 20 {
                return Err(bad("width over 20"));
            }
            spec = Some((width, zero));
            parts.push(String::new());
        }
        let Some((width, zero)) = spec else {
            return Err(bad("needs a %d (or %06d) for the shard number"));
        };
        let mut after = parts.pop().unwrap();
        if !after.ends_with(".tar") {
            after.push_str(".tar");
        }
        Ok(Template {
            text: text.to_string(),
            before: parts.pop().unwrap(),
            after,
            width,
            zero,
        })
    }

    /// The file name of shard `k` of this template's group.
    pub(crate) fn name(&self, k: u64) -> String {
        let (b, a, w) = (&self.before, &self.after, self.width);
        if self.zero {
            format!("{b}{k:0w$}{a}")
        } else {
            format!("{b}{k:w$}{a}")
        }
    }
}

/// What to do with a sample whose key no group claims (`--unmatched`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Unmatched {
    /// An error naming the input file and the key.
    #[default]
    Error,
    /// Left out (counted in the manifest).
    Skip,
    /// Into the group of this template (added when the map lacks it).
    Group(String),
}

impl Unmatched {
    /// The flag's value, as `--unmatched` takes it.
    pub(crate) fn flag(&self) -> String {
        match self {
            Unmatched::Error => "error".into(),
            Unmatched::Skip => "skip".into(),
            Unmatched::Group(t) => format!("group:{t}"),
        }
    }
}

impl std::str::FromStr for Unmatched {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "error" => Ok(Unmatched::Error),
            "skip" => Ok(Unmatched::Skip),
            _ => match s.strip_prefix("group:") {
                Some(t) if !t.is_empty() => Ok(Unmatched::Group(t.to_string())),
                _ => Err(format!(
                    "expected error, skip or group:TEMPLATE (e.g. group:other-%06d.tar), got {s:?}"
                )),
            },
        }
    }
}

/// A loaded key map.
pub(crate) struct KeyMap {
    /// The groups, in order.
    pub(crate) groups: Vec<Template>,
    patterns: Option<(RegexSet, Vec<usize>)>,
    unmatched: Unmatched,
}

/// Marks a sample in [`KeyMap::assign`]'s result that no group claims and `--unmatched skip`
/// leaves out.
pub(crate) const SKIPPED: u32 = u32::MAX;

impl KeyMap {
    /// Reads the key map and gives each of `keys` (this rank's) its group (an index into
    /// `groups`, or [`SKIPPED`]). Collective: every rank calls it. `shard_of(i)` names the input
    /// shard of key `i` for messages.
    ///
    /// # Errors
    /// The file cannot be read, or a line, pattern or template is malformed (named with the file
    /// and line); a key claimed by two groups or (with `--unmatched error`) by none, naming the
    /// input file and the key; for the lines form, a key mapped again to another group. Errors
    /// before the look-ups are the same on every rank; the ranks must agree on the outcome.
    pub(crate) fn load(
        comm: &impl Comm,
        path: &Path,
        unmatched: Unmatched,
        keys: &[Vec<u8>],
        shard_of: &dyn Fn(usize) -> String,
    ) -> Result<(KeyMap, Vec<u32>)> {
        let shown = path.display();
        // Every rank takes the same form: the lines form is read by all of them together.
        let json = agree_once(comm, Self::is_json(path))?;
        let forms = comm.all_gather(u64::from(json));
        if forms.iter().any(|&f| f != forms[0]) {
            return Err(anyhow!(
                "{shown}: the ranks read different key maps (not the same file on every node)"
            ));
        }
        let mut templates: BTreeSet<String> = BTreeSet::new();
        let mut pattern_list: Vec<(String, String)> = Vec::new();
        // Lines form: the template each local key is mapped to.
        let mut hits: Vec<Option<String>> = Vec::new();
        if json {
            let text = storage::source(path)
                .read(path)
                .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other))
                .with_context(|| format!("{shown}: cannot read the key map"))?;
            let map: std::collections::BTreeMap<String, Vec<String>> = serde_json::from_str(&text)
                .with_context(|| {
                    format!("{shown}: expected JSON {{\"name-%06d.tar\": [\"regex\", ...], ...}}")
                })?;
            for (t, pats) in map {
                for p in pats {
                    pattern_list.push((t.clone(), p));
                }
                templates.insert(t);
            }
        } else {
            let found = lines::find(comm, path, keys)?;
            hits = found
                .hits
                .iter()
                .map(|h| h.map(|t| found.templates[t as usize].clone()))
                .collect();
            templates.extend(found.templates);
        }
        if let Unmatched::Group(t) = &unmatched {
            templates.insert(t.clone());
        }
        if templates.is_empty() {
            bail!("{shown}: the key map names no groups");
        }
        let groups = templates
            .iter()
            .map(|t| Template::parse(t).with_context(|| format!("{shown}")))
            .collect::<Result<Vec<_>>>()?;
        let patterns = if json {
            let set = RegexSet::new(pattern_list.iter().map(|(_, p)| p.as_str()))
                .with_context(|| format!("{shown}: a pattern is not a valid regex"))?;
            let group_of = pattern_list
                .iter()
                .map(|(t, _)| groups.binary_search_by(|g| g.text.as_str().cmp(t)).unwrap())
                .collect();
            Some((set, group_of))
        } else {
            None
        };
        let map = KeyMap {
            groups,
            patterns,
            unmatched,
        };
        let found = match &map.patterns {
            Some(_) => map.matches(path, keys, shard_of)?,
            None => hits
                .into_iter()
                .map(|h| h.and_then(|t| map.group(&t)))
                .collect(),
        };
        let groups = map.resolve_unmatched(path, keys, found, shard_of)?;
        Ok((map, groups))
    }

    /// Whether the map at `path` is the JSON form: its first non-blank byte is `{`.
    fn is_json(path: &Path) -> Result<bool> {
        let shown = path.display();
        let mut head = Vec::new();
        let file =
            storage::open(path).with_context(|| format!("{shown}: cannot open the key map"))?;
        Sequential::new(file)
            .take(4096)
            .read_to_end(&mut head)
            .with_context(|| format!("{shown}: cannot read the key map"))?;
        Ok(head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{'))
    }

    /// A digest of the groups and patterns, for checking that every rank read the same map.
    pub(crate) fn digest(&self) -> u64 {
        let mut text: Vec<u8> = Vec::new();
        for g in &self.groups {
            text.extend(g.text.as_bytes());
            text.push(0);
        }
        if let Some((set, group_of)) = &self.patterns {
            for (p, g) in set.patterns().iter().zip(group_of) {
                text.extend(p.as_bytes());
                text.extend(g.to_le_bytes());
            }
        }
        crate::tar::key_hash(&text)
    }

    /// The index of the group with template `t`.
    fn group(&self, t: &str) -> Option<u32> {
        self.groups
            .binary_search_by(|g| g.text.as_str().cmp(t))
            .ok()
            .map(|g| g as u32)
    }

    /// The JSON form: the group whose patterns match each key, if any.
    fn matches(
        &self,
        path: &Path,
        keys: &[Vec<u8>],
        shard_of: &dyn Fn(usize) -> String,
    ) -> Result<Vec<Option<u32>>> {
        let (set, group_of) = self.patterns.as_ref().expect("the JSON form");
        let mut out = vec![None; keys.len()];
        for (i, key) in keys.iter().enumerate() {
            let mut hit: Option<usize> = None;
            for m in set.matches(key).iter() {
                let g = group_of[m];
                if let Some(h) = hit.filter(|&h| h != g) {
                    bail!(
                        "{}: sample {:?} matches patterns of two groups, {:?} and {:?} (key map {})",
                        shard_of(i),
                        String::from_utf8_lossy(key),
                        self.groups[h].text,
                        self.groups[g].text,
                        path.display()
                    );
                }
                hit = Some(g);
            }
            out[i] = hit.map(|g| g as u32);
        }
        Ok(out)
    }

    /// Groups for every key: the one found, or what `--unmatched` says.
    fn resolve_unmatched(
        &self,
        path: &Path,
        keys: &[Vec<u8>],
        found: Vec<Option<u32>>,
        shard_of: &dyn Fn(usize) -> String,
    ) -> Result<Vec<u32>> {
        found
            .into_iter()
            .enumerate()
            .map(|(i, g)| match (g, &self.unmatched) {
                (Some(g), _) => Ok(g),
                (None, Unmatched::Error) => bail!(
                    "{}: sample {:?} matches no group of the key map {} (--unmatched skip or group:TEMPLATE accept it)",
                    shard_of(i),
                    String::from_utf8_lossy(&keys[i]),
                    path.display()
                ),
                (None, Unmatched::Skip) => Ok(SKIPPED),
                (None, Unmatched::Group(t)) => {
                    Ok(self.group(t).expect("load adds the --unmatched group"))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local::LocalComm;

    #[test]
    fn templates_format_like_printf() {
        let t = Template::parse("fish-%06d.tar").unwrap();
        assert_eq!(t.name(7), "fish-000007.tar");
        assert_eq!(Template::parse("a%d").unwrap().name(12), "a12.tar");
        assert_eq!(
            Template::parse("100%%-%3d.tar").unwrap().name(5),
            "100%-  5.tar"
        );
        for bad in ["x.tar", "a-%d-%d.tar", "d/%d.tar", "%s.tar", "", ".h%d"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    /// Loads the map at `path` for `ks`: the groups' templates and each key's group, or the
    /// error's text.
    fn load(
        path: &Path,
        unmatched: Unmatched,
        ks: &[&str],
    ) -> Result<(Vec<String>, Vec<u32>), String> {
        let keys: Vec<Vec<u8>> = ks.iter().map(|k| k.as_bytes().to_vec()).collect();
        LocalComm::run(1, |c| {
            KeyMap::load(c, path, unmatched.clone(), &keys, &|_| "in.tar".into())
                .map(|(map, got)| (map.groups.into_iter().map(|g| g.text).collect(), got))
                .map_err(|e| format!("{e:#}"))
        })
        .remove(0)
    }

    #[test]
    fn json_patterns_route_keys_to_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("map.json");
        std::fs::write(
            &path,
            r#"{"fish-%06d.tar": ["^fish/"], "bird-%d.tar": ["^bird/", "parrot"]}"#,
        )
        .unwrap();
        let (names, got) =
            load(&path, Unmatched::Error, &["fish/1", "bird/2", "x/parrot"]).unwrap();
        assert_eq!(names, ["bird-%d.tar", "fish-%06d.tar"]);
        assert_eq!(got, [1, 0, 0]);
        let err = load(&path, Unmatched::Error, &["cat/1"]).unwrap_err();
        assert!(err.contains("in.tar") && err.contains("cat/1"), "{err}");
        assert_eq!(
            load(&path, Unmatched::Skip, &["cat/1"]).unwrap().1,
            [SKIPPED]
        );
        let other = load(&path, Unmatched::Group("other-%d".into()), &["cat/1"]).unwrap();
        assert_eq!(other.1, [2]);
        std::fs::write(&path, r#"{"a-%d": ["1"], "b-%d": ["^x"]}"#).unwrap();
        let err = load(&path, Unmatched::Error, &["x1"]).unwrap_err();
        assert!(err.contains("two groups"), "{err}");
    }

    #[test]
    fn lines_map_exact_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("map.txt");
        std::fs::write(&path, "a/1\tx-%d.tar\na/2\ty-%d.tar\n\nzzz\tx-%d.tar\n").unwrap();
        let (names, got) = load(&path, Unmatched::Error, &["a/2", "a/1"]).unwrap();
        assert_eq!(names, ["x-%d.tar", "y-%d.tar"]);
        assert_eq!(got, [1, 0]);
        std::fs::write(&path, "a/1\tx-%d.tar\na/1\ty-%d.tar\n").unwrap();
        let err = load(&path, Unmatched::Error, &["a/1"]).unwrap_err();
        assert!(err.contains(":2:") && err.contains("line 1"), "{err}");
        std::fs::write(&path, "no tab here\n").unwrap();
        let err = load(&path, Unmatched::Error, &[]).unwrap_err();
        assert!(err.contains(":1:"), "{err}");
    }
}
