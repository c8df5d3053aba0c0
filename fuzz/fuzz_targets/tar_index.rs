//! Arbitrary bytes into the header-only tar indexer: it must return samples or an error, never
//! panic, and the samples it returns must be what its docs promise.

#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use reshard::tar::{index_reader, HeaderReader};

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let Ok(index) = index_reader(HeaderReader::new(Cursor::new(data)), len) else {
        return;
    };
    // Samples are whole blocks, in file order, disjoint, inside the file.
    let mut end = 0;
    for s in &index.samples {
        assert!(s.len > 0 && s.len % 512 == 0, "{s:?}");
        assert!(s.start % 512 == 0 && s.start >= end, "{s:?} after {end}");
        end = s.start + s.len;
        assert!(end <= len, "{s:?} past the end ({len} bytes)");
    }
});
