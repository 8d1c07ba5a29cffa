"""Cluster operation probes for scripts/bench-cluster-ops.sh, the same for spate and Kafka.
Nodes are given as ID=HOST:PORT. Each node is asked for Metadata (v8) on its own connection,
so the answer is that node's view: librdkafka's list_topics cannot promise that, it asks any
broker it has learned of, whatever it was bootstrapped to. Topics are created with
librdkafka (confluent-kafka) through the first node.

    python3 scripts/cluster_ops_probe.py propagate TOPIC PARTITIONS ID=ADDR...
        CreateTopics (PARTITIONS, replication factor 3), then asks every node for TOPIC's
        Metadata every PROBE_POLL_MS until all PARTITIONS have a leader there; then asks
        each leader for ListOffsets of its partitions until it answers them all (a node may
        be named leader before it acts as one). Prints `propagation_ms=<slowest node>
        leaders_serve_ms=<last partition served> create_ms=<CreateTopics answered>
        node<ID>_ms=...` and what the nodes answered meanwhile; all from CreateTopics sent.
    python3 scripts/cluster_ops_probe.py healthy ID=ADDR...
        Waits until every node's Metadata lists all the nodes and every partition of every
        topic with a leader and a full ISR.
    python3 scripts/cluster_ops_probe.py create TOPIC LEADER ID=ADDR...
        Creates TOPIC with one partition, replicas LEADER first then the other nodes, and
        waits until every node names LEADER as its leader.

Env: PROBE_TIMEOUT (seconds a command may take: 300), PROBE_POLL_MS (20).
Exits 1 on a timeout or an error, with the reason on stderr.
"""
import collections
import os
import socket
import struct
import sys
import threading
import time

from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT = float(os.environ.get("PROBE_TIMEOUT", "300"))
POLL = float(os.environ.get("PROBE_POLL_MS", "20")) / 1000


def err_name(code):
    return KafkaError(code).name()


def string(s):
    return struct.pack(">h", len(s.encode())) + s.encode()


class Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take(">h")
        if n < 0:
            return None
        s = self.buf[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def array(self, item):
        return [item() for _ in range(max(0, self.take(">i")))]


class Node:
    """A connection to one node's Kafka listener, reopened after any error."""

    def __init__(self, node, addr):
        host, port = addr.rsplit(":", 1)
        self.id, self.addr, self.sock, self.corr = node, (host, int(port)), None, 0

    def _recv(self, n):
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("connection closed")
            out += chunk
        return bytes(out)

    def _call(self, api_key, version, body, timeout):
        """Sends one request (header v1) and returns a Reader past the response header."""
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.addr, timeout=timeout)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.settimeout(timeout)
            self.corr += 1
            client = b"cluster-ops-probe"
            req = struct.pack(">hhih", api_key, version, self.corr, len(client)) + client + body
            self.sock.sendall(struct.pack(">i", len(req)) + req)
            size = struct.unpack(">i", self._recv(4))[0]
            r = Reader(self._recv(size))
        except OSError:
            self.close()
            raise
        if r.take(">i") != self.corr:
            self.close()
            raise ConnectionError("correlation id mismatch")
        return r

    def metadata(self, topics=None, timeout=5.0):
        """{"brokers": {id, ...}, "topics": {name: (error, {partition: (error, leader,
        replicas, isr)})}} as this node answers Metadata v8 for `topics` (None: all)."""
        if topics is None:
            body = struct.pack(">i", -1)
        else:
            body = struct.pack(">i", len(topics)) + b"".join(string(t) for t in topics)
        # No auto-creation (a poll must not create the topic), no authorized operations.
        r = self._call(3, 8, body + struct.pack(">???", False, False, False), timeout)
        r.take(">i")  # throttle_time_ms
        brokers = r.array(lambda: (r.take(">i"), r.string(), r.take(">i"), r.string()))
        r.string()  # cluster_id
        r.take(">i")  # controller_id

        def partition():
            err, index, leader, _epoch = r.take(">h"), r.take(">i"), r.take(">i"), r.take(">i")
            replicas = r.array(lambda: r.take(">i"))
            isr = r.array(lambda: r.take(">i"))
            r.array(lambda: r.take(">i"))  # offline replicas
            return index, (err, leader, replicas, isr)

        def topic():
            err, name, _internal = r.take(">h"), r.string(), r.take(">?")
            parts = dict(r.array(partition))
            r.take(">i")  # topic_authorized_operations
            return name, (err, parts)

        return {"brokers": {b[0] for b in brokers}, "topics": dict(r.array(topic))}

    def list_offsets(self, topic, partitions, timeout=5.0):
        """{partition: error code} of ListOffsets v4 (latest) for `partitions` of `topic`: 0
        once this node leads the partition and serves it."""
        body = struct.pack(">ib", -1, 0) + struct.pack(">i", 1) + string(topic)
        body += struct.pack(">i", len(partitions))
        body += b"".join(struct.pack(">iiq", p, -1, -1) for p in partitions)
        r = self._call(2, 4, body, timeout)
        r.take(">i")  # throttle_time_ms

        def partition():
            index, err = r.take(">i"), r.take(">h")
            r.take(">q"), r.take(">q"), r.take(">i")  # timestamp, offset, leader_epoch
            return index, err

        out = {}
        for _name, parts in r.array(lambda: (r.string(), r.array(partition))):
            out.update(parts)
        return out

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def parse_nodes(args):
    return [Node(int(a.split("=", 1)[0]), a.split("=", 1)[1]) for a in args]


def admin(node):
    # librdkafka's informational lines (telemetry, reconnects) would clutter the report.
    return AdminClient({"bootstrap.servers": "%s:%d" % node.addr, "log_level": 3})


def propagate(topic, partitions, nodes):
    # Connections open and the topic absent on every node before the clock starts.
    for n in nodes:
        err, _ = n.metadata([topic], timeout=30)["topics"][topic]
        if err == 0:
            sys.exit(f"topic {topic} exists already on node {n.id}")
    creator = admin(nodes[0])
    creator.list_topics(timeout=30)
    done, led, served, answers = {}, {}, {}, collections.Counter()
    lock = threading.Lock()
    created = {}
    t0 = time.monotonic()
    future = creator.create_topics([NewTopic(topic, partitions, 3)], request_timeout=TIMEOUT)[topic]
    future.add_done_callback(lambda f: created.setdefault("ms", (time.monotonic() - t0) * 1000))
    deadline = t0 + TIMEOUT

    def poll(n, ask, tag):
        """Calls ask() every POLL until it returns True; the answers it lists are counted."""
        while time.monotonic() < deadline:
            start = time.monotonic()
            seen = []
            try:
                if ask(seen):
                    return
            except OSError as e:
                seen.append(type(e).__name__)
            with lock:
                answers.update(f"{tag}:{s}" for s in seen)
            time.sleep(max(0.0, POLL - (time.monotonic() - start)))

    def metadata_led(n):
        def ask(seen):
            err, parts = n.metadata([topic])["topics"][topic]
            if err:
                seen.append(err_name(err))
            elif len(parts) == partitions and all(e == 0 and leader >= 0 for e, leader, _, _ in parts.values()):
                with lock:
                    done[n.id] = (time.monotonic() - t0) * 1000
                    led[n.id] = {i: leader for i, (_, leader, _, _) in parts.items()}
                return True
            else:
                seen.append("partially_led")
                seen.extend(err_name(e) for e, _, _, _ in parts.values() if e)
            return False
        poll(n, ask, "metadata")

    def leader_serves(n, pending):
        # Metadata names a leader as soon as the controller chose it; whether that node
        # already acts as one shows in ListOffsets, which only a partition's leader answers.
        def ask(seen):
            for p, err in n.list_offsets(topic, sorted(pending)).items():
                if err == 0:
                    pending.discard(p)
                else:
                    seen.append(err_name(err))
            if not pending:
                with lock:
                    served[n.id] = (time.monotonic() - t0) * 1000
                return True
            return False
        poll(n, ask, "listoffsets")

    def run(target, args_list):
        threads = [threading.Thread(target=target, args=a, daemon=True) for a in args_list]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()) + 10)

    run(metadata_led, [(n,) for n in nodes])
    if len(done) == len(nodes):
        by_leader = collections.defaultdict(set)
        for i, leader in led[nodes[0].id].items():
            by_leader[leader].add(i)
        by_id = {n.id: n for n in nodes}
        run(leader_serves, [(by_id[k], v) for k, v in by_leader.items() if k in by_id])
    create_err = None
    try:
        future.result(timeout=max(0.0, deadline - time.monotonic()) + 1)
        created.setdefault("ms", (time.monotonic() - t0) * 1000)  # the callback may not have run yet
    except Exception as e:  # the polls still tell whether the topic arrived
        create_err = e
    seen = ",".join(f"{k}:{v}" for k, v in sorted(answers.items())) or "none"
    per_node = " ".join(f"node{i}_ms={done[i]:.0f}" for i in sorted(done))
    if create_err is not None:
        print(f"CreateTopics failed: {create_err}", file=sys.stderr)
    leaders = set(led[nodes[0].id].values()) if led else set()
    if len(done) < len(nodes) or set(served) != leaders or create_err is not None:
        missing = sorted({n.id for n in nodes} - set(done))
        print(f"propagation of {topic} ({partitions} partitions) incomplete after {TIMEOUT:.0f} s: "
              f"Metadata without every leader on nodes {missing}, leaders {sorted(leaders - set(served))} "
              f"not serving; {per_node}; answers meanwhile: {seen}", file=sys.stderr)
        return 1
    print(f"propagation_ms={max(done.values()):.0f} leaders_serve_ms={max(served.values()):.0f} "
          f"create_ms={created['ms']:.0f} {per_node} partitions={partitions} answers_meanwhile={seen}")
    return 0


def unhealthy(md, ids):
    """Why md (one node's Metadata) is not healthy yet, or None."""
    if md["brokers"] != ids:
        return f"brokers {sorted(md['brokers'])}"
    for name, (err, parts) in md["topics"].items():
        if err:
            return f"{name}: {err_name(err)}"
        for index, (err, leader, replicas, isr) in parts.items():
            if err or leader < 0:
                return f"{name}-{index}: leader {leader}, {err_name(err)}"
            if sorted(isr) != sorted(replicas):
                return f"{name}-{index}: isr {isr} of replicas {replicas}"
    return None


def healthy(nodes):
    t0 = time.monotonic()
    ids = {n.id for n in nodes}
    why = {}
    while time.monotonic() - t0 < TIMEOUT:
        for n in nodes:
            try:
                why[n.id] = unhealthy(n.metadata(), ids)
            except OSError as e:
                why[n.id] = f"{type(e).__name__}: {e}"
        if all(w is None for w in why.values()):
            print(f"healthy after {time.monotonic() - t0:.1f} s")
            return 0
        time.sleep(0.5)
    print(f"not healthy after {TIMEOUT:.0f} s: " + "; ".join(f"node {i}: {w}" for i, w in why.items() if w),
          file=sys.stderr)
    return 1


def create(topic, leader, nodes):
    replicas = [leader] + sorted(n.id for n in nodes if n.id != leader)
    creator = admin(nodes[0])  # alive until the answer: destroying it fails the request
    creator.create_topics([NewTopic(topic, 1, replica_assignment=[replicas])])[topic].result(timeout=60)
    t0 = time.monotonic()
    leaders = {}
    while time.monotonic() - t0 < TIMEOUT:
        for n in nodes:
            try:
                err, parts = n.metadata([topic])["topics"][topic]
                leaders[n.id] = parts[0][1] if not err and 0 in parts else None
            except OSError:
                leaders[n.id] = None
        if all(v == leader for v in leaders.values()):
            print(f"{topic}: replicas {replicas}, led by node {leader} on every node")
            return 0
        time.sleep(0.1)
    print(f"{topic}: leaders after {TIMEOUT:.0f} s: {leaders}, not {leader} everywhere", file=sys.stderr)
    return 1


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("propagate", "healthy", "create"):
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "propagate":
        return propagate(args[0], int(args[1]), parse_nodes(args[2:]))
    if cmd == "healthy":
        return healthy(parse_nodes(args))
    return create(args[0], int(args[1]), parse_nodes(args[2:]))


if __name__ == "__main__":
    sys.exit(main())
