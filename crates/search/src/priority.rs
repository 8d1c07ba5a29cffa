//! Indexing threads' CPU priority. They run under SCHED_IDLE (or niced) so a saturated
//! broker lets the index lag instead of slowing producers; while one holds a partition's
//! lock it runs at normal priority ([`Boost`]), so a preempted indexer never keeps producers
//! and replica fetchers waiting behind that lock (priority inversion).

/// Lowers the calling thread's scheduling priority; threads it starts inherit it. Under
/// SCHED_IDLE the thread runs only on CPU time nothing else wants; otherwise it is niced by
/// `nice` (0 leaves it as it is).
pub(crate) fn lower(idle: bool, nice: i32) {
    #[cfg(target_os = "linux")]
    {
        let mut nice = nice;
        if idle {
            // Only where a SCHED_IDLE thread can be raised again while it holds a partition's
            // lock ([`Boost`]): without CAP_SYS_NICE (a container running as a plain user) it
            // could not, and producers would wait behind a thread that gets no CPU.
            if idle_can_be_boosted() && set_policy(libc::SCHED_IDLE) {
                return;
            }
            // Expected in a container without CAP_SYS_NICE (the chart drops every capability):
            // said once, as information, not as a warning at every start.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| tracing::info!("search indexers cannot run under SCHED_IDLE here (a SCHED_IDLE thread could not be raised back while it holds a partition's lock, which needs CAP_SYS_NICE); nicing them instead"));
            nice = nice.max(10);
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

/// Normal priority for a SCHED_IDLE thread while this lives (a partition lock is held).
pub(crate) struct Boost {
    #[cfg(target_os = "linux")]
    restore: bool,
}

impl Boost {
    /// Raises the calling thread to SCHED_OTHER if it runs under SCHED_IDLE.
    pub(crate) fn new() -> Self {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: queries the calling thread's own policy.
            let idle = unsafe { libc::sched_getscheduler(0) } == libc::SCHED_IDLE;
            Self {
                restore: idle && set_policy(libc::SCHED_OTHER),
            }
        }
        #[cfg(not(target_os = "linux"))]
        Self {}
    }
}

impl Drop for Boost {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.restore {
            set_policy(libc::SCHED_IDLE);
        }
    }
}

/// Whether a thread here can go to SCHED_IDLE and back to SCHED_OTHER, tried on a throwaway
/// thread.
#[cfg(target_os = "linux")]
fn idle_can_be_boosted() -> bool {
    std::thread::spawn(|| set_policy(libc::SCHED_IDLE) && set_policy(libc::SCHED_OTHER))
        .join()
        .unwrap_or(false)
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

    /// Run in a child process that dropped root (see the test below): an indexing thread must
    /// never sit under SCHED_IDLE while holding a boost it could not get.
    #[test]
    fn child_without_cap_sys_nice_never_holds_a_lock_at_idle_priority() {
        if std::env::var_os("SPATE_PRIORITY_CHILD").is_some() {
            no_boosted_section_at_idle_priority();
        }
    }

    #[test]
    fn without_cap_sys_nice_indexers_are_niced_not_idle() {
        // SAFETY: reads the process's own uid.
        if unsafe { libc::geteuid() } != 0 {
            // Only root can drop to a plain user here; as a plain user this test process is
            // already the case the child checks.
            no_boosted_section_at_idle_priority();
            return;
        }
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().unwrap();
        let mut cmd = std::process::Command::new(exe);
        cmd.args([
            "--exact",
            "priority::tests::child_without_cap_sys_nice_never_holds_a_lock_at_idle_priority",
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
    }

    /// An indexing thread, lowered as indexers are, holding a boost as around a lock.
    fn no_boosted_section_at_idle_priority() {
        std::thread::spawn(|| {
            lower(true, 10);
            let _b = Boost::new();
            assert_ne!(
                policy(),
                libc::SCHED_IDLE,
                "a boosted section at idle priority"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_boost_runs_an_idle_thread_at_normal_priority_and_restores_it() {
        std::thread::spawn(|| {
            lower(true, 0);
            assert_eq!(policy(), libc::SCHED_IDLE);
            {
                let _b = Boost::new();
                assert_eq!(policy(), libc::SCHED_OTHER);
            }
            assert_eq!(policy(), libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
    }
}
