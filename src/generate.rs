//! Synthetic WebDataset generator (`reshard generate`).
//!
//! Writes `OUTPUT/{prefix}-{i:06}.tar` shards of samples whose contents are a pure function of
//! the arguments and the seed, so tests, examples and benchmarks can rebuild the exact same
//! bytes anywhere:
//!
//! * sample `i` (global index) has the key `c{class:03}/{i:08}`, or
//!   `c{class:03}/{LONG_DIR}/{i:08}` for every `--long-names-every`-th sample, whose member paths
//!   are longer than the 100 bytes of a tar header name;
//! * its members are, in this order, `KEY.jpg` (pseudo-random bytes, lognormal size with mean
//!   `--mean-size`), `KEY.cls` (the class as decimal text) and `KEY.json` (key, index, class and
//!   jpg size);
//! * every header has mode 0644, uid/gid 0, owner `reshard` and mtime [`MTIME`];
//! * samples are laid out in contiguous runs: shard 0 holds the first samples, and so on, with
//!   per-shard counts from [`shard_counts`].

use std::io::{self, BufWriter, Read, Write};
use std::ops::Range;
use std::path::Path;

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tar::{Builder, EntryType, Header};

use crate::config::{GenerateConfig, HeaderFormat};
use crate::storage;

/// Modification time of every member (2023-11-14T22:13:20Z), fixed so output is reproducible.
pub(crate) const MTIME: u64 = 1_700_000_000;

/// Owner and group name of every member.
pub(crate) const OWNER: &str = "reshard";

/// Number of distinct classes (`KEY.cls` holds `0..CLASSES`).
pub(crate) const CLASSES: u64 = 100;

/// Number of samples when neither `--samples` nor `--total-size` is given.
pub(crate) const DEFAULT_SAMPLES: u64 = 1000;

/// Directory component inserted into the keys of "long name" samples: with it the shortest
/// member path (`c000/LONG_DIR/00000000.cls`) is 116 bytes, past the 100-byte header name.
pub(crate) const LONG_DIR: &str =
    "a_rather_long_directory_name_that_pushes_the_member_path_past_the_100_byte_ustar_name_field";

/// Largest `.jpg` payload (8 GiB - 1, the most a plain octal tar size field holds).
const MAX_PAYLOAD: u64 = (1 << 33) - 1;

/// Write buffer of each shard file.
const WRITE_BUFFER: usize = 4 << 20;

/// Writes the dataset `cfg` describes, then prints one summary line to stdout.
///
/// # Errors
/// An output directory that already holds `{prefix}-*.tar` shards, and I/O errors naming the
/// file.
pub fn generate(cfg: &GenerateConfig) -> Result<()> {
    prepare_output(&cfg.output, &cfg.prefix)?;

    let counts = shard_counts(cfg.samples, cfg.shards, cfg.skew);
    let base_rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut bytes = 0u64;
    let mut start = 0u64;
    for (shard, count) in counts.iter().enumerate() {
        let range = start..start + count;
        start = range.end;
        bytes += write_shard(cfg, &base_rng, shard as u64, range)?;
    }
    debug_assert_eq!(start, cfg.samples);
    println!(
        "generated {} samples, {bytes} bytes in {} shards at {}",
        cfg.samples,
        cfg.shards,
        cfg.output.display()
    );
    Ok(())
}

/// Creates `dir` if needed and refuses to mix with shards of an earlier dataset.
fn prepare_output(dir: &Path, prefix: &str) -> Result<()> {
    storage::sink(dir)
        .create_dir_all(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let entries = storage::source(dir)
        .list(dir)
        .with_context(|| format!("reading {}", dir.display()))?;
    let head = format!("{prefix}-");
    let mut clashes = Vec::new();
    for entry in entries {
        if let Some(name) = entry.name.to_str() {
            if name.starts_with(&head) && name.ends_with(".tar") {
                clashes.push(dir.join(name));
            }
        }
    }
    clashes.sort();
    if let Some(first) = clashes.first() {
        bail!(
            "{} already exists ({} {prefix}-*.tar shard(s) in {}): remove them or choose another --output or --prefix",
            first.display(),
            clashes.len(),
            dir.display()
        );
    }
    Ok(())
}

/// Splits `total` samples over `shards` contiguous runs with weights
/// `exp(-skew * i / shards)`: every shard gets at least one sample, the counts sum to `total`,
/// and `skew == 0` gives counts that differ by at most one.
///
/// Requires `total >= shards`; with `total < shards` the trailing shards get zero.
pub(crate) fn shard_counts(total: u64, shards: u64, skew: f64) -> Vec<u64> {
    let n = usize::try_from(shards).expect("shard count fits in memory");
    if n == 0 {
        return Vec::new();
    }
    let base = if total >= shards { 1 } else { 0 };
    let spare = total - base * shards;
    // Exponents shifted so the largest weight is 1: no overflow for any finite skew.
    let exps: Vec<f64> = (0..n).map(|i| -skew * i as f64 / shards as f64).collect();
    let top = exps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = exps.iter().map(|e| (e - top).exp()).collect();
    let sum: f64 = weights.iter().sum();
    // Spare samples by rounding the cumulative weight: monotone, exact sum, +-1 when equal.
    let mut counts = Vec::with_capacity(n);
    let mut cumulative = 0.0;
    let mut prev = 0u64;
    for (i, w) in weights.iter().enumerate() {
        cumulative += w;
        let boundary = if i + 1 == n {
            spare
        } else {
            ((spare as f64 * (cumulative / sum)).round() as u64).clamp(prev, spare)
        };
        counts.push(base + (boundary - prev));
        prev = boundary;
    }
    if total < shards {
        for (i, c) in counts.iter_mut().enumerate() {
            *c = u64::from((i as u64) < total);
        }
    }
    counts
}

/// Everything about one sample that its members are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sample {
    index: u64,
    key: String,
    class: u64,
    size: u64,
    payload_seed: u64,
}

impl Sample {
    /// Sample `index` of the dataset: drawn from its own ChaCha8 stream of the seed, so it does
    /// not depend on how samples are split over shards.
    fn new(cfg: &GenerateConfig, base_rng: &ChaCha8Rng, index: u64) -> Sample {
        let mut rng = base_rng.clone();
        rng.set_stream(index);
        let class = rng.next_u64() % CLASSES;
        let z = standard_normal(&mut rng);
        let payload_seed = rng.next_u64();
        let size = lognormal_size(cfg.mean_size, cfg.sigma, z);
        let n = cfg.long_names_every;
        let key = if n > 0 && index % n == n - 1 {
            format!("c{class:03}/{LONG_DIR}/{index:08}")
        } else {
            format!("c{class:03}/{index:08}")
        };
        Sample {
            index,
            key,
            class,
            size,
            payload_seed,
        }
    }

    fn json(&self) -> Result<String> {
        Ok(format!(
            "{{\"key\":{},\"index\":{},\"class\":{},\"jpg_size\":{}}}",
            serde_json::to_string(&self.key)?,
            self.index,
            self.class,
            self.size
        ))
    }
}

/// A uniform draw in (0, 1].
fn unit_open0(rng: &mut ChaCha8Rng) -> f64 {
    ((rng.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A standard normal draw (Box-Muller, cosine branch).
fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = unit_open0(rng);
    let u2 = unit_open0(rng);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Lognormal payload size with mean `mean` (so `samples * mean` estimates the total), from a
/// standard normal draw `z`; at least 1 byte.
fn lognormal_size(mean: u64, sigma: f64, z: f64) -> u64 {
    let mu = (mean as f64).ln() - sigma * sigma / 2.0;
    let size = (mu + sigma * z).exp().round();
    // `as` saturates (and maps NaN to 0), then the clamp bounds it.
    (size as u64).clamp(1, MAX_PAYLOAD)
}

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// Word `w` of the payload stream `seed`: SplitMix64 as a counter-based generator, so any byte
/// range can be produced independently.
#[inline]
fn payload_word(seed: u64, w: u64) -> u64 {
    let mut z = seed.wrapping_add(w.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with bytes `pos..pos + buf.len()` of the payload stream `seed` (little-endian
/// words), independent of how the stream is cut into buffers.
fn fill_payload(seed: u64, pos: u64, buf: &mut [u8]) {
    let mut word = pos / 8;
    let offset = (pos % 8) as usize;
    let mut rest = buf;
    if offset != 0 {
        let bytes = payload_word(seed, word).to_le_bytes();
        let n = rest.len().min(8 - offset);
        rest[..n].copy_from_slice(&bytes[offset..offset + n]);
        rest = &mut rest[n..];
        word += 1;
    }
    let mut chunks = rest.chunks_exact_mut(8);
    for chunk in &mut chunks {
        chunk.copy_from_slice(&payload_word(seed, word).to_le_bytes());
        word += 1;
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let n = tail.len();
        tail.copy_from_slice(&payload_word(seed, word).to_le_bytes()[..n]);
    }
}

/// Streams a `.jpg` payload without holding it in memory.
struct Payload {
    seed: u64,
    pos: u64,
    len: u64,
}

impl Read for Payload {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = usize::try_from(self.len - self.pos)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        fill_payload(self.seed, self.pos, &mut buf[..n]);
        self.pos += n as u64;
        Ok(n)
    }
}

/// A member header with the fixed metadata, the size and no path yet.
fn base_header(format: HeaderFormat, size: u64) -> io::Result<Header> {
    let mut header = match format {
        HeaderFormat::Gnu => Header::new_gnu(),
        HeaderFormat::Pax => Header::new_ustar(),
    };
    header.set_entry_type(EntryType::Regular);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_username(OWNER)?;
    header.set_groupname(OWNER)?;
    header.set_mtime(MTIME);
    header.set_size(size);
    Ok(header)
}

/// Appends one regular member, with a long-name record first when `path` needs one.
fn append_member<W: Write>(
    builder: &mut Builder<W>,
    format: HeaderFormat,
    path: &str,
    size: u64,
    data: impl Read,
) -> io::Result<()> {
    let mut header = base_header(format, size)?;
    match format {
        // Paths over 100 bytes become a GNU 'L' record (tar's `append_data` does it).
        HeaderFormat::Gnu => builder.append_data(&mut header, path, data),
        HeaderFormat::Pax => {
            let name_len = header.as_old().name.len();
            if path.len() <= name_len {
                header.set_path(path)?;
            } else {
                builder.append_pax_extensions([("path", path.as_bytes())])?;
                // Readers take the path from the PAX record; the header keeps a fallback
                // name: the file name, truncated to the field.
                let base = path.rsplit('/').next().unwrap_or(path).as_bytes();
                let base = &base[..base.len().min(name_len)];
                header.as_old_mut().name[..base.len()].copy_from_slice(base);
            }
            header.set_cksum();
            builder.append(&header, data)
        }
    }
}

/// Writes shard `index` holding samples `range` to a temporary name, then renames it into
/// place. Returns the shard's size in bytes.
fn write_shard(
    cfg: &GenerateConfig,
    base_rng: &ChaCha8Rng,
    index: u64,
    range: Range<u64>,
) -> Result<u64> {
    let name = crate::output::shard_file_name(&cfg.prefix, index);
    let path = cfg.output.join(&name);
    let tmp = cfg.output.join(format!(".{name}.tmp"));
    let sink = storage::sink(&path);
    let result = write_tar(cfg, base_rng, &tmp, range);
    let bytes = match result {
        Ok(bytes) => bytes,
        Err(e) => {
            let _ = sink.remove_file(&tmp);
            return Err(e);
        }
    };
    sink.rename(&tmp, &path).with_context(|| {
        let _ = sink.remove_file(&tmp);
        format!("renaming {} to {}", tmp.display(), path.display())
    })?;
    Ok(bytes)
}

fn write_tar(
    cfg: &GenerateConfig,
    base_rng: &ChaCha8Rng,
    path: &Path,
    range: Range<u64>,
) -> Result<u64> {
    let ctx = || format!("writing {}", path.display());
    let file = storage::sink(path).create_stream(path).with_context(ctx)?;
    let mut builder = Builder::new(BufWriter::with_capacity(WRITE_BUFFER, file));
    for i in range {
        let s = Sample::new(cfg, base_rng, i);
        let payload = Payload {
            seed: s.payload_seed,
            pos: 0,
            len: s.size,
        };
        let cls = s.class.to_string();
        let json = s.json()?;
        let key = &s.key;
        append_member(
            &mut builder,
            cfg.format,
            &format!("{key}.jpg"),
            s.size,
            payload,
        )
        .with_context(ctx)?;
        append_member(
            &mut builder,
            cfg.format,
            &format!("{key}.cls"),
            cls.len() as u64,
            cls.as_bytes(),
        )
        .with_context(ctx)?;
        append_member(
            &mut builder,
            cfg.format,
            &format!("{key}.json"),
            json.len() as u64,
            json.as_bytes(),
        )
        .with_context(ctx)?;
    }
    let buffered = builder.into_inner().with_context(ctx)?;
    let file = buffered
        .into_inner()
        .map_err(io::IntoInnerError::into_error)
        .with_context(ctx)?;
    // Closed unsynced, as a test data set needs no more.
    drop(file);
    storage::stamp(path).map(|s| s.size).with_context(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::resolve::generate_config;
    use crate::cli::GenerateArgs;
    use std::collections::BTreeMap;
    use std::fs::{self, File};
    use std::path::PathBuf;
    use std::process::Command;

    /// `reshard generate` as the binary takes it: the arguments resolved, then the dataset written.
    fn generate(args: &GenerateArgs) -> Result<()> {
        super::generate(&generate_config(args)?)
    }

    fn args(dir: &Path) -> GenerateArgs {
        GenerateArgs {
            output: dir.to_path_buf(),
            shards: 3,
            samples: Some(30),
            total_size: None,
            mean_size: "200".into(),
            sigma: 0.5,
            skew: 0.0,
            seed: 7,
            long_names_every: 0,
            format: "gnu".into(),
            prefix: "train".into(),
        }
    }

    fn shard_files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    }

    /// (path, entry type, contents) of every member, as `tar::Archive` reads them.
    fn members(path: &Path) -> Vec<(String, EntryType, Vec<u8>)> {
        let mut archive = tar::Archive::new(File::open(path).unwrap());
        let mut out = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
            let kind = entry.header().entry_type();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            out.push((name, kind, data));
        }
        out
    }

    /// Entry types of the raw records, extension headers included.
    fn raw_types(path: &Path) -> Vec<u8> {
        let mut archive = tar::Archive::new(File::open(path).unwrap());
        let entries = archive.entries().unwrap().raw(true);
        entries
            .map(|e| e.unwrap().header().entry_type().as_byte())
            .collect()
    }

    #[test]
    fn same_seed_gives_identical_bytes() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let c = tempfile::tempdir().unwrap();
        let mut args_a = args(a.path());
        args_a.long_names_every = 4;
        let mut args_b = args(b.path());
        args_b.long_names_every = 4;
        generate(&args_a).unwrap();
        generate(&args_b).unwrap();
        let fa = shard_files(a.path());
        let fb = shard_files(b.path());
        assert_eq!(fa.len(), 3);
        let names = |v: &[PathBuf]| -> Vec<_> {
            v.iter()
                .map(|p| p.file_name().unwrap().to_owned())
                .collect()
        };
        assert_eq!(names(&fa), names(&fb));
        for (x, y) in fa.iter().zip(&fb) {
            assert_eq!(
                fs::read(x).unwrap(),
                fs::read(y).unwrap(),
                "{}",
                x.display()
            );
        }
        let mut args_c = args(c.path());
        args_c.long_names_every = 4;
        args_c.seed = 8;
        generate(&args_c).unwrap();
        let fc = shard_files(c.path());
        assert_ne!(fs::read(&fa[0]).unwrap(), fs::read(&fc[0]).unwrap());
    }

    #[test]
    fn shard_names_and_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("new/nested");
        let mut a = args(&out);
        a.prefix = "ds".into();
        generate(&a).unwrap();
        let names: Vec<String> = shard_files(&out)
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["ds-000000.tar", "ds-000001.tar", "ds-000002.tar"]);
    }

    #[test]
    fn counts_sum_and_skew() {
        for &(total, shards) in &[(1u64, 1u64), (10, 10), (11, 10), (1000, 7), (12345, 64)] {
            for &skew in &[0.0, 0.5, 3.0, 50.0, -2.0, 1e6] {
                let c = shard_counts(total, shards, skew);
                assert_eq!(c.len() as u64, shards);
                assert_eq!(c.iter().sum::<u64>(), total, "{total} {shards} {skew}");
                assert!(c.iter().all(|&x| x >= 1), "{c:?}");
                if skew == 0.0 {
                    let (lo, hi) = (c.iter().min().unwrap(), c.iter().max().unwrap());
                    assert!(hi - lo <= 1, "{c:?}");
                }
            }
        }
        let c = shard_counts(1000, 8, 3.0);
        assert!(c[0] > c[7], "{c:?}");
        assert!(c.windows(2).all(|w| w[0] >= w[1]), "{c:?}");
        // Weights exp(-3 i / 8) over 992 spare samples: shard 0 about 3.2x shard 7.
        assert!(c[0] > 3 * c[7], "{c:?}");
        let c = shard_counts(1000, 8, -3.0);
        assert!(c[0] < c[7], "{c:?}");
    }

    #[test]
    fn shards_hold_contiguous_runs_with_skewed_counts() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args(dir.path());
        a.shards = 4;
        a.samples = Some(40);
        a.skew = 2.0;
        generate(&a).unwrap();
        let expected = shard_counts(40, 4, 2.0);
        assert!(expected[0] > expected[3]);
        let mut next = 0u64;
        for (file, &count) in shard_files(dir.path()).iter().zip(&expected) {
            let m = members(file);
            assert_eq!(m.len() as u64, 3 * count, "{}", file.display());
            for sample in m.chunks(3) {
                let (jpg, cls, json) = (&sample[0], &sample[1], &sample[2]);
                let key = jpg.0.strip_suffix(".jpg").unwrap();
                assert_eq!(cls.0, format!("{key}.cls"));
                assert_eq!(json.0, format!("{key}.json"));
                assert!(key.ends_with(&format!("/{next:08}")), "{key}");
                let class: u64 = std::str::from_utf8(&cls.2).unwrap().parse().unwrap();
                assert!(class < CLASSES);
                assert!(key.starts_with(&format!("c{class:03}/")));
                let v: serde_json::Value = serde_json::from_slice(&json.2).unwrap();
                assert_eq!(v["key"], key);
                assert_eq!(v["index"], next);
                assert_eq!(v["class"], class);
                assert_eq!(v["jpg_size"], jpg.2.len() as u64);
                assert!(!jpg.2.is_empty());
                next += 1;
            }
        }
        assert_eq!(next, 40);
    }

    #[test]
    fn header_metadata_is_fixed() {
        let dir = tempfile::tempdir().unwrap();
        generate(&args(dir.path())).unwrap();
        let file = &shard_files(dir.path())[0];
        let mut archive = tar::Archive::new(File::open(file).unwrap());
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let h = entry.header();
            assert_eq!(h.mode().unwrap(), 0o644);
            assert_eq!(h.uid().unwrap(), 0);
            assert_eq!(h.gid().unwrap(), 0);
            assert_eq!(h.mtime().unwrap(), MTIME);
            assert_eq!(h.username().unwrap(), Some(OWNER));
            assert_eq!(h.groupname().unwrap(), Some(OWNER));
            assert!(h.as_gnu().is_some());
        }
        // Ends with the end-of-archive marker: two zero blocks.
        let bytes = fs::read(file).unwrap();
        assert_eq!(bytes.len() % 512, 0);
        assert!(bytes[bytes.len() - 1024..].iter().all(|&b| b == 0));
    }

    fn check_long_names(format: &str, extension: u8) {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args(dir.path());
        a.format = format.into();
        a.long_names_every = 5;
        a.samples = Some(12);
        a.shards = 2;
        generate(&a).unwrap();
        let mut listed = Vec::new();
        let mut long_keys = BTreeMap::new();
        for file in shard_files(dir.path()) {
            let mut long_in_file = 0;
            for (name, kind, _) in members(&file) {
                assert_eq!(kind, EntryType::Regular);
                if name.len() > 100 {
                    assert!(name.contains(LONG_DIR), "{name}");
                    let idx: u64 = name.rsplit('/').next().unwrap()[..8].parse().unwrap();
                    *long_keys.entry(idx).or_insert(0) += 1;
                    long_in_file += 1;
                } else {
                    assert!(!name.contains(LONG_DIR), "{name}");
                }
                listed.push(name);
            }
            // One extension record per long member, and none of the other kind.
            let types = raw_types(&file);
            let other = if extension == b'L' { b'x' } else { b'L' };
            assert!(!types.contains(&other), "{format}: {types:?}");
            let records = types.iter().filter(|&&t| t == extension).count();
            assert_eq!(records, long_in_file, "{format}: {types:?}");
        }
        // Samples 4 and 9 have long keys, each with three long members.
        assert_eq!(long_keys, BTreeMap::from([(4, 3), (9, 3)]));
        assert_eq!(listed.len(), 36);

        // GNU tar lists the same full paths.
        if Command::new("tar").arg("--version").output().is_err() {
            crate::hooks::skip(
                "the GNU tar check of generated long names",
                "tar not found on PATH",
            );
            return;
        }
        let mut gnu = Vec::new();
        for file in shard_files(dir.path()) {
            let out = Command::new("tar").arg("-tf").arg(&file).output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.stderr.is_empty(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            gnu.extend(
                String::from_utf8(out.stdout)
                    .unwrap()
                    .lines()
                    .map(str::to_owned),
            );
        }
        assert_eq!(gnu, listed);
    }

    #[test]
    fn long_names_gnu() {
        check_long_names("gnu", b'L');
    }

    #[test]
    fn long_names_pax() {
        check_long_names("pax", b'x');
    }

    #[test]
    fn pax_headers_are_ustar() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args(dir.path());
        a.format = "pax".into();
        a.long_names_every = 2;
        generate(&a).unwrap();
        let file = &shard_files(dir.path())[0];
        let mut archive = tar::Archive::new(File::open(file).unwrap());
        for entry in archive.entries().unwrap().raw(true) {
            let entry = entry.unwrap();
            assert!(entry.header().as_ustar().is_some());
        }
    }

    #[test]
    fn sample_count_from_total_size_and_default() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args(dir.path());
        a.samples = None;
        a.total_size = Some("2KiB".into());
        a.mean_size = "100".into();
        assert_eq!(generate_config(&a).unwrap().samples, 20);
        a.total_size = Some("1".into());
        a.shards = 1;
        assert_eq!(generate_config(&a).unwrap().samples, 1);
        a.total_size = None;
        assert_eq!(generate_config(&a).unwrap().samples, DEFAULT_SAMPLES);
    }

    #[test]
    fn invalid_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let err = |f: &dyn Fn(&mut GenerateArgs)| {
            let mut a = args(dir.path());
            f(&mut a);
            generate(&a).unwrap_err().to_string()
        };
        assert!(err(&|a| a.shards = 0).contains("--shards"));
        assert!(err(&|a| a.samples = Some(2)).contains("at least one sample"));
        assert!(err(&|a| a.format = "zip".into()).contains("--format"));
        assert!(err(&|a| a.mean_size = "0".into()).contains("--mean-size"));
        assert!(err(&|a| a.mean_size = "lots".into()).contains("--mean-size"));
        assert!(err(&|a| a.sigma = f64::NAN).contains("--sigma"));
        assert!(err(&|a| a.prefix = "a/b".into()).contains("--prefix"));
        assert!(err(&|a| a.prefix = String::new()).contains("--prefix"));
        assert!(shard_files(dir.path()).is_empty());
    }

    #[test]
    fn refuses_existing_shards() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("train-000007.tar"), b"x").unwrap();
        fs::write(dir.path().join("other.txt"), b"x").unwrap();
        let e = generate(&args(dir.path())).unwrap_err().to_string();
        assert!(e.contains("train-000007.tar"), "{e}");
        // Another prefix is fine, and a second run with it fails.
        let mut a = args(dir.path());
        a.prefix = "val".into();
        generate(&a).unwrap();
        let e = generate(&a).unwrap_err().to_string();
        assert!(e.contains("val-000000.tar"), "{e}");
    }

    #[test]
    fn output_that_is_a_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        let e = format!("{:#}", generate(&args(&file)).unwrap_err());
        assert!(e.contains(&file.display().to_string()), "{e}");
    }

    #[test]
    fn payload_stream_does_not_depend_on_chunking() {
        let mut whole = vec![0u8; 1000];
        fill_payload(42, 3, &mut whole);
        let mut pieces = vec![0u8; 1000];
        let mut pos = 0;
        for len in [1usize, 7, 8, 13, 64, 3, 500].iter().cycle() {
            if pos == pieces.len() {
                break;
            }
            let end = (pos + len).min(pieces.len());
            fill_payload(42, 3 + pos as u64, &mut pieces[pos..end]);
            pos = end;
        }
        assert_eq!(whole, pieces);
        let mut other = vec![0u8; 1000];
        fill_payload(43, 3, &mut other);
        assert_ne!(whole, other);

        let mut read = Vec::new();
        Payload {
            seed: 42,
            pos: 3,
            len: 1003,
        }
        .read_to_end(&mut read)
        .unwrap();
        assert_eq!(read, whole);
    }

    #[test]
    fn lognormal_sizes_have_the_requested_mean() {
        let rng = ChaCha8Rng::seed_from_u64(1);
        let cfg = generate_config(&GenerateArgs {
            mean_size: "10000".into(),
            sigma: 0.5,
            ..args(Path::new("unused"))
        })
        .unwrap();
        let n = 20_000u64;
        let sizes: Vec<u64> = (0..n).map(|i| Sample::new(&cfg, &rng, i).size).collect();
        let mean = sizes.iter().sum::<u64>() as f64 / n as f64;
        assert!((mean - 10_000.0).abs() < 150.0, "{mean}");
        assert!(sizes.iter().all(|&s| s >= 1));
        let classes: std::collections::BTreeSet<u64> =
            (0..n).map(|i| Sample::new(&cfg, &rng, i).class).collect();
        assert_eq!(classes.len() as u64, CLASSES);
        // Degenerate spread: every size is the mean; tiny means never give empty payloads.
        assert_eq!(lognormal_size(777, 0.0, 1.3), 777);
        assert_eq!(lognormal_size(1, 3.0, -5.0), 1);
        assert_eq!(lognormal_size(1 << 40, 3.0, 8.0), MAX_PAYLOAD);
    }
}
