//! Unit tests of the header walk ([`super`]).

use super::*;
use crate::tar::testing::{header, padded, pax_record, set_checksum, walk_all};
use std::io::Cursor;

#[test]
fn old_gnu_sparse_member_extent_is_its_stored_data_and_extension_blocks() {
    // 'S' with stored size 1024 and one extension block, then a plain member.
    let mut s = header("a.npy", b'S', 1024, b"ustar  \0");
    s[482] = 1;
    set_checksum(&mut s, false);
    let ext = [0u8; 512]; // its own flag (byte 504) is 0: the last one
    let bytes = [
        s.to_vec(),
        ext.to_vec(),
        vec![7u8; 1024],
        header("a.cls", b'0', 1, b"ustar  \0").to_vec(),
        padded(b"1"),
        vec![0; 1024],
    ]
    .concat();
    let m = walk_all(&bytes).unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(
        (m[0].kind, m[0].data, m[0].stored, m[0].end, m[0].sparse),
        (EntryKind::Sparse, 1024, 1024, 2048, true)
    );
    assert_eq!((m[1].start, m[1].header, m[1].end), (2048, 2048, 3072));
}

#[test]
fn pax_sparse_name_and_size_records_are_applied() {
    let records = [
        pax_record("GNU.sparse.name", "d/x.npy"),
        pax_record("GNU.sparse.major", "1"),
    ]
    .concat();
    let records = records.as_bytes();
    let bytes = [
        header(
            "PaxHeader/x.npy",
            b'x',
            records.len() as u64,
            b"ustar\x0000",
        )
        .to_vec(),
        padded(records),
        header("GNUSparseFile.0/x.npy", b'0', 600, b"ustar\x0000").to_vec(),
        vec![1u8; 1024],
        vec![0; 1024],
    ]
    .concat();
    let m = walk_all(&bytes).unwrap();
    assert_eq!(m[0].path, b"d/x.npy");
    assert_eq!((m[0].start, m[0].header, m[0].end), (0, 1024, 2560));
    assert!(m[0].sparse);
}

#[test]
fn signed_checksums_labels_and_base256_sizes_are_read() {
    let mut h = header("\u{e9}t\u{e9}.txt", b'0', 3, b"ustar\x0000");
    set_checksum(&mut h, true);
    let mut big = header("b.bin", b'0', 0, b"ustar  \0");
    big[124..136].fill(0);
    big[124] = 0x80;
    big[135] = 5;
    set_checksum(&mut big, false);
    let bytes = [
        header("LABEL", b'V', 0, b"ustar  \0").to_vec(),
        h.to_vec(),
        padded(b"abc"),
        big.to_vec(),
        padded(b"12345"),
    ]
    .concat();
    let m = walk_all(&bytes).unwrap();
    assert_eq!(m[0].kind, EntryKind::Label);
    assert_eq!(m[1].stored, 3);
    assert_eq!((m[2].stored, m[2].end), (5, 2560));
}

#[test]
fn errors_name_the_offset_and_reason() {
    let mut jpeg = vec![0xff, 0xd8, 0xff, 0xe0, 0, 0x10, b'J', b'F', b'I', b'F'];
    jpeg.resize(2000, 0x55);
    let e = format!("{:#}", walk_all(&jpeg).unwrap_err());
    assert!(
        e.contains("byte offset 0: not a tar archive") && e.contains("JPEG"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        walk_all(b"hello world, this is text\n").unwrap_err()
    );
    assert!(e.contains("byte offset 0"), "{e}");
    let mut bytes = [
        header("a.x", b'0', 1, b"ustar\x0000").to_vec(),
        padded(b"1"),
        header("b.x", b'0', 1, b"ustar\x0000").to_vec(),
    ]
    .concat();
    bytes[1024 + 3] ^= 1;
    let e = format!("{:#}", walk_all(&bytes).unwrap_err());
    assert!(
        e.contains("byte offset 1024") && e.contains("checksum"),
        "{e}"
    );
    let bytes = header("a.x", b'x', 100, b"ustar\x0000");
    let e = format!("{:#}", walk_all(&bytes).unwrap_err());
    assert!(
        e.contains("byte offset 0") && e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn forward_sources_report_truncated_data() {
    let bytes = [
        header("a.x", b'0', 3000, b"ustar\x0000").to_vec(),
        vec![1u8; 1000],
    ]
    .concat();
    let mut w = Walk::new(Forward(Cursor::new(&bytes)), None);
    w.next_member().unwrap().unwrap();
    let e = format!("{:#}", w.next_member().unwrap_err());
    assert!(e.contains("truncated"), "{e}");
    // A forward-only source does not know its length: the member is returned, and reading
    // its data finds the end.
    let mut w = Walk::new(Forward(Cursor::new(&bytes)), None);
    let m = w.next_member().unwrap().unwrap();
    let e = format!("{:#}", w.read_data(&m).unwrap_err());
    assert!(
        e.contains("byte offset 0: truncated tar") && e.contains("input ends at byte 1512"),
        "{e}"
    );
    let whole = [
        header("a.x", b'0', 5, b"ustar\x0000").to_vec(),
        padded(b"12345"),
    ]
    .concat();
    let mut w = Walk::new(Forward(Cursor::new(&whole)), None);
    let m = w.next_member().unwrap().unwrap();
    assert_eq!(w.read_data(&m).unwrap(), b"12345");
}

#[test]
fn a_ustar_prefix_is_part_of_the_path_and_other_headers_have_none() {
    let dir = "p".repeat(120);
    let mut h = header("k.jpg", b'0', 0, b"ustar\x0000");
    h[345..345 + dir.len()].copy_from_slice(dir.as_bytes());
    set_checksum(&mut h, false);
    let bytes = [&h[..], &[0u8; 1024]].concat();
    assert_eq!(
        walk_all(&bytes).unwrap()[0].path,
        format!("{dir}/k.jpg").into_bytes()
    );
    // An old GNU header keeps other fields (access and change times) where ustar's prefix
    // is: they are no part of the path.
    let mut h = header("k.jpg", b'0', 0, b"ustar  \0");
    h[345..357].copy_from_slice(b"14717334450\0");
    set_checksum(&mut h, false);
    let bytes = [&h[..], &[0u8; 1024]].concat();
    assert_eq!(walk_all(&bytes).unwrap()[0].path, b"k.jpg");
}

#[test]
fn what_follows_the_marker_is_found_at_its_offset_and_counted_to_the_end() {
    // One member (header and a data block), the marker at 1024, more zeros than one read
    // of `trailing` takes (64 KiB), then 100 bytes of data.
    let gap = 70_000;
    let bytes = [
        header("a.x", b'0', 1, b"ustar\x0000").to_vec(),
        padded(b"1"),
        vec![0; gap],
        vec![9u8; 100],
    ]
    .concat();
    let want = Trailing {
        marker: 1024,
        data_at: 1024 + gap as u64,
        after: (gap + 100 - 512) as u64,
    };
    // A decompressor is read to its end: the length comes from where the reads stopped.
    let mut w = Walk::new(Forward(Cursor::new(&bytes)), None);
    assert!(w.next_member().unwrap().is_some());
    assert!(w.next_member().unwrap().is_none());
    assert_eq!(w.trailing().unwrap(), Some(want));
    let len = Some(bytes.len() as u64);
    let mut w = Walk::new(Seekable(Cursor::new(&bytes)), len);
    while w.next_member().unwrap().is_some() {}
    assert_eq!(w.trailing().unwrap(), Some(want));
}

#[test]
fn a_pax_path_names_the_member_over_its_header_and_a_gnu_long_name() {
    let records = pax_record("path", "long/dir/k.jpg");
    let long = padded(b"gnu/long/k.jpg\0");
    let bytes = [
        header("././@LongLink", b'L', 15, b"ustar  \0").to_vec(),
        long,
        header(
            "PaxHeader/k.jpg",
            b'x',
            records.len() as u64,
            b"ustar\x0000",
        )
        .to_vec(),
        padded(records.as_bytes()),
        header("k.jpg", b'0', 0, b"ustar\x0000").to_vec(),
        vec![0; 1024],
    ]
    .concat();
    let m = walk_all(&bytes).unwrap();
    assert_eq!(
        (m[0].path.as_slice(), m[0].start),
        (&b"long/dir/k.jpg"[..], 0)
    );
    // Without the PAX record, the GNU long name.
    let bytes = [
        header("././@LongLink", b'L', 15, b"ustar  \0").to_vec(),
        padded(b"gnu/long/k.jpg\0"),
        header("k.jpg", b'0', 0, b"ustar  \0").to_vec(),
        vec![0; 1024],
    ]
    .concat();
    assert_eq!(walk_all(&bytes).unwrap()[0].path, b"gnu/long/k.jpg");
}

#[test]
fn a_link_target_is_the_pax_linkpath_then_a_gnu_long_link_then_the_header_field() {
    let mut link = header("l", b'2', 0, b"ustar\x0000");
    link[157..167].copy_from_slice(b"short/name");
    set_checksum(&mut link, false);
    let records = pax_record("linkpath", "pax/target");
    let long_link = [
        header("././@LongLink", b'K', 12, b"ustar  \0").to_vec(),
        padded(b"gnu/target\0\0"),
    ]
    .concat();
    let pax = [
        header("PaxHeader/l", b'x', records.len() as u64, b"ustar\x0000").to_vec(),
        padded(records.as_bytes()),
    ]
    .concat();
    let cases: [(Vec<u8>, &[u8]); 3] = [
        ([long_link.clone(), pax].concat(), b"pax/target"),
        (long_link, b"gnu/target"),
        (Vec::new(), b"short/name"),
    ];
    for (extensions, target) in cases {
        let bytes = [extensions, link.to_vec(), vec![0; 1024]].concat();
        let m = walk_all(&bytes).unwrap();
        assert_eq!(
            (m[0].kind, m[0].link.as_slice()),
            (EntryKind::Symlink, target)
        );
    }
}

#[test]
fn runs_of_zero_blocks_read_past_are_counted() {
    let part = |name: &str| {
        [
            header(name, b'0', 1, b"ustar\x0000").to_vec(),
            padded(b"1"),
            vec![0; 1024],
        ]
        .concat()
    };
    for (parts, runs) in [(1, 0), (2, 1), (3, 2)] {
        let bytes: Vec<u8> = (0..parts).flat_map(|i| part(&format!("{i}.x"))).collect();
        let len = Some(bytes.len() as u64);
        let mut w = Walk::new(Seekable(Cursor::new(&bytes)), len).ignoring_zeros(true);
        let mut members = 0;
        while w.next_member().unwrap().is_some() {
            members += 1;
        }
        assert_eq!((members, w.zero_runs()), (parts, runs));
    }
}

#[test]
fn no_data_follows_a_directory_or_a_hard_link_whatever_its_size_says() {
    // GNU tar, bsdtar and tarfile all read the member right after such a header; skipping
    // `size` bytes would drop it.
    for typeflag in [b'5', b'1'] {
        let bytes = [
            header("d.x", typeflag, 1024, b"ustar\x0000").to_vec(),
            header("b.txt", b'0', 1, b"ustar\x0000").to_vec(),
            padded(b"B"),
            header("c.txt", b'0', 1, b"ustar\x0000").to_vec(),
            padded(b"C"),
            vec![0; 1024],
        ]
        .concat();
        let m = walk_all(&bytes).unwrap();
        let names: Vec<&[u8]> = m.iter().map(|m| m.path.as_slice()).collect();
        assert_eq!(names, [&b"d.x"[..], b"b.txt", b"c.txt"]);
        assert_eq!((m[0].stored, m[0].end, m[1].start), (0, 512, 512));
    }
}

#[test]
fn a_type_the_readers_disagree_on_is_refused_with_its_offset() {
    let with = |typeflag: u8, name: &str, size: u64| {
        [
            header("a.txt", b'0', 1, b"ustar\x0000").to_vec(),
            padded(b"A"),
            header(name, typeflag, size, b"ustar\x0000").to_vec(),
            vec![0; 2048],
        ]
        .concat()
    };
    for (typeflag, name) in [(b'2', "l.x"), (b'6', "f.x"), (b'V', "v"), (b'0', "d/")] {
        walk_all(&with(typeflag, name, 0)).unwrap();
        let e = format!("{:#}", walk_all(&with(typeflag, name, 512)).unwrap_err());
        assert!(
            e.starts_with("byte offset 1024: member") && e.contains("GNU tar"),
            "{e}"
        );
    }
    let e = format!("{:#}", walk_all(&with(b'A', "acl", 0)).unwrap_err());
    assert!(
        e.starts_with("byte offset 1024: member \"acl\" (type 'A') is a Solaris ACL"),
        "{e}"
    );
    let e = format!("{:#}", walk_all(&with(b'Z', "z.x", 0)).unwrap_err());
    assert!(
        e.contains("(type 'Z') is an entry") && e.contains("tarfile"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        walk_all(&with(b'L', "././@LongLink", 0)).unwrap_err()
    );
    assert!(
        e.starts_with("byte offset 1024: an empty GNU long name"),
        "{e}"
    );
}

#[test]
fn what_tarfile_reads_and_others_do_not_is_refused() {
    // A long name whose record holds more name after its size: tarfile and GNU tar read it
    // to the NUL, others stop at the size (a fuzzed shard moved a member under a
    // different name than tarfile's).
    let mut long = padded(b"d/long/b.cls\0");
    long[1] = b'/';
    let bytes = [
        header("././@LongLink", b'L', 1, b"ustar  \0").to_vec(),
        long,
        header("x", b'0', 0, b"ustar  \0").to_vec(),
        vec![0; 1024],
    ]
    .concat();
    let e = format!("{:#}", walk_all(&bytes).unwrap_err());
    assert!(
        e.starts_with("byte offset 0: an extension header of 1 bytes with data in its padding (byte offset 513)"),
        "{e}"
    );
    // A mode field that is not a number: GNU tar lists the member, tarfile and bsdtar refuse
    // the archive.
    let mut h = header("a.jpg", b'0', 0, b"ustar  \0");
    h[102] = 0x10;
    set_checksum(&mut h, false);
    let e = format!(
        "{:#}",
        walk_all(&[&h[..], &[0; 1024]].concat()).unwrap_err()
    );
    assert!(e.starts_with("byte offset 0: header field 'mode'"), "{e}");
}

#[test]
fn a_global_header_is_read_and_refused_when_malformed_or_naming_members() {
    let with = |records: &str| {
        [
            header(
                "pax_global_header",
                b'g',
                records.len() as u64,
                b"ustar\x0000",
            )
            .to_vec(),
            padded(records.as_bytes()),
            header("a.txt", b'0', 1, b"ustar\x0000").to_vec(),
            padded(b"A"),
            vec![0; 1024],
        ]
        .concat()
    };
    let m = walk_all(&with(&pax_record("comment", "made by git archive"))).unwrap();
    assert_eq!((m[0].kind, m[1].start), (EntryKind::GlobalHeader, 1024));
    for bad in [
        pax_record("path", "x.txt"),
        pax_record("size", "9"),
        "garbage".into(),
    ] {
        let e = format!("{:#}", walk_all(&with(&bad)).unwrap_err());
        assert!(
            e.contains("byte offset 0") && e.contains("global header"),
            "{e}"
        );
    }
}

#[test]
fn the_walk_is_at_the_end_of_the_member_it_returned_last() {
    let bytes = [
        header("a.x", b'0', 600, b"ustar\x0000").to_vec(),
        vec![1u8; 1024],
        header("b.x", b'0', 1, b"ustar\x0000").to_vec(),
        padded(b"2"),
        vec![0; 1024],
    ]
    .concat();
    let mut w = Walk::new(Seekable(Cursor::new(&bytes)), Some(bytes.len() as u64));
    assert_eq!(w.offset(), 0);
    let mut ends = Vec::new();
    while let Some(m) = w.next_member().unwrap() {
        assert_eq!(w.offset(), m.end);
        ends.push(m.end);
    }
    assert_eq!(ends, [1536, 2560]);
}

#[test]
fn an_extension_header_over_16_mib_is_refused_before_it_is_read() {
    let with_extension = |size: u64| {
        [
            header("PaxHeader/k", b'x', size, b"ustar\x0000").to_vec(),
            vec![0; MAX_EXTENSION as usize], // NULs: padding, no records
            header("k.jpg", b'0', 0, b"ustar\x0000").to_vec(),
            vec![0; 1024],
        ]
        .concat()
    };
    let m = walk_all(&with_extension(MAX_EXTENSION)).unwrap();
    assert_eq!((m[0].start, m[0].path.as_slice()), (0, &b"k.jpg"[..]));
    // One byte more, read, would take the member's header as extension data.
    let e = format!(
        "{:#}",
        walk_all(&with_extension(MAX_EXTENSION + 1)).unwrap_err()
    );
    let want = format!(
        "byte offset 0: an extension header of {} bytes",
        MAX_EXTENSION + 1
    );
    assert!(e.contains(&want), "{e}");
}
