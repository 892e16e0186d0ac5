//! Raw figures and the comparisons drawn from them. Every measurement is a
//! `Record` (one value per round, in the order the rounds ran); a
//! `Comparison` names a Lamina record and an anchor record of the same
//! metric, and is reported as a ratio Lamina / anchor.

use serde::Serialize;

#[derive(Serialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Higher,
    Lower,
}

#[derive(Serialize, Clone, Debug)]
pub struct Record {
    pub case: String,
    pub target: String,
    pub metric: String,
    pub unit: String,
    pub better: Better,
    pub values: Vec<f64>,
}

impl Record {
    pub fn median(&self) -> f64 {
        median(&self.values)
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct Comparison {
    pub case: String,
    pub label: String,
    pub metric: String,
    pub lamina: String,
    pub anchor: String,
    /// The target from `targets.md`, as a bound on the ratio: at least this
    /// when higher is better, at most this when lower is better.
    pub goal: Option<f64>,
}

/// A comparison worked out: per-round ratios, their median and spread.
#[derive(Serialize, Clone, Debug)]
pub struct Ratio {
    pub comparison: Comparison,
    pub unit: String,
    pub better: Better,
    pub lamina_median: f64,
    pub anchor_median: f64,
    pub ratios: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub verdict: &'static str,
    pub meets_goal: Option<Judgement>,
}

/// Whether a measure meets its goal, judged on every round rather than the
/// median alone: on these machines one comparison has moved from 0.65× to
/// 1.74× between runs, so a median on the right side of a goal the rounds
/// straddle proves nothing.
#[derive(Serialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub enum Judgement {
    /// Every round meets it.
    Met,
    /// No round meets it.
    Missed,
    /// Some rounds do and some do not.
    NotDecided,
}

impl Judgement {
    /// Judge `values` (NaN left out) against `bound`: at least when higher
    /// is better, at most when lower is.
    pub fn of(values: &[f64], better: Better, bound: f64) -> Judgement {
        let meets = |v: f64| match better {
            Better::Higher => v >= bound,
            Better::Lower => v <= bound,
        };
        let vals: Vec<f64> = values.iter().cloned().filter(|v| !v.is_nan()).collect();
        if vals.iter().all(|&v| meets(v)) && !vals.is_empty() {
            Judgement::Met
        } else if vals.iter().all(|&v| !meets(v)) {
            Judgement::Missed
        } else {
            Judgement::NotDecided
        }
    }

    pub fn text(self) -> &'static str {
        match self {
            Judgement::Met => "met",
            Judgement::Missed => "**missed**",
            Judgement::NotDecided => "not decided (the rounds straddle it)",
        }
    }
}

/// An absolute bound from `targets.md` on one Lamina record's median, for
/// measures with no anchor (a list under a second, RSS under 512 MiB).
#[derive(Serialize, Clone, Debug)]
pub struct Goal {
    pub case: String,
    pub label: String,
    pub target: String,
    pub metric: String,
    /// At least this when higher is better, at most this when lower is.
    pub bound: f64,
}

#[derive(Default, Serialize)]
pub struct Records {
    pub records: Vec<Record>,
    pub comparisons: Vec<Comparison>,
    pub goals: Vec<Goal>,
    /// Free text per case: what was not run and why, what was seen.
    pub notes: Vec<(String, String)>,
}

impl Records {
    pub fn add(
        &mut self,
        case: &str,
        target: &str,
        metric: &str,
        unit: &str,
        better: Better,
        v: f64,
    ) {
        if let Some(r) = self
            .records
            .iter_mut()
            .find(|r| r.case == case && r.target == target && r.metric == metric)
        {
            r.values.push(v);
            return;
        }
        self.records.push(Record {
            case: case.into(),
            target: target.into(),
            metric: metric.into(),
            unit: unit.into(),
            better,
            values: vec![v],
        });
    }

    pub fn get(&self, case: &str, target: &str, metric: &str) -> Option<&Record> {
        self.records
            .iter()
            .find(|r| r.case == case && r.target == target && r.metric == metric)
    }

    pub fn compare(
        &mut self,
        case: &str,
        label: &str,
        metric: &str,
        lamina: &str,
        anchor: &str,
        goal: Option<f64>,
    ) {
        self.comparisons.push(Comparison {
            case: case.into(),
            label: label.into(),
            metric: metric.into(),
            lamina: lamina.into(),
            anchor: anchor.into(),
            goal,
        });
    }

    pub fn goal(&mut self, case: &str, label: &str, target: &str, metric: &str, bound: f64) {
        self.goals.push(Goal {
            case: case.into(),
            label: label.into(),
            target: target.into(),
            metric: metric.into(),
            bound,
        });
    }

    /// Every goal whose record exists, with its record and whether every
    /// value in it meets the goal.
    pub fn goals_checked(&self) -> Vec<(Goal, &Record, Judgement)> {
        self.goals
            .iter()
            .filter_map(|g| {
                let r = self.get(&g.case, &g.target, &g.metric)?;
                Some((g.clone(), r, Judgement::of(&r.values, r.better, g.bound)))
            })
            .collect()
    }

    pub fn note(&mut self, case: &str, text: impl Into<String>) {
        let text = text.into();
        eprintln!("  note ({case}): {text}");
        self.notes.push((case.into(), text));
    }

    /// Every comparison whose two records exist, worked out.
    pub fn ratios(&self) -> Vec<Ratio> {
        self.comparisons
            .iter()
            .filter_map(|c| {
                let l = self.get(&c.case, &c.lamina, &c.metric)?;
                let a = self.get(&c.case, &c.anchor, &c.metric)?;
                Some(ratio(c, l, a))
            })
            .collect()
    }
}

fn ratio(c: &Comparison, l: &Record, a: &Record) -> Ratio {
    // Rounds ran in alternation, so round i of one is paired with round i of
    // the other; when the counts differ, every pair is taken.
    let ratios: Vec<f64> = if l.values.len() == a.values.len() {
        l.values
            .iter()
            .zip(&a.values)
            .map(|(x, y)| div(*x, *y))
            .collect()
    } else {
        l.values
            .iter()
            .flat_map(|x| a.values.iter().map(move |y| div(*x, *y)))
            .collect()
    };
    let med = median(&ratios);
    let min = ratios.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let better = l.better;
    // Within 5% either way is noise on these machines. A win or a loss is
    // declared only when every round says so; rounds on both sides of the
    // band decide nothing.
    let (win, lose) = match better {
        Better::Higher => (min >= 1.05, max <= 0.95),
        Better::Lower => (max <= 0.95, min >= 1.05),
    };
    let verdict = if !med.is_finite() {
        "n/a"
    } else if win {
        "Lamina wins"
    } else if lose {
        "**Lamina loses**"
    } else if min > 0.95 && max < 1.05 {
        "even"
    } else {
        "not decided"
    };
    let meets_goal = c.goal.map(|g| Judgement::of(&ratios, better, g));
    Ratio {
        comparison: c.clone(),
        unit: l.unit.clone(),
        better,
        lamina_median: l.median(),
        anchor_median: a.median(),
        ratios,
        median: med,
        min,
        max,
        verdict,
        meets_goal,
    }
}

fn div(x: f64, y: f64) -> f64 {
    if y == 0.0 {
        f64::NAN
    } else {
        x / y
    }
}

/// The median; the mean of the middle two for an even count.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().cloned().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile of unsorted values (NaN when empty).
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s: Vec<f64> = v.iter().cloned().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[((s.len() - 1) as f64 * p).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_pair_rounds_and_judge_direction() {
        let mut r = Records::default();
        for (l, a) in [(90.0, 100.0), (110.0, 100.0), (80.0, 100.0)] {
            r.add("io", "lamina", "iops", "IOPS", Better::Higher, l);
            r.add("io", "nbdkit", "iops", "IOPS", Better::Higher, a);
        }
        r.add("lat", "lamina", "p99", "ms", Better::Lower, 2.0);
        r.add("lat", "qsd", "p99", "ms", Better::Lower, 10.0);
        r.compare("io", "rr", "iops", "lamina", "nbdkit", Some(0.75));
        r.compare("lat", "snap", "p99", "lamina", "qsd", None);
        r.compare("lat", "missing", "p99", "lamina", "nobody", None);
        r.goal("lat", "snapshot p99", "lamina", "p99", 5.0);
        r.goal("lat", "absent", "lamina", "p50", 5.0);
        let g = r.goals_checked();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].2, Judgement::Met, "2 ms is within a 5 ms bound");
        let x = r.ratios();
        assert_eq!(x.len(), 2, "a comparison with a missing side is left out");
        assert_eq!(x[0].ratios, vec![0.9, 1.1, 0.8]);
        assert_eq!(x[0].median, 0.9);
        assert_eq!((x[0].min, x[0].max), (0.8, 1.1));
        assert_eq!(
            x[0].verdict, "not decided",
            "0.8-1.1 straddles the even band"
        );
        assert_eq!(x[0].meets_goal, Some(Judgement::Met));
        assert_eq!(x[1].median, 0.2);
        assert_eq!(x[1].verdict, "Lamina wins", "lower latency wins");
    }

    #[test]
    fn a_verdict_needs_every_round() {
        let mut r = Records::default();
        let rounds = [
            ("lose", [0.8, 0.9, 0.7]),
            ("win", [1.2, 1.1, 1.3]),
            ("even", [0.98, 1.02, 1.0]),
            ("split", [0.7, 1.3, 0.9]),
        ];
        for (name, vals) in rounds {
            for v in vals {
                r.add(name, "lamina", "iops", "IOPS", Better::Higher, v);
                r.add(name, "anchor", "iops", "IOPS", Better::Higher, 1.0);
            }
            r.compare(name, name, "iops", "lamina", "anchor", Some(0.85));
        }
        let x = r.ratios();
        let got: Vec<(&str, Option<Judgement>)> =
            x.iter().map(|r| (r.verdict, r.meets_goal)).collect();
        assert_eq!(
            got,
            vec![
                ("**Lamina loses**", Some(Judgement::NotDecided)),
                ("Lamina wins", Some(Judgement::Met)),
                ("even", Some(Judgement::Met)),
                ("not decided", Some(Judgement::NotDecided)),
            ]
        );
        assert_eq!(
            Judgement::of(&[6.0, 7.0], Better::Lower, 5.0),
            Judgement::Missed
        );
        assert_eq!(
            Judgement::of(&[f64::NAN], Better::Lower, 5.0),
            Judgement::Missed,
            "no valid value meets nothing"
        );
    }

    #[test]
    fn percentiles() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0]), 1.5);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.99), 99.0);
    }
}
