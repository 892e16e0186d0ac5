//! The harness's promises, checked against stand-ins for `lamina` (shell
//! scripts in `testdata/`, kept in git so that no test writes an executable
//! while another thread forks).

use crate::command::try_run_for;
use crate::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;
use std::time::Duration;

const STOPS: Lamina = Lamina::new(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/daemon-stops"
));
const IGNORES_SIGTERM: Lamina = Lamina::new(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/daemon-ignores-sigterm"
));
const EXITS: Lamina = Lamina::new(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/daemon-exits"
));

/// What `f` panicked with; the test fails if it did not panic.
fn panic_of(f: impl FnOnce()) -> String {
    let Err(p) = catch_unwind(AssertUnwindSafe(f)) else {
        panic!("expected a panic");
    };
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn a_command_past_its_limit_is_killed_and_named() {
    let e = try_run_for(Command::new("sleep").arg("600"), Duration::from_millis(200))
        .expect_err("sleep 600 cannot finish in its limit");
    assert!(e.contains("sleep") && e.contains("did not finish"), "{e}");
    let o = run(Command::new("sh").args(["-c", "echo out; echo err >&2; exit 7"]));
    assert_eq!(
        (o.code(), o.stdout.as_str(), o.stderr.as_str()),
        (Some(7), "out\n", "err\n")
    );
    assert_eq!(o.fails(7), "err\n");
}

#[test]
fn lamina_processes_see_no_lamina_variable() {
    std::env::set_var("LAMINA_TEST_SUPPORT_PROBE", "1");
    // The variable is there for other processes...
    let all = run(&mut Command::new("env")).ok();
    assert!(all.contains("LAMINA_TEST_SUPPORT_PROBE=1"), "{all}");
    // ...but neither the CLI nor the daemon sees it.
    let cli = run(&mut Lamina::new("env").cmd()).ok();
    assert!(!cli.contains("LAMINA_"), "{cli}");
    let d = STOPS.start();
    // The stand-in "answers" (its `volume list` succeeds) before it has
    // written its environment: wait for the line written after it.
    let log = wait_until("the stand-in's log", Duration::from_secs(30), || {
        let log = d.log();
        log.contains("fake daemon up").then_some(log)
    });
    assert!(!log.contains("LAMINA_"), "{log}");
    d.stop_cleanly();
}

/// The stand-in answers before its shell has set its SIGTERM trap; a
/// SIGTERM sent before the trap kills it by signal (CI caught that on a
/// busy machine). Its log line comes after the trap.
fn wait_up(d: &Daemon) {
    wait_until("the stand-in's log", Duration::from_secs(30), || {
        d.log().contains("fake daemon up").then_some(())
    });
}

#[test]
fn a_daemon_stops_on_sigterm_and_runs_the_cli_on_its_directory() {
    let d = STOPS.start();
    let o = run(d.cmd().arg("volume").arg("list"));
    assert!(o.what.contains(d.data().to_str().unwrap()), "{}", o.what);
    assert_eq!(d.ok(&["volume", "list"]), "");
    wait_up(&d);
    d.stop_cleanly();
    // Stopping twice is harmless; dropping a stopped daemon too.
    let mut d = STOPS.start();
    wait_up(&d);
    assert!(d.stop().is_some_and(|s| s.success()));
    assert_eq!(d.stop(), None);
}

#[test]
fn a_daemon_that_ignores_sigterm_fails_the_test_with_its_log() {
    let mut d = IGNORES_SIGTERM.start();
    // Up for real (it "answers" before it has written anything).
    wait_until("the stand-in's log", Duration::from_secs(30), || {
        d.log().contains("fake daemon up").then_some(())
    });
    d.stop_limit = Duration::from_millis(300);
    let e = panic_of(move || drop(d));
    assert!(
        e.contains("did not exit within") && e.contains("fake daemon up"),
        "{e}"
    );
}

#[test]
fn a_daemon_that_exits_at_start_is_an_error_with_its_log() {
    match EXITS.start_with(&["--listen", "127.0.0.1:1"]) {
        Err(StartError::Exited { status, log }) => {
            assert_eq!(status.code(), Some(3));
            assert!(log.contains("cannot bind"), "{log}");
        }
        Ok(_) => panic!("the stand-in cannot answer"),
        Err(e) => panic!("not the error wanted: {e}"),
    }
    let e = panic_of(|| drop(EXITS.start()));
    assert!(
        e.contains("exited with") && e.contains("cannot bind"),
        "{e}"
    );
}

#[test]
fn a_missing_tool_fails_naming_its_package() {
    need("sh", "dash");
    let e = panic_of(|| need("lamina-no-such-tool", "some-package"));
    assert!(e.contains("apt-get install some-package"), "{e}");
}

#[test]
fn a_wait_gives_up_naming_what_it_waited_for() {
    let mut polls = 0;
    let got = wait_until("the third poll", Duration::from_secs(60), || {
        polls += 1;
        (polls == 3).then_some(polls)
    });
    assert_eq!(got, 3);
    let e = panic_of(|| {
        wait_until("the moon", Duration::from_millis(100), || None::<()>);
    });
    assert!(e.contains("the moon"), "{e}");
}

#[test]
fn a_daemon_in_a_chosen_directory_logs_where_told_and_leaves_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");
    let mut d = STOPS
        .serve()
        .data_dir(&data)
        .log(&log)
        .env("RUST_LOG", "warn")
        .start()
        .unwrap();
    wait_up(&d);
    assert_eq!(d.data(), data);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("RUST_LOG=warn"), "{text}");
    assert!(!data.join("daemon.log").exists());
    assert!(d.try_stop().unwrap().is_some_and(|s| s.success()));
    drop(d);
    assert!(data.is_dir(), "the caller's data directory is kept");
}

#[test]
fn a_daemon_that_ignores_sigterm_is_an_error_to_try_stop() {
    let mut d = IGNORES_SIGTERM.start();
    wait_up(&d);
    d.stop_limit = Duration::from_millis(300);
    match d.try_stop() {
        Err(StopError::Hung { log, .. }) => assert!(log.contains("fake daemon up"), "{log}"),
        other => panic!("not the error wanted: {other:?}"),
    }
    assert!(!d.running(), "killed after the limit");
}
