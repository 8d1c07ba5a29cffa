//! Linux network namespaces for cluster tests: each node gets its own namespace and address,
//! one veth pair per pair of nodes carries their traffic, so a test can cut a link between two
//! nodes (`ip link set down` on both ends) while the test process, in the root namespace,
//! still reaches every node over a veth pair of its own.
//!
//! Layout of a run using address block `s` (0..64, the first free one is claimed):
//! - node N: 10.77.(4s).N/32 on the namespace's loopback;
//! - root <-> node N: 10.77.(4s+1).(4N-3)/30 in the root namespace, .(4N-2) in the node's;
//!   the root namespace routes 10.77.(4s).N through it, node N has only the connected /30
//!   back (it answers the test on that address);
//! - node A <-> node B (A < B), the k-th pair: 10.77.(4s+2).(4k+1)/30 at A, .(4k+2) at B, and a
//!   route to the other node's /32 through it with the own /32 as the source.
//!
//! No namespace has a default route and forwarding stays off in the node namespaces, so
//! nothing transits a node or the root namespace: when a pair link is down its routes are
//! gone and connects fail at once (ENETUNREACH). Names carry the test's pid and a counter, so
//! parallel runs and leftovers do not collide; leftovers of dead runs are removed at start.
//! Everything is torn down on drop, also when the test panics.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Namespace names are `spate<pid><letter>n<N>`.
const NS_PREFIX: &str = "spate";
/// Address blocks of 4 /24s each within 10.77.0.0/16.
const SLOTS: u8 = 64;

static RUNS: AtomicU32 = AtomicU32::new(0);

/// The namespaces, links and addresses of one test run; removed on drop.
pub struct Net {
    /// `<pid><letter>`: unique per run.
    tag: String,
    nodes: u8,
    slot: u8,
    /// Pairs of nodes with a link, in order (the index is the pair's address block).
    pairs: Vec<(u8, u8)>,
}

/// Why the namespaces could not be made.
#[derive(Debug)]
pub struct NetError(pub String);

impl std::fmt::Display for NetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Runs `ip` with these arguments; the error carries its stderr.
fn ip(args: &[&str]) -> Result<(), NetError> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetError(format!("cannot run `ip` (iproute2): {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Runs `ip` and returns its stdout ("" when it fails).
fn ip_output(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Why this process cannot manage network namespaces, if it visibly cannot.
pub fn unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(str::to_owned);
    if euid.as_deref() != Some("0") {
        return Some(format!(
            "network namespace tests need root (CAP_NET_ADMIN and CAP_SYS_ADMIN to create \
             namespaces and veth pairs); effective uid is {}",
            euid.as_deref().unwrap_or("unknown")
        ));
    }
    if Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        return Some("network namespace tests need the `ip` command (iproute2)".into());
    }
    None
}

impl Net {
    /// Creates `nodes` namespaces, fully meshed, each reachable from the root namespace.
    pub fn create(nodes: u8) -> Result<Self, NetError> {
        assert!((2..=9).contains(&nodes), "2 to 9 nodes");
        remove_leftovers();
        let run = RUNS.fetch_add(1, Ordering::SeqCst);
        let letter = char::from(b'a' + (run % 26) as u8);
        let tag = format!("{}{letter}", std::process::id());
        let mut pairs = Vec::new();
        for a in 1..=nodes {
            for b in a + 1..=nodes {
                pairs.push((a, b));
            }
        }
        let mut net = Net {
            tag,
            nodes,
            slot: 0,
            pairs,
        };
        // From here on, drop removes whatever was made.
        net.build()?;
        Ok(net)
    }

    /// Namespace of node `n`.
    pub fn ns(&self, n: u8) -> String {
        format!("{NS_PREFIX}{}n{n}", self.tag)
    }

    /// Address of node `n`, reachable from the root namespace and from the other nodes.
    pub fn addr(&self, n: u8) -> String {
        format!("10.77.{}.{n}", 4 * u32::from(self.slot))
    }

    fn root_veth(&self, n: u8) -> String {
        format!("sp{}r{n}", self.tag)
    }

    fn node_veth(&self, n: u8) -> String {
        format!("sp{}h{n}", self.tag)
    }

    /// The two ends of the link between `a` and `b` (a < b), in a's and in b's namespace.
    fn pair_veths(&self, a: u8, b: u8) -> (String, String) {
        (
            format!("sp{}a{a}{b}", self.tag),
            format!("sp{}b{a}{b}", self.tag),
        )
    }

    fn pair_index(&self, a: u8, b: u8) -> usize {
        let (a, b) = (a.min(b), a.max(b));
        self.pairs
            .iter()
            .position(|&p| p == (a, b))
            .unwrap_or_else(|| panic!("no link between nodes {a} and {b}"))
    }

    fn build(&mut self) -> Result<(), NetError> {
        for n in 1..=self.nodes {
            let ns = self.ns(n);
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        for n in 1..=self.nodes {
            let (ns, root, node) = (self.ns(n), self.root_veth(n), self.node_veth(n));
            ip(&[
                "link", "add", &root, "type", "veth", "peer", "name", &node, "netns", &ns,
            ])?;
            ip(&["link", "set", &root, "up"])?;
            ip(&["-n", &ns, "link", "set", &node, "up"])?;
        }
        for &(a, b) in &self.pairs {
            let (va, vb) = self.pair_veths(a, b);
            let (na, nb) = (self.ns(a), self.ns(b));
            ip(&[
                "link", "add", &va, "netns", &na, "type", "veth", "peer", "name", &vb, "netns", &nb,
            ])?;
        }
        self.claim_slot()?;
        for n in 1..=self.nodes {
            let (ns, node) = (self.ns(n), self.node_veth(n));
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/32", self.addr(n)),
                "dev",
                "lo",
            ])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &self.root_link(n, false),
                "dev",
                &node,
            ])?;
        }
        for k in 0..self.pairs.len() {
            let (a, b) = self.pairs[k];
            self.link_up(a, b)?;
        }
        Ok(())
    }

    /// The root-side (`root`) or node-side address with prefix of node n's root link.
    fn root_link(&self, n: u8, root: bool) -> String {
        let host = 4 * u32::from(n) - if root { 3 } else { 2 };
        format!("10.77.{}.{host}/30", 4 * u32::from(self.slot) + 1)
    }

    /// Address (no prefix) of node `n`'s end of the link between a and b.
    fn pair_addr(&self, a: u8, b: u8, n: u8) -> String {
        let k = self.pair_index(a, b) as u32;
        let host = 4 * k + if n == a.min(b) { 1 } else { 2 };
        format!("10.77.{}.{host}", 4 * u32::from(self.slot) + 2)
    }

    /// Takes the first address block whose node addresses the root namespace does not route
    /// yet: adding a route that exists fails, so two runs cannot both claim one block.
    fn claim_slot(&mut self) -> Result<(), NetError> {
        let start = (std::process::id() % u32::from(SLOTS)) as u8;
        let mut last = None;
        for i in 0..SLOTS {
            self.slot = (start + i) % SLOTS;
            match self.root_routes() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    self.drop_root_routes();
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| NetError("no free address block in 10.77.0.0/16".into())))
    }

    fn root_routes(&self) -> Result<(), NetError> {
        for n in 1..=self.nodes {
            let root = self.root_veth(n);
            ip(&["addr", "add", &self.root_link(n, true), "dev", &root])?;
            let via = self.root_link(n, false);
            let via = via.trim_end_matches("/30");
            ip(&[
                "route",
                "add",
                &format!("{}/32", self.addr(n)),
                "via",
                via,
                "dev",
                &root,
            ])?;
        }
        Ok(())
    }

    fn drop_root_routes(&self) {
        for n in 1..=self.nodes {
            let root = self.root_veth(n);
            let _ = ip(&[
                "route",
                "del",
                &format!("{}/32", self.addr(n)),
                "dev",
                &root,
            ]);
            let _ = ip(&["addr", "flush", "dev", &root]);
        }
    }

    /// Brings the link between nodes `a` and `b` up (both ends) and (re)installs the routes
    /// through it; a link that went down lost them.
    pub fn link_up(&self, a: u8, b: u8) -> Result<(), NetError> {
        let (a, b) = (a.min(b), a.max(b));
        let (va, vb) = self.pair_veths(a, b);
        for (n, dev) in [(a, &va), (b, &vb)] {
            let ns = self.ns(n);
            let mine = format!("{}/30", self.pair_addr(a, b, n));
            let _ = ip(&["-n", &ns, "addr", "replace", &mine, "dev", dev]);
            ip(&["-n", &ns, "link", "set", dev, "up"])?;
        }
        for (n, peer, dev) in [(a, b, &va), (b, a, &vb)] {
            let ns = self.ns(n);
            ip(&[
                "-n",
                &ns,
                "route",
                "replace",
                &format!("{}/32", self.addr(peer)),
                "via",
                &self.pair_addr(a, b, peer),
                "dev",
                dev,
                "src",
                &self.addr(n),
            ])?;
        }
        Ok(())
    }

    /// Cuts the link between nodes `a` and `b`: both ends down, so the routes through it
    /// vanish and neither side can send to the other.
    pub fn cut(&self, a: u8, b: u8) {
        let (a, b) = (a.min(b), a.max(b));
        let (va, vb) = self.pair_veths(a, b);
        for (n, dev) in [(a, &va), (b, &vb)] {
            ip(&["-n", &self.ns(n), "link", "set", dev, "down"])
                .unwrap_or_else(|e| panic!("cutting link {a}-{b}: {e}"));
        }
    }

    /// Heals a cut link.
    pub fn heal(&self, a: u8, b: u8) {
        self.link_up(a, b)
            .unwrap_or_else(|e| panic!("healing link {a}-{b}: {e}"));
    }

    /// A command that runs `program` inside node `n`'s namespace (`ip netns exec` execs it,
    /// so the child's pid is the program's).
    pub fn command(&self, n: u8, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(n)]).arg(program);
        c
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Processes first: a namespace lives on while a process is inside it.
        for n in 1..=self.nodes {
            kill_all_in(&self.ns(n));
        }
        for n in 1..=self.nodes {
            // Deleting one end of a veth pair deletes both, root routes with them.
            let _ = ip(&["link", "del", &self.root_veth(n)]);
        }
        for n in 1..=self.nodes {
            let _ = ip(&["netns", "del", &self.ns(n)]);
        }
    }
}

/// SIGKILLs every process in namespace `ns` and waits (briefly) until they are gone.
fn kill_all_in(ns: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids: Vec<String> = ip_output(&["netns", "pids", ns])
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in &pids {
            let _ = Command::new("kill")
                .args(["-KILL", pid])
                .stderr(Stdio::null())
                .status();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid in `<pid><letter><kind><digits>` (the tail of a name this module makes) when
/// that process is gone and it is not this one.
fn dead_owner(tagged: &str, kind: u8) -> Option<u32> {
    let digits: String = tagged.chars().take_while(char::is_ascii_digit).collect();
    let tail = &tagged.as_bytes()[digits.len()..];
    let shaped = tail.len() >= 3
        && tail[0].is_ascii_lowercase()
        && tail[1] == kind
        && tail[2..].iter().all(u8::is_ascii_digit);
    let pid = digits.parse::<u32>().ok()?;
    let gone = pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists();
    (shaped && gone).then_some(pid)
}

/// Removes what runs of this test left behind when their process was killed before it could
/// clean up: namespaces `spate<pid><letter>n<N>` (with the processes in them) and root-side
/// veths `sp<pid><letter>r<N>`, only where `<pid>` is gone.
fn remove_leftovers() {
    for line in ip_output(&["netns", "list"]).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(NS_PREFIX)
            .and_then(|rest| dead_owner(rest, b'n'))
        else {
            continue;
        };
        eprintln!("netns: removing namespace {name}, left over by a run (pid {pid}) that is gone");
        kill_all_in(name);
        let _ = ip(&["netns", "del", name]);
    }
    // A namespace can outlive its name for a while (the kernel frees it when the last user
    // goes), and its veth ends with it: delete the root ends, which takes both.
    for line in ip_output(&["-o", "link", "show"]).lines() {
        let Some(name) = line
            .split(':')
            .nth(1)
            .map(|n| n.trim().split('@').next().unwrap_or_default())
        else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix("sp")
            .and_then(|rest| dead_owner(rest, b'r'))
        else {
            continue;
        };
        eprintln!("netns: removing link {name}, left over by a run (pid {pid}) that is gone");
        let _ = ip(&["link", "del", name]);
    }
}

/// A process in a node's namespace, SIGKILLed when dropped; its output goes to a log file.
pub struct NsProcess {
    child: Option<Child>,
}

impl NsProcess {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> Self {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open node log");
        let err = out.try_clone().expect("clone log handle");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn a process in a network namespace");
        Self { child: Some(child) }
    }

    /// The process id while it runs (`ip netns exec` execs the program, so it is the
    /// program's).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (a name `kill` understands: "STOP", "CONT", "TERM") to the process.
    pub fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`; reaps it. True when it
    /// exited on its own after the SIGTERM.
    pub fn terminate(&mut self, grace: Duration) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        // A stopped process would only act on SIGTERM once continued.
        let pid = c.id().to_string();
        for sig in ["-TERM", "-CONT"] {
            let _ = Command::new("kill")
                .args([sig, &pid])
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + grace;
        loop {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// True while the process runs (it may have exited on its own, e.g. on a failed start).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NsProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A GET on a node's HTTP listener with a short timeout; `None` when it cannot be reached.
pub fn node_get(http: &str, path: &str) -> Option<(u16, String)> {
    crate::harness::try_http(http, "GET", path, &[], "", Duration::from_secs(3)).ok()
}

/// Whether the node's `/ready` answers 200.
pub fn node_ready(http: &str) -> bool {
    node_get(http, "/ready").is_some_and(|(code, _)| code == 200)
}

/// Node `id`'s `/admin/cluster`, or why it could not be read.
pub fn node_status(http: &str, id: u8) -> Result<serde_json::Value, String> {
    let (code, body) = node_get(http, "/admin/cluster")
        .ok_or_else(|| format!("node {id}: /admin/cluster unreachable"))?;
    if code != 200 {
        return Err(format!("node {id}: /admin/cluster answered {code}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("node {id}: {e}"))
}

/// Polls `probe` every `every` until it gives a value; panics with its last complaint after
/// `within`.
pub fn wait_for<T>(
    what: &str,
    within: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let last = match probe() {
            Ok(v) => return v,
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            panic!("waited {within:?} for {what}; last: {last}");
        }
        std::thread::sleep(every);
    }
}
