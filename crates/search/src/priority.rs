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
        if idle {
            if set_policy(libc::SCHED_IDLE) {
                return;
            }
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot run the search indexers under SCHED_IDLE; nicing them instead");
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
