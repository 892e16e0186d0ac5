//! Schedules end to end: `lamina schedule ...` against a real daemon whose
//! schedules read a clock the test moves (`serve --test-clock FILE`), so
//! hours pass in milliseconds and nothing sleeps through real time. Each
//! test waits for the daemon to record the slot it moved to, then checks
//! the snapshots themselves (`snapshot list --schedule`), not only the
//! daemon's own account of them.

use lamina_test_support::*;
use serde_json::Value;
use std::time::Duration;

const LAMINA: Lamina = Lamina::new(env!("CARGO_BIN_EXE_lamina"));
const H: i64 = 3600;
/// 2030-01-01T00:10:00Z: ten minutes past a slot of an hourly schedule.
const T0: i64 = 1_893_456_600;
/// The bound on waiting for a schedule's step: a hang guard, not a
/// measurement. Each step commits to the store (an fsync or more), and a
/// CI run of this test at 30 s gave up on one while a release build wrote
/// beside it.
const LIMIT: Duration = Duration::from_secs(120);

/// The daemon, its requests and operations logged, for the log a failure
/// shows.
fn start(clock: &TestClock, more: &[&str]) -> Daemon {
    let mut args = vec!["--test-clock", clock.arg()];
    args.extend(more);
    LAMINA
        .serve()
        .args(&args)
        .env("LAMINA_LOG", "info,lamina_server=debug")
        .start()
        .unwrap()
}

/// The hourly slot `n` hours after T0's (T0 is 10 minutes past it).
fn slot(n: i64) -> i64 {
    T0 - 600 + n * H
}

fn rfc(t: i64) -> String {
    let secs = t.rem_euclid(86_400);
    let days = t.div_euclid(86_400);
    // 2030-01-01 is day 21915 since the epoch; the tests stay in January.
    assert!(
        (21_915..21_915 + 31).contains(&days),
        "test times stay in January 2030"
    );
    format!(
        "2030-01-{:02}T{:02}:{:02}:{:02}Z",
        days - 21_915 + 1,
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// The name a schedule gives the snapshot of `slot`.
fn snap_name(schedule: &str, t: i64) -> String {
    let r = rfc(t);
    format!(
        "{schedule}-{}{}{}-{}{}",
        &r[0..4],
        &r[5..7],
        &r[8..10],
        &r[11..13],
        &r[14..16]
    )
}

fn schedule(d: &Daemon, name: &str) -> Value {
    d.json(&["schedule", "get", name])
}

/// Where `name` stands on `volume`.
fn volume_state(s: &Value, volume: &str) -> Option<(String, Option<String>)> {
    s["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["volume"] == volume)
        .map(|v| {
            (
                v["state"].as_str().unwrap_or_default().to_string(),
                v["last_slot"].as_str().map(String::from),
            )
        })
}

/// Wait until schedule `name` has recorded `state` for slot `t` on every
/// one of `volumes`.
#[track_caller]
fn wait_for(d: &Daemon, name: &str, volumes: &[&str], t: i64, state: &str) -> Value {
    let want = Some(rfc(t));
    wait_until(
        &format!("{name} {state} at {} on {volumes:?}", rfc(t)),
        LIMIT,
        || {
            let s = schedule(d, name);
            volumes
                .iter()
                .all(|v| volume_state(&s, v) == Some((state.to_string(), want.clone())))
                .then_some(s)
        },
    )
}

/// `(volume, snapshot)` of every snapshot schedule `name` made, sorted.
fn made_by(d: &Daemon, name: &str) -> Vec<(String, String)> {
    let v = d.json(&["snapshot", "list", "--schedule", name]);
    let mut out: Vec<(String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["volume"].as_str().unwrap().to_string(),
                s["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn names_on(all: &[(String, String)], volume: &str) -> Vec<String> {
    all.iter()
        .filter(|(v, _)| v == volume)
        .map(|(_, n)| n.clone())
        .collect()
}

fn runs_for<'a>(s: &'a Value, volume: &str) -> Vec<&'a Value> {
    s["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["volume"] == volume)
        .collect()
}

fn volumes(d: &Daemon, names: &[&str]) {
    for v in names {
        d.ok(&["volume", "create", v, "--size", "16M"]);
    }
}

/// Write 1 MiB into `volume` over NBD: its snapshots then hold data, which
/// a linked clone of one shares (a clone of an empty snapshot shares
/// nothing and depends on nothing).
fn fill(d: &Daemon, volume: &str) {
    need("qemu-io", "qemu-utils");
    let uri = d.attach(&["volume", "attach", volume]);
    qemu_io(&uri, &["write -P 0x5a 0 1M"]);
    d.ok(&["volume", "detach", volume]);
}

#[test]
fn every_hour_keep_3_leaves_exactly_3_and_touches_nothing_else() {
    let clock = TestClock::new(T0);
    let d = start(&clock, &[]);
    volumes(&d, &["a", "b", "c"]);
    d.ok(&["snapshot", "create", "a", "manual"]);
    // Another schedule on the same volume, at half past: its snapshots are
    // not hourly's, and its own retention keeps one.
    d.ok(&[
        "schedule",
        "create",
        "other",
        "--cron",
        "30 * * * *",
        "--keep",
        "1",
        "--volume",
        "a",
    ]);
    let out = d.ok(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--keep",
        "3",
        "--volume",
        "a",
        "--volume",
        "b",
        "--label",
        "tier=gold",
    ]);
    assert!(out.contains("created schedule hourly"), "{out}");
    // The same spec again is no change; another spec under the name is refused.
    let again = d.ok(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--keep",
        "3",
        "--volume",
        "a",
        "--volume",
        "b",
        "--label",
        "tier=gold",
    ]);
    assert!(again.contains("exists already"), "{again}");
    let e = d.err(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--keep",
        "4",
        "--volume",
        "a",
    ]);
    assert!(e.contains("another spec"), "{e}");

    for h in 1..=6 {
        clock.set(slot(h) + 5);
        wait_for(&d, "hourly", &["a", "b"], slot(h), "done");
        wait_for(&d, "other", &["a"], slot(h) - 1800, "done");
    }
    let mine = made_by(&d, "hourly");
    let want: Vec<String> = (4..=6).map(|h| snap_name("hourly", slot(h))).collect();
    assert_eq!(names_on(&mine, "a"), want);
    assert_eq!(names_on(&mine, "b"), want);
    assert!(names_on(&mine, "c").is_empty());
    // The manual snapshot and other's are untouched; c has nothing.
    let a_all: Vec<String> = d
        .json(&["snapshot", "list", "a"])
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert!(a_all.contains(&"manual".to_string()), "{a_all:?}");
    assert_eq!(
        names_on(&made_by(&d, "other"), "a"),
        vec![snap_name("other", slot(6) - 1800)]
    );
    assert_eq!(a_all.len(), 5, "manual + 3 hourly + 1 other: {a_all:?}");
    assert!(d
        .json(&["snapshot", "list", "c"])
        .as_array()
        .unwrap()
        .is_empty());
    // Each snapshot carries the schedule's labels and its id, not its name.
    let s = schedule(&d, "hourly");
    let id = s["id"].as_str().unwrap().to_string();
    let snap = d.json(&["snapshot", "get", "a", &want[0]]);
    assert_eq!(snap["labels"]["tier"], "gold");
    assert_eq!(snap["labels"]["lamina.io/schedule"], id.as_str());
    // Every run is recorded: six per volume, three of them deleting one.
    let runs = runs_for(&s, "a");
    assert_eq!(runs.len(), 6, "{runs:?}");
    assert!(runs.iter().all(|r| r["outcome"] == "taken"));
    assert_eq!(
        runs.iter()
            .filter(|r| !r["deleted"].as_array().unwrap().is_empty())
            .count(),
        3
    );
    assert_eq!(s["next_runs"][0], "2030-01-01T07:00:00+00:00");
}

#[test]
fn a_daemon_down_over_five_slots_takes_one_catch_up() {
    let clock = TestClock::new(T0);
    let mut d = start(&clock, &[]);
    volumes(&d, &["a"]);
    d.ok(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--keep",
        "24",
        "--volume",
        "a",
    ]);
    clock.set(slot(1) + 5);
    wait_for(&d, "hourly", &["a"], slot(1), "done");
    d.stop();
    // Down over the slots of hours 2 to 6; back at 6:30.
    clock.set(slot(6) + 1800);
    d.start_again();
    let s = wait_for(&d, "hourly", &["a"], slot(6), "done");
    assert_eq!(
        names_on(&made_by(&d, "hourly"), "a"),
        vec![snap_name("hourly", slot(1)), snap_name("hourly", slot(6))]
    );
    let last = &runs_for(&s, "a")[0];
    assert_eq!(last["catch_up"], true, "{last}");
    assert_eq!(last["slot"], rfc(slot(6)).as_str());
    // And the next slot is on time again, not a second catch-up.
    clock.set(slot(7));
    let s = wait_for(&d, "hourly", &["a"], slot(7), "done");
    assert_eq!(runs_for(&s, "a")[0]["catch_up"], false);
    assert_eq!(made_by(&d, "hourly").len(), 3);
}

#[test]
fn a_clock_set_back_resumes_at_the_next_slot_as_announced() {
    // T0 is a whole minute: the schedule takes its slot at once, which
    // shows it covers the volume before the clock moves.
    let clock = TestClock::new(T0);
    let d = start(&clock, &[]);
    volumes(&d, &["a"]);
    d.ok(&[
        "schedule",
        "create",
        "minutely",
        "--cron",
        "* * * * *",
        "--keep",
        "100",
        "--volume",
        "a",
    ]);
    wait_for(&d, "minutely", &["a"], T0, "done");
    // The clock runs an hour ahead: that minute's slot is taken.
    clock.set(T0 + H + 5);
    wait_for(&d, "minutely", &["a"], T0 + H, "done");
    // Corrected to 00:11:05: the schedule starts afresh from now.
    clock.set(T0 + 65);
    let s = wait_until(
        "the track restarted after the clock was set back",
        LIMIT,
        || {
            let s = schedule(&d, "minutely");
            (volume_state(&s, "a") == Some(("idle".to_string(), None))).then_some(s)
        },
    );
    let announced = rfc(T0 + 120).replace('Z', "+00:00");
    assert_eq!(s["next_runs"][0], announced.as_str(), "{s}");
    // The announced slot is taken, and only it (not 00:11, no catch-up).
    clock.set(T0 + 125);
    let s = wait_for(&d, "minutely", &["a"], T0 + 120, "done");
    // (Runs are ordered by their time: the one taken ahead comes first.)
    let run = |s: &Value, t: i64| -> Value {
        runs_for(s, "a")
            .into_iter()
            .rfind(|r| r["slot"] == rfc(t).as_str())
            .cloned()
            .unwrap_or_else(|| panic!("no run for {}: {s}", rfc(t)))
    };
    assert_eq!(run(&s, T0 + 120)["catch_up"], false, "{s}");
    assert_eq!(
        names_on(&made_by(&d, "minutely"), "a"),
        vec![
            snap_name("minutely", T0),
            snap_name("minutely", T0 + 120),
            snap_name("minutely", T0 + H)
        ]
    );
    // The slot taken while the clock ran ahead is found, not taken twice.
    clock.set(T0 + H + 5);
    let s = wait_for(&d, "minutely", &["a"], T0 + H, "done");
    assert!(
        runs_for(&s, "a")
            .iter()
            .any(|r| r["slot"] == rfc(T0 + H).as_str() && r["outcome"] == "existed"),
        "{s}"
    );
    assert_eq!(made_by(&d, "minutely").len(), 3);
}

#[test]
fn killed_mid_run_the_slot_is_finished_at_restart_never_doubled() {
    for (point, outcome) in [
        ("schedule-after-claim", "taken"),
        ("schedule-after-snapshot", "existed"),
    ] {
        let clock = TestClock::new(T0);
        let mut d = start(&clock, &["--test-crash-at", point]);
        volumes(&d, &["a"]);
        d.ok(&[
            "schedule",
            "create",
            "hourly",
            "--cron",
            "0 * * * *",
            "--keep",
            "5",
            "--volume",
            "a",
        ]);
        clock.set(slot(1) + 5);
        let status = d
            .wait_exit(LIMIT)
            .unwrap_or_else(|| panic!("the daemon did not crash at {point}"));
        assert!(!status.success());
        assert!(
            d.log().contains(&format!("crashing at {point}")),
            "{}",
            d.log()
        );
        d.kill9();
        d.set_extra(&["--test-clock", clock.arg()]);
        d.start_again();
        let s = wait_for(&d, "hourly", &["a"], slot(1), "done");
        assert_eq!(
            names_on(&made_by(&d, "hourly"), "a"),
            vec![snap_name("hourly", slot(1))],
            "{point}"
        );
        let runs = runs_for(&s, "a");
        assert_eq!(runs.len(), 1, "{point}: {runs:?}");
        assert_eq!(runs[0]["outcome"], outcome, "{point}");
    }
}

#[test]
fn retention_keeps_what_clones_depend_on_converges_and_survives_a_rename() {
    let clock = TestClock::new(T0);
    let d = start(&clock, &[]);
    volumes(&d, &["a"]);
    fill(&d, "a");
    d.ok(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--keep",
        "30",
        "--volume",
        "a",
    ]);
    for h in 1..=8 {
        clock.set(slot(h) + 5);
        wait_for(&d, "hourly", &["a"], slot(h), "done");
    }
    assert_eq!(made_by(&d, "hourly").len(), 8);
    let pinned = snap_name("hourly", slot(2));
    // Each holds the 1 MiB written before, shared with the volume: none of
    // it is its own, so deleting it alone would free nothing.
    let snap = d.json(&["snapshot", "get", "a", &pinned]);
    assert_eq!(snap["allocated_bytes"], 1 << 20, "{snap}");
    assert_eq!(snap["shared_bytes"], 1 << 20, "{snap}");
    assert_eq!(snap["exclusive_bytes"], 0, "{snap}");
    d.ok(&[
        "clone",
        "create",
        "x",
        "--from-snapshot",
        &format!("a/{pinned}"),
    ]);
    // keep-30 becomes keep-3: the next run leaves exactly the 3 newest,
    // and the one a clone depends on, saying why.
    d.ok(&["schedule", "update", "hourly", "--keep", "3"]);
    clock.set(slot(9) + 5);
    let s = wait_for(&d, "hourly", &["a"], slot(9), "done");
    let mut want = vec![pinned.clone()];
    want.extend((7..=9).map(|h| snap_name("hourly", slot(h))));
    assert_eq!(names_on(&made_by(&d, "hourly"), "a"), want);
    let last = &runs_for(&s, "a")[0];
    assert_eq!(last["deleted"].as_array().unwrap().len(), 5, "{last}");
    let kept = last["kept"].as_array().unwrap();
    assert_eq!(kept.len(), 1, "{last}");
    assert_eq!(kept[0]["snapshot"], pinned.as_str());
    assert!(kept[0]["reason"].as_str().unwrap().contains('x'), "{last}");
    // Renamed, it keeps its snapshots under its retention: the next run
    // (named after the new name) deletes the oldest old-named one.
    let id = s["id"].clone();
    d.ok(&["schedule", "update", "hourly", "--rename", "nightly-ish"]);
    let s = schedule(&d, "nightly-ish");
    assert_eq!(s["id"], id);
    assert_eq!(made_by(&d, "nightly-ish").len(), 4);
    d.err(&["schedule", "get", "hourly"]);
    clock.set(slot(10) + 5);
    wait_for(&d, "nightly-ish", &["a"], slot(10), "done");
    let mut want = vec![
        pinned.clone(),
        snap_name("hourly", slot(8)),
        snap_name("hourly", slot(9)),
    ];
    want.push(snap_name("nightly-ish", slot(10)));
    want.sort();
    assert_eq!(names_on(&made_by(&d, "nightly-ish"), "a"), want);
}

#[test]
fn a_failed_run_is_retried_then_given_up_and_every_attempt_recorded() {
    let clock = TestClock::new(T0);
    let d = start(&clock, &[]);
    volumes(&d, &["a"]);
    // A manual snapshot already has the name slot 1 would take.
    let taken = snap_name("hourly", slot(1));
    d.ok(&["snapshot", "create", "a", &taken]);
    d.ok(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--keep",
        "3",
        "--volume",
        "a",
        "--retry-window",
        "5min",
    ]);
    clock.set(slot(1));
    wait_for(&d, "hourly", &["a"], slot(1), "failed");
    // The first retry is 15 s later; the window closes 5 min after the slot.
    clock.set(slot(1) + 20);
    wait_until("a second failed attempt", LIMIT, || {
        let s = schedule(&d, "hourly");
        (runs_for(&s, "a").len() == 2).then_some(())
    });
    clock.set(slot(1) + 301);
    let s = wait_for(&d, "hourly", &["a"], slot(1), "gave-up");
    let runs = runs_for(&s, "a");
    let outcomes: Vec<&str> = runs
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["gave-up", "failed", "failed"], "{runs:?}");
    assert!(
        runs[2]["error"].as_str().unwrap().contains("exists"),
        "{runs:?}"
    );
    // The manual snapshot is untouched, and the next slot works.
    clock.set(slot(2));
    wait_for(&d, "hourly", &["a"], slot(2), "done");
    assert_eq!(
        names_on(&made_by(&d, "hourly"), "a"),
        vec![snap_name("hourly", slot(2))]
    );
    d.ok(&["snapshot", "get", "a", &taken]);
}

#[test]
fn deleting_a_schedule_asks_what_to_do_with_its_snapshots() {
    let clock = TestClock::new(T0);
    let d = start(&clock, &[]);
    volumes(&d, &["a"]);
    fill(&d, "a");
    for name in ["keepme", "dropme"] {
        d.ok(&[
            "schedule",
            "create",
            name,
            "--cron",
            "0 * * * *",
            "--keep",
            "5",
            "--volume",
            "a",
        ]);
    }
    for h in 1..=2 {
        clock.set(slot(h));
        wait_for(&d, "keepme", &["a"], slot(h), "done");
        wait_for(&d, "dropme", &["a"], slot(h), "done");
    }
    let e = d.err(&["schedule", "delete", "keepme"]);
    assert!(
        e.contains("--keep-snapshots") && e.contains("2 on the volumes"),
        "{e}"
    );
    assert_eq!(made_by(&d, "keepme").len(), 2);

    let kept = made_by(&d, "keepme");
    d.ok(&["schedule", "delete", "keepme", "--keep-snapshots"]);
    d.err(&["schedule", "get", "keepme"]);
    for (v, n) in &kept {
        d.ok(&["snapshot", "get", v, n]);
    }
    // A new schedule of that name is another schedule: it does not adopt them.
    clock.set(slot(2) + 5);
    d.ok(&[
        "schedule",
        "create",
        "keepme",
        "--cron",
        "0 * * * *",
        "--keep",
        "1",
        "--volume",
        "a",
    ]);
    assert!(made_by(&d, "keepme").is_empty());

    let pinned = snap_name("dropme", slot(1));
    d.ok(&[
        "clone",
        "create",
        "y",
        "--from-snapshot",
        &format!("a/{pinned}"),
    ]);
    let r = d.json(&["schedule", "delete", "dropme", "--delete-snapshots"]);
    assert_eq!(
        r["deleted"],
        serde_json::json!([format!("a/{}", snap_name("dropme", slot(2)))])
    );
    assert_eq!(r["kept"][0]["snapshot"], format!("a/{pinned}"));
    d.ok(&["snapshot", "get", "a", &pinned]);
    // Deleting what is gone succeeds and says so.
    let out = d.ok(&["schedule", "delete", "dropme", "--delete-snapshots"]);
    assert!(out.contains("does not exist"), "{out}");
}

#[test]
fn bad_schedules_and_reserved_labels_are_refused_and_change_nothing() {
    let clock = TestClock::new(T0);
    let d = start(&clock, &[]);
    volumes(&d, &["a"]);
    for (args, says) in [
        (
            vec!["--cron", "0 * * *", "--keep", "3", "--volume", "a"],
            "five fields",
        ),
        (
            vec![
                "--cron",
                "0 * * * *",
                "--time-zone",
                "Mars/Olympus",
                "--keep",
                "3",
                "--volume",
                "a",
            ],
            "IANA",
        ),
        (
            vec!["--cron", "0 0 30 2 *", "--keep", "3", "--volume", "a"],
            "never fires",
        ),
        (
            vec!["--cron", "0 * * * *", "--volume", "a"],
            "keep-last, keep-for",
        ),
        (
            vec!["--cron", "0 * * * *", "--keep", "0", "--volume", "a"],
            "keep-last 0",
        ),
        (vec!["--cron", "0 * * * *", "--keep", "3"], "give one"),
        (
            vec![
                "--cron",
                "0 * * * *",
                "--keep",
                "3",
                "--volume",
                "a",
                "--label",
                "lamina.io/x=1",
            ],
            "lamina.io/",
        ),
    ] {
        let mut a = vec!["schedule", "create", "s"];
        a.extend(args);
        let e = d.err(&a);
        assert!(e.contains(says), "{a:?}: {e}");
    }
    let long = "n".repeat(64);
    let e = d.err(&[
        "schedule",
        "create",
        &long,
        "--cron",
        "0 * * * *",
        "--keep",
        "1",
        "--volume",
        "a",
    ]);
    assert!(e.contains("at most 63"), "{e}");
    assert!(d.json(&["schedule", "list"]).as_array().unwrap().is_empty());
    // Nobody but a schedule puts its labels on a snapshot.
    for label in ["lamina.io/schedule=sch-1", "lamina.io/slot=1"] {
        let e = d.err(&["snapshot", "create", "a", "s", "--label", label]);
        assert!(e.contains("reserved"), "{e}");
        let e = d.err(&["snapshot", "create-group", "g", "a", "--label", label]);
        assert!(e.contains("reserved"), "{e}");
    }
    assert!(d
        .json(&["snapshot", "list", "a"])
        .as_array()
        .unwrap()
        .is_empty());
    let e = d.err(&["snapshot", "list", "--schedule", "nope"]);
    assert!(e.contains("no schedule"), "{e}");
}

#[test]
fn a_schedule_covers_the_volumes_its_selector_picks_from_when_they_match() {
    let clock = TestClock::new(T0);
    let d = start(&clock, &[]);
    d.ok(&[
        "volume",
        "create",
        "db",
        "--size",
        "16M",
        "--label",
        "tier=gold",
    ]);
    d.ok(&[
        "volume",
        "create",
        "web",
        "--size",
        "16M",
        "--label",
        "tier=gold",
    ]);
    d.ok(&["volume", "create", "tmp", "--size", "16M"]);
    d.ok(&[
        "schedule",
        "create",
        "gold",
        "--cron",
        "0 * * * *",
        "--keep",
        "24",
        "--selector",
        "tier=gold",
    ]);
    clock.set(slot(1));
    wait_for(&d, "gold", &["db", "web"], slot(1), "done");
    // tmp gets the label at 1:30: covered from then on, so its first slot is 2:00.
    clock.set(slot(1) + 1800);
    d.ok(&["volume", "label", "tmp", "tier=gold"]);
    // web loses it: no longer covered, its snapshots stay.
    d.ok(&["volume", "label", "web", "tier-"]);
    wait_until("tmp covered", LIMIT, || {
        volume_state(&schedule(&d, "gold"), "tmp").map(|_| ())
    });
    clock.set(slot(2));
    wait_for(&d, "gold", &["db", "tmp"], slot(2), "done");
    let mine = made_by(&d, "gold");
    assert_eq!(names_on(&mine, "db").len(), 2);
    assert_eq!(names_on(&mine, "tmp"), vec![snap_name("gold", slot(2))]);
    assert_eq!(names_on(&mine, "web"), vec![snap_name("gold", slot(1))]);
    assert!(volume_state(&schedule(&d, "gold"), "web").is_none());
}

#[test]
fn past_the_high_water_mark_scheduled_snapshots_pause_with_the_reason() {
    need("qemu-io", "qemu-utils");
    let clock = TestClock::new(T0);
    let mut d = start(&clock, &["--high-water", "4M"]);
    volumes(&d, &["a"]);
    d.ok(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--keep",
        "5",
        "--volume",
        "a",
    ]);
    clock.set(slot(1));
    wait_for(&d, "hourly", &["a"], slot(1), "done");
    assert!(d.json(&["status"])["warnings"]
        .as_array()
        .unwrap()
        .is_empty());
    // 6 MiB of data: the pool is past its 4 MiB mark.
    let uri = d.attach(&["volume", "attach", "a"]);
    qemu_io(&uri, &["write -P 0x11 0 6M"]);
    d.ok(&["volume", "detach", "a"]);
    let status = d.ok(&["status"]);
    assert!(
        status.contains("warning:") && status.contains("high-water mark of 4.0 MiB"),
        "{status}"
    );
    clock.set(slot(2));
    let s = wait_for(&d, "hourly", &["a"], slot(2), "failed");
    let last = &runs_for(&s, "a")[0];
    assert_eq!(last["outcome"], "paused", "{last}");
    assert!(
        last["error"].as_str().unwrap().contains("high-water"),
        "{last}"
    );
    assert_eq!(made_by(&d, "hourly").len(), 1);
    // With room again (a higher mark), the retry within the window takes it.
    d.stop();
    d.set_extra(&["--test-clock", clock.arg(), "--high-water", "90%"]);
    d.start_again();
    clock.set(slot(2) + 20);
    let s = wait_for(&d, "hourly", &["a"], slot(2), "done");
    assert_eq!(runs_for(&s, "a")[0]["outcome"], "taken");
    assert_eq!(made_by(&d, "hourly").len(), 2);
}

#[test]
fn metrics_count_operations_and_schedule_runs_exactly() {
    let clock = TestClock::new(T0);
    let d = start(&clock, &[]);
    volumes(&d, &["a", "b"]);
    d.ok(&["snapshot", "create", "a", "manual"]);
    d.err(&["snapshot", "create", "nope", "s"]);
    d.ok(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--keep",
        "1",
        "--volume",
        "a",
        "--volume",
        "b",
    ]);
    for h in 1..=2 {
        clock.set(slot(h));
        wait_for(&d, "hourly", &["a", "b"], slot(h), "done");
    }
    let m = d.ok(&["metrics"]);
    let ops = |kind: &str, outcome: &str| {
        prometheus_sample(
            &m,
            "lamina_operations_total",
            &format!("kind=\"{kind}\",outcome=\"{outcome}\""),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(ops("create-volume", "succeeded"), 2.0, "{m}");
    // manual, and 2 slots x 2 volumes; the one of a missing volume failed
    assert_eq!(ops("create-snapshot", "succeeded"), 5.0, "{m}");
    assert_eq!(ops("create-snapshot", "failed"), 1.0, "{m}");
    // keep 1: slot 1's two snapshots deleted at slot 2
    assert_eq!(ops("delete-snapshot", "succeeded"), 2.0, "{m}");
    assert_eq!(
        prometheus_sample(
            &m,
            "lamina_schedule_runs_total",
            "schedule=\"hourly\",outcome=\"taken\""
        ),
        Some(4.0),
        "{m}"
    );
    assert_eq!(
        prometheus_sample(&m, "lamina_volumes", ""),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        prometheus_sample(&m, "lamina_snapshots", ""),
        Some(3.0),
        "{m}"
    );
    assert!(
        prometheus_sample(&m, "lamina_pool_used_bytes", "").unwrap() > 0.0,
        "{m}"
    );
    assert!(
        prometheus_sample(
            &m,
            "lamina_operation_duration_seconds_count",
            "kind=\"create-snapshot\""
        ) == Some(6.0),
        "{m}"
    );
}
