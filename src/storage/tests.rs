//! The storage seam's contract, run against every backend.

use super::*;

#[test]
fn schemes_pick_backends() {
    assert_eq!(scheme(Path::new("mem://t/a.tar")), Some("mem"));
    assert_eq!(scheme(Path::new("s3://bucket/a.tar")), Some("s3"));
    assert_eq!(scheme(Path::new("3s://bucket/a.tar")), None);
    assert_eq!(scheme(Path::new("/data/a.tar")), None);
    assert_eq!(scheme(Path::new("./x://y")), None);
}

/// What the lock and the space check ask of a backend, the same on POSIX and in memory.
fn lock_and_space_methods(root: &Path) {
    lock_and_space_methods_of(root, source(root), sink(root));
    // The same through the rate limits' wrapper: each later method forwarded, not answered
    // by the trait's default.
    lock_and_space_methods_of(root, sources(root).1, sinks(root).1);
}

fn lock_and_space_methods_of(root: &Path, source: &dyn Source, sink: &dyn Sink) {
    sink.create_dir_all(root).unwrap();
    let lock = root.join("lock");
    sink.create_new(&lock, b"run A beat 0").unwrap();
    let again = sink.create_new(&lock, b"run B beat 0").unwrap_err();
    assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
    assert_eq!(source.read(&lock).unwrap(), b"run A beat 0");
    // Nothing left beside it (POSIX writes aside first).
    let names: Vec<_> = source
        .list(root)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, [OsString::from("lock")]);

    let beat = |to: &'static [u8]| {
        move |old: &[u8]| old.starts_with(b"run A").then(|| [&old[..11], to].concat())
    };
    assert!(sink.update(&lock, &mut beat(b"1")).unwrap());
    assert_eq!(source.read(&lock).unwrap(), b"run A beat 1");
    sink.remove_file(&lock).unwrap();
    sink.create_new(&lock, b"run B beat 7").unwrap();
    assert!(
        !sink.update(&lock, &mut beat(b"2")).unwrap(),
        "not A's any more"
    );
    assert_eq!(source.read(&lock).unwrap(), b"run B beat 7");
    sink.remove_file(&lock).unwrap();
    let gone = sink.update(&lock, &mut beat(b"3")).unwrap_err();
    assert_eq!(gone.kind(), io::ErrorKind::NotFound);

    let shard = root.join("shard");
    let out = sink.create(&shard, 1 << 20).unwrap();
    let before = source.allocated(&shard).unwrap();
    out.write_at(&[1u8; 8192], 0).unwrap();
    out.sync_all().unwrap();
    assert!(source.allocated(&shard).unwrap() >= before.max(8192));
    sink.remove_dir_all(root).unwrap();
}

#[test]
fn lock_and_space_methods_in_memory() {
    let root = Path::new("mem://lock-and-space");
    lock_and_space_methods(root);
    assert_eq!(sink(root).free_space(root).unwrap(), None, "unknown");
    memory::set_capacity(root, 1000);
    memory::put(&root.join("a"), vec![0; 300]);
    for sink in [sink(root), sinks(root).1] {
        assert_eq!(sink.free_space(&root.join("x")).unwrap(), Some(700));
    }
}

#[test]
fn lock_and_space_methods_on_posix() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("d");
    lock_and_space_methods(&root);
    for sink in [sink(tmp.path()), sinks(tmp.path()).1] {
        assert!(sink.free_space(tmp.path()).unwrap().is_some());
    }
}

/// What a backend offers beyond the contract every backend keeps: POSIX has symbolic links
/// and atomic swaps, the memory backend answers `Unsupported` and changes nothing.
#[derive(Clone, Copy)]
struct Offers {
    links_and_swap: bool,
}

/// Runs `contract` on a new POSIX directory and on the `mem://` prefix `name`, each through
/// the backend itself and through the rate limits' wrapper, so that both backends keep one
/// contract and the wrapper forwards every method (not the trait's default).
fn on_every_backend(name: &str, contract: fn(&Path, &dyn Source, &dyn Sink, Offers)) {
    let tmp = tempfile::tempdir().unwrap();
    let mem = PathBuf::from(format!("mem://{name}"));
    let posix = Offers {
        links_and_swap: true,
    };
    let memory = Offers {
        links_and_swap: false,
    };
    for (base, offers) in [(tmp.path(), posix), (mem.as_path(), memory)] {
        let (source, sink) = (sources(base), sinks(base));
        contract(&base.join("plain"), source.0, sink.0, offers);
        contract(&base.join("paced"), source.1, sink.1, offers);
    }
}

fn not_found(source: &dyn Source, path: &Path) -> bool {
    source.stat(path).map_err(|e| e.kind()).err() == Some(io::ErrorKind::NotFound)
}

/// Directories are made with their parents; `write` replaces the whole content (a shorter
/// one leaves nothing of the longer behind); `replace` leaves nothing beside the file; a
/// stream's `finish` says its length; a listing names every entry with its kind; an open
/// input reads at any offset, up to the end and then 0, and its stamp is the path's.
fn written_objects_read_back(root: &Path, source: &dyn Source, sink: &dyn Sink, _: Offers) {
    sink.create_dir_all(&root.join("sub/deeper")).unwrap();
    for dir in [
        root.to_path_buf(),
        root.join("sub"),
        root.join("sub/deeper"),
    ] {
        assert_eq!(
            source.stat(&dir).unwrap().kind,
            Kind::Dir,
            "{}",
            dir.display()
        );
    }

    let a = root.join("a");
    sink.write(&a, b"the first and longer content").unwrap();
    sink.write(&a, b"0123456789").unwrap();
    assert_eq!(source.read(&a).unwrap(), b"0123456789");
    let stat = source.stat(&a).unwrap();
    assert_eq!((stat.kind, stat.stamp.size), (Kind::File, 10));

    let b = root.join("b.json");
    sink.replace(&b, b"the old content").unwrap();
    sink.replace(&b, b"new").unwrap();
    assert_eq!(source.read(&b).unwrap(), b"new");

    let c = root.join("c");
    let mut stream = sink.create_stream(&c).unwrap();
    for part in [&b"front "[..], b"to ", b"back"] {
        stream.write_all(part).unwrap();
    }
    assert_eq!(stream.finish().unwrap(), 13, "the stream's length");
    assert_eq!(source.read(&c).unwrap(), b"front to back");

    let mut listed = source.list(root).unwrap();
    listed.sort_by(|x, y| x.name.cmp(&y.name));
    let entry = |name: &str, kind| Entry {
        name: name.into(),
        kind,
    };
    let want = [
        entry("a", Kind::File),
        entry("b.json", Kind::File),
        entry("c", Kind::File),
        entry("sub", Kind::Dir),
    ];
    assert_eq!(listed, want, "every entry, and nothing left beside b.json");
    let mut starting = source.list_starting(root, "b").unwrap();
    starting.extend(source.list_starting(root, "su").unwrap());
    assert_eq!(
        starting,
        [want[1].clone(), want[3].clone()],
        "the names that start so"
    );

    let input = source.open(&a).unwrap();
    input.advise_random();
    let mut buf = [0u8; 4];
    assert_eq!(input.read_at(&mut buf, 3).unwrap(), 4);
    assert_eq!(&buf, b"3456");
    assert_eq!(input.read_at(&mut buf, 8).unwrap(), 2, "up to the end");
    assert_eq!(&buf[..2], b"89");
    assert_eq!(input.read_at(&mut buf, 10).unwrap(), 0, "0 at the end");
    assert_eq!(input.stamp().unwrap(), source.stat(&a).unwrap().stamp);

    let missing = root.join("missing");
    assert!(not_found(source, &missing));
    assert_eq!(
        source.read(&missing).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    let Err(e) = source.open(&missing) else {
        panic!("{} opened", missing.display())
    };
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
}

#[test]
fn every_backend_reads_back_what_was_written() {
    on_every_backend("written-objects", written_objects_read_back);
}

/// `create` makes a new object of zeros of the length asked and refuses one that exists
/// (touching nothing in it); `write_at` places bytes at their offset, past the end too;
/// `size` follows; `reopen` keeps what the object holds.
fn outputs_take_bytes_at_their_offsets(
    root: &Path,
    source: &dyn Source,
    sink: &dyn Sink,
    _: Offers,
) {
    sink.create_dir_all(root).unwrap();
    let shard = root.join("shard");
    let out = sink.create(&shard, 100).unwrap();
    assert_eq!(out.size().unwrap(), 100);
    assert_eq!(source.read(&shard).unwrap(), [0u8; 100]);
    out.write_at(b"xyz", 10).unwrap();
    out.write_at(b"end", 200).unwrap();
    assert_eq!(out.size().unwrap(), 203, "a write past the end extends it");
    out.start_writeback(0, 203);
    out.sync_data().unwrap();
    out.sync_all().unwrap();
    drop(out);

    let Err(again) = sink.create(&shard, 5) else {
        panic!("{} created twice", shard.display())
    };
    assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
    let out = sink.reopen(&shard).unwrap();
    assert_eq!(out.size().unwrap(), 203, "neither truncated nor resized");
    out.write_at(b"Q", 0).unwrap();
    drop(out);
    let mut want = vec![0u8; 203];
    want[0] = b'Q';
    want[10..13].copy_from_slice(b"xyz");
    want[200..].copy_from_slice(b"end");
    assert_eq!(source.read(&shard).unwrap(), want);

    let Err(e) = sink.reopen(&root.join("missing")) else {
        panic!("a missing object reopened")
    };
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
}

#[test]
fn every_backend_writes_outputs_at_offsets_and_creates_only_new_ones() {
    on_every_backend("outputs", outputs_take_bytes_at_their_offsets);
}

/// `rename_noreplace` moves a directory only where nothing is (not over a user's directory, an empty
/// one or a file), `rename` replaces a file, `exchange` swaps two directories where the
/// backend can (else `Unsupported`, nothing moved), a link points where it was told, and
/// the removals remove exactly what they name.
fn names_move_only_as_documented(
    root: &Path,
    source: &dyn Source,
    sink: &dyn Sink,
    offers: Offers,
) {
    let (staging, taken) = (root.join("staging"), root.join("taken"));
    sink.create_dir_all(&staging).unwrap();
    sink.write(&staging.join("shard"), b"new output").unwrap();
    sink.create_dir_all(&taken).unwrap();
    sink.write(&taken.join("shard"), b"a user's file").unwrap();
    sink.create_dir_all(&root.join("empty")).unwrap();
    sink.write(&root.join("file"), b"a file").unwrap();
    for occupied in ["taken", "empty", "file"] {
        let refused = sink
            .rename_noreplace(&staging, &root.join(occupied))
            .unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::AlreadyExists, "{occupied}");
    }
    assert_eq!(source.read(&taken.join("shard")).unwrap(), b"a user's file");
    assert_eq!(source.read(&root.join("file")).unwrap(), b"a file");
    assert_eq!(source.read(&staging.join("shard")).unwrap(), b"new output");

    let out = root.join("out");
    sink.rename_noreplace(&staging, &out).unwrap();
    assert!(not_found(source, &staging));
    assert_eq!(source.read(&out.join("shard")).unwrap(), b"new output");

    sink.write(&root.join("next"), b"next").unwrap();
    sink.rename(&root.join("next"), &root.join("file")).unwrap();
    assert!(not_found(source, &root.join("next")));
    assert_eq!(source.read(&root.join("file")).unwrap(), b"next");

    let swapped = sink.swap(&out, &taken);
    let linked = sink.symlink(Path::new("out"), &root.join("current"));
    if offers.links_and_swap {
        swapped.unwrap();
        assert_eq!(source.read(&out.join("shard")).unwrap(), b"a user's file");
        assert_eq!(source.read(&taken.join("shard")).unwrap(), b"new output");
        let one_missing = sink.swap(&out, &root.join("missing")).unwrap_err();
        assert_eq!(one_missing.kind(), io::ErrorKind::NotFound);
        assert_eq!(source.read(&out.join("shard")).unwrap(), b"a user's file");

        linked.unwrap();
        let current = root.join("current");
        assert_eq!(source.stat_link(&current).unwrap().kind, Kind::Link);
        assert_eq!(source.stat(&current).unwrap().kind, Kind::Dir);
        assert_eq!(
            source.read(&current.join("shard")).unwrap(),
            b"a user's file"
        );
        sink.remove_file(&current).unwrap();
        assert!(not_found(source, &current));
        assert_eq!(source.stat(&out).unwrap().kind, Kind::Dir, "the link only");
    } else {
        for refused in [swapped, linked] {
            assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::Unsupported);
        }
        assert_eq!(source.read(&out.join("shard")).unwrap(), b"new output");
        assert!(not_found(source, &root.join("current")));
    }

    sink.remove_file(&root.join("file")).unwrap();
    assert!(not_found(source, &root.join("file")));
    let twice = sink.remove_file(&root.join("file")).unwrap_err();
    assert_eq!(twice.kind(), io::ErrorKind::NotFound);
    sink.remove_dir_all(&out).unwrap();
    assert!(not_found(source, &out.join("shard")) && not_found(source, &out));
    assert_eq!(
        source.stat(&taken).unwrap().kind,
        Kind::Dir,
        "only what was named"
    );
    sink.sync_dir(root).unwrap();
}

#[test]
fn every_backend_moves_names_only_as_documented() {
    on_every_backend("names", names_move_only_as_documented);
}

/// `update` hands `change` the content and writes what it returns: a change anywhere (the
/// first byte and the last, the middle the same), a shorter content (nothing of the old
/// left after it), a longer one; `None` writes nothing and says so.
fn updates_rewrite_the_content_in_place(
    root: &Path,
    source: &dyn Source,
    sink: &dyn Sink,
    _: Offers,
) {
    sink.create_dir_all(root).unwrap();
    let beat = root.join("beat");
    sink.write(&beat, b"abcdef").unwrap();
    let steps: [(&[u8], &[u8]); 3] = [
        (b"abcdef", b"xbcdeZ"),
        (b"xbcdeZ", b"xbc"),
        (b"xbc", b"xbc and more"),
    ];
    for (old, new) in steps {
        let mut seen = Vec::new();
        let wrote = sink.update(&beat, &mut |was| {
            seen = was.to_vec();
            Some(new.to_vec())
        });
        assert!(wrote.unwrap());
        assert_eq!(seen, old, "the content handed to the change");
        assert_eq!(source.read(&beat).unwrap(), new);
    }
    assert!(
        !sink.update(&beat, &mut |_| None).unwrap(),
        "nothing to write"
    );
    assert_eq!(source.read(&beat).unwrap(), b"xbc and more");
}

#[test]
fn every_backend_updates_in_place_from_what_it_read() {
    on_every_backend("updates", updates_rewrite_the_content_in_place);
}

#[test]
fn sequential_streams_do_not_move_each_other() {
    let path = Path::new("mem://seq/a");
    memory::put(path, b"0123456789".to_vec());
    let shard = open(path).unwrap();
    let (mut a, mut b) = (Sequential::new(shard.clone()), Sequential::new(shard));
    let mut buf = [0u8; 4];
    a.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"0123");
    b.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"0123");
    a.seek(SeekFrom::End(-2)).unwrap();
    let mut rest = Vec::new();
    a.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"89");
    assert!(a.seek(SeekFrom::Current(-100)).is_err());
}

#[test]
fn an_output_commits_by_manifest_where_it_can_neither_write_at_offsets_nor_rename() {
    let can = |positioned_writes, rename| Capabilities {
        positioned_writes,
        rename,
        symlinks: false,
    };
    assert!(!can(true, true).commits_by_manifest());
    for (positioned, rename) in [(false, true), (true, false), (false, false)] {
        assert!(can(positioned, rename).commits_by_manifest());
    }
    assert!(!sink(Path::new("/tmp/out"))
        .capabilities()
        .commits_by_manifest());
    assert!(sink(Path::new("s3://b/p/out"))
        .capabilities()
        .commits_by_manifest());
}
