//! reshard: reorganize WebDataset tar shards over MPI.
//!
//! The pipeline (see `pipeline`) is pure code over a [`comm::Comm`] transport; only
//! `comm::mpi` touches MPI, so the whole job also runs in-process in unit tests.

pub mod cli;
pub mod comm;
pub mod config;
pub mod error;
pub mod exit;
pub mod generate;
pub mod hooks;
pub mod input;
pub mod job;
pub mod key_map;
pub mod manifest;
pub mod order;
pub mod output;
pub mod permute;
pub mod pipeline;
pub mod plan;
pub mod progress;
pub mod report;
pub mod saved_index;
pub mod size;
pub mod sys;
pub mod tar;
pub mod tar_headers;
pub mod tar_index;
pub mod verify;
pub mod watchdog;
pub mod writer;
