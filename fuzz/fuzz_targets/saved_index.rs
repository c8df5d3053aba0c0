//! Edits of a saved index (`.reshard/NAME.reshard-layout`) that the next run would read instead
//! of the shard's headers: whatever the edits, an index the reader believes (`Lookup::Found`)
//! must describe the shard's tar structure, sample for sample, as the header walk finds it.
//!
//! The input is a list of edits to the valid layout file: 3 bytes each, a 16-bit position (modulo
//! the file's length) and the byte written there; a final odd byte truncates the file to that
//! many percent of its length.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use reshard::output::saved_index::{self, Lookup};
use reshard::tar::index_file;

/// A real shard (webdataset's `mpdata.tar`, first 40 members), its valid saved index, and the
/// samples its headers hold.
struct Fixture {
    _dir: tempfile::TempDir,
    shard: PathBuf,
    layout: PathBuf,
    valid: Vec<u8>,
    samples: Vec<(u64, u64)>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("s.tar");
        std::fs::write(&shard, include_bytes!("../corpus/tar_index/mpdata-head.tar")).unwrap();
        let index = index_file(&shard).unwrap();
        let out = dir.path().join(saved_index::DIR_NAME);
        std::fs::create_dir_all(&out).unwrap();
        saved_index::save(&out, &shard, index.samples.iter().copied()).unwrap();
        let layout = saved_index::path_for(&shard, None);
        let valid = std::fs::read(&layout).unwrap();
        let samples = index.samples.iter().map(|s| (s.start, s.len)).collect();
        Fixture { _dir: dir, shard, layout, valid, samples }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let mut bytes = f.valid.clone();
    let mut edits = data.chunks_exact(3);
    for e in &mut edits {
        let at = usize::from(u16::from_le_bytes([e[0], e[1]])) % bytes.len();
        bytes[at] = e[2];
    }
    if let [cut] = edits.remainder() {
        bytes.truncate(bytes.len() * usize::from(*cut % 101) / 100);
    }
    std::fs::write(&f.layout, &bytes).unwrap();
    if let Lookup::Found(index) = saved_index::load(&f.shard, None) {
        let believed: Vec<(u64, u64)> = index.samples.iter().map(|s| (s.start, s.len)).collect();
        assert_eq!(believed, f.samples, "a saved index believed that the shard's headers contradict");
    }
});
