//! The physical floor that `scripts/bench-floor.sh` compares spate with.
//!
//! `spate-floor produce` takes the same produce request stream as a broker (any Kafka client,
//! over loopback) and does only what no broker can avoid: it reads each request, appends each
//! partition's record bytes to that partition's file, syncs them per the fsync policy and
//! answers. No validation, no CRC check, no offset assignment inside batches, no index, no
//! replication, no metrics: the CPU per byte it spends is the floor of a broker's.
//! It answers just enough of the protocol (ApiVersions, Metadata, Produce) for a client to
//! produce; every requested topic exists with `--partitions` partitions.
//!
//! `spate-floor copy` is the consume floor: `sendfile` of a file to a loopback socket, as a
//! broker serving plain TCP fetches of bytes that need no change could at best. It prints the
//! sending thread's CPU per byte.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, BytesMut};
use clap::{Parser, Subcommand, ValueEnum};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, MetadataRequest, MetadataResponse, ProduceRequest,
    ProduceResponse, RequestHeader,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use spate_protocol::codec::encode_response;

#[derive(Parser)]
#[command(about = "The physical floor for spate's benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve produce requests by appending their record bytes to one file per partition.
    Produce {
        /// Address to listen on; the bound one is printed first ("floor listening on ...").
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Directory for the partition files.
        #[arg(long)]
        dir: PathBuf,
        /// Partitions of every topic.
        #[arg(long, default_value_t = 3)]
        partitions: i32,
        /// When appended bytes are synced (as spate's --fsync).
        #[arg(long, value_enum, default_value_t = Fsync::Interval)]
        fsync: Fsync,
        /// Interval of `--fsync interval`, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        fsync_interval_ms: u64,
    },
    /// Send a file to a loopback socket with sendfile until `--bytes` are sent.
    Copy {
        /// The file to send (repeatedly, from its start, until enough is sent).
        #[arg(long)]
        file: PathBuf,
        /// Bytes to send in all.
        #[arg(long, default_value_t = 4 << 30)]
        bytes: u64,
        /// Bytes per sendfile call (a broker sends a fetch's worth per partition).
        #[arg(long, default_value_t = 1 << 20)]
        chunk: usize,
    },
}

/// When appended bytes reach the disk.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Fsync {
    /// Before each produce is answered.
    Always,
    /// By a background thread every `--fsync-interval-ms`.
    Interval,
    /// Never: the page cache decides.
    Never,
}

/// One partition's file and the next offset it hands out.
struct PartitionFile {
    file: File,
    next_offset: i64,
}

/// A partition's file, shared by the connections producing to it.
type SharedFile = Arc<Mutex<PartitionFile>>;

/// The files of every topic-partition produced to.
struct Files {
    dir: PathBuf,
    partitions: Mutex<std::collections::HashMap<(String, i32), SharedFile>>,
}

impl Files {
    fn get(&self, topic: &str, partition: i32) -> io::Result<SharedFile> {
        let mut all = self
            .partitions
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        if let Some(p) = all.get(&(topic.to_string(), partition)) {
            return Ok(p.clone());
        }
        let path = self.dir.join(format!("{topic}-{partition}.log"));
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let p = Arc::new(Mutex::new(PartitionFile {
            file,
            next_offset: 0,
        }));
        all.insert((topic.to_string(), partition), p.clone());
        Ok(p)
    }

    fn sync_all(&self) -> io::Result<()> {
        let all: Vec<_> = self
            .partitions
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .values()
            .cloned()
            .collect();
        for p in all {
            let f = p.lock().map_err(|_| io::Error::other("poisoned"))?;
            f.file.sync_data()?;
        }
        Ok(())
    }
}

/// Records in a blob of record batches: the sum of each batch's last offset delta + 1, read
/// from the batch headers only (v2 batches: length at byte 8, last offset delta at 23).
fn records_in(mut blob: &[u8]) -> i64 {
    let mut n = 0;
    while blob.len() >= 27 {
        let len = i32::from_be_bytes([blob[8], blob[9], blob[10], blob[11]]);
        let delta = i32::from_be_bytes([blob[23], blob[24], blob[25], blob[26]]);
        n += i64::from(delta) + 1;
        let total = 12 + len.max(0) as usize;
        if total > blob.len() {
            break;
        }
        blob = &blob[total..];
    }
    n
}

/// What this server answers to ApiVersions: only what a producer needs.
fn api_versions() -> ApiVersionsResponse {
    let v = |key: ApiKey, min, max| {
        ApiVersion::default()
            .with_api_key(key as i16)
            .with_min_version(min)
            .with_max_version(max)
    };
    ApiVersionsResponse::default().with_api_keys(vec![
        v(ApiKey::Produce, 3, 12),
        v(ApiKey::Metadata, 0, 12),
        v(ApiKey::ApiVersions, 0, 3),
    ])
}

fn metadata(req: &MetadataRequest, port: i32, partitions: i32) -> MetadataResponse {
    let topics = req
        .topics
        .iter()
        .flatten()
        .filter_map(|t| t.name.clone())
        .map(|name| {
            MetadataResponseTopic::default()
                .with_name(Some(name))
                .with_partitions(
                    (0..partitions)
                        .map(|p| {
                            MetadataResponsePartition::default()
                                .with_partition_index(p)
                                .with_leader_id(BrokerId(0))
                                .with_replica_nodes(vec![BrokerId(0)])
                                .with_isr_nodes(vec![BrokerId(0)])
                        })
                        .collect(),
                )
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(0))
            .with_host(StrBytes::from_static_str("127.0.0.1"))
            .with_port(port)])
        .with_controller_id(BrokerId(0))
        .with_cluster_id(Some(StrBytes::from_static_str("spate-floor")))
        .with_topics(topics)
}

fn produce(req: ProduceRequest, files: &Files, fsync: Fsync) -> io::Result<ProduceResponse> {
    let mut responses = Vec::with_capacity(req.topic_data.len());
    for t in req.topic_data {
        let mut parts = Vec::with_capacity(t.partition_data.len());
        for p in t.partition_data {
            let records = p.records.unwrap_or_default();
            let file = files.get(&t.name, p.index)?;
            let mut f = file.lock().map_err(|_| io::Error::other("poisoned"))?;
            f.file.write_all(&records)?;
            if fsync == Fsync::Always {
                f.file.sync_data()?;
            }
            let base = f.next_offset;
            f.next_offset += records_in(&records);
            parts.push(
                PartitionProduceResponse::default()
                    .with_index(p.index)
                    .with_base_offset(base)
                    .with_log_append_time_ms(-1),
            );
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(t.name)
                .with_partition_responses(parts),
        );
    }
    Ok(ProduceResponse::default().with_responses(responses))
}

/// Appends exactly `n` bytes read from `fd` to `buf`; `false` when the peer closed first.
/// Reads straight into the buffer's spare room: no zeroing and no second copy, as a
/// broker's reads should be.
fn read_into(fd: i32, buf: &mut BytesMut, n: usize) -> io::Result<bool> {
    buf.reserve(n);
    let mut left = n;
    while left > 0 {
        let spare = buf.spare_capacity_mut();
        // SAFETY: `spare` has at least `left` writable bytes; read writes at most `left`.
        let got = unsafe { libc::read(fd, spare.as_mut_ptr().cast(), left) };
        match got {
            0 => return Ok(false),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            n => {
                // SAFETY: read initialised these `n` bytes.
                unsafe { buf.advance_mut(n as usize) };
                left -= n as usize;
            }
        }
    }
    Ok(true)
}

/// Serves one connection until the client closes it.
fn serve(
    stream: TcpStream,
    files: &Files,
    port: i32,
    partitions: i32,
    fsync: Fsync,
) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let fd = stream.as_raw_fd();
    let mut out = &stream;
    // Frames are split off and dropped once answered, so the allocation is reused.
    let mut buf = BytesMut::with_capacity(1 << 20);
    loop {
        if !read_into(fd, &mut buf, 4)? {
            return Ok(());
        }
        let len = buf.split_to(4).get_i32();
        if !(0..=100 << 20).contains(&len) {
            bail!("a frame of {len} bytes");
        }
        if !read_into(fd, &mut buf, len as usize)? {
            return Ok(());
        }
        let mut frame = buf.split_to(len as usize).freeze();
        if frame.len() < 4 {
            bail!("a frame too short for a request header");
        }
        let key = ApiKey::try_from(frame.clone().get_i16())
            .map_err(|()| anyhow::anyhow!("an API key this floor does not serve"))?;
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let header = RequestHeader::decode(&mut frame, key.request_header_version(version))?;
        let id = header.correlation_id;
        let answer = match key {
            ApiKey::ApiVersions => encode_response(key, version.min(3), id, &api_versions())?,
            ApiKey::Metadata => {
                let req = MetadataRequest::decode(&mut frame, version)?;
                encode_response(key, version, id, &metadata(&req, port, partitions))?
            }
            ApiKey::Produce => {
                let req = ProduceRequest::decode(&mut frame, version)?;
                let acks = req.acks;
                let resp = produce(req, files, fsync)?;
                if acks == 0 {
                    continue;
                }
                encode_response(key, version, id, &resp)?
            }
            other => bail!("{other:?} is not served by the floor"),
        };
        out.write_all(&answer)?;
    }
}

fn run_produce(
    listen: &str,
    dir: &Path,
    partitions: i32,
    fsync: Fsync,
    interval: Duration,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let listener = TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
    let bound = listener.local_addr()?;
    println!("floor listening on {bound}");
    io::stdout().flush()?;
    let files = Arc::new(Files {
        dir: dir.to_path_buf(),
        partitions: Mutex::default(),
    });
    if fsync == Fsync::Interval {
        let files = files.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(interval);
            if let Err(e) = files.sync_all() {
                eprintln!("floor: fsync failed: {e}");
                std::process::exit(1);
            }
        });
    }
    for stream in listener.incoming() {
        let stream = stream?;
        let files = files.clone();
        let port = i32::from(bound.port());
        // A thread per connection: the fewest moving parts, as a floor should have.
        std::thread::spawn(move || {
            if let Err(e) = serve(stream, &files, port, partitions, fsync) {
                eprintln!("floor: connection closed: {e:#}");
            }
        });
    }
    Ok(())
}

/// CPU seconds (user + system) the calling thread has used.
fn thread_cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr());
        u.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn run_copy(path: &Path, total: u64, chunk: usize) -> anyhow::Result<()> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let size = file.metadata()?.len();
    if size == 0 {
        bail!("{} is empty", path.display());
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    // The reader (a consumer's side) discards what it reads; its CPU is not the floor's.
    let sink = std::thread::spawn(move || -> io::Result<u64> {
        let mut s = TcpStream::connect(addr)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => return Ok(n),
                k => n += k as u64,
            }
        }
    });
    let (sock, _) = listener.accept()?;
    let started = Instant::now();
    let cpu0 = thread_cpu_seconds();
    let mut sent = 0u64;
    let mut offset: libc::off_t = 0;
    while sent < total {
        if offset as u64 >= size {
            offset = 0;
        }
        let want = chunk
            .min((size - offset as u64) as usize)
            .min((total - sent) as usize);
        // SAFETY: both descriptors are open for the whole call; `offset` is ours.
        let n = unsafe { libc::sendfile(sock.as_raw_fd(), file.as_raw_fd(), &mut offset, want) };
        if n < 0 {
            return Err(io::Error::last_os_error()).context("sendfile");
        }
        sent += n as u64;
    }
    let cpu = thread_cpu_seconds() - cpu0;
    let wall = started.elapsed().as_secs_f64();
    drop(sock);
    let received = sink
        .join()
        .map_err(|_| anyhow::anyhow!("the sink panicked"))??;
    println!(
        "floor copy: {sent} bytes in {wall:.2} s ({:.0} MB/s), sender CPU {cpu:.3} s = {:.3} ns/byte; sink read {received}",
        sent as f64 / wall / 1e6,
        cpu * 1e9 / sent as f64
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Produce {
            listen,
            dir,
            partitions,
            fsync,
            fsync_interval_ms,
        } => run_produce(
            &listen,
            &dir,
            partitions,
            fsync,
            Duration::from_millis(fsync_interval_ms.max(1)),
        ),
        Command::Copy { file, bytes, chunk } => run_copy(&file, bytes, chunk.max(4096)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v2 batch header with this last offset delta, its length covering `extra` more bytes.
    fn batch(delta: i32, extra: usize) -> Vec<u8> {
        let mut b = vec![0u8; 61 + extra];
        let len = (b.len() - 12) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        b[23..27].copy_from_slice(&delta.to_be_bytes());
        b
    }

    #[test]
    fn records_are_counted_from_each_batch_header() {
        let mut blob = batch(9, 100);
        blob.extend(batch(0, 3));
        blob.extend(batch(4, 0));
        assert_eq!(records_in(&blob), 10 + 1 + 5);
        assert_eq!(records_in(&[]), 0);
    }
}
