//! A schedule's timing: a five-field cron expression read in an IANA time
//! zone (croner evaluates it; jiff holds the zone, from its bundled tz
//! database so a container without /usr/share/zoneinfo reads it the same).
//! A *slot* is one instant the expression names, in Unix seconds.

use crate::Error;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

#[derive(Debug, Clone)]
pub struct Timing {
    expr: String,
    zone_name: String,
    cron: Cron,
    zone: TimeZone,
}

impl Timing {
    /// Parse `expr` (minute hour day-of-month month day-of-week; names such
    /// as `MON` and shorthands such as `@hourly` are accepted) in `zone`.
    pub fn parse(expr: &str, zone: &str) -> Result<Timing, Error> {
        let parser = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build();
        let cron = parser.parse(expr).map_err(|e| Error::Cron {
            expr: expr.to_string(),
            reason: e.to_string(),
        })?;
        let tz = TimeZone::get(zone).map_err(|_| Error::TimeZone {
            zone: zone.to_string(),
        })?;
        let t = Timing {
            expr: expr.trim().to_string(),
            zone_name: zone.to_string(),
            cron,
            zone: tz,
        };
        // An expression such as "0 0 30 2 *" parses but names no instant.
        if t.next_after(0).is_none() {
            return Err(Error::NeverFires {
                expr: expr.to_string(),
            });
        }
        Ok(t)
    }

    pub fn expr(&self) -> &str {
        &self.expr
    }

    pub fn zone(&self) -> &str {
        &self.zone_name
    }

    fn zoned(&self, at: i64) -> Option<Zoned> {
        Some(Timestamp::from_second(at).ok()?.to_zoned(self.zone.clone()))
    }

    /// The first slot strictly after `at`.
    pub fn next_after(&self, at: i64) -> Option<i64> {
        let z = self.zoned(at)?;
        let next = self.cron.find_next_occurrence(&z, false).ok()?;
        Some(next.timestamp().as_second())
    }

    /// The last slot at or before `at`.
    pub fn last_at_or_before(&self, at: i64) -> Option<i64> {
        let z = self.zoned(at)?;
        let prev = self.cron.find_previous_occurrence(&z, true).ok()?;
        Some(prev.timestamp().as_second())
    }

    /// The next `n` slots after `at`.
    pub fn upcoming(&self, at: i64, n: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(n);
        let mut t = at;
        while out.len() < n {
            match self.next_after(t) {
                Some(s) => {
                    out.push(s);
                    t = s;
                }
                None => break,
            }
        }
        out
    }

    /// `at` as local time in the schedule's zone, RFC 3339 with offset.
    pub fn local(&self, at: i64) -> String {
        match self.zoned(at) {
            Some(z) => z.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string(),
            None => at.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_second()
    }

    #[test]
    fn hourly_in_utc() {
        let t = Timing::parse("0 * * * *", "UTC").unwrap();
        let at = ts("2026-11-24T10:15:30Z");
        assert_eq!(t.next_after(at), Some(ts("2026-11-24T11:00:00Z")));
        assert_eq!(t.last_at_or_before(at), Some(ts("2026-11-24T10:00:00Z")));
        // A slot is its own last slot, and not its own next one.
        let slot = ts("2026-11-24T10:00:00Z");
        assert_eq!(t.last_at_or_before(slot), Some(slot));
        assert_eq!(t.next_after(slot), Some(ts("2026-11-24T11:00:00Z")));
        assert_eq!(
            t.upcoming(at, 3),
            vec![
                ts("2026-11-24T11:00:00Z"),
                ts("2026-11-24T12:00:00Z"),
                ts("2026-11-24T13:00:00Z")
            ]
        );
    }

    #[test]
    fn a_zone_moves_the_slots() {
        // 02:30 every day in Tokyo (UTC+9, no DST) is 17:30 UTC the day before.
        let t = Timing::parse("30 2 * * *", "Asia/Tokyo").unwrap();
        assert_eq!(
            t.next_after(ts("2026-11-24T00:00:00Z")),
            Some(ts("2026-11-24T17:30:00Z"))
        );
        assert_eq!(
            t.local(ts("2026-11-24T17:30:00Z")),
            "2026-11-25T02:30:00+09:00"
        );
    }

    #[test]
    fn daylight_saving_never_doubles_a_slot() {
        // Europe/Paris goes back from 03:00 to 02:00 on 2026-10-25: the
        // wall-clock 02:30 happens twice, but a daily 02:30 fires once.
        let t = Timing::parse("30 2 * * *", "Europe/Paris").unwrap();
        let slots = t.upcoming(ts("2026-10-24T00:00:00Z"), 3);
        assert_eq!(slots.len(), 3);
        for w in slots.windows(2) {
            assert!(w[1] - w[0] >= 23 * 3600, "{slots:?}");
        }
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        for (expr, zone) in [
            ("* * * *", "UTC"),
            ("0 0 * * * *", "UTC"),
            ("61 * * * *", "UTC"),
            ("banana", "UTC"),
            ("", "UTC"),
        ] {
            assert!(
                matches!(Timing::parse(expr, zone), Err(Error::Cron { .. })),
                "{expr}"
            );
        }
        assert!(matches!(
            Timing::parse("0 * * * *", "Mars/Olympus"),
            Err(Error::TimeZone { .. })
        ));
        assert!(matches!(
            Timing::parse("0 0 30 2 *", "UTC"),
            Err(Error::NeverFires { .. })
        ));
    }
}
