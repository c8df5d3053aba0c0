//! [`VerifyConfig`]: a resolved `verify` request. Its own file so that moving it to the crate's
//! `config.rs` (issue 14) is one file and a re-export.

use std::path::PathBuf;

use crate::cli::VerifyArgs;

/// A `verify` request.
#[derive(Debug, Clone)]
pub struct VerifyConfig {
    /// Input specs, as given to `reshard run`.
    pub inputs: Vec<String>,
    /// The output directory of a run: its shards and `index.json`.
    pub output: PathBuf,
    /// Print the report as JSON.
    pub json: bool,
}

impl From<&VerifyArgs> for VerifyConfig {
    fn from(args: &VerifyArgs) -> Self {
        VerifyConfig {
            inputs: args.inputs.clone(),
            output: args.output.clone(),
            json: args.json,
        }
    }
}
