"""TLS and SASL through real clients: librdkafka (confluent-kafka) on every listener kind, and
Kafka's own kafka-configs / console producer and consumer (the Java client).

  security_e2e.py certs DIR     writes a CA, a server certificate for 127.0.0.1/localhost,
                                client certificates (CN=alice; expired; from another CA), node
                                certificates (server and client, from the CA and from another)
                                and a second CA into DIR
  security_e2e.py check DIR     runs the checks against the broker whose listeners are in
                                SPATE_LISTENERS (NAME://host:port,...), started with DIR's
                                certificates, --ssl-client-auth requested and
                                SPATE_BOOTSTRAP_USERS=admin:admin-secret,alice:alice-secret

Each check prints ok or FAIL; the exit status is non-zero if any failed."""
import contextlib
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid

RUN = uuid.uuid4().hex[:8]
FAILED = []


def certs(d):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)

    def key():
        return ec.generate_private_key(ec.SECP256R1())

    def write(name, k, cert):
        with open(os.path.join(d, name + ".key"), "wb") as f:
            f.write(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
        with open(os.path.join(d, name + ".pem"), "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))

    def ca(name):
        k = key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(k.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(k, hashes.SHA256()))
        write(name, k, cert)
        return k, cert

    def leaf(name, cn, issuer, server, days=(-1, 2), client=False):
        k = key()
        ik, icert = issuer
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .issuer_name(icert.subject).public_key(k.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(now + datetime.timedelta(days=days[0]))
             .not_valid_after(now + datetime.timedelta(days=days[1])))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            usages = [ExtendedKeyUsageOID.SERVER_AUTH] + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
            b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        else:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        write(name, k, b.sign(ik, hashes.SHA256()))

    root = ca("ca")
    other = ca("other-ca")
    leaf("server", "localhost", root, True)
    leaf("alice", "alice", root, False)
    leaf("expired", "old", root, False, days=(-10, -1))
    leaf("stranger", "stranger", other, False)
    # A cluster node's: it serves and it connects to the other nodes (mutual TLS between nodes).
    leaf("node", "spate-node", root, True, client=True)
    leaf("other-node", "spate-node", other, True, client=True)


@contextlib.contextmanager
def own_broker(args, listener, **env):
    """A second spate (SPATE_BIN, or target/debug/spate) with `args`, for settings the main
    broker cannot have at once; yields the address of its `listener` and stops it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = os.environ.get("SPATE_BIN", os.path.join(root, "target", "debug", "spate"))
    with tempfile.TemporaryDirectory() as data:
        out = open(os.path.join(data, "stdout"), "w+")
        proc = subprocess.Popen([binary, "--data-dir", os.path.join(data, "d"), "--http-listen", "127.0.0.1:0"]
                                + args, stdout=out, stderr=subprocess.DEVNULL, env=dict(os.environ, **env))
        try:
            deadline = time.time() + 30
            addr = None
            while addr is None and time.time() < deadline:
                out.seek(0)
                m = re.search(listener + r"://(\S+)", out.read())
                addr = m and m.group(1).rstrip(",")
                time.sleep(0.1)
            assert addr, f"a spate with {args} did not start"
            yield addr
        finally:
            proc.kill()
            proc.wait()


def check(name):
    def wrap(f):
        try:
            f()
            print(f"ok    {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported the same way
            FAILED.append(name)
            print(f"FAIL  {name}: {e}", flush=True)
        return f
    return wrap


def run_checks(d):
    from confluent_kafka import Consumer, KafkaError, Producer
    from confluent_kafka.admin import AdminClient

    listeners = dict(re.findall(r"(PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL)://([^,]+)",
                                os.environ["SPATE_LISTENERS"]))
    assert len(listeners) == 4, f"expected four listeners, got {os.environ['SPATE_LISTENERS']}"

    def conf(proto, user=None, password=None, mechanism="PLAIN", **extra):
        c = {"bootstrap.servers": listeners[proto], "security.protocol": proto,
             "socket.timeout.ms": 10000, "message.timeout.ms": 15000}
        if "SSL" in proto:
            c["ssl.ca.location"] = os.path.join(d, "ca.pem")
        if user is not None:
            c.update({"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password})
        c.update(extra)
        return c

    def round_trip(c, n=20):
        """Produces n records to a new topic and reads them back with the same settings."""
        topic = f"sec-{RUN}-{uuid.uuid4().hex[:6]}"
        p = Producer(c)
        for i in range(n):
            p.produce(topic, key=str(i), value=f"value-{i}")
        left = p.flush(30)
        assert left == 0, f"{left} records not delivered"
        cc = dict(c, **{"group.id": f"g-{RUN}", "auto.offset.reset": "earliest"})
        consumer = Consumer(cc)
        consumer.subscribe([topic])
        got = []
        deadline = time.time() + 30
        while len(got) < n and time.time() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value().decode())
        consumer.close()
        assert got == [f"value-{i}" for i in range(n)], f"read back {len(got)} of {n}"

    def refused(c, want_words):
        """A client with these settings gets nowhere; its error mentions one of want_words."""
        errors = []
        a = AdminClient(dict(c, error_cb=lambda e: errors.append(e)))
        try:
            a.list_topics(timeout=6)
            raise AssertionError("metadata was answered")
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - the refusal itself
            errors.append(e)
        # librdkafka reports connection errors through error_cb when polled.
        for _ in range(4):
            a.poll(0.5)
        text = " | ".join(str(e) for e in errors)
        assert any(w.lower() in text.lower() for w in want_words), f"errors were: {text[:300]}"
        return errors

    @check("PLAINTEXT round trip")
    def _():
        round_trip(conf("PLAINTEXT"))

    for mech in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        @check(f"SASL_PLAINTEXT {mech} round trip as admin")
        def _():
            round_trip(conf("SASL_PLAINTEXT", "admin", "admin-secret", mech))

        @check(f"SASL_SSL {mech} round trip as alice")
        def _():
            round_trip(conf("SASL_SSL", "alice", "alice-secret", mech))

    @check("SSL without a client certificate (requested) round trip")
    def _():
        round_trip(conf("SSL"))

    @check("SSL with a client certificate (mTLS, CN=alice) round trip")
    def _():
        round_trip(conf("SSL", **{"ssl.certificate.location": os.path.join(d, "alice.pem"),
                                  "ssl.key.location": os.path.join(d, "alice.key")}))

    @check("Metadata names the listener the client came through")
    def _():
        for proto, addr in listeners.items():
            c = conf(proto, "admin", "admin-secret") if proto.startswith("SASL") else conf(proto)
            md = AdminClient(c).list_topics(timeout=10)
            seen = {f"{b.host}:{b.port}" for b in md.brokers.values()}
            assert seen == {addr}, f"{proto}: brokers {seen}, listener {addr}"

    @check("a wrong password and an unknown user fail alike, for every mechanism")
    def _():
        for mech in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            wrong = refused(conf("SASL_PLAINTEXT", "admin", "nope", mech), ["authentication"])
            ghost = refused(conf("SASL_PLAINTEXT", "ghost", "nope", mech), ["authentication"])
            strip = lambda errs: re.sub(r"after \d+ms", "", str(errs[0]))  # noqa: E731
            assert strip(wrong) == strip(ghost), f"{mech}: '{strip(wrong)}' vs '{strip(ghost)}'"

    @check("a mechanism the broker does not offer is refused")
    def _():
        refused(conf("SASL_PLAINTEXT", **{"sasl.mechanism": "OAUTHBEARER",
                                          "enable.sasl.oauthbearer.unsecure.jwt": True}),
                ["mechanism", "authentication"])

    def with_cert(c, name):
        return dict(c, **{"ssl.certificate.location": os.path.join(d, f"{name}.pem"),
                          "ssl.key.location": os.path.join(d, f"{name}.key")})

    @check("an expired client certificate is refused (client auth requested)")
    def _():
        refused(with_cert(conf("SSL"), "expired"), ["expired", "certificate", "ssl"])

    @check("with --ssl-client-auth required: alice's certificate passes; none, an expired one or one from another CA do not")
    def _():
        with own_broker(["--listeners", "SSL://127.0.0.1:0", "--ssl-cert", os.path.join(d, "server.pem"),
                         "--ssl-key", os.path.join(d, "server.key"), "--ssl-ca", os.path.join(d, "ca.pem"),
                         "--ssl-client-auth", "required"], "SSL") as addr:
            c = dict(conf("SSL"), **{"bootstrap.servers": addr})
            round_trip(with_cert(c, "alice"), 5)
            refused(c, ["certificate", "ssl", "handshake", "transport"])
            for name in ("expired", "stranger"):
                refused(with_cert(c, name), ["certificate", "ssl", "handshake", "transport", "expired"])

    @check("a client that does not trust the broker's CA does not connect")
    def _():
        refused(conf("SSL", **{"ssl.ca.location": os.path.join(d, "other-ca.pem")}),
                ["certificate", "ssl", "handshake"])

    @check("a TLS client on the plaintext port and a plaintext client on the TLS port fail")
    def _():
        c = conf("PLAINTEXT")
        c["security.protocol"] = "SSL"
        c["ssl.ca.location"] = os.path.join(d, "ca.pem")
        refused(c, ["ssl", "handshake", "transport", "disconnect"])
        refused(dict(conf("PLAINTEXT"), **{"bootstrap.servers": listeners["SSL"]}),
                ["transport", "disconnect", "timed out", "size"])
        round_trip(conf("PLAINTEXT"), 5)

    @check("kafka-configs adds, describes and deletes a SCRAM user; the user logs in meanwhile")
    def _():
        root = os.path.dirname(os.path.abspath(__file__))
        props = os.path.join(d, "admin.properties")
        with open(props, "w") as f:
            f.write("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
                    "required username=\"admin\" password=\"admin-secret\";\n")
        tool = [os.path.join(root, "kafka", "tool.sh"), "kafka-configs", "--bootstrap-server",
                listeners["SASL_PLAINTEXT"], "--command-config", props]
        user = f"bob-{RUN}"

        def configs(*args):
            r = subprocess.run(tool + list(args), capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, f"kafka-configs {' '.join(args)}: {r.stderr[-500:]}"
            return r.stdout

        configs("--alter", "--entity-type", "users", "--entity-name", user, "--add-config",
                "SCRAM-SHA-256=[iterations=8192,password=bob-secret],SCRAM-SHA-512=[password=bob-secret]")
        out = configs("--describe", "--entity-type", "users", "--entity-name", user)
        assert "SCRAM-SHA-256=iterations=8192" in out and "SCRAM-SHA-512=iterations=4096" in out, out
        round_trip(conf("SASL_SSL", user, "bob-secret", "SCRAM-SHA-256"), 5)
        round_trip(conf("SASL_PLAINTEXT", user, "bob-secret", "PLAIN"), 5)
        configs("--alter", "--entity-type", "users", "--entity-name", user, "--delete-config",
                "SCRAM-SHA-256,SCRAM-SHA-512")
        refused(conf("SASL_PLAINTEXT", user, "bob-secret", "SCRAM-SHA-256"), ["authentication"])

    @check("Kafka's console producer and consumer over SASL_SSL with SCRAM-SHA-256")
    def _():
        root = os.path.dirname(os.path.abspath(__file__))
        props = os.path.join(d, "client.properties")
        with open(props, "w") as f:
            f.write("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
                    "required username=\"alice\" password=\"alice-secret\";\n"
                    f"ssl.truststore.type=PEM\nssl.truststore.location={os.path.join(d, 'ca.pem')}\n")
        topic = f"sec-java-{RUN}"
        tool = os.path.join(root, "kafka", "tool.sh")
        lines = "\n".join(f"line-{i}" for i in range(10)) + "\n"
        r = subprocess.run([tool, "kafka-console-producer", "--bootstrap-server", listeners["SASL_SSL"],
                            "--topic", topic, "--producer.config", props],
                           input=lines, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-500:]
        r = subprocess.run([tool, "kafka-console-consumer", "--bootstrap-server", listeners["SASL_SSL"],
                            "--topic", topic, "--from-beginning", "--max-messages", "10",
                            "--timeout-ms", "30000", "--consumer.config", props],
                           capture_output=True, text=True, timeout=120)
        got = [w for w in r.stdout.split() if w.startswith("line-")]
        assert got == [f"line-{i}" for i in range(10)], (r.stdout, r.stderr[-500:])

    @check("kafka-acls add/list/remove, literal and prefixed, and their effect on librdkafka clients")
    def _():
        with own_broker(["--listeners", "SASL_PLAINTEXT://127.0.0.1:0", "--authorizer", "acl",
                         "--super-users", "User:admin"], "SASL_PLAINTEXT",
                        SPATE_BOOTSTRAP_USERS="admin:admin-secret,alice:alice-secret") as addr:
            acl_check(addr, d)

    @check("the broker still serves after all of the above")
    def _():
        round_trip(conf("SASL_SSL", "admin", "admin-secret", "SCRAM-SHA-512"), 5)


def acl_check(addr, d):
    from confluent_kafka import Consumer, KafkaError, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    root = os.path.dirname(os.path.abspath(__file__))

    def conf(user):
        return {"bootstrap.servers": addr, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
                "sasl.password": f"{user}-secret", "socket.timeout.ms": 10000}

    props = os.path.join(d, "acl-admin.properties")
    with open(props, "w") as f:
        f.write("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
                "required username=\"admin\" password=\"admin-secret\";\n")

    def acls(*args):
        r = subprocess.run([os.path.join(root, "kafka", "tool.sh"), "kafka-acls", "--bootstrap-server", addr,
                            "--command-config", props] + list(args),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"kafka-acls {' '.join(args)}: {r.stdout[-300:]} {r.stderr[-500:]}"
        return r.stdout

    admin = AdminClient(conf("admin"))
    for f in admin.create_topics([NewTopic("orders", 1, 1), NewTopic("logs-app", 1, 1),
                                  NewTopic("secret", 1, 1)]).values():
        f.result(timeout=30)

    def produce(user, topic):
        errors = []
        p = Producer(dict(conf(user), **{"message.timeout.ms": 8000}))
        p.produce(topic, value=b"x", on_delivery=lambda err, msg: errors.append(err))
        p.flush(15)
        return errors[0] if errors else "no delivery report"

    def visible(user):
        md = AdminClient(conf(user)).list_topics(timeout=10)
        return {t for t in md.topics if not t.startswith("__")}

    err = produce("alice", "orders")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, f"no ACL yet: {err}"
    assert visible("alice") == set(), f"alice sees {visible('alice')} without ACLs"
    assert produce("admin", "orders") is None, "the super user writes anywhere"
    acls("--add", "--allow-principal", "User:alice", "--operation", "Write", "--topic", "orders")
    assert produce("alice", "orders") is None, "literal Write allows"
    acls("--add", "--allow-principal", "User:alice", "--operation", "Read", "--topic", "logs-",
         "--resource-pattern-type", "prefixed", "--group", "alice-")
    listed = acls("--list", "--topic", "logs-", "--resource-pattern-type", "prefixed")
    assert "User:alice" in listed and "READ" in listed.upper(), listed
    assert visible("alice") == {"orders", "logs-app"}, f"Describe is implied: {visible('alice')}"
    assert produce("admin", "logs-app") is None
    c = Consumer(dict(conf("alice"), **{"group.id": "alice-1", "auto.offset.reset": "earliest"}))
    c.subscribe(["logs-app"])
    got = None
    deadline = time.time() + 30
    while got is None and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got = m.value()
    c.close()
    assert got == b"x", "prefixed Read on topic and group lets alice consume"
    c = Consumer(dict(conf("alice"), **{"group.id": "other-group", "auto.offset.reset": "earliest"}))
    c.subscribe(["logs-app"])
    refused = None
    deadline = time.time() + 20
    while refused is None and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is not None:
            refused = m.error()
    c.close()
    assert refused is not None and refused.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, f"{refused}"
    acls("--add", "--deny-principal", "User:alice", "--operation", "Write", "--topic", "*")
    err = produce("alice", "orders")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, f"deny wins: {err}"
    acls("--remove", "--force", "--deny-principal", "User:alice", "--operation", "Write", "--topic", "*")
    assert produce("alice", "orders") is None, "allowed again once the deny is removed"
    acls("--remove", "--force", "--allow-principal", "User:alice", "--operation", "Write", "--topic", "orders")
    err = produce("alice", "orders")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, f"removed: {err}"
    assert "secret" not in visible("alice")
    # Admin operations need their own ACLs: creating, deleting and describing configs.
    from confluent_kafka.admin import ConfigResource
    alice = AdminClient(conf("alice"))
    f = alice.create_topics([NewTopic("alice-new", 1, 1)])["alice-new"]
    try:
        f.result(timeout=30)
        raise AssertionError("alice created a topic without Create")
    except Exception as e:  # noqa: BLE001
        assert "AUTHORIZATION" in str(e).upper(), e
    f = alice.delete_topics(["orders"])["orders"]
    try:
        f.result(timeout=30)
        raise AssertionError("alice deleted a topic without Delete")
    except Exception as e:  # noqa: BLE001
        assert "AUTHORIZATION" in str(e).upper(), e
    res = alice.describe_configs([ConfigResource("topic", "secret")])
    try:
        list(res.values())[0].result(timeout=30)
        raise AssertionError("alice described configs without DescribeConfigs")
    except Exception as e:  # noqa: BLE001
        assert "AUTHORIZATION" in str(e).upper(), e
    acls("--add", "--allow-principal", "User:alice", "--operation", "Create", "--cluster")
    alice.create_topics([NewTopic("alice-new", 1, 1)])["alice-new"].result(timeout=30)
    assert "orders" in visible("admin"), "the refused delete deleted nothing"


if __name__ == "__main__":
    mode, directory = sys.argv[1], sys.argv[2]
    if mode == "certs":
        certs(directory)
    else:
        run_checks(directory)
        if FAILED:
            print(f"{len(FAILED)} check(s) failed: {FAILED}")
            sys.exit(1)
        print("all security checks passed")
