"""Many partitions on a 3-node spate cluster (issue 28), measured against throw-away release
nodes this script starts itself (scripts/bench-scale-cluster.sh passes the binary and a
data dir), once with FEW partitions (10) and once with PARTITIONS (10,000: 30,000 replicas
at RF 3), so each number has its small-cluster counterpart:

- creating the topics (CreateTopics answered) and until every partition has its three
  replicas in sync (Metadata's ISR);
- RSS per replica on each node, after the topics settled, over the replicas it holds;
- idle CPU of the three nodes with nothing produced (follower fetches of idle partitions);
- Metadata latency: all topics, and one topic (median of 20);
- controller failover: kill -9 of the node that is the controller, until Metadata names
  another one and until every partition has a live leader again;
- the killed node out of every ISR, then restarted: until it answers, and until every
  partition's ISR is whole again.

Prints one line per number and a JSON summary at the end. Every wait is bounded (WAIT_S)."""
import json
import os
import signal
import socket
import statistics
import subprocess
import time

from confluent_kafka.admin import AdminClient, NewTopic

BIN = os.environ["SPATE_BIN"]
DATA = os.environ["SCALE_DATA"]
PARTITIONS = int(os.environ.get("PARTITIONS", "10000"))
FEW = int(os.environ.get("FEW", "10"))
PER_TOPIC = int(os.environ.get("PER_TOPIC", "100"))
WAIT_S = float(os.environ.get("WAIT_S", "600"))
IDLE_S = float(os.environ.get("IDLE_S", "10"))
RESULT = {}


def report(key, value, unit):
    RESULT[key] = value
    print(f"{key}: {value} {unit}", flush=True)


def free_ports(n):
    """N free loopback ports below the ephemeral range (scripts/free-ports.py)."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.check_output(["python3", os.path.join(here, "free-ports.py"), str(n)])
    return [int(p) for p in out.split()]


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_ticks(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def waited(what, check, limit=None):
    """Seconds until check() is true, polling; raises after `limit` (WAIT_S)."""
    started = time.monotonic()
    deadline = started + (limit or WAIT_S)
    while True:
        try:
            if check():
                return time.monotonic() - started
        except Exception:  # the cluster is in the middle of changing: ask again
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached in {limit or WAIT_S:.0f} s")
        time.sleep(0.2)


class Cluster:
    """Three spate nodes on fixed loopback ports, so a node restarts where it was."""

    def __init__(self, name):
        self.dir = os.path.join(DATA, name)
        ports = free_ports(9)
        self.inter = ports[0:3]
        self.kafka = ports[3:6]
        self.http = ports[6:9]
        self.peers = ",".join(f"{n + 1}=127.0.0.1:{p}" for n, p in enumerate(self.inter))
        self.procs = {}
        for n in (1, 2, 3):
            self.start(n)
        self.bootstrap = ",".join(f"127.0.0.1:{p}" for p in self.kafka)
        waited("the cluster is ready", self.ready, 120)
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})

    def start(self, n):
        d = os.path.join(self.dir, f"node{n}")
        os.makedirs(d, exist_ok=True)
        log = open(os.path.join(d, "spate.log"), "a")
        self.procs[n] = subprocess.Popen(
            [BIN, "--node-id", str(n), "--cluster-peers", self.peers,
             "--listen", f"127.0.0.1:{self.kafka[n - 1]}",
             "--http-listen", f"127.0.0.1:{self.http[n - 1]}",
             "--data-dir", os.path.join(d, "data"), "--fsync", "interval"],
            stdout=log, stderr=log)

    def ready(self, nodes=(1, 2, 3)):
        import urllib.request
        for n in nodes:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http[n - 1]}/ready", timeout=5) as r:
                if r.status != 200:
                    return False
        return True

    def answers(self, n):
        with socket.create_connection(("127.0.0.1", self.kafka[n - 1]), timeout=2):
            return True

    def kill(self, n):
        self.procs[n].send_signal(signal.SIGKILL)
        self.procs[n].wait(30)

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(30)

    def controller(self):
        # A Metadata request of its own each time: librdkafka's DescribeCluster goes to the
        # controller it cached, which it refreshes only every 5 minutes.
        return self.admin.list_topics(timeout=5).controller_id

    def partitions(self):
        md = self.admin.list_topics(timeout=30)
        return [p for name, t in md.topics.items() if name.startswith("scale-")
                for p in t.partitions.values()]


def topic_layout(count):
    per = min(PER_TOPIC, count)
    return [(f"scale-{i:04d}", per) for i in range(max(count // per, 1))]


def measure(label, count):
    cluster = Cluster(label)
    try:
        pids = {n: p.pid for n, p in cluster.procs.items()}
        rss_before = {n: rss_kib(pid) for n, pid in pids.items()}
        layout = topic_layout(count)
        total = sum(n for _, n in layout)
        started = time.monotonic()
        for i in range(0, len(layout), 20):
            fs = cluster.admin.create_topics([NewTopic(t, n, 3) for t, n in layout[i:i + 20]],
                                             operation_timeout=120, request_timeout=180)
            for f in fs.values():
                f.result(timeout=300)
        report(f"{label}_create_seconds", round(time.monotonic() - started, 2),
               f"s to create {total} partitions at RF 3 ({len(layout)} CreateTopics)")

        def in_sync():
            parts = cluster.partitions()
            return len(parts) == total and all(len(p.isrs) == 3 and p.leader >= 1 for p in parts)

        report(f"{label}_in_sync_seconds", round(time.monotonic() - started + waited("full ISRs", in_sync), 2),
               "s from the first CreateTopics until every ISR is whole")
        time.sleep(5)
        replicas = total  # RF 3 on 3 nodes: every node holds every partition
        per_replica = [round((rss_kib(pid) - rss_before[n]) / replicas, 2) for n, pid in pids.items()]
        report(f"{label}_rss_per_replica_kib", max(per_replica),
               f"KiB per replica, the largest of the three nodes ({per_replica})")
        ticks = {n: cpu_ticks(pid) for n, pid in pids.items()}
        time.sleep(IDLE_S)
        hz = os.sysconf("SC_CLK_TCK")
        idle = sum(cpu_ticks(pid) - ticks[n] for n, pid in pids.items()) / hz / IDLE_S
        report(f"{label}_idle_cpu_cores", round(idle, 3), "cores used by the three idle nodes")
        times = []
        for _ in range(20):
            t = time.monotonic()
            cluster.admin.list_topics(timeout=60)
            times.append(time.monotonic() - t)
        report(f"{label}_metadata_all_ms", round(statistics.median(times) * 1000, 1), "ms, median of 20")
        times = []
        for _ in range(20):
            t = time.monotonic()
            cluster.admin.list_topics(topic=layout[0][0], timeout=60)
            times.append(time.monotonic() - t)
        report(f"{label}_metadata_one_ms", round(statistics.median(times) * 1000, 1), "ms, median of 20")

        old = cluster.controller()
        survivors = [n for n in (1, 2, 3) if n != old]
        cluster.kill(old)
        killed = time.monotonic()
        cluster.admin = AdminClient({"bootstrap.servers": ",".join(
            f"127.0.0.1:{cluster.kafka[n - 1]}" for n in survivors)})
        waited("a new controller", lambda: cluster.controller() in survivors)
        report(f"{label}_controller_failover_seconds", round(time.monotonic() - killed, 2),
               f"s from kill -9 of controller {old} until Metadata names another")

        def led():
            parts = cluster.partitions()
            return len(parts) == total and all(p.leader in survivors for p in parts)

        waited("live leaders", led)
        report(f"{label}_leaders_after_kill_seconds", round(time.monotonic() - killed, 2),
               "s from the kill until every partition has a live leader")

        def shrunk():
            parts = cluster.partitions()
            return len(parts) == total and all(old not in p.isrs for p in parts)

        # Restarted before its replicas left the ISRs, the node would have nothing to rejoin.
        waited("the killed node out of every ISR", shrunk)
        report(f"{label}_isr_shrunk_seconds", round(time.monotonic() - killed, 2),
               "s from the kill until no ISR holds the killed node")
        cluster.start(old)
        restarted = time.monotonic()
        waited("the restarted node answers", lambda: cluster.answers(old))
        report(f"{label}_restart_answers_seconds", round(time.monotonic() - restarted, 2),
               "s until the restarted node answers on its Kafka port")
        waited("full ISRs after the restart", in_sync)
        report(f"{label}_isr_whole_after_restart_seconds", round(time.monotonic() - restarted, 2),
               "s until every ISR holds the restarted node again")
    finally:
        cluster.stop()


def main():
    measure("few", FEW)
    measure("many", PARTITIONS)
    for key in ("controller_failover_seconds", "leaders_after_kill_seconds",
                "isr_shrunk_seconds", "isr_whole_after_restart_seconds"):
        few, many = RESULT.get(f"few_{key}"), RESULT.get(f"many_{key}")
        if few and many:
            report(f"ratio_{key}", round(many / few, 2), f"many ({PARTITIONS}) over few ({FEW})")
    print("summary " + json.dumps(RESULT), flush=True)


if __name__ == "__main__":
    main()
