//! Runs of equal labels in a distributed sorted order (`--stratify-by`): how many labels there
//! are and how far any label's count strays from its ideal share, found where the runs lie
//! after the sort. Runs wholly inside one rank's bucket are measured there; only the runs at
//! bucket edges (which may continue on a neighbour) meet on rank 0 (`job::planning::runs::total_runs`).

use crate::comm::sort::Item;

/// The deviation of a label holding the ranks `a..a + n` of the sorted order.
pub(crate) type Deviation<'a> = &'a dyn Fn(u64, u64) -> f64;

/// A run of one label: its key, its first rank in the sorted order, its length.
pub(crate) type Run = (Vec<u8>, u64, u64);

/// One rank's share of the runs: the worst deviation and the label count of the runs wholly
/// inside its bucket, and the runs at its edges.
#[derive(Default)]
pub(crate) struct Runs {
    inner_worst: f64,
    inner_labels: u64,
    edges: Vec<Run>,
}

impl Runs {
    /// The runs of `bucket`, this rank's part of the sorted order starting at rank `start`.
    pub(crate) fn of(start: u64, bucket: &[Item], deviation: Deviation<'_>) -> Runs {
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

    /// The runs at this rank's bucket edges, for [`join`].
    pub(crate) fn edges(&self) -> &[Run] {
        &self.edges
    }

    /// The labels and the worst deviation of this rank's inner runs and of `joined` (every
    /// rank's edge runs joined; rank 0 alone measures them, the other ranks pass none).
    pub(crate) fn measure(&self, joined: &[Run], deviation: Deviation<'_>) -> (u64, f64) {
        let worst = joined
            .iter()
            .fold(self.inner_worst, |w, (_, a, n)| w.max(deviation(*a, *n)));
        (self.inner_labels + joined.len() as u64, worst)
    }
}

/// Every rank's edge runs, in rank order, with a run that continues on the next rank (same
/// label, next rank in the order) made one.
pub(crate) fn join(edges: Vec<Run>) -> Vec<Run> {
    let mut joined: Vec<Run> = Vec::new();
    for (key, a, n) in edges {
        match joined.last_mut() {
            Some(last) if last.0 == key && last.1 + last.2 == a => last.2 += n,
            _ => joined.push((key, a, n)),
        }
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(keys: &[u8]) -> Vec<Item> {
        keys.iter()
            .map(|&k| Item {
                key: vec![k],
                tie: 0,
            })
            .collect()
    }

    /// The length of the run as its deviation.
    fn length(_: u64, n: u64) -> f64 {
        n as f64
    }

    #[test]
    fn inner_runs_are_measured_where_they_lie_and_edges_kept() {
        let runs = Runs::of(10, &bucket(b"aabbbcd"), &length);
        assert_eq!(runs.edges(), [(vec![b'a'], 10, 2), (vec![b'd'], 16, 1)]);
        assert_eq!(runs.measure(&[], &length), (2, 3.0));
        let one = Runs::of(0, &bucket(b"aaa"), &length);
        assert_eq!(one.edges(), [(vec![b'a'], 0, 3)]);
        assert_eq!(one.measure(&[], &length), (0, 0.0));
    }

    #[test]
    fn a_run_continued_on_the_next_rank_is_one_label() {
        let k = |c: u8| vec![c];
        let edges = vec![
            (k(b'a'), 0, 2),
            (k(b'b'), 5, 1),
            (k(b'b'), 6, 4),
            (k(b'b'), 10, 3),
            (k(b'c'), 13, 1),
            // The same label again, but not where the last one ended: another run.
            (k(b'c'), 20, 1),
        ];
        let joined = join(edges);
        assert_eq!(
            joined,
            [
                (k(b'a'), 0, 2),
                (k(b'b'), 5, 8),
                (k(b'c'), 13, 1),
                (k(b'c'), 20, 1)
            ]
        );
        assert_eq!(Runs::default().measure(&joined, &length), (4, 8.0));
    }
}
