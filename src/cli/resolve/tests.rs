//! The tests of resolving requests ([`super`]): each subcommand's arguments to its configuration, and the usage errors.

use super::*;

#[test]
fn keep_needs_epoch_in_the_output_name() {
    let p = |s: &str| Some(std::path::PathBuf::from(s));
    let ok = keep_series(Some(2), p("data/epoch-{epoch}").as_deref()).unwrap();
    assert_eq!(ok.unwrap().series, "epoch-{epoch}");
    assert!(keep_series(None, p("data/x").as_deref()).unwrap().is_none());
    for bad in ["data/x", "{epoch}/x", "data-{epoch}/e-{epoch}"] {
        assert!(keep_series(Some(2), p(bad).as_deref()).is_err(), "{bad}");
    }
    assert!(keep_series(Some(0), p("e-{epoch}").as_deref()).is_err());
    assert!(keep_series(Some(1), None).is_err());
}

fn request(flags: &str) -> RunConfig {
    use clap::Parser;
    let argv = format!("reshard run --input in.tar --output out --seed 1 {flags}");
    let cli = super::super::Cli::try_parse_from(argv.split_whitespace()).unwrap();
    let Command::Run(args) = cli.command else {
        panic!("run")
    };
    run_config(&args, false).unwrap()
}

fn settings(flags: &str) -> PlanSettings {
    plan_settings(&request(flags))
}

/// A resumed run may change what does not shape the staging shards (the finish phase's
/// compression and digests, the memory budget), and nothing else.
#[test]
fn resume_records_what_shapes_the_staging_shards() {
    let first = job_settings(&request("--shards 2"));
    for same in ["--compress zst --checksum", "--mem-limit 64MiB", "--force"] {
        let again = job_settings(&request(&format!("--shards 2 {same}")));
        assert_eq!(again.resume.arguments, first.resume.arguments, "{same}");
    }
    for other in [
        "3",
        "2 --epoch 2",
        "2 --order key",
        "2 --prefix p",
        "2 --equalize drop",
    ] {
        let again = job_settings(&request(&format!("--shards {other}")));
        assert_ne!(again.resume.arguments, first.resume.arguments, "{other}");
    }
    let mapped = job_settings(&request("--shards 2 --key-map m.tsv"));
    assert_eq!(mapped.resume.key_map, Some(PathBuf::from("m.tsv")));
    assert_eq!(mapped.publish.key_map, mapped.resume.key_map);
    assert!(
        job_settings(&request("--shards 2 --split a=0.5,b=rest"))
            .publish
            .split
    );
}

#[test]
fn saved_indexes_stand_in_for_headers_only_when_nothing_needs_the_headers() {
    assert!(settings("--shards 2 --index idx").index.reuse_saved);
    for flags in [
        "--order key",
        "--order content:cls:int",
        "--stratify-by cls",
        "--energon",
        "--dali-index",
    ] {
        let index = settings(&format!("--shards 2 --index idx {flags}")).index;
        assert!(!index.reuse_saved, "{flags}");
        assert_eq!(index.saved_indexes, Some(PathBuf::from("idx")));
    }
}

#[test]
fn the_gpus_train_on_the_first_split() {
    let plain = settings("--gpus 2 --workers 1").layout;
    assert_eq!(plain.gpu_groups, None);
    let split = settings("--gpus 2 --workers 1 --split train=0.9,val=rest");
    assert_eq!(split.layout.gpu_groups, Some(1));
    let assign = split.place.split.unwrap();
    assert_eq!(assign.seed, split.place.seed);
    assert_eq!(assign.splits.spec.names(), ["train", "val"]);
}
