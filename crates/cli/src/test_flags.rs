//! The hidden flags tests give `lamina serve` and `lamina schedule-controller`:
//! a scheduler's clock read from a file, and a crash at a named point. They
//! exist exactly when lamina-server has its test knobs: in the builds tests
//! run, never in a production build (`lamina_server::cfg_testing!` says how
//! Cargo decides).

use lamina_server::Config;

lamina_server::cfg_testing!({
    use std::path::PathBuf;

    /// Knobs for tests, hidden from `--help`.
    #[derive(clap::Args, Debug)]
    pub struct TestFlags {
        /// Tests only: read the scheduler's clock (Unix seconds) from FILE.
        #[arg(long, value_name = "FILE", hide = true)]
        test_clock: Option<PathBuf>,
        /// Tests only: abort, as kill -9 would, at this named point.
        #[arg(long, value_name = "POINT", hide = true)]
        test_crash_at: Option<String>,
    }

    impl TestFlags {
        /// The daemon's configuration with these knobs (`lamina serve`).
        pub fn apply(self, config: Config) -> Config {
            config.testing(lamina_server::Testing {
                clock_file: self.test_clock,
                crash_at: self.test_crash_at,
                hold_operations: None,
            })
        }

        /// The clock and the crash point (`lamina schedule-controller`).
        #[cfg(feature = "kubernetes")]
        pub fn schedules(self) -> (std::sync::Arc<dyn lamina_schedule::Clock>, Option<String>) {
            let clock: std::sync::Arc<dyn lamina_schedule::Clock> = match self.test_clock {
                Some(p) => std::sync::Arc::new(lamina_schedule::FileClock::new(p)),
                None => std::sync::Arc::new(lamina_schedule::SystemClock),
            };
            (clock, self.test_crash_at)
        }
    }
} else {
    /// No test flags in this build.
    #[derive(clap::Args, Debug)]
    pub struct TestFlags {}

    impl TestFlags {
        pub fn apply(self, config: Config) -> Config {
            config
        }

        #[cfg(feature = "kubernetes")]
        pub fn schedules(self) -> (std::sync::Arc<dyn lamina_schedule::Clock>, Option<String>) {
            (std::sync::Arc::new(lamina_schedule::SystemClock), None)
        }
    }
});
