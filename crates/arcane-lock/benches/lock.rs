//! Benchmark: the cost of one acquire+release of the workspace lock against the raw
//! syscall floor, and acquisition latency under contention.
//!
//! Run: `cargo bench -p arcane-lock --bench lock` (a few seconds).
//!
//! * **Floor**: what any exclusive lock file with an advisory lock must do at least —
//!   `open(O_CREAT|O_EXCL)`, `flock(LOCK_EX|LOCK_NB)`, `write` the same record bytes,
//!   `fsync` (the same fsync policy as the lock: one data fsync, no directory fsync),
//!   `unlink`, `close`.
//! * **Lock**: `WorkspaceLock::acquire` + `release` as a process that locks a workspace
//!   again and again pays for them (path checks on its cached handles, registry, the
//!   record written and fsynced, sentinel `flock` + inode recheck, the record's exclusive
//!   link, the holder's facts, identity-checked removal).
//!
//! Both run in the same process on the same filesystem, interleaved in rounds, and the
//! ratio of their medians is printed. Then 8 copies of this binary contend, first for
//! one file with a plain blocking `flock` loop (the baseline), then for one workspace
//! (each acquiring with a wait, holding for a moment, releasing); the p50/p99/max
//! acquisition latency and the throughput of each are printed. Last, a summary puts
//! each row beside its target (issue 31) and says whether it meets it.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::disallowed_methods)] // it starts contending processes

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arcane_lock::{AcquireOptions, WorkspaceLock};
use arcane_report::NullSink;
use rustix::fs::{FlockOperation, Mode, OFlags};

const ROUNDS: usize = 5;
const PER_ROUND: usize = 100;
const CONTENDERS: usize = 8;
const PER_CONTENDER: usize = 60;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    for (flag, raw) in [("--child", false), ("--raw-child", true)] {
        if let Some(i) = args.iter().position(|a| a == flag) {
            child(
                Path::new(&args[i + 1]),
                args[i + 2].parse().unwrap_or(1),
                Path::new(&args[i + 3]),
                raw,
            );
            return;
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("arcane-lock-bench-")
        .tempdir()
        .expect("temp dir");
    let mut rows = Vec::new();
    let disk = single(dir.path(), "the temporary directory's filesystem");
    // On tmpfs fsync costs nothing, so this shows the lock's own syscall overhead.
    if let Ok(shm) = tempfile::Builder::new()
        .prefix("arcane-lock-bench-")
        .tempdir_in("/dev/shm")
    {
        let tmpfs = single(shm.path(), "tmpfs (fsync is free: the lock's own overhead)");
        rows.push((
            "acquire+release on tmpfs, × floor",
            tmpfs,
            Target::AtMost(2.0),
        ));
    }
    rows.push((
        "acquire+release on disk, × floor",
        disk,
        Target::AtMost(1.3),
    ));
    let raw = contended(dir.path(), true);
    let lock = contended(dir.path(), false);
    println!(
        "  p99 ratio arcane-lock / raw flock: {:.2}× (target ≤ 2×)",
        lock.p99.as_secs_f64() / raw.p99.as_secs_f64()
    );
    rows.push((
        "8 contenders: throughput, × raw flock",
        lock.throughput / raw.throughput,
        Target::AtLeast(0.5),
    ));
    rows.push((
        "8 contenders: p99 latency, × raw flock",
        lock.p99.as_secs_f64() / raw.p99.as_secs_f64(),
        Target::AtMost(2.0),
    ));
    println!("summary (targets of issue 31):");
    for (what, value, target) in rows {
        let (sign, bound, met) = match target {
            Target::AtMost(bound) => ("≤", bound, value <= bound),
            Target::AtLeast(bound) => ("≥", bound, value >= bound),
        };
        println!(
            "  {what:<40} {value:>6.2}×  target {sign} {bound}×  {}",
            if met { "met" } else { "NOT MET" }
        );
    }
}

/// A row's target: its ratio at most or at least this.
enum Target {
    AtMost(f64),
    AtLeast(f64),
}

/// What one contention round measured.
struct Contention {
    p99: Duration,
    throughput: f64,
}

/// Runs the single-process rounds on `root`'s filesystem; the ratio of the medians.
fn single(root: &Path, label: &str) -> f64 {
    let ws = root.join("single");
    std::fs::create_dir_all(&ws).expect("workspace");
    let options = AcquireOptions::new("bench").expect("name");
    // A record of the same size as the lock's own.
    let probe = WorkspaceLock::acquire(&ws, &options, &NullSink).expect("acquire");
    let bytes = std::fs::read(ws.join(".arcane/workspace-operation.lock.json")).expect("record");
    probe.release().expect("release");
    let floor_path = root.join("floor.lock");

    let mut lock_samples = Vec::new();
    let mut floor_samples = Vec::new();
    // Alternate one floor and one lock iteration so disk noise hits both alike.
    for _ in 0..ROUNDS * PER_ROUND {
        let t = Instant::now();
        floor_once(&floor_path, &bytes);
        floor_samples.push(t.elapsed());
        let t = Instant::now();
        let lock = WorkspaceLock::acquire(&ws, &options, &NullSink).expect("acquire");
        lock.release().expect("release");
        lock_samples.push(t.elapsed());
    }
    let floor = median(&mut floor_samples);
    let lock = median(&mut lock_samples);
    println!(
        "acquire+release, single process, on {label} ({} samples each, median):",
        ROUNDS * PER_ROUND
    );
    println!("  raw syscall floor   {:>9.1} µs", micros(floor));
    println!("  arcane-lock         {:>9.1} µs", micros(lock));
    println!(
        "  ratio               {:>9.2}×",
        lock.as_secs_f64() / floor.as_secs_f64()
    );
    println!(
        "  means: floor {:.1} µs, lock {:.1} µs",
        micros(mean(&floor_samples)),
        micros(mean(&lock_samples))
    );
    lock.as_secs_f64() / floor.as_secs_f64()
}

fn floor_once(path: &Path, bytes: &[u8]) {
    let fd = rustix::fs::open(
        path,
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o600),
    )
    .expect("create");
    rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).expect("flock");
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = rustix::io::write(&fd, rest).expect("write");
        rest = &rest[n..];
    }
    rustix::fs::fsync(&fd).expect("fsync");
    rustix::fs::unlink(path).expect("unlink");
    drop(fd);
}

/// Runs the contention round (`raw`: a plain blocking `flock` loop on one file, the
/// baseline; otherwise the workspace lock): its p99 acquisition latency and throughput.
fn contended(root: &Path, raw: bool) -> Contention {
    let ws = root.join(if raw { "contended-raw" } else { "contended" });
    std::fs::create_dir_all(&ws).expect("workspace");
    let exe = std::env::current_exe().expect("own path");
    let started = Instant::now();
    let children: Vec<(std::process::Child, PathBuf)> = (0..CONTENDERS)
        .map(|i| {
            let out = root.join(format!("latencies-{raw}-{i}.txt"));
            let child = std::process::Command::new(&exe)
                .arg(if raw { "--raw-child" } else { "--child" })
                .arg(&ws)
                .arg(PER_CONTENDER.to_string())
                .arg(&out)
                .spawn()
                .expect("spawn contender");
            (child, out)
        })
        .collect();
    let mut samples = Vec::new();
    for (mut child, out) in children {
        let status = child.wait().expect("wait");
        assert!(status.success(), "a contender failed");
        let text = std::fs::read_to_string(out).expect("latencies");
        samples.extend(
            text.lines()
                .filter_map(|l| l.parse::<u64>().ok())
                .map(Duration::from_nanos),
        );
    }
    let total = started.elapsed();
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "acquisition latency, {}, {CONTENDERS} contending processes × {PER_CONTENDER} (hold ≈ 200 µs, {} samples):",
        if raw { "raw flock (baseline)" } else { "arcane-lock" },
        samples.len()
    );
    println!("  p50 {:>9.1} µs", micros(pick(0.50)));
    println!("  p99 {:>9.1} µs", micros(pick(0.99)));
    println!("  max {:>9.1} µs", micros(pick(1.0)));
    let throughput = samples.len() as f64 / total.as_secs_f64();
    println!("  throughput {throughput:.0} acquisitions/s");
    Contention {
        p99: pick(0.99),
        throughput,
    }
}

fn child(ws: &Path, count: usize, out: &Path, raw: bool) {
    let options = AcquireOptions::new("bench.contended")
        .expect("name")
        .wait(Duration::from_secs(120));
    let raw_path = ws.join("raw.lock");
    let mut lines = String::new();
    for _ in 0..count {
        let t = Instant::now();
        let held = if raw {
            let fd = rustix::fs::open(
                &raw_path,
                OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .expect("open");
            rustix::fs::flock(&fd, FlockOperation::LockExclusive).expect("flock");
            Err(fd)
        } else {
            Ok(WorkspaceLock::acquire(ws, &options, &NullSink).expect("acquire"))
        };
        let waited = t.elapsed();
        // A short critical section.
        let until = Instant::now() + Duration::from_micros(200);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        match held {
            Ok(lock) => lock.release().expect("release"),
            Err(fd) => drop(fd),
        }
        lines.push_str(&format!("{}\n", waited.as_nanos()));
    }
    std::fs::write(out, lines).expect("write latencies");
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / samples.len().max(1) as u32
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
