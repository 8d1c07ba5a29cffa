//! Indexing threads' CPU priority. They run under SCHED_IDLE so a saturated broker lets the
//! index lag instead of slowing producers. Any thread may lower itself to SCHED_IDLE, with or
//! without CAP_SYS_NICE (the shipped image runs as a plain user without it); none can raise
//! itself back without it, so these threads never need to: they never take a partition's lock
//! (the indexer reads the log on the runtime before each turn, see [`crate::indexer`]), and
//! what queries and the runtime read of an index is swapped whole, not locked. An idle thread
//! holding a lock that a producer waits on would keep it waiting while it gets no CPU.

/// Lowers the calling thread's scheduling priority; threads it starts inherit it. Under
/// SCHED_IDLE the thread runs only on CPU time nothing else wants; where that is refused, or
/// with `idle` off, it is niced by `nice` (0 leaves it as it is).
pub(crate) fn lower(idle: bool, nice: i32) {
    #[cfg(target_os = "linux")]
    {
        if idle && set_policy(libc::SCHED_IDLE) {
            return;
        }
        if nice <= 0 {
            return;
        }
        // On Linux the nice value belongs to the thread (its tid), not the process.
        // SAFETY: plain syscalls on the calling thread's own id, no memory involved.
        let rc = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, nice)
        };
        if rc != 0 {
            tracing::warn!(nice, error = %std::io::Error::last_os_error(), "cannot lower the search indexers' priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (idle, nice);
}

#[cfg(target_os = "linux")]
fn set_policy(policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain syscall on the calling thread (pid 0), reading `param` only.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn policy() -> libc::c_int {
        // SAFETY: queries the calling thread's own policy.
        unsafe { libc::sched_getscheduler(0) }
    }

    /// An indexing thread, lowered as indexers are, and one it starts (as tantivy's threads
    /// are started), both under SCHED_IDLE.
    fn lowered_threads_run_idle() {
        std::thread::spawn(|| {
            lower(true, 10);
            assert_eq!(policy(), libc::SCHED_IDLE, "the indexing thread");
            let child = std::thread::spawn(policy).join().unwrap();
            assert_eq!(child, libc::SCHED_IDLE, "a thread it starts");
        })
        .join()
        .unwrap();
    }

    /// Run in a child process that dropped root (see the test below).
    #[test]
    fn child_without_cap_sys_nice_runs_indexing_threads_idle() {
        if std::env::var_os("SPATE_PRIORITY_CHILD").is_some() {
            lowered_threads_run_idle();
        }
    }

    #[test]
    fn without_cap_sys_nice_indexing_threads_still_run_under_sched_idle() {
        // SAFETY: reads the process's own uid.
        if unsafe { libc::geteuid() } != 0 {
            // Only root can drop to a plain user here; as a plain user this test process is
            // already the case the child checks.
            lowered_threads_run_idle();
            return;
        }
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().unwrap();
        let mut cmd = std::process::Command::new(exe);
        cmd.args([
            "--exact",
            "priority::tests::child_without_cap_sys_nice_runs_indexing_threads_idle",
            "--test-threads=1",
        ])
        .env("SPATE_PRIORITY_CHILD", "1");
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("1 passed"), "the child ran no test: {said}");
    }
}
