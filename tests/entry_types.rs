//! Every tar type flag, with a size of 0 and of 1024, named `t.x`, `d/` and `b.txt`, in front of
//! two members: listed by GNU tar, bsdtar and Python's tarfile (tests/util/tar_oracle.py), and
//! moved by reshard. Where the three readers agree on the regular files, reshard moves exactly
//! the (name, bytes) tarfile reads; where they disagree, it refuses naming the file and the
//! byte offset. The one table is `src/tar/entry_type.rs`.

use crate::util::fuzz::{answer, check_moved, oracle, Answer, Case};
use crate::util::{find_on_path, skip, test_python, Dir};

#[test]
fn every_type_flag_moves_as_gnu_tar_bsdtar_and_tarfile_read_it_or_is_refused() {
    let test = "every_type_flag_moves_as_gnu_tar_bsdtar_and_tarfile_read_it_or_is_refused";
    if test_python().is_none() || find_on_path("bsdtar").is_none() {
        skip(test, "needs RESHARD_TEST_PYTHON (webdataset) and bsdtar");
        return;
    }
    let dir = Dir::new("entry-types");
    let at = dir.create_dir("types");
    let rows = oracle(
        &dir,
        &["types", at.to_str().unwrap(), "types.json"],
        "types.json",
    );
    let mut problems = Vec::new();
    let (mut moved, mut refused) = (Vec::new(), 0);
    for (i, row) in rows.as_array().unwrap().iter().enumerate() {
        let mut case = from_row(row);
        case.how = format!(
            "type {} size {} name {}: GNU tar {}, bsdtar {}",
            row["typeflag"], row["size"], row["name"], row["gnu"], row["bsd"]
        );
        let agree = row["agree"].as_bool().unwrap();
        match answer(&dir, None, &case, &format!("out-{i}")) {
            Err(e) => problems.push(e),
            Ok(Answer::Moved(_)) if !agree => problems.push(format!(
                "{}: the readers disagree, but reshard exited 0",
                case.how
            )),
            Ok(Answer::Moved(out)) => moved.push((case, out)),
            // Refused where the readers agree: only by the table's choices.
            Ok(Answer::Refused(msg)) if agree && !refusal_by_design(row, &msg) => {
                problems.push(format!(
                    "{}: the readers agree, but reshard refused: {msg}",
                    case.how
                ))
            }
            Ok(Answer::Refused(_)) => refused += 1,
        }
    }
    // Exit 0: exactly the members tarfile reads from the input.
    problems.extend(check_moved(&dir, &moved));
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    // Not vacuous: the directory with a size (issue 36) moves, with the member behind it.
    assert!(
        moved
            .iter()
            .any(|(c, _)| c.how.starts_with("type \"35\" size 1024 name \"t.x\"")),
        "the directory with a size did not move"
    );
    assert!(
        moved.len() > 30 && refused > 30,
        "{} moved, {refused} refused",
        moved.len()
    );
}

fn from_row(row: &serde_json::Value) -> Case {
    let t = &row["tarfile"];
    Case {
        file: row["file"].as_str().unwrap().into(),
        ok: t["ok"].as_bool().unwrap(),
        members: t["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m[0].as_str().unwrap().into(), m[1].as_str().unwrap().into()))
            .collect(),
        how: String::new(),
    }
}

/// Whether a refusal of a row the readers agree on is one of the table's choices: an entry
/// named like the sample after it (the sample rule), a multi-volume continuation (part of a
/// file), or an unknown type (a regular file to POSIX, GNU tar and bsdtar, none to tarfile),
/// which is refused even where no keyed file depends on it.
fn refusal_by_design(row: &serde_json::Value, msg: &str) -> bool {
    let named_like_b = row["name"] == "b.txt" && msg.contains("sample \"b\"");
    named_like_b || row["typeflag"] == "4d" || msg.contains("is an entry of a type flag")
}
