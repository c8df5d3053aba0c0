pub use crate::plan::permute::*;
