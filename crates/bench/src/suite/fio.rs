//! fio, the load generator for every I/O figure: through its nbd engine
//! (libnbd) for anything served over NBD, or io_uring with O_DIRECT on a
//! plain file for the disk's own limit. One job, one connection.

use super::proc;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

#[derive(Clone, Debug)]
pub struct Job {
    /// fio's `rw`: randread, randwrite, read, write.
    pub rw: &'static str,
    pub bs: &'static str,
    pub iodepth: u32,
    pub seconds: f64,
    /// Stop after this many I/Os instead of after `seconds`.
    pub number_ios: Option<u64>,
    /// Limit to the first `size` bytes of the target.
    pub size: Option<u64>,
    pub seed: u64,
    /// Write fio's IOPS log to `{prefix}_iops.1.log`: the mean IOPS of each
    /// `SLICE_MS`, stamped with the Unix time in ms of the slice's end
    /// (`read_iops_log`).
    pub iops_log: Option<PathBuf>,
    /// Issue at most this many I/Os a second (fio's `rate_iops`): a steady
    /// load rather than the most the target takes.
    pub rate_iops: Option<u32>,
    /// Flush after every this many writes (fio's `fsync`: NBD_CMD_FLUSH
    /// through the nbd engine), as a file system or a database would.
    pub fsync: Option<u32>,
    /// Flush once at the end of the job (fio's `end_fsync`).
    pub end_fsync: bool,
}

/// The length of one entry of an IOPS log.
pub const SLICE_MS: u64 = 250;

impl Job {
    pub fn new(rw: &'static str, bs: &'static str, iodepth: u32, seconds: f64) -> Job {
        Job {
            rw,
            bs,
            iodepth,
            seconds,
            number_ios: None,
            size: None,
            seed: 1,
            iops_log: None,
            rate_iops: None,
            fsync: None,
            end_fsync: false,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Target {
    /// An NBD URI, e.g. `nbd+unix:///vol?socket=/path`.
    Nbd(String),
    /// A file of this size, opened with O_DIRECT.
    File(PathBuf, u64),
    /// An NBD URI reached from inside a network namespace: fio runs under
    /// `prefix` (`nsenter --net=...`).
    NbdIn { prefix: Vec<String>, uri: String },
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Outcome {
    pub iops: f64,
    pub mb_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub ios: u64,
    /// CPU time fio used, user and system, in seconds.
    pub cpu_s: f64,
}

fn command(job: &Job, target: &Target) -> Command {
    let mut c = match target {
        Target::NbdIn { prefix, .. } if !prefix.is_empty() => {
            let mut c = Command::new(&prefix[0]);
            c.args(&prefix[1..]).arg("fio");
            c
        }
        _ => Command::new("fio"),
    };
    c.args([
        "--name=bench",
        "--output-format=json",
        "--group_reporting",
        "--norandommap",
        "--verify_state_save=0",
    ]);
    c.arg(format!("--rw={}", job.rw))
        .arg(format!("--bs={}", job.bs))
        .arg(format!("--iodepth={}", job.iodepth))
        .arg(format!("--randseed={}", job.seed));
    if let Some(prefix) = &job.iops_log {
        c.arg(format!("--write_iops_log={}", prefix.display()))
            .arg(format!("--log_avg_msec={SLICE_MS}"))
            .arg("--log_unix_epoch=1");
    }
    if let Some(r) = job.rate_iops {
        c.arg(format!("--rate_iops={r}"));
    }
    if let Some(n) = job.fsync {
        c.arg(format!("--fsync={n}"));
    }
    if job.end_fsync {
        c.arg("--end_fsync=1");
    }
    match job.number_ios {
        Some(n) => {
            c.arg(format!("--number_ios={n}"));
        }
        None => {
            c.arg("--time_based")
                .arg(format!("--runtime={}ms", (job.seconds * 1000.0) as u64));
        }
    }
    match target {
        Target::Nbd(uri) | Target::NbdIn { uri, .. } => {
            c.arg("--ioengine=nbd").arg(format!("--uri={uri}"));
            if let Some(s) = job.size {
                c.arg(format!("--size={s}"));
            }
        }
        Target::File(path, size) => {
            c.args(["--ioengine=io_uring", "--direct=1"])
                .arg(format!("--filename={}", path.display()))
                .arg(format!("--size={}", job.size.unwrap_or(*size)));
        }
    }
    c
}

/// Run one job to completion.
pub fn run(job: &Job, target: &Target) -> Result<Outcome> {
    let out = proc::run(&mut command(job, target))?;
    parse(job, &out)
}

/// A job running in the background, for loads measured while something
/// else happens.
pub struct Running {
    job: Job,
    child: Option<Child>,
}

pub fn spawn(job: &Job, target: &Target) -> Result<Running> {
    // Jobs as threads of the one fio process: by default fio runs each job
    // in a forked process in a session of its own, which killing fio leaves
    // running, so a load would outlive the measurement it was for.
    let child = command(job, target)
        .arg("--thread")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting fio")?;
    Ok(Running {
        job: job.clone(),
        child: Some(child),
    })
}

impl Running {
    pub fn wait(mut self) -> Result<Outcome> {
        let out = self.child.take().unwrap().wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "fio failed: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        parse(&self.job, &stdout)
    }
}

impl Running {
    /// Stop the job now (SIGINT, as at the end of its run) and take its
    /// report: for a load that lasts as long as something else does. fio
    /// stopped so exits non-zero but still prints its report, which says
    /// whether the job met an error.
    pub fn interrupt(mut self) -> Result<Outcome> {
        let c = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child's pid; it touches no memory.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGINT);
        }
        let out = c.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        parse(&self.job, &stdout).with_context(|| {
            format!(
                "fio stopped with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGINT first: fio stops its jobs and closes its connections
            // as at the end of a run (an NBD server sees a clean
            // disconnect, not a connection cut mid-request); SIGKILL if it
            // has not gone within 10 s.
            // SAFETY: kill(2) on our own child's pid; it touches no memory.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGINT);
            }
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn parse(job: &Job, out: &str) -> Result<Outcome> {
    // The nbd engine prints a line before the JSON document.
    let start = out
        .find('{')
        .with_context(|| format!("no JSON in fio output: {out}"))?;
    let v: Value =
        serde_json::from_str(&out[start..]).with_context(|| format!("fio output: {out}"))?;
    let j = &v["jobs"][0];
    if j["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio reported error {}: {out}", j["error"]);
    }
    let side = if job.rw.contains("read") {
        &j["read"]
    } else {
        &j["write"]
    };
    let pct = |k: &str| {
        side["clat_ns"]["percentile"][k]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1e3
    };
    Ok(Outcome {
        iops: side["iops"].as_f64().unwrap_or(0.0),
        mb_per_s: side["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        p50_us: pct("50.000000"),
        p99_us: pct("99.000000"),
        max_us: side["clat_ns"]["max"].as_f64().unwrap_or(f64::NAN) / 1e3,
        ios: side["total_ios"].as_u64().unwrap_or(0),
        cpu_s: (j["usr_cpu"].as_f64().unwrap_or(0.0) + j["sys_cpu"].as_f64().unwrap_or(0.0))
            / 100.0
            * j["job_runtime"].as_f64().unwrap_or(0.0)
            / 1e3,
    })
}

/// One entry of an IOPS log: the slice `[end_ms - SLICE_MS, end_ms]` in
/// Unix time, and its mean IOPS.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slice {
    pub end_ms: u64,
    pub iops: f64,
}

/// The IOPS log a job with `iops_log: Some(prefix)` wrote.
pub fn read_iops_log(prefix: &std::path::Path) -> Result<Vec<Slice>> {
    let path = PathBuf::from(format!("{}_iops.1.log", prefix.display()));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_iops_log(&text).with_context(|| format!("in {}", path.display()))
}

fn parse_iops_log(text: &str) -> Result<Vec<Slice>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut f = l.split(',').map(str::trim);
            let (Some(t), Some(v)) = (f.next(), f.next()) else {
                bail!("not an IOPS log line: {l:?}");
            };
            Ok(Slice {
                end_ms: t.parse().with_context(|| format!("time in {l:?}"))?,
                iops: v.parse().with_context(|| format!("IOPS in {l:?}"))?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json_after_the_nbd_banner() {
        let out = r#"fio: connected to NBD server
{"jobs":[{"error":0,"usr_cpu":10.0,"sys_cpu":15.0,"job_runtime":2000,"read":{"iops":1000.5,"bw_bytes":4096000,"total_ios":5000,
"clat_ns":{"max":90000,"percentile":{"50.000000":20000,"99.000000":80000}}},
"write":{"iops":0}}]}"#;
        let o = parse(&Job::new("randread", "4k", 32, 1.0), out).unwrap();
        assert_eq!(o.iops, 1000.5);
        assert_eq!(o.mb_per_s, 4.096);
        assert_eq!((o.p50_us, o.p99_us, o.max_us), (20.0, 80.0, 90.0));
        assert_eq!(o.ios, 5000);
        assert_eq!(o.cpu_s, 0.5);
        assert!(parse(&Job::new("randread", "4k", 32, 1.0), "fio: nothing").is_err());
        let failed = r#"{"jobs":[{"error":5,"read":{}}]}"#;
        assert!(parse(&Job::new("randread", "4k", 32, 1.0), failed).is_err());
    }

    #[test]
    fn parses_an_iops_log_with_unix_times() {
        let log = "1795784022564, 38328, 1, 0, 0\n1795784022814, 34912, 1, 0, 0\n\n";
        let s = parse_iops_log(log).unwrap();
        assert_eq!(
            s,
            vec![
                Slice {
                    end_ms: 1795784022564,
                    iops: 38328.0
                },
                Slice {
                    end_ms: 1795784022814,
                    iops: 34912.0
                },
            ]
        );
        assert!(parse_iops_log("12\n").is_err());
        assert!(parse_iops_log("x, 1, 1, 0, 0\n").is_err());
    }
}
