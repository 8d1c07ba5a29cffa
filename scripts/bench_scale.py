"""Many partitions and connections on one spate node (issue 28), measured against a throw-away
release broker (see scripts/bench-scale.sh, which starts it and passes its pid and addresses):

- RSS per idle partition: RSS after creating PARTITIONS partitions (TOPICS topics) and letting
  them settle, minus the RSS before, over the partition count;
- Metadata latency: all topics (librdkafka's list_topics), and one topic, median of 20;
- produce throughput across PARTITIONS partitions against across 10 (spate-bench, the same
  load, null keys so records spread over every partition), PRODUCE_ROUNDS (3) alternating
  rounds, medians compared;
- start-up time after a clean stop (SIGTERM) and after kill -9, until Kafka's port answers
  ApiVersions and every partition is listed again;
- stop time (SIGTERM to exit) with idle partitions and right after producing to all of them;
- RSS per idle connection: CONNECTIONS connections each having sent one ApiVersions request.

Prints one line per number and a JSON summary at the end."""
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import time

from confluent_kafka.admin import AdminClient, NewTopic

BIN = os.environ["SPATE_BIN"]
BENCH = os.environ["BENCH_BIN"]
DATA = os.environ["SCALE_DATA"]
PARTITIONS = int(os.environ.get("PARTITIONS", "10000"))
PER_TOPIC = int(os.environ.get("PER_TOPIC", "100"))
CONNECTIONS = int(os.environ.get("CONNECTIONS", "10000"))
SECONDS = int(os.environ.get("PRODUCE_SECONDS", "10"))
PRODUCE_ROUNDS = int(os.environ.get("PRODUCE_ROUNDS", "3"))
RESULT = {}


def report(key, value, unit):
    RESULT[key] = value
    print(f"{key}: {value} {unit}", flush=True)


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Broker:
    """A spate on DATA; started and stopped by this script."""

    def __init__(self):
        self.out = open(os.path.join(DATA, "stdout"), "w+")
        self.err = open(os.path.join(DATA, "spate.log"), "a")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [BIN, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--data-dir", os.path.join(DATA, "d"), "--fsync", "interval",
             "--max-connections", str(CONNECTIONS + 100),
             "--max-connections-per-ip", str(CONNECTIONS + 100)],
            stdout=self.out, stderr=self.err)
        deadline = time.time() + 600
        line = ""
        while "listening on" not in line:
            assert self.proc.poll() is None, "spate exited; see spate.log"
            assert time.time() < deadline, "spate did not start in 600 s"
            time.sleep(0.02)
            self.out.seek(0)
            line = self.out.read()
        self.addr = line.split()[3]
        host, port = self.addr.rsplit(":", 1)
        self.hostport = (host, int(port))

    def answers(self):
        """Seconds from start until ApiVersions is answered on the Kafka port."""
        deadline = time.time() + 600
        while True:
            try:
                s = api_versions_connection(self.hostport)
                s.close()
                return time.monotonic() - self.started
            except OSError:
                assert time.time() < deadline, "no ApiVersions answer in 600 s"
                time.sleep(0.02)

    def stop(self, sig):
        """Signals the broker and waits for it to exit: the seconds that took."""
        t = time.monotonic()
        self.proc.send_signal(sig)
        self.proc.wait(300)
        return time.monotonic() - t


def api_versions_connection(hostport):
    """A connection that has sent ApiVersions v0 and read its answer."""
    s = socket.create_connection(hostport, timeout=30)
    client = b"scale"
    body = struct.pack(">hhih", 18, 0, 1, len(client)) + client
    s.sendall(struct.pack(">i", len(body)) + body)
    (size,) = struct.unpack(">i", recv_exactly(s, 4))
    recv_exactly(s, size)
    return s


def recv_exactly(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("closed")
        buf += chunk
    return buf


def topic_names():
    return [f"scale-{i:04d}" for i in range(PARTITIONS // PER_TOPIC)]


def create_topics(admin):
    names = topic_names()
    started = time.monotonic()
    for i in range(0, len(names), 20):
        fs = admin.create_topics([NewTopic(n, PER_TOPIC, 1) for n in names[i:i + 20]],
                                 operation_timeout=120, request_timeout=180)
        for f in fs.values():
            f.result(timeout=300)
    return time.monotonic() - started


def listed_partitions(admin):
    md = admin.list_topics(timeout=120)
    return sum(len(t.partitions) for n, t in md.topics.items() if n.startswith("scale-"))


def median_ms(f, n=20):
    times = []
    for _ in range(n):
        t = time.monotonic()
        f()
        times.append((time.monotonic() - t) * 1000)
    return round(statistics.median(times), 2)


def produce_rate(addr, topic, partitions):
    out = subprocess.run(
        [BENCH, "-b", addr, "-t", topic, "--create-topic", "-p", str(partitions), "-c", "4",
         "-s", "256", "--acks", "1", "-d", str(SECONDS), "-w", "3", "--no-progress",
         "--json-output", os.path.join(DATA, f"{topic}.json")],
        capture_output=True, text=True, timeout=SECONDS + 300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return json.load(open(os.path.join(DATA, f"{topic}.json")))["produce"]["msgs_per_sec"]


def main():
    b = Broker()
    b.answers()
    time.sleep(3)
    base = rss_kib(b.proc.pid)
    report("rss_idle_broker_mib", round(base / 1024, 1), "MiB")
    admin = AdminClient({"bootstrap.servers": b.addr})
    secs = create_topics(admin)
    report("create_seconds", round(secs, 1), f"s for {PARTITIONS} partitions")
    assert listed_partitions(admin) == PARTITIONS
    time.sleep(10)
    after = rss_kib(b.proc.pid)
    report("rss_per_idle_partition_kib", round((after - base) / PARTITIONS, 2), "KiB (bar <= 50)")
    report("fds_with_partitions", fds(b.proc.pid), "open files")
    report("metadata_all_topics_ms", median_ms(lambda: admin.list_topics(timeout=60)), "ms (median of 20)")
    report("metadata_one_topic_ms",
           median_ms(lambda: admin.list_topics(topic="scale-0000", timeout=60)), "ms (median of 20)")
    # Start-up with every partition: after a clean stop, then after kill -9.
    for how, sig in (("clean", signal.SIGTERM), ("kill9", signal.SIGKILL)):
        took = b.stop(sig)
        if how == "clean":
            report("stop_idle_partitions_seconds", round(took, 2), f"s from SIGTERM to exit, {PARTITIONS} idle partitions")
        b = Broker()
        up = b.answers()
        admin = AdminClient({"bootstrap.servers": b.addr})
        assert listed_partitions(admin) == PARTITIONS
        report(f"startup_after_{how}_seconds", round(up, 2), "s to answer Kafka requests (bar <= 10 after clean)")
    # The partitions go before the connections come: each holds a file open, and the
    # broker's open-file limit is this machine's hard limit.
    for f in admin.delete_topics(topic_names(), operation_timeout=120).values():
        f.result(timeout=300)
    while listed_partitions(admin):
        time.sleep(0.5)
    time.sleep(3)
    before = rss_kib(b.proc.pid)
    conns = []
    try:
        for _ in range(CONNECTIONS):
            conns.append(api_versions_connection(b.hostport))
        time.sleep(3)
        report("rss_per_idle_connection_kib", round((rss_kib(b.proc.pid) - before) / CONNECTIONS, 2),
               f"KiB over {CONNECTIONS} connections (bar <= 20)")
    finally:
        for c in conns:
            c.close()
    # One run of each varies by up to 2x on this disk (page-cache writeback): rounds alternate
    # few and many, and the medians are compared.
    fews, manys = [], []
    for _ in range(PRODUCE_ROUNDS):
        fews.append(produce_rate(b.addr, "spread-10", 10))
        manys.append(produce_rate(b.addr, "spread-many", PARTITIONS))
    few, many = statistics.median(fews), statistics.median(manys)
    report("produce_10_partitions_msgs", round(few), f"msg/s (median of {PRODUCE_ROUNDS}: {', '.join(str(round(x)) for x in fews)})")
    report(f"produce_{PARTITIONS}_partitions_msgs", round(many), f"msg/s (median of {PRODUCE_ROUNDS}: {', '.join(str(round(x)) for x in manys)})")
    report("produce_many_over_few", round(many / few, 2), "(medians; bar >= 0.70)")
    took = b.stop(signal.SIGTERM)
    report("stop_busy_partitions_seconds", round(took, 2),
           f"s from SIGTERM to exit right after producing to {PARTITIONS} partitions")
    print("summary " + json.dumps(RESULT), flush=True)


if __name__ == "__main__":
    main()
