//! Free space of the data dir: a watermark below which produce is refused before anything is
//! written, so a filling disk becomes an ordinary, recoverable state instead of failed writes.
//!
//! The free space is sampled by a background task ([`DiskSpace::sample`], one `statvfs`) into
//! atomics; the produce path only loads one of them ([`DiskSpace::is_full`]), never a system
//! call per request. Between samples every append is charged against the bytes the last sample
//! left above the watermark, so a fast producer cannot run far past it before the next sample
//! (on a 64 MiB tmpfs a producer writes the 8 MiB margin in well under a sample interval).
//! An append that still meets ENOSPC (the watermark raced, another process
//! filled the disk) marks the disk full until the next sample says otherwise.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

/// Where the refusal starts: produce is refused while the free bytes are below the smaller of
/// the limits set. The smaller, so that 5 % of a large disk (12 GiB of 250) does not stop
/// writes that 1 GiB would let through, nor 1 GiB a small disk that 5 % would not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskWatermark {
    /// Refuse produce below this many free bytes (0: no byte limit).
    pub min_free_bytes: u64,
    /// Refuse produce below this percentage of the file system free (0: no percentage limit).
    pub min_free_percent: u8,
}

impl DiskWatermark {
    /// The server's defaults: 1 GiB and 5 %.
    pub const DEFAULT: Self = Self {
        min_free_bytes: 1 << 30,
        min_free_percent: 5,
    };

    /// No watermark: produce is refused only after an actual ENOSPC.
    pub const DISABLED: Self = Self {
        min_free_bytes: 0,
        min_free_percent: 0,
    };

    /// The free bytes below which produce is refused, on a file system of `total_bytes`.
    pub fn threshold_bytes(&self, total_bytes: u64) -> u64 {
        let pct = (total_bytes as u128 * u128::from(self.min_free_percent.min(100)) / 100) as u64;
        match (self.min_free_bytes, pct) {
            (0, pct) => pct,
            (bytes, 0) => bytes,
            (bytes, pct) => bytes.min(pct),
        }
    }
}

/// Reads a file system's free and total bytes for a directory: `statvfs`, or a stand-in.
pub type Probe = Arc<dyn Fn(&Path) -> io::Result<(u64, u64)> + Send + Sync>;

/// The free space of one data dir and whether writes are refused for it.
pub struct DiskSpace {
    dir: PathBuf,
    /// The watermark's two limits, changeable at run time (broker configs).
    min_free_bytes: AtomicU64,
    min_free_percent: AtomicU8,
    /// Replaces `statvfs` when set (tests simulate a small disk with it).
    probe: RwLock<Option<Probe>>,
    free_bytes: AtomicU64,
    /// Bytes that may still be written before the watermark: the last sample's free bytes
    /// above it, less what appends wrote since.
    budget: AtomicI64,
    total_bytes: AtomicU64,
    full: AtomicBool,
    /// Set by an ENOSPC seen on a write; cleared by the next sample.
    enospc: AtomicBool,
    crossings: AtomicU64,
}

/// What a sample changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crossing {
    /// Still on the same side of the watermark.
    None,
    /// Went below: produce is refused from now on.
    BecameFull,
    /// Came back above: produce resumes.
    Recovered,
}

impl std::fmt::Debug for DiskSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskSpace")
            .field("dir", &self.dir)
            .field("watermark", &self.watermark())
            .field("free_bytes", &self.free_bytes())
            .field("full", &self.is_full())
            .finish_non_exhaustive()
    }
}

impl DiskSpace {
    /// The state of `dir` with this watermark, not yet sampled (not full).
    pub fn new(dir: PathBuf, watermark: DiskWatermark) -> Self {
        Self {
            dir,
            min_free_bytes: AtomicU64::new(watermark.min_free_bytes),
            min_free_percent: AtomicU8::new(watermark.min_free_percent.min(100)),
            probe: RwLock::new(None),
            free_bytes: AtomicU64::new(u64::MAX),
            budget: AtomicI64::new(i64::MAX),
            total_bytes: AtomicU64::new(0),
            full: AtomicBool::new(false),
            enospc: AtomicBool::new(false),
            crossings: AtomicU64::new(0),
        }
    }

    /// The data dir watched.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The watermark applied.
    pub fn watermark(&self) -> DiskWatermark {
        DiskWatermark {
            min_free_bytes: self.min_free_bytes.load(Ordering::Relaxed),
            min_free_percent: self.min_free_percent.load(Ordering::Relaxed),
        }
    }

    /// Changes the watermark at run time and samples at once, so produce is refused or
    /// resumes under the new limits now rather than at the next sample.
    pub fn set_watermark(&self, watermark: DiskWatermark) {
        self.set_limits(watermark);
        self.resample();
    }

    /// Changes the watermark from the next sample on (the sampler's own use).
    pub fn set_limits(&self, watermark: DiskWatermark) {
        self.min_free_bytes
            .store(watermark.min_free_bytes, Ordering::Relaxed);
        self.min_free_percent
            .store(watermark.min_free_percent.min(100), Ordering::Relaxed);
    }

    /// Reads free space through `probe` instead of `statvfs` from now on (tests simulate a
    /// small disk with it).
    pub fn set_probe(&self, probe: Probe) {
        *self.probe.write() = Some(probe);
    }

    /// True while produce is refused: one atomic load, for the produce path.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Counts `bytes` just appended against the room left above the watermark; the append
    /// that uses it up turns produce off until a sample shows space again. One atomic add.
    #[inline]
    pub fn charge(&self, bytes: usize) {
        let n = i64::try_from(bytes).unwrap_or(i64::MAX);
        let before = self.budget.fetch_sub(n, Ordering::Relaxed);
        if before > 0 && before <= n && !self.full.swap(true, Ordering::Relaxed) {
            self.crossings.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                dir = %self.dir.display(),
                threshold_bytes = self.threshold_bytes(),
                "data dir below its free-space watermark (by the bytes written since the last sample): produce is refused until space is freed"
            );
        }
    }

    /// Free bytes now: the last sample less what appends wrote since (`u64::MAX` before the
    /// first sample).
    pub fn free_bytes(&self) -> u64 {
        if self.total_bytes() == 0 {
            return self.free_bytes.load(Ordering::Relaxed);
        }
        let threshold = i64::try_from(self.threshold_bytes()).unwrap_or(i64::MAX);
        let estimate = self
            .budget
            .load(Ordering::Relaxed)
            .saturating_add(threshold);
        u64::try_from(estimate.max(0))
            .unwrap_or(0)
            .min(self.free_bytes.load(Ordering::Relaxed))
    }

    /// Size of the file system at the last sample (0 before the first).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes.load(Ordering::Relaxed)
    }

    /// Free bytes below which produce is refused, at the last sample.
    pub fn threshold_bytes(&self) -> u64 {
        self.watermark().threshold_bytes(self.total_bytes())
    }

    /// How many times the state changed sides (either way).
    pub fn crossings(&self) -> u64 {
        self.crossings.load(Ordering::Relaxed)
    }

    /// Why produce is refused, for error messages.
    pub fn refusal(&self) -> String {
        if self.enospc.load(Ordering::Relaxed) {
            format!(
                "the data dir {} is full (a write met ENOSPC); nothing was written, retry once space is freed",
                self.dir.display()
            )
        } else {
            format!(
                "the data dir {} has {} bytes free, below the watermark of {} bytes (--disk-min-free-bytes, --disk-min-free-percent); nothing was written, retry once space is freed",
                self.dir.display(),
                self.free_bytes(),
                self.threshold_bytes()
            )
        }
    }

    /// Reads the file system's free space (one `statvfs`) and updates the state; for the
    /// background sampler, never the produce path.
    pub fn sample(&self) -> io::Result<Crossing> {
        let probe = self.probe.read().clone();
        let (free, total) = match probe {
            Some(probe) => probe(&self.dir)?,
            None => statvfs(&self.dir)?,
        };
        Ok(self.observe(free, total))
    }

    /// Samples now, after something freed space (DeleteRecords, DeleteTopics, retention,
    /// cleaning) or changed the watermark: produce resumes at once instead of at the next
    /// periodic sample. Blocking (one `statvfs`): call it off the async workers.
    pub fn resample(&self) {
        if let Err(e) = self.sample() {
            tracing::debug!(dir = %self.dir.display(), error = %e, "cannot read the data dir's free space");
        }
    }

    /// Updates the state from a sample of `free` bytes out of `total`, logging a crossing.
    pub fn observe(&self, free: u64, total: u64) -> Crossing {
        self.free_bytes.store(free, Ordering::Relaxed);
        self.total_bytes.store(total, Ordering::Relaxed);
        // A fresh sample is the truth: an earlier ENOSPC no longer holds once space shows.
        let threshold = self.watermark().threshold_bytes(total);
        let below = free < threshold;
        let room =
            i64::try_from(free).unwrap_or(i64::MAX) - i64::try_from(threshold).unwrap_or(i64::MAX);
        self.budget.store(room, Ordering::Relaxed);
        let enospc = self.enospc.load(Ordering::Relaxed);
        let full = below || (enospc && free == 0);
        if !full {
            self.enospc.store(false, Ordering::Relaxed);
        }
        let was = self.full.swap(full, Ordering::Relaxed);
        match (was, full) {
            (false, true) => {
                self.crossings.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    dir = %self.dir.display(),
                    free_bytes = free,
                    threshold_bytes = threshold,
                    "data dir below its free-space watermark: produce is refused until space is freed"
                );
                Crossing::BecameFull
            }
            (true, false) => {
                self.crossings.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    dir = %self.dir.display(),
                    free_bytes = free,
                    threshold_bytes = threshold,
                    "data dir above its free-space watermark again: produce resumes"
                );
                Crossing::Recovered
            }
            _ => Crossing::None,
        }
    }

    /// Records that a write met ENOSPC: produce is refused until a sample shows free space.
    pub fn mark_enospc(&self) {
        self.enospc.store(true, Ordering::Relaxed);
        if !self.full.swap(true, Ordering::Relaxed) {
            self.crossings.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                dir = %self.dir.display(),
                "a write to the data dir met ENOSPC: produce is refused until space is freed"
            );
        }
    }
}

/// Free bytes (for unprivileged users, as `df` shows) and size of the file system holding
/// `dir`.
fn statvfs(dir: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    // SAFETY: statvfs only writes into the zeroed struct we own; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok((
        (st.f_bavail as u64).saturating_mul(unit),
        (st.f_blocks as u64).saturating_mul(unit),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(min_free_bytes: u64, min_free_percent: u8) -> DiskSpace {
        DiskSpace::new(
            PathBuf::from("/data"),
            DiskWatermark {
                min_free_bytes,
                min_free_percent,
            },
        )
    }

    #[test]
    fn below_the_byte_watermark_is_full_and_above_it_recovers() {
        let d = space(100, 0);
        assert_eq!(d.observe(1000, 10_000), Crossing::None);
        assert!(!d.is_full());
        assert_eq!(d.observe(99, 10_000), Crossing::BecameFull);
        assert!(d.is_full());
        assert_eq!(d.observe(50, 10_000), Crossing::None);
        assert!(d.is_full());
        assert_eq!(d.observe(100, 10_000), Crossing::Recovered);
        assert!(!d.is_full());
        assert_eq!(d.crossings(), 2);
    }

    #[test]
    fn the_smaller_of_the_limits_set_applies() {
        // 5 % of 10 000 is 500, above the 100-byte limit: 100 applies.
        let d = space(100, 5);
        d.observe(499, 10_000);
        assert!(!d.is_full());
        assert_eq!(d.threshold_bytes(), 100);
        d.observe(99, 10_000);
        assert!(d.is_full());
        // 5 % (500) below a 1 000-byte limit: 500 applies.
        let d = space(1000, 5);
        d.observe(600, 10_000);
        assert!(!d.is_full());
        assert_eq!(d.threshold_bytes(), 500);
        d.observe(499, 10_000);
        assert!(d.is_full());
        // A limit of 0 is no limit: the other one applies alone.
        let d = space(0, 5);
        d.observe(499, 10_000);
        assert!(d.is_full());
        let d = space(100, 0);
        d.observe(499, 10_000);
        assert!(!d.is_full());
    }

    #[test]
    fn appends_between_samples_use_up_the_room_above_the_watermark() {
        let d = space(100, 0);
        d.observe(1100, 10_000);
        d.charge(600);
        assert!(!d.is_full(), "400 bytes of room left");
        assert_eq!(
            d.free_bytes(),
            500,
            "free bytes count what was written since"
        );
        d.charge(400);
        assert!(
            d.is_full(),
            "the room is used up: refused before the next sample"
        );
        assert_eq!(d.crossings(), 1);
        d.charge(50);
        assert_eq!(d.crossings(), 1, "one crossing logged, not one per append");
        // Retention freed space meanwhile: the next sample lifts the refusal.
        assert_eq!(d.observe(5000, 10_000), Crossing::Recovered);
        assert!(!d.is_full());
    }

    #[test]
    fn a_disabled_watermark_never_refuses_on_samples() {
        let d = space(0, 0);
        d.observe(0, 10_000);
        assert!(!d.is_full());
    }

    #[test]
    fn an_enospc_refuses_until_a_sample_shows_space() {
        let d = space(0, 0);
        d.mark_enospc();
        assert!(d.is_full());
        assert!(d.refusal().contains("ENOSPC"), "{}", d.refusal());
        // Still nothing free: stays refused.
        d.observe(0, 10_000);
        assert!(d.is_full());
        d.observe(4096, 10_000);
        assert!(!d.is_full());
        assert!(!d.refusal().contains("ENOSPC"));
    }

    #[test]
    fn sampling_a_real_directory_reports_its_file_system() {
        let d = DiskSpace::new(std::env::temp_dir(), DiskWatermark::DISABLED);
        d.sample().expect("statvfs of the temp dir");
        assert!(d.total_bytes() > 0);
        assert!(d.free_bytes() <= d.total_bytes());
    }
}
