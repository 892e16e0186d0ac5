//! The report: every raw figure as JSON, and a markdown page of ratios with
//! the machine, the profile and the command that produced them.

use super::record::{Better, Ratio, Record};
use super::{Ctx, CASES};
use anyhow::Result;
use serde_json::{json, Value};
use std::fmt::Write;
use std::path::Path;

/// Where the run stands when its report is written.
pub struct RunSoFar<'a> {
    /// The command line that started it.
    pub command: String,
    /// Seconds per case run so far.
    pub timings: &'a [(String, f64)],
    /// Seconds since the run started.
    pub secs: f64,
    /// Cases asked for and not yet run: empty once the run is over.
    pub pending: Vec<&'a str>,
}

pub fn write(out: &Path, ctx: &Ctx, machine: &Value, run: &RunSoFar) -> Result<()> {
    let ratios = ctx.rec.ratios();
    let doc = json!({
        "command": run.command,
        "machine": machine,
        "profile": ctx.p,
        "seconds": run.secs,
        "case_seconds": run.timings,
        "records": ctx.rec.records,
        "ratios": ratios,
        "goals": ctx.rec.goals_checked().iter().map(|(g, r, met)| json!({"goal": g, "median": r.median(), "met": met})).collect::<Vec<_>>(),
        "notes": ctx.rec.notes,
        "cases_not_yet_run": run.pending,
    });
    std::fs::write(
        out.join("bench-suite.json"),
        serde_json::to_string_pretty(&doc)?,
    )?;
    let plotted = super::plot::depth(&ctx.rec, &out.join("bench-depth.png"))?;
    std::fs::write(
        out.join("benchmarks.md"),
        markdown(ctx, machine, run, &ratios, plotted),
    )?;
    Ok(())
}

fn fmt(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v.abs() >= 100.0 {
        format!("{:.0}", v)
    } else if v.abs() >= 10.0 {
        format!("{:.1}", v)
    } else if v.abs() >= 1.0 {
        format!("{:.2}", v)
    } else {
        format!("{:.3}", v)
    }
}

fn ratio_row(r: &Ratio) -> String {
    let goal = match (r.comparison.goal, r.meets_goal) {
        (Some(g), Some(j)) => format!(
            "{} {}× — {}",
            if r.better == Better::Higher {
                "≥"
            } else {
                "≤"
            },
            fmt(g),
            j.text()
        ),
        _ => String::new(),
    };
    format!(
        "| {} | {} {} | {} {} | **{}×** | {}–{} | {} | {} |\n",
        r.comparison.label,
        fmt(r.lamina_median),
        r.unit,
        fmt(r.anchor_median),
        r.unit,
        fmt(r.median),
        fmt(r.min),
        fmt(r.max),
        r.verdict,
        goal
    )
}

fn raw_row(r: &Record) -> String {
    let vals: Vec<String> = r.values.iter().map(|v| fmt(*v)).collect();
    let lo = r.values.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = r.values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "| {} | {} | {} {} | {}–{} | {} |\n",
        r.target,
        r.metric,
        fmt(r.median()),
        r.unit,
        fmt(lo),
        fmt(hi),
        vals.join(", ")
    )
}

fn markdown(ctx: &Ctx, machine: &Value, run: &RunSoFar, ratios: &[Ratio], plotted: bool) -> String {
    let (command, timings, secs, pending) = (&run.command, run.timings, run.secs, &run.pending);
    let mut m = String::new();
    let _ = writeln!(m, "# Benchmarks\n");
    if !pending.is_empty() {
        let _ = writeln!(
            m,
            "**Partial: the run has not finished (or did not finish). Cases not reached: {}.**\n",
            pending.join(", ")
        );
    }
    let _ = writeln!(
        m,
        "This page is the benchmark suite's last full run: Lamina against the \
         tools a user would pick instead, as ratios, case by case. The dated \
         measurements behind the design are in [bench-history.md](bench-history.md).\n\n\
         Written by the suite itself: `{command}` ({} profile, {:.0} min, {}). \
         Every figure here comes from that one run, on this machine:\n",
        ctx.p.name,
        secs / 60.0,
        machine["date"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        m,
        "- {} cores ({}), {} GiB memory, kernel {}\n- scratch files on {} ({})\n- Lamina commit {}\n",
        machine["cores"],
        machine["cpu"].as_str().unwrap_or(""),
        machine["memory_gib"],
        machine["kernel"].as_str().unwrap_or(""),
        machine["filesystem"].as_str().unwrap_or(""),
        machine["work_dir"].as_str().unwrap_or(""),
        machine["lamina_commit"].as_str().unwrap_or("")
    );
    if let Some(t) = machine["tools"].as_object() {
        let _ = writeln!(m, "Tools:");
        for (k, v) in t {
            let _ = writeln!(m, "- {k}: {}", v.as_str().unwrap_or(""));
        }
        m.push('\n');
    }
    let _ = writeln!(
        m,
        "How to read it: each comparison is a ratio **Lamina / anchor** of the same \
         metric, measured round by round with the two runs next to each other in time \
         ({} rounds of {} s per fio run); the table gives the median ratio and the \
         spread (lowest–highest round). Absolute numbers are for reference only: the \
         machine is small and shared. A verdict needs every round: all within 5% \
         either way is even, all beyond it says who wins (and says so when Lamina \
         loses), and rounds on both sides are **not decided**. Where `targets.md` \
         sets a goal the last column judges it the same way: met when every round \
         meets it, missed when none does, not decided otherwise. \
         Raw figures, per round, are in `bench-suite.json` beside this page.\n",
        ctx.p.rounds, ctx.p.seconds
    );
    let _ = writeln!(
        m,
        "Profile: `{}`\n",
        serde_json::to_string(&ctx.p).unwrap_or_default()
    );
    for (name, title, _) in CASES {
        let recs: Vec<&Record> = ctx.rec.records.iter().filter(|r| r.case == *name).collect();
        let notes: Vec<&String> = ctx
            .rec
            .notes
            .iter()
            .filter(|(c, _)| c == name)
            .map(|(_, n)| n)
            .collect();
        if recs.is_empty() && notes.is_empty() {
            continue;
        }
        let took = timings
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| *s)
            .unwrap_or(0.0);
        let _ = writeln!(m, "## {title}\n\n_{:.0} s of the run._\n", took);
        for n in &notes {
            let _ = writeln!(m, "- {n}");
        }
        if !notes.is_empty() {
            m.push('\n');
        }
        if *name == "depth" && plotted {
            let _ = writeln!(m, "![throughput against snapshot depth](bench-depth.png)\n");
        }
        let goals: Vec<_> = ctx
            .rec
            .goals_checked()
            .into_iter()
            .filter(|(g, _, _)| g.case == *name)
            .collect();
        if !goals.is_empty() {
            let _ = writeln!(m, "| measure | Lamina | target | |");
            let _ = writeln!(m, "|---|---|---|---|");
            for (g, r, met) in goals {
                let _ = writeln!(
                    m,
                    "| {} | {} {} | {} {} {} | {} |",
                    g.label,
                    fmt(r.median()),
                    r.unit,
                    if r.better == Better::Higher {
                        "≥"
                    } else {
                        "≤"
                    },
                    fmt(g.bound),
                    r.unit,
                    met.text()
                );
            }
            m.push('\n');
        }
        let rs: Vec<&Ratio> = ratios
            .iter()
            .filter(|r| r.comparison.case == *name)
            .collect();
        if !rs.is_empty() {
            let _ = writeln!(
                m,
                "| comparison | Lamina | anchor | ratio | spread | verdict | target |"
            );
            let _ = writeln!(m, "|---|---|---|---|---|---|---|");
            for r in rs {
                m.push_str(&ratio_row(r));
            }
            m.push('\n');
        }
        if !recs.is_empty() {
            let _ = writeln!(m, "<details><summary>raw figures</summary>\n");
            let _ = writeln!(m, "| target | metric | median | spread | rounds |");
            let _ = writeln!(m, "|---|---|---|---|---|");
            for r in recs {
                m.push_str(&raw_row(r));
            }
            let _ = writeln!(m, "\n</details>\n");
        }
    }
    let _ = writeln!(
        m,
        "## The engine in process\n\nFigures without the daemon or NBD in the way \
         (`cargo run --release -p lamina-bench -- engine`) are in \
         [bench-engine.md](bench-engine.md)."
    );
    m
}
