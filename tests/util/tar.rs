//! Tar builders and byte surgery: archives of given members, compressed copies, header
//! checksums rewritten after an edit, and GNU tar's listing of a shard.

use std::fs;
use std::io::Write;
use std::path::Path;

use super::verifier::walk;
use super::Dir;

/// Header offsets of the records of a GNU-format shard without extension records.
pub fn header_offsets(bytes: &[u8]) -> Vec<usize> {
    let w = walk(bytes.to_vec()).unwrap();
    assert!(w.records.iter().all(|r| r.types == b"0"));
    w.records.iter().map(|r| r.start).collect()
}

/// A GNU-format tar of regular files with fixed metadata.
pub fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// The bytes of the file at `path` compressed with `codec`: `gz` for gzip, anything else zstd.
pub fn compress(path: &Path, codec: &str) -> Vec<u8> {
    let raw = fs::read(path).unwrap();
    match codec {
        "gz" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&raw).unwrap();
            e.finish().unwrap()
        }
        _ => zstd::encode_all(&raw[..], 3).unwrap(),
    }
}

/// The decompressed bytes of a `.gz` (gzip) or other (zstd) file.
pub fn decompress(path: &Path) -> Vec<u8> {
    let raw = fs::read(path).unwrap();
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&raw[..]), &mut out).unwrap();
        out
    } else {
        zstd::decode_all(&raw[..]).unwrap()
    }
}

/// Rewrites the file at `path` as `f` edits its bytes.
pub fn edit_bytes(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = fs::read(path).unwrap();
    f(&mut bytes);
    fs::write(path, bytes).unwrap();
}

/// Rewrites the file at `path` as `f` edits its bytes, in place (same inode), and sets its
/// modification time back: only the contents and the change time differ.
pub fn rewrite_keeping_mtime(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let mut bytes = fs::read(path).unwrap();
    f(&mut bytes);
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &bytes, 0).unwrap();
    file.set_len(bytes.len() as u64).unwrap();
    file.set_modified(mtime).unwrap();
}

/// Recomputes a header's checksum after an edit, so that only the verbatim check can notice.
pub fn fix_checksum(header: &mut [u8]) {
    header[148..156].fill(b' ');
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// Rewrites the checksum of every header that holds bytes >= 0x80 as the sum of its bytes taken
/// as signed values (what old tars wrote); returns how many it rewrote.
pub fn sign_checksums(archive: &Path) -> usize {
    let mut bytes = fs::read(archive).unwrap();
    let w = walk(bytes.clone()).unwrap();
    let mut headers: Vec<usize> = Vec::new();
    for r in &w.records {
        let mut at = r.start;
        while at <= r.header {
            headers.push(at);
            let size =
                usize::from_str_radix(std::str::from_utf8(&bytes[at + 124..at + 135]).unwrap(), 8)
                    .unwrap();
            at += 512 + size.div_ceil(512) * 512;
        }
    }
    let mut n = 0;
    for h in headers {
        let block = &mut bytes[h..h + 512];
        if block.iter().all(|&b| b < 0x80) {
            continue;
        }
        block[148..156].fill(b' ');
        let signed: i64 = block.iter().map(|&b| i64::from(b as i8)).sum();
        let unsigned: i64 = block.iter().map(|&b| i64::from(b)).sum();
        assert_ne!(signed, unsigned);
        block[148..156].copy_from_slice(format!("{signed:06o}\0 ").as_bytes());
        n += 1;
    }
    fs::write(archive, bytes).unwrap();
    n
}

/// The member names of every output shard, as `tar -tf` lists them.
pub fn gnu_tar_list(dir: &Dir, shard: &Path) -> Vec<String> {
    let out = dir.program("tar").arg("-tf").arg(shard).assert_success();
    out.stdout.lines().map(str::to_string).collect()
}
