//! Runs of equal labels in a distributed sorted order (`--stratify-by`): how many labels there
//! are and how far any label's count strays from its ideal share, found where the runs lie
//! after the sort. Runs wholly inside one rank's bucket are measured there; only the runs at
//! bucket edges (which may continue on a neighbour) meet on rank 0.

use anyhow::Result;

use crate::comm::sort::Item;
use crate::comm::wire::gather_concat;
use crate::comm::{agree, Comm};

/// The deviation of a label holding the ranks `a..a + n` of the sorted order.
pub type Deviation<'a> = &'a dyn Fn(u64, u64) -> f64;

/// One rank's share of the runs: the worst deviation and the label count of the runs wholly
/// inside its bucket, and the runs at its edges.
#[derive(Default)]
pub struct Runs {
    inner_worst: f64,
    inner_labels: u64,
    edges: Vec<(Vec<u8>, u64, u64)>,
}

impl Runs {
    /// The runs of `bucket`, this rank's part of the sorted order starting at rank `start`.
    pub fn of(start: u64, bucket: &[Item], deviation: Deviation<'_>) -> Runs {
        let mut runs = Runs::default();
        let mut k = 0;
        while k < bucket.len() {
            let end = k + bucket[k..].partition_point(|it| it.key == bucket[k].key);
            let (a, n) = (start + k as u64, (end - k) as u64);
            if k == 0 || end == bucket.len() {
                runs.edges.push((bucket[k].key.clone(), a, n));
            } else {
                runs.inner_labels += 1;
                runs.inner_worst = runs.inner_worst.max(deviation(a, n));
            }
            k = end;
        }
        runs
    }

    /// Over all ranks: the number of labels (runs) and the worst deviation, on every rank.
    ///
    /// # Errors
    /// A decoding failure on rank 0 (internal), agreed on every rank.
    pub fn total(self, comm: &impl Comm, deviation: Deviation<'_>) -> Result<(u64, f64)> {
        let mut worst = self.inner_worst;
        let mut labels = self.inner_labels;
        let edges = gather_concat::<(Vec<u8>, u64, u64)>(comm, 0, &self.edges);
        let joined = edges.map(|edges| {
            let mut joined: Vec<(Vec<u8>, u64, u64)> = Vec::new();
            for (key, a, n) in edges {
                match joined.last_mut() {
                    Some(last) if last.0 == key && last.1 + last.2 == a => last.2 += n,
                    _ => joined.push((key, a, n)),
                }
            }
            joined
        });
        // Only rank 0 decodes: agreed before the next collective.
        let joined = agree(comm, joined)?;
        labels += joined.len() as u64;
        for (_, a, n) in joined {
            worst = worst.max(deviation(a, n));
        }
        // Non-negative floats order like their bits, which stay below 2^63.
        let worst = f64::from_bits(comm.all_max(&[worst.to_bits()])[0]);
        let labels = comm.all_sum(&[labels])[0];
        Ok((labels, worst))
    }
}
