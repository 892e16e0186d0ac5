//! What tests of the daemon's schedules and metrics share: the clock file
//! `lamina serve --test-clock FILE` reads, and a reader of one sample of the
//! Prometheus text that `/metrics` serves.

use std::path::PathBuf;

/// The schedules' clock, in a file the daemon reads (Unix seconds).
pub struct TestClock {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl TestClock {
    pub fn new(t: i64) -> TestClock {
        let dir = tempfile::tempdir().unwrap();
        let c = TestClock {
            path: dir.path().join("clock"),
            _dir: dir,
        };
        c.set(t);
        c
    }

    /// Written whole then renamed: the daemon never reads half a number.
    pub fn set(&self, t: i64) {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, t.to_string()).unwrap();
        std::fs::rename(&tmp, &self.path).unwrap();
    }

    /// The file's path, for `--test-clock`.
    pub fn arg(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

/// The value of the sample `name{labels}` (or `name` alone, with no labels)
/// in a Prometheus text exposition.
pub fn prometheus_sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{labels}}}")
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(&key)?.strip_prefix(' ')?.trim().parse().ok())
}
