//! One set-up at a time per cache: two at once (run and test commands side by side) would write
//! the same files. A kernel lock on `setup.lock`.
//!
//! The lock is the kernel's (`flock` through [`std::fs::File::lock`]), not the file's
//! existence: it is held by an open file, so it dies with its process however that process
//! ends (SIGKILL included), and no waiter can judge a live holder dead or a dead one alive by
//! its PID. The file itself stays; it only says, for a person looking, who holds it.

use std::fs::{File, TryLockError};
use std::io::Write;
use std::path::Path;

use anyhow::Context;

/// Held for as long as this value lives; dropping it (or the process ending) frees it.
pub struct SetupLock {
    _file: File,
}

impl SetupLock {
    /// Waits until no process holds the lock, then takes it.
    pub fn acquire(root: &Path) -> anyhow::Result<Self> {
        Self::acquire_at(&root.join("setup.lock"), |holder| {
            eprintln!("approxy setup: waiting for setup process {holder} to finish");
        })
    }

    /// Takes the lock at `path`, telling `waiting` once (with what the holder wrote) when it
    /// must wait.
    fn acquire_at(path: &Path, waiting: impl FnOnce(&str)) -> anyhow::Result<Self> {
        let mut file = open(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(path).unwrap_or_default();
                waiting(holder.trim());
                file.lock()
                    .with_context(|| format!("cannot lock {}", path.display()))?;
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()));
            }
        }
        // Informational only: nothing decides by it.
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        Ok(Self { _file: file })
    }

    /// Takes the lock at `path` if no one holds it.
    #[cfg(test)]
    fn try_at(path: &Path) -> anyhow::Result<Option<Self>> {
        let file = open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e.into()),
        }
    }
}

/// The lock file, created when missing. Not truncated on open: the holder's PID must stay
/// readable to a waiter.
fn open(path: &Path) -> anyhow::Result<File> {
    File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("cannot open the set-up lock {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    /// Set in the environment of the child process that [`holder_process`] runs.
    const HOLDER_ENV: &str = "APPROXY_TEST_LOCK_HOLDER";

    #[test]
    fn contenders_started_together_never_both_hold_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let path = dir.path().join("setup.lock");
        // A lock file left by a dead process: the case where PID-judging waiters could both
        // decide it stale and both go on.
        std::fs::write(&path, "999999999").unwrap_or_else(|e| unreachable!("{e}"));
        let holding = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        for _ in 0..20 {
            let start = Arc::new(Barrier::new(6));
            let threads: Vec<_> = (0..6)
                .map(|_| {
                    let (path, holding, most, start) =
                        (path.clone(), holding.clone(), most.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        let lock = SetupLock::acquire_at(&path, |_| {});
                        assert!(lock.is_ok(), "{:?}", lock.err());
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(2));
                        holding.fetch_sub(1, Ordering::SeqCst);
                        drop(lock);
                    })
                })
                .collect();
            for t in threads {
                assert!(t.join().is_ok());
            }
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "two contenders held the lock at once"
        );
    }

    #[test]
    fn a_live_pid_in_the_file_does_not_hold_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let path = dir.path().join("setup.lock");
        // Our own PID: alive, as a dead holder's reused PID would be, but holding nothing.
        std::fs::write(&path, std::process::id().to_string())
            .unwrap_or_else(|e| unreachable!("{e}"));
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let _ = tx.send(SetupLock::acquire_at(&p, |_| {}).is_ok());
        });
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(true));
    }

    /// Not a test of its own: run by [`a_holder_killed_with_sigkill_frees_it_at_once`] as a
    /// child process, it takes the lock, says so, and waits to be killed.
    #[test]
    fn holder_process() {
        let Ok(path) = std::env::var(HOLDER_ENV) else {
            return;
        };
        let lock = SetupLock::acquire_at(Path::new(&path), |_| {});
        assert!(lock.is_ok());
        println!("held");
        std::thread::sleep(Duration::from_secs(60));
    }

    #[test]
    fn a_holder_killed_with_sigkill_frees_it_at_once() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let path = dir.path().join("setup.lock");
        let exe = std::env::current_exe().unwrap_or_else(|e| unreachable!("{e}"));
        let mut child = Command::new(exe)
            .args([
                "lock::tests::holder_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLDER_ENV, &path)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| unreachable!("{e}"));
        let out = child.stdout.take().unwrap_or_else(|| unreachable!());
        let held = BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("held"));
        assert!(held, "the holder process never took the lock");
        assert!(
            matches!(SetupLock::try_at(&path), Ok(None)),
            "taken while the holder lives"
        );
        assert!(std::fs::read_to_string(&path).is_ok_and(|s| s.trim() == child.id().to_string()));
        assert!(child.kill().is_ok()); // SIGKILL: no destructor runs
        assert!(child.wait().is_ok());
        let started = Instant::now();
        let freed = SetupLock::try_at(&path);
        assert!(
            matches!(freed, Ok(Some(_))),
            "not freed by the holder's death"
        );
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
