//! Inputs made at test time by other writers: GNU tar (pax and gnu formats) and Python's
//! tarfile (PAX records for long names, non-ASCII names and long owner names, a PAX global
//! header, ustar prefixes, entries that belong to no sample).

use std::path::PathBuf;

use crate::util::runs::reshard_both;
use crate::util::verifier::{input_samples, InputShard};
use crate::util::{have_python, noise, sorted, Dir};

#[test]
fn gnu_tar_pax_and_gnu_formats() {
    let dir = Dir::new("gnutar");
    let long_dir = format!("s/{}", "deep_directory_name_".repeat(8));
    let long_base = format!("s/{}", "f".repeat(120));
    // Sizes around block boundaries; several members per sample; dots in directory names;
    // multi-dot extensions; a path over 100 bytes and a file name over 100 bytes.
    let files: Vec<(String, usize)> = vec![
        ("s/a.jpg".into(), 1000),
        ("s/a.cls".into(), 1),
        ("s/a.meta.json".into(), 0),
        (format!("{long_dir}/b.seg.png"), 513),
        (format!("{long_dir}/b.json"), 512),
        ("s/c.d/x.txt".into(), 511),
        ("s/c.d/x.txt.gz".into(), 2048),
        (format!("{long_base}.bin"), 700),
        (format!("{long_base}.cls"), 3),
        ("s/z.empty".into(), 0),
    ];
    for (i, (name, len)) in files.iter().enumerate() {
        dir.create_bytes(name, &noise(i as u64 + 1, *len));
    }
    // A directory entry first (skipped), then the files in this order.
    let mut list = vec!["s".to_string()];
    list.extend(files.iter().map(|(n, _)| n.clone()));
    let tar = |format: &str, owner: &str| {
        let out = format!("{format}.tar");
        dir.program("tar")
            .args([
                &format!("--format={format}"),
                "--no-recursion",
                "--mtime=@1700000000",
                &format!("--owner={owner}"),
                "--group=0",
                "-cf",
                &out,
            ])
            .args(&list)
            .assert_success();
        dir.join(out)
    };
    let long_owner = "an_owner_name_longer_than_the_32_byte_ustar_field:1234";
    let inputs = vec![tar("pax", long_owner), tar("gnu", "0")];

    let pax = input_samples(&inputs[0]);
    let gnu = input_samples(&inputs[1]);
    let types = |s: &InputShard| -> Vec<u8> {
        s.walk
            .records
            .iter()
            .flat_map(|r| r.types.clone())
            .collect()
    };
    assert!(types(&pax).contains(&b'x'), "GNU tar wrote no PAX records");
    assert!(
        types(&gnu).contains(&b'L'),
        "GNU tar wrote no long-name records"
    );
    let keys = vec![
        "s/a".to_string(),
        format!("{long_dir}/b"),
        "s/c.d/x".into(),
        long_base.clone(),
        "s/z".into(),
    ];
    for s in [&pax, &gnu] {
        assert_eq!(
            s.samples.iter().map(|x| x.key.clone()).collect::<Vec<_>>(),
            keys
        );
        assert_eq!(s.skipped.directories, 1);
    }

    let v = reshard_both(&dir, &inputs, 3);
    assert_eq!(v.skipped.directories, 2);
    let mut want: Vec<String> = keys.iter().chain(&keys).cloned().collect();
    want.sort();
    assert_eq!(sorted(v.order.clone()), want);
}

const PY_MAKE: &str = r#"
import io, tarfile

def add(tf, name, data, **kw):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 1700000000
    ti.mode = 0o644
    for k, v in kw.items():
        setattr(ti, k, v)
    tf.addfile(ti, io.BytesIO(data))

def blob(n, seed):
    return bytes((i * 31 + seed * 17 + (i >> 7)) % 251 for i in range(n))

long_dir = "p/" + "a_long_directory_component_" * 5
with tarfile.open("py-pax.tar", "w", format=tarfile.PAX_FORMAT,
                  pax_headers={"comment": "global header made by the reshard tests"}) as tf:
    add(tf, "p/one.jpg", blob(1500, 1), uname="someone_with_a_user_name_longer_than_32_bytes")
    add(tf, "p/one.txt", b"one")
    add(tf, long_dir + "/two.jpg", blob(512, 2))
    add(tf, long_dir + "/two.cls", b"2", pax_headers={"comment": "per-member record"})
    ti = tarfile.TarInfo("p/link")
    ti.type = tarfile.SYMTYPE
    ti.linkname = "one.jpg"
    tf.addfile(ti)
    add(tf, "p/donn\u00e9es/\u00e9t\u00e9.txt", blob(10, 3))
    add(tf, "p/donn\u00e9es/\u00e9t\u00e9.json", b"{}")
    add(tf, "p/README", b"no key")
    add(tf, "p/three.bin", blob(0, 4))
    add(tf, "p/three.big.bin", blob(10000, 5))

with tarfile.open("py-gnu.tar", "w", format=tarfile.GNU_FORMAT) as tf:
    add(tf, long_dir + "/four.jpg", blob(100, 6))
    add(tf, long_dir + "/four.cls", b"4")
    add(tf, "g/" + "n" * 130 + ".txt", blob(1, 7))
    add(tf, "g/five.a", blob(513, 8))

# ustar: a path over 100 bytes split into the prefix and name fields.
with tarfile.open("py-ustar.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
    add(tf, long_dir + "/six.jpg", blob(300, 9))
    add(tf, long_dir + "/six.cls", b"6")
    add(tf, "u/seven.x", blob(1024, 10))
"#;

#[test]
fn python_tarfile_formats() {
    if !have_python("inputs made by Python's tarfile") {
        return;
    }
    let dir = Dir::new("pytar");
    dir.program("python3")
        .args(["-c", PY_MAKE])
        .assert_success();
    let inputs: Vec<PathBuf> = ["py-pax.tar", "py-gnu.tar", "py-ustar.tar"]
        .iter()
        .map(|n| dir.join(n))
        .collect();

    let long_dir = format!("p/{}", "a_long_directory_component_".repeat(5));
    let keys = |i: usize| -> Vec<String> {
        input_samples(&inputs[i])
            .samples
            .iter()
            .map(|s| s.key.clone())
            .collect()
    };
    assert_eq!(
        keys(0),
        [
            "p/one".to_string(),
            format!("{long_dir}/two"),
            "p/donn\u{e9}es/\u{e9}t\u{e9}".into(),
            "p/three".into(),
        ]
    );
    assert_eq!(
        keys(1),
        [
            format!("{long_dir}/four"),
            format!("g/{}", "n".repeat(130)),
            "g/five".into(),
        ]
    );
    assert_eq!(keys(2), [format!("{long_dir}/six"), "u/seven".into()]);
    let ustar = input_samples(&inputs[2]);
    assert!(
        ustar.walk.records.iter().all(|r| r.types == b"0"),
        "py-ustar.tar should need no extension records"
    );

    let v = reshard_both(&dir, &inputs, 2);
    assert_eq!(v.skipped.global_headers, 1, "{:?}", v.skipped);
    assert_eq!(v.skipped.other_entries, 1, "{:?}", v.skipped);
    assert_eq!(v.skipped.keyless_files, 1, "{:?}", v.skipped);
    assert_eq!(v.order.len(), 9);
}
