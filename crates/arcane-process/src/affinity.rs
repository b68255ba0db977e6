//! CPU sets: which cores a process (and every thread it starts) may run on.
//!
//! A model's `cpus = "0-3"` becomes a [`CpuSet`], checked against the cores this
//! process may use before anything starts, given to [`crate::spawn`] (the child sets its
//! own affinity between `fork` and `exec`, so the engine and every thread it ever
//! creates inherit it: no window where a thread runs elsewhere), and read back from
//! `/proc/PID/status` (`Cpus_allowed_list`) once the engine runs, as the evidence that
//! it took.

use std::collections::BTreeSet;
use std::fmt;

/// The most CPUs a set may name (`CPU_SETSIZE`).
const MAX_CPUS: usize = 1024;

/// A set of CPU numbers, written as the kernel writes them: `0-3,6,8-9`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<usize>);

/// Why a CPU list is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CpuSetError {
    /// Nothing but separators.
    #[error("`{0}` names no CPU")]
    Empty(String),
    /// Not a list of numbers and ranges.
    #[error("`{text}` is not a CPU list like `0-3,6`: `{part}` {why}")]
    Malformed {
        /// The list.
        text: String,
        /// The part that is wrong.
        part: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl CpuSet {
    /// Parses `0-3,6`: numbers and inclusive ranges, comma-separated (spaces allowed).
    pub fn parse(text: &str) -> Result<Self, CpuSetError> {
        let malformed = |part: &str, why| CpuSetError::Malformed {
            text: text.to_string(),
            part: part.to_string(),
            why,
        };
        let number = |part: &str, digits: &str| -> Result<usize, CpuSetError> {
            let n: usize = digits
                .trim()
                .parse()
                .map_err(|_| malformed(part, "is not a number or a range"))?;
            if n >= MAX_CPUS {
                return Err(malformed(part, "is past the largest CPU number (1023)"));
            }
            Ok(n)
        };
        let mut cpus = BTreeSet::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('-') {
                Some((first, last)) => {
                    let (first, last) = (number(part, first)?, number(part, last)?);
                    if first > last {
                        return Err(malformed(part, "runs backwards"));
                    }
                    cpus.extend(first..=last);
                }
                None => {
                    cpus.insert(number(part, part)?);
                }
            }
        }
        if cpus.is_empty() {
            return Err(CpuSetError::Empty(text.to_string()));
        }
        Ok(Self(cpus))
    }

    /// How many CPUs it names.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it names none (never, for a parsed set).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every CPU it names is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    /// The CPUs both name.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    /// The CPUs this process may run on now (`sched_getaffinity`).
    pub fn allowed_now() -> std::io::Result<CpuSet> {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at
        // most its size into it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(CpuSet(
                (0..MAX_CPUS)
                    .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
                    .collect(),
            ))
        }
    }

    /// The CPUs process (or thread) `pid` may run on, from `/proc/PID/status`; `None`
    /// when it is gone.
    pub fn of_process(pid: u32) -> Option<CpuSet> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let list = status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))?;
        CpuSet::parse(list).ok()
    }

    /// The CPUs of every thread of `pid` (`/proc/PID/task/*`), one set per thread.
    pub fn of_threads(pid: u32) -> Vec<CpuSet> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        tasks
            .filter_map(|task| {
                let tid = task.ok()?.file_name().to_str()?.parse().ok()?;
                CpuSet::of_process(tid)
            })
            .collect()
    }

    /// The kernel's form, made before a `fork` (nothing is allocated after it).
    pub(crate) fn raw(&self) -> libc::cpu_set_t {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; every CPU is below
        // CPU_SETSIZE (checked when parsed).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in &self.0 {
                libc::CPU_SET(cpu, &mut set);
            }
            set
        }
    }
}

impl fmt::Display for CpuSet {
    /// `0-3,6`: runs of consecutive CPUs as ranges.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let mut cpus = self.0.iter().copied().peekable();
        while let Some(first) = cpus.next() {
            let mut last = first;
            while cpus.peek() == Some(&(last + 1)) {
                last = cpus.next().unwrap_or(last);
            }
            parts.push(if first == last {
                first.to_string()
            } else {
                format!("{first}-{last}")
            });
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_print_as_the_kernel_writes_them() {
        let set = CpuSet::parse("0-3, 6,8-9,3").unwrap();
        assert_eq!(set.len(), 7);
        assert_eq!(set.to_string(), "0-3,6,8-9");
        assert_eq!(CpuSet::parse("5").unwrap().to_string(), "5");
    }

    #[test]
    fn bad_lists_name_the_part() {
        for (text, part) in [
            ("0-x", "0-x"),
            ("3-1", "3-1"),
            ("a", "a"),
            ("0,2000", "2000"),
        ] {
            match CpuSet::parse(text) {
                Err(CpuSetError::Malformed { part: p, .. }) => assert_eq!(p, part, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(CpuSet::parse(" , "), Err(CpuSetError::Empty(_))));
    }

    #[test]
    fn this_process_and_its_threads_have_a_set() {
        let allowed = CpuSet::allowed_now().unwrap();
        assert!(!allowed.is_empty());
        let mine = CpuSet::of_process(std::process::id()).unwrap();
        assert_eq!(mine, allowed);
        assert!(CpuSet::of_threads(std::process::id())
            .iter()
            .all(|t| !t.is_empty()));
    }
}
