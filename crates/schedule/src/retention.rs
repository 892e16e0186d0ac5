//! Which of a schedule's snapshots its retention removes.
//!
//! A snapshot stays when any rule keeps it (like restic's `forget`): it is
//! among the newest `keep_last`, or younger than `keep_for`. One that no
//! rule keeps goes, unless it is pinned (a linked clone depends on it, it
//! is exported, a copy reads it): then it stays and the plan says why.
//! Candidates are only the schedule's own snapshots: the caller selects
//! them by the schedule's id, never by name, so manual snapshots and other
//! schedules' are never candidates. The plan depends only on the current
//! candidates and the rules, so it converges: after keep-30 becomes keep-3,
//! the next plan leaves 3 (plus the pinned, each with its reason).

use crate::Error;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Keep the newest N.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
    /// Keep those younger than this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_for: Option<u64>,
}

impl Retention {
    /// At least one rule, and no rule that keeps nothing.
    pub fn validate(&self) -> Result<(), Error> {
        match (self.keep_last, self.keep_for) {
            (None, None) => Err(Error::NoRetention),
            (Some(0), _) => Err(Error::Retention(
                "keep-last 0 would delete every snapshot as it is made".into(),
            )),
            (_, Some(0)) => Err(Error::Retention(
                "keep-for 0 would delete every snapshot as it is made".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// One of the schedule's snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// Why it must stay whatever the rules say, if it must.
    pub pinned: Option<String>,
}

/// A snapshot the rules would remove but that stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// To delete, oldest first.
    pub delete: Vec<String>,
    /// Past retention but pinned.
    pub kept: Vec<Kept>,
}

/// The plan for `candidates` at `now`.
pub fn plan(retention: &Retention, candidates: &[Candidate], now: i64) -> Plan {
    let mut sorted: Vec<&Candidate> = candidates.iter().collect();
    // Newest first; equal times by name, so the plan is deterministic.
    sorted.sort_by(|a, b| b.created.cmp(&a.created).then(b.name.cmp(&a.name)));
    let mut plan = Plan::default();
    for (i, c) in sorted.iter().enumerate().rev() {
        let by_count = retention.keep_last.is_some_and(|n| (i as u64) < n as u64);
        let by_age = retention
            .keep_for
            .is_some_and(|secs| now.saturating_sub(c.created) < secs.min(i64::MAX as u64) as i64);
        if by_count || by_age {
            continue;
        }
        match &c.pinned {
            Some(reason) => plan.kept.push(Kept {
                name: c.name.clone(),
                reason: reason.clone(),
            }),
            None => plan.delete.push(c.name.clone()),
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snaps(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate {
                name: format!("s{i:03}"),
                created: 1000 + i as i64 * 3600,
                pinned: None,
            })
            .collect()
    }

    #[test]
    fn keep_last_keeps_the_newest() {
        let c = snaps(5);
        let p = plan(
            &Retention {
                keep_last: Some(2),
                keep_for: None,
            },
            &c,
            1_000_000,
        );
        assert_eq!(p.delete, vec!["s000", "s001", "s002"]);
        assert!(p.kept.is_empty());
    }

    #[test]
    fn either_rule_keeps() {
        let c = snaps(5); // hourly from t=1000
        let now = 1000 + 4 * 3600 + 10;
        // Younger than 2.5 h: s002, s003, s004; the newest one: s004.
        let r = Retention {
            keep_last: Some(1),
            keep_for: Some(9000),
        };
        assert_eq!(plan(&r, &c, now).delete, vec!["s000", "s001"]);
        let r = Retention {
            keep_last: Some(4),
            keep_for: Some(60),
        };
        assert_eq!(plan(&r, &c, now).delete, vec!["s000"]);
    }

    #[test]
    fn pinned_snapshots_stay_with_their_reason_and_do_not_shift_the_count() {
        let mut c = snaps(30);
        c[3].pinned = Some("linked clone db-test depends on it".into());
        let r = Retention {
            keep_last: Some(3),
            keep_for: None,
        };
        let p = plan(&r, &c, 1_000_000);
        assert_eq!(p.delete.len(), 26);
        assert!(!p.delete.contains(&"s003".to_string()));
        assert_eq!(
            p.kept,
            vec![Kept {
                name: "s003".into(),
                reason: "linked clone db-test depends on it".into()
            }]
        );
        // What stays: the 3 newest and the pinned one; planning again over
        // what stays deletes nothing more (it converges).
        let left: Vec<Candidate> = c
            .into_iter()
            .filter(|x| !p.delete.contains(&x.name))
            .collect();
        assert_eq!(left.len(), 4);
        let again = plan(&r, &left, 1_000_000);
        assert!(again.delete.is_empty());
    }

    #[test]
    fn retention_must_say_something() {
        assert_eq!(Retention::default().validate(), Err(Error::NoRetention));
        assert!(Retention {
            keep_last: Some(0),
            keep_for: None
        }
        .validate()
        .is_err());
        assert!(Retention {
            keep_last: None,
            keep_for: Some(0)
        }
        .validate()
        .is_err());
        assert!(Retention {
            keep_last: Some(24),
            keep_for: None
        }
        .validate()
        .is_ok());
    }
}
