//! The runs of equal labels after a distributed sort ([`crate::plan::runs`]) totalled over
//! all ranks: the edge runs meet on rank 0, which joins and measures them.

use anyhow::Result;

use crate::comm::wire::gather_concat;
use crate::comm::{agree, Comm};
use crate::plan::runs::{join, Deviation, Run, Runs};

/// Over all ranks: the number of labels (runs) and the worst deviation, on every rank.
///
/// # Errors
/// A decoding failure on rank 0 (internal), agreed on every rank.
pub(crate) fn total_runs(
    comm: &impl Comm,
    runs: &Runs,
    deviation: Deviation<'_>,
) -> Result<(u64, f64)> {
    let edges = gather_concat::<Run>(comm, 0, &runs.edges());
    // Only rank 0 decodes: agreed before the next collective.
    let joined = agree(comm, edges.map(join))?;
    let (labels, worst) = runs.measure(&joined, deviation);
    // Non-negative floats order like their bits, which stay below 2^63.
    let worst = f64::from_bits(comm.all_max(&[worst.to_bits()])[0]);
    let labels = comm.all_sum(&[labels])[0];
    Ok((labels, worst))
}
