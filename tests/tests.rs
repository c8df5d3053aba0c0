//! Integration tests: the built binary, run under mpirun on generated data.
//!
//! One module per area; each holds only `#[test]` functions. `util` holds everything they share:
//! it launches the binary (directly or under `mpirun -np N`) in a temporary directory per test
//! with a timeout, and `util::verifier` checks an output against its input with its own tar
//! reader. Run one area with `cargo test --test integration orders::`.

mod util;

mod bad_input;
mod cloud;
mod cluster;
mod compressed;
mod docs;
mod entry_types;
mod epochs;
mod faults_input;
mod faults_lock;
mod faults_publish;
mod fencing;
mod fuzz_tars;
mod golden;
mod harness;
mod house;
mod hygiene;
mod integrity;
mod loader_index;
mod loose_files;
mod loose_s3;
mod memory;
mod messages;
mod odd_inputs;
mod ops;
mod orders;
mod plan;
mod rate;
mod real_data;
mod real_tars;
mod release;
mod resume;
mod rounds;
mod run;
mod s3;
mod s3_loaders;
mod s3_once;
mod s3_resume;
mod s3_user;
mod signals;
mod sizing;
mod slurm;
mod splits;
mod usage;
mod verify_cmd;
