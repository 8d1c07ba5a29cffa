"""A secured 3-node cluster through real clients: SASL_SSL clients (librdkafka, Kafka's
kafka-configs and kafka-acls), mutual TLS between the nodes (--cluster-tls), HTTPS
(--http-tls), ACLs on, and a leader killed with kill -9 while an ACL'd user produces with
acks=all; every acknowledged record is read back.

  security_cluster_e2e.py DIR   DIR holds security_e2e.py's certificates

Each check prints ok or FAIL; the exit status is non-zero if any failed. Nodes are started
and stopped here (SPATE_BIN, or target/debug/spate)."""
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SPATE_BIN", os.path.join(ROOT, "target", "debug", "spate"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from security_e2e import FAILED, check  # noqa: E402 - the same reporting as the standalone checks

RUN = uuid.uuid4().hex[:8]
ADMIN = ("admin", "admin-secret")


class Cluster:
    """Three nodes on loopback with fixed inter-node ports; Kafka and HTTP ports are chosen
    by each process and read from its first line."""

    def __init__(self, certs, work):
        self.certs, self.work = certs, work
        ports = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "free-ports.py"), "3"],
                               capture_output=True, text=True, check=True).stdout.split()
        self.inter = {n: f"127.0.0.1:{ports[n - 1]}" for n in (1, 2, 3)}
        self.peers = ",".join(f"{n}={a}" for n, a in self.inter.items())
        self.procs, self.listeners, self.http = {}, {}, {}

    def start(self, n):
        c = self.certs
        args = [BIN, "--node-id", str(n), "--cluster-peers", self.peers,
                "--listeners", "SASL_SSL://127.0.0.1:0,SSL://127.0.0.1:0",
                "--http-listen", "127.0.0.1:0", "--data-dir", os.path.join(self.work, f"node{n}"),
                "--ssl-cert", os.path.join(c, "node.pem"), "--ssl-key", os.path.join(c, "node.key"),
                "--ssl-ca", os.path.join(c, "ca.pem"), "--cluster-tls", "true", "--http-tls", "true",
                "--authorizer", "acl", "--super-users", "User:admin",
                "--offsets-topic-num-partitions", "3", "--broker-session-timeout-ms", "2000",
                "--broker-heartbeat-interval-ms", "300", "--replica-lag-time-max-ms", "3000"]
        out = open(os.path.join(self.work, f"node{n}.out"), "w+")
        log = open(os.path.join(self.work, f"node{n}.log"), "a")
        env = dict(os.environ, SPATE_BOOTSTRAP_USERS=f"{ADMIN[0]}:{ADMIN[1]}", RUST_LOG="info")
        self.procs[n] = subprocess.Popen(args, stdout=out, stderr=log, env=env)
        deadline = time.time() + 60
        while time.time() < deadline:
            out.seek(0)
            line = out.readline()
            m = re.search(r"http on (\S+?),", line)
            if m and "listeners" in line:
                self.http[n] = m.group(1)
                self.listeners[n] = dict(re.findall(r"(SASL_SSL|SSL)://([\d.]+:\d+)", line))
                return
            if self.procs[n].poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"node {n} did not start: {self.log(n)[-2000:]}")

    def log(self, n):
        with open(os.path.join(self.work, f"node{n}.log")) as f:
            return f.read()

    def kill9(self, n):
        self.procs[n].send_signal(signal.SIGKILL)
        self.procs[n].wait()

    def stop_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()

    def ready(self, n):
        ctx = ssl.create_default_context(cafile=os.path.join(self.certs, "ca.pem"))
        try:
            with urllib.request.urlopen(f"https://{self.http[n]}/ready", context=ctx, timeout=3) as r:
                return r.status == 200
        except Exception:  # noqa: BLE001 - not ready yet
            return False

    def wait_ready(self, nodes, timeout=90):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if all(self.ready(n) for n in nodes):
                return
            time.sleep(0.2)
        raise AssertionError(f"nodes {nodes} not ready: " + " | ".join(self.log(n)[-800:] for n in nodes))

    def bootstrap(self, nodes=(1, 2, 3), listener="SASL_SSL"):
        return ",".join(self.listeners[n][listener] for n in nodes if self.procs[n].poll() is None)


def main(certs):
    from confluent_kafka import Consumer, KafkaError, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    work = tempfile.mkdtemp(prefix="spate-sec-cluster-")
    cluster = Cluster(certs, work)
    ca = os.path.join(certs, "ca.pem")

    def conf(user, password, nodes=(1, 2, 3), mechanism="SCRAM-SHA-512", **extra):
        c = {"bootstrap.servers": cluster.bootstrap(nodes), "security.protocol": "SASL_SSL",
             "ssl.ca.location": ca, "sasl.mechanism": mechanism, "sasl.username": user,
             "sasl.password": password, "socket.timeout.ms": 10000}
        c.update(extra)
        return c

    def props(name, user, password, mechanism="SCRAM-SHA-512"):
        path = os.path.join(work, name)
        with open(path, "w") as f:
            f.write(f"security.protocol=SASL_SSL\nsasl.mechanism={mechanism}\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
                    f"required username=\"{user}\" password=\"{password}\";\n"
                    f"ssl.truststore.type=PEM\nssl.truststore.location={ca}\n")
        return path

    def tool(name, node, *args):
        r = subprocess.run([os.path.join(ROOT, "scripts", "kafka", "tool.sh"), name, "--bootstrap-server",
                            cluster.listeners[node]["SASL_SSL"], "--command-config",
                            props("admin.properties", *ADMIN)] + list(args),
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, f"{name} {' '.join(args)}: {r.stdout[-300:]} {r.stderr[-600:]}"
        return r.stdout

    def produce(c, topic, values):
        """Produces values; returns those acknowledged and the errors of the others."""
        acked, errors = [], []
        p = Producer(dict(c, **{"acks": "all", "enable.idempotence": True, "message.timeout.ms": 60000}))

        def report(err, msg):
            if err is None:
                acked.append(msg.value().decode())
            else:
                errors.append(err)
        for v in values:
            p.produce(topic, value=v, on_delivery=report)
            p.poll(0)
        p.flush(90)
        return acked, errors

    def consume_all(c, topic, want, timeout=60):
        cc = dict(c, **{"group.id": f"alice-{RUN}-{uuid.uuid4().hex[:4]}", "auto.offset.reset": "earliest",
                        "enable.auto.commit": False})
        consumer = Consumer(cc)
        consumer.subscribe([topic])
        got = []
        deadline = time.time() + timeout
        while len(got) < want and time.time() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value().decode())
        consumer.close()
        return got

    def refused_login(c):
        errors = []
        # Quiet: the refusals are the point, not worth a log line each.
        a = AdminClient(dict(c, error_cb=lambda e: errors.append(e), log_level=0))
        try:
            a.list_topics(timeout=6)
            return False
        except Exception:  # noqa: BLE001 - the refusal itself
            return True

    try:
        for n in (1, 2, 3):
            cluster.start(n)
        cluster.wait_ready((1, 2, 3))
        topic = f"orders-{RUN}"

        @check("HTTPS /ready on every node, trusting the CA; plain HTTP gets no answer")
        def _():
            assert all(cluster.ready(n) for n in (1, 2, 3))
            try:
                urllib.request.urlopen(f"http://{cluster.http[1]}/ready", timeout=3)
                raise AssertionError("plain HTTP was answered")
            except AssertionError:
                raise
            except Exception:  # noqa: BLE001 - the refusal
                pass

        @check("the bootstrap admin (replicated credentials) creates a topic with RF 3 over SASL_SSL")
        def _():
            a = AdminClient(conf(*ADMIN, nodes=(3,)))
            t = NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})
            a.create_topics([t])[topic].result(timeout=60)

        @check("kafka-configs on node 1 adds alice; she logs in on node 3 with SCRAM-SHA-256 and PLAIN")
        def _():
            tool("kafka-configs", 1, "--alter", "--entity-type", "users", "--entity-name", "alice",
                 "--add-config", "SCRAM-SHA-256=[password=alice-secret],SCRAM-SHA-512=[password=alice-secret]")
            deadline = time.time() + 20
            while True:
                try:
                    AdminClient(conf("alice", "alice-secret", nodes=(3,), mechanism="SCRAM-SHA-256")) \
                        .list_topics(timeout=6)
                    break
                except Exception:  # noqa: BLE001 - not replicated yet
                    assert time.time() < deadline, "alice cannot log in on node 3"
                    time.sleep(0.5)
            AdminClient(conf("alice", "alice-secret", nodes=(2,), mechanism="PLAIN")).list_topics(timeout=6)
            assert refused_login(conf("alice", "wrong", nodes=(2,))), "a wrong password logs in"
            out = tool("kafka-configs", 3, "--describe", "--entity-type", "users", "--entity-name", "alice")
            assert "SCRAM-SHA-256" in out and "SCRAM-SHA-512" in out, out

        @check("kafka-acls on node 2 lets alice write and read; without them she is refused")
        def _():
            acked, errors = produce(conf("alice", "alice-secret", nodes=(1,)), topic, ["denied"])
            assert not acked and errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors
            tool("kafka-acls", 2, "--add", "--allow-principal", "User:alice", "--operation", "Write",
                 "--operation", "Read", "--operation", "Describe", "--topic", topic)
            tool("kafka-acls", 2, "--add", "--allow-principal", "User:alice", "--operation", "Read",
                 "--group", "alice-", "--resource-pattern-type", "prefixed")
            tool("kafka-acls", 2, "--add", "--allow-principal", "User:alice", "--operation",
                 "IdempotentWrite", "--cluster")
            listed = tool("kafka-acls", 3, "--list", "--topic", topic)
            assert "User:alice" in listed, listed

        acked_all = []

        @check("alice produces with acks=all through a kill -9 of the leader; every acked record reads back")
        def _():
            c = conf("alice", "alice-secret", nodes=(1, 2, 3))
            acked, errors = produce(c, topic, [f"a-{i}" for i in range(300)])
            assert len(acked) == 300, f"{len(acked)} acked before the kill, errors {errors[:3]}"
            acked_all.extend(acked)
            md = AdminClient(conf(*ADMIN)).list_topics(topic, timeout=10)
            leader = md.topics[topic].partitions[0].leader
            assert leader in (1, 2, 3), md.topics[topic].partitions[0]
            cluster.kill9(leader)
            survivors = tuple(n for n in (1, 2, 3) if n != leader)
            acked, errors = produce(conf("alice", "alice-secret", nodes=survivors), topic,
                                    [f"b-{i}" for i in range(300)])
            acked_all.extend(acked)
            assert len(acked) == 300, f"{len(acked)} of 300 acked after the kill: {errors[:3]}"
            cluster.start(leader)
            cluster.wait_ready((1, 2, 3))
            got = consume_all(conf("alice", "alice-secret", nodes=(leader,)), topic, len(acked_all))
            missing = set(acked_all) - set(got)
            assert not missing, f"{len(missing)} acknowledged records missing, e.g. {sorted(missing)[:5]}"
            assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicates"

        @check("Metadata on a node's SSL listener names every broker's SSL address")
        def _():
            c = {"bootstrap.servers": cluster.listeners[1]["SSL"], "security.protocol": "SSL",
                 "ssl.ca.location": ca, "socket.timeout.ms": 10000}
            md = AdminClient(c).list_topics(timeout=10)
            got = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
            want = {n: cluster.listeners[n]["SSL"] for n in (1, 2, 3)}
            assert got == want, f"{got} != {want}"
            md = AdminClient(conf(*ADMIN, nodes=(2,))).list_topics(timeout=10)
            got = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
            assert got == {n: cluster.listeners[n]["SASL_SSL"] for n in (1, 2, 3)}, got

        @check("the inter-node port refuses plain TCP, TLS without a certificate and a foreign CA's node")
        def _():
            host, port = cluster.inter[1].split(":")
            # A Raft hello in plain TCP: the TLS server closes without a Raft answer.
            s = socket.create_connection((host, int(port)), timeout=5)
            body = json.dumps({"from": 9, "to": 1, "body": "Hello"}).encode()
            s.sendall(len(body).to_bytes(4, "big") + body)
            s.settimeout(5)
            try:
                data = s.recv(4096)
            except (ConnectionResetError, socket.timeout):
                data = b""
            assert b"Hello" not in data and b"peers" not in data, data[:200]
            s.close()

            def tls_refused(cert):
                ctx = ssl.create_default_context(cafile=ca)
                if cert:
                    ctx.load_cert_chain(os.path.join(certs, cert + ".pem"), os.path.join(certs, cert + ".key"))
                try:
                    with socket.create_connection((host, int(port)), timeout=5) as raw:
                        with ctx.wrap_socket(raw, server_hostname=host) as t:
                            # TLS 1.3: a refused client certificate shows on the first read.
                            t.sendall(len(body).to_bytes(4, "big") + body)
                            t.settimeout(5)
                            return t.recv(4096) == b""
                except (ssl.SSLError, ConnectionResetError, OSError):
                    return True
            assert tls_refused(None), "TLS without a client certificate was served"
            assert tls_refused("other-node"), "a node certificate from another CA was served"
            assert not tls_refused("node"), "the CA's node certificate was refused"

        @check("an ACL removed on node 3 stops alice on node 1")
        def _():
            tool("kafka-acls", 3, "--remove", "--force", "--allow-principal", "User:alice", "--operation",
                 "Write", "--topic", topic)
            deadline = time.time() + 20
            while True:
                acked, errors = produce(conf("alice", "alice-secret", nodes=(1,),
                                             **{"message.timeout.ms": 8000}), topic, ["late"])
                if not acked and errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    break
                assert time.time() < deadline, f"still allowed: {acked} {errors}"
                time.sleep(0.5)
    finally:
        cluster.stop_all()
        if FAILED:
            for n in (1, 2, 3):
                print(f"---- node {n} log (tail) ----\n{cluster.log(n)[-3000:]}")
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main(sys.argv[1])
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {FAILED}")
        sys.exit(1)
    print("all cluster security checks passed")
