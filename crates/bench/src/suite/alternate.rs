//! A load measured while other work runs, in alternation with quiet: one
//! fio run, the work started in turns with quiet gaps between them, and
//! fio's IOPS log (one figure per 250 ms slice) split into the slices that
//! fell wholly inside a turn and those wholly outside every turn, with a
//! margin. Both halves come from one run on one warm state, interleaved,
//! so a drift of the machine falls on both alike. Separate runs before
//! and after the loaded one let it decide the ratio: on this machine ten
//! 5 s runs in a row of 4 KiB random writes at QD32 on an idle daemon
//! moved between 39k and 61k IOPS, and the cross-node case's goal (0.8)
//! sits inside that.
//!
//! What it owns: the schedule of turns and the split. What the work is and
//! what the figures mean belong to the case that calls it.

use super::fio::{self, Job, Slice, Target, SLICE_MS};
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A slice counts as quiet only if no turn ran within this of it: what a
/// turn leaves behind (a page cache to write back, a process exiting)
/// still weighs on the slices just after it.
const QUIET_MARGIN_MS: u64 = 500;

/// The shortest turn: four slices.
const MIN_TURN: Duration = Duration::from_millis(4 * SLICE_MS);

/// The run split in two.
#[derive(Debug)]
pub struct Alternated {
    /// Mean IOPS of the slices outside every turn, and how many.
    pub quiet_iops: f64,
    pub quiet_slices: usize,
    /// Mean IOPS of the slices inside a turn, and how many.
    pub busy_iops: f64,
    pub busy_slices: usize,
    /// Turns started (the last one may end after fio does), and the calls
    /// of the work in them.
    pub turns: usize,
    pub calls: usize,
    /// Time inside turns while fio ran, and what `moved` counted in it.
    pub busy_time: Duration,
    pub moved: u64,
}

impl Alternated {
    pub fn kept(&self) -> f64 {
        self.busy_iops / self.quiet_iops
    }
}

/// Run `job` (its `seconds` is the whole run) on `target`, with turns of
/// `turn` (called again within a turn until the turn has lasted
/// `MIN_TURN`), each a `gap` of quiet after the last one ended (the first
/// a `gap` and a margin after fio was started), while at least a `gap` of
/// fio's run would be left. A `gap` of 1.25 s or less leaves no slice
/// quiet between two turns. `moved` is a byte counter read at each turn's
/// start and end (a link's tx, say). fio's log goes to `log_prefix`.
pub fn alternate(
    job: &Job,
    target: &Target,
    log_prefix: &Path,
    gap: Duration,
    moved: impl Fn() -> u64,
    mut turn: impl FnMut(usize) -> Result<()>,
) -> Result<Alternated> {
    let mut job = job.clone();
    job.iops_log = Some(log_prefix.to_path_buf());
    let run = Duration::from_secs_f64(job.seconds);
    let running = fio::spawn(&job, target)?;
    let started = Instant::now();
    let mut turns: Vec<(u64, u64)> = Vec::new();
    let mut moved_in_turns = 0;
    let mut busy = Duration::ZERO;
    let mut calls = 0;
    // When the next turn starts: a gap after the last one ended. The first
    // waits a margin more, for fio to connect and start its clock.
    let mut next = gap + Duration::from_millis(QUIET_MARGIN_MS);
    while next + gap <= run {
        if let Some(wait) = next.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        let (m0, t0, i0) = (moved(), now_ms(), Instant::now());
        // A turn is at least `MIN_TURN`: work quicker than that (the
        // quick profile's copies) runs again within it, so that every turn
        // holds whole slices.
        loop {
            turn(calls)?;
            calls += 1;
            if i0.elapsed() >= MIN_TURN {
                break;
            }
        }
        let (m1, t1) = (moved(), now_ms());
        // What ran after fio ended is not part of its run.
        let left = run.saturating_sub(i0.duration_since(started));
        let took = i0.elapsed();
        busy += took.min(left);
        moved_in_turns += if took <= left {
            m1.saturating_sub(m0)
        } else {
            (m1.saturating_sub(m0) as f64 * left.as_secs_f64() / took.as_secs_f64()) as u64
        };
        turns.push((t0, t1));
        next = started.elapsed() + gap;
    }
    running.wait().context("the measured fio run")?;
    let slices = fio::read_iops_log(log_prefix)?;
    let (quiet, inside) = split(&slices, &turns, QUIET_MARGIN_MS);
    ensure!(
        !quiet.is_empty() && !inside.is_empty(),
        "{} slices quiet and {} inside {} turns: too few to compare (gap {gap:?}, run {run:?})",
        quiet.len(),
        inside.len(),
        turns.len()
    );
    Ok(Alternated {
        quiet_iops: mean(&quiet),
        quiet_slices: quiet.len(),
        busy_iops: mean(&inside),
        busy_slices: inside.len(),
        turns: turns.len(),
        calls,
        busy_time: busy,
        moved: moved_in_turns,
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// The IOPS of the slices wholly outside every turn widened by `margin` on
/// each side, and of those wholly inside one turn. A slice straddling a
/// turn's edge, or in its margin, counts for neither.
fn split(slices: &[Slice], turns: &[(u64, u64)], margin: u64) -> (Vec<f64>, Vec<f64>) {
    let mut quiet = Vec::new();
    let mut inside = Vec::new();
    for s in slices {
        let (a, b) = (s.end_ms.saturating_sub(SLICE_MS), s.end_ms);
        if turns.iter().any(|&(t0, t1)| t0 <= a && b <= t1) {
            inside.push(s.iops);
        } else if turns
            .iter()
            .all(|&(t0, t1)| b + margin <= t0 || t1 + margin <= a)
        {
            quiet.push(s.iops);
        }
    }
    (quiet, inside)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slices(from: u64, iops: &[f64]) -> Vec<Slice> {
        iops.iter()
            .enumerate()
            .map(|(i, &iops)| Slice {
                end_ms: from + (i as u64 + 1) * SLICE_MS,
                iops,
            })
            .collect()
    }

    #[test]
    fn slices_split_by_the_turns_with_a_margin() {
        // Slices end at 1250, 1500, ..., 4000; one turn from 1990 to 3010.
        let s = slices(1000, &[1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.]);
        let (quiet, inside) = split(&s, &[(1990, 3010)], 500);
        // Inside: [2000,2250] .. [2750,3000]. Quiet: ends at or before
        // 1490 ([1000,1250]), or starts at or after 3510 ([3750,4000]).
        assert_eq!(inside, vec![5., 6., 7., 8.]);
        assert_eq!(quiet, vec![1., 12.]);
        // No margin: everything not straddling an edge is one or the other.
        let (quiet, inside) = split(&s, &[(1990, 3010)], 0);
        assert_eq!(inside, vec![5., 6., 7., 8.]);
        assert_eq!(quiet, vec![1., 2., 3., 10., 11., 12.]);
    }

    #[test]
    fn a_slice_between_two_turns_is_quiet_only_clear_of_both() {
        let s = slices(0, &[1., 2., 3., 4., 5., 6., 7., 8.]);
        let (quiet, inside) = split(&s, &[(0, 500), (1500, 2000)], 250);
        assert_eq!(inside, vec![1., 2., 7., 8.]);
        assert_eq!(quiet, vec![4., 5.]);
    }
}
