//! Label selectors: which volumes a schedule covers, which snapshots a bulk
//! delete takes. One syntax everywhere (API query parameters, the CLI's
//! `--selector`, schedule records): `key=value` terms joined by commas, all
//! of which must hold (`app=db,tier=gold`). Equality only: it is what the
//! issues ask for, and a richer syntax can be added without changing this
//! one's meaning.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use utoipa::ToSchema;

/// Labels that must all be present with these values. Empty selects
/// everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
}

/// Why a selector did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectorError(pub String);

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SelectorError {}

impl LabelSelector {
    /// Parse `key=value[,key=value...]`; the empty string selects
    /// everything. Keys and values are trimmed; a key named twice, an empty
    /// key or a term without `=` is refused.
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut match_labels = BTreeMap::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector { match_labels });
        }
        for term in s.split(',') {
            let Some((k, v)) = term.split_once('=') else {
                return Err(SelectorError(format!(
                    "selector term {:?} is not key=value",
                    term.trim()
                )));
            };
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() {
                return Err(SelectorError(format!(
                    "selector term {:?} has no key",
                    term.trim()
                )));
            }
            if v.contains('=') || v.starts_with('!') || k.ends_with('!') {
                return Err(SelectorError(format!(
                    "selector term {:?}: only key=value is supported",
                    term.trim()
                )));
            }
            if match_labels.insert(k.to_string(), v.to_string()).is_some() {
                return Err(SelectorError(format!("selector names {k:?} twice")));
            }
        }
        Ok(LabelSelector { match_labels })
    }

    /// Whether `labels` carry every term.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    }

    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty()
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (k, v) in &self.match_labels {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LabelSelector::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_and_prints_back() {
        let s = LabelSelector::parse(" tier = gold ,app=db").unwrap();
        assert_eq!(s.match_labels, labels(&[("app", "db"), ("tier", "gold")]));
        assert_eq!(s.to_string(), "app=db,tier=gold");
        assert_eq!(LabelSelector::parse(&s.to_string()).unwrap(), s);
        assert!(LabelSelector::parse("").unwrap().is_empty());
        assert_eq!(
            LabelSelector::parse("k=").unwrap().match_labels,
            labels(&[("k", "")])
        );
    }

    #[test]
    fn refuses_what_it_cannot_mean() {
        for bad in ["app", "=db", "app=db,", "a=1,a=2", "a!=1", "a==1", "a=b=c"] {
            let e = LabelSelector::parse(bad).unwrap_err();
            assert!(!e.0.is_empty(), "{bad}");
        }
    }

    #[test]
    fn every_term_must_hold() {
        let s = LabelSelector::parse("app=db,tier=gold").unwrap();
        assert!(s.matches(&labels(&[("app", "db"), ("tier", "gold"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("app", "db")])));
        assert!(!s.matches(&labels(&[("app", "db"), ("tier", "silver")])));
        assert!(LabelSelector::default().matches(&labels(&[])));
    }
}
