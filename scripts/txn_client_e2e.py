"""Kafka transactions through a real client (confluent-kafka, i.e. librdkafka) against the broker
at SPATE_BOOTSTRAP: interleaved commits and aborts as read_committed and read_uncommitted
consumers see them, zombie fencing, consume-transform-produce with send_offsets_to_transaction,
the broker aborting a transaction that outlives transaction.timeout.ms, refused bad input, and
the read_committed ListOffsets answer (the LSO) while a transaction is open. Each check prints
ok or FAIL; the exit status is non-zero if any failed. Topics and transactional ids are unique
per run, so the script can run again against the same broker.

The broker must abort timed-out transactions within a few seconds (Kafka: pass
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000; its default is 10 s)."""
import logging
import os
import re
import sys
import time
import uuid
import warnings

from confluent_kafka import (OFFSET_BEGINNING, OFFSET_END, Consumer, ConsumerGroupTopicPartitions, IsolationLevel,
                             KafkaError, KafkaException, Producer, TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

BOOTSTRAP = os.environ["SPATE_BOOTSTRAP"]
RUN = uuid.uuid4().hex[:8]
ADMIN = AdminClient({"bootstrap.servers": BOOTSTRAP})
# What librdkafka reported where the broker refused something; printed at the end, since
# another broker has to make librdkafka report the same.
OBSERVED = {}
FENCED_CODES = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)


def name(kind):
    return f"txn-py-{kind}-{RUN}"


def create_topics(*specs):
    """specs: (topic, partitions). Waits until each exists."""
    fs = ADMIN.create_topics([NewTopic(t, n, 1) for t, n in specs], operation_timeout=20)
    for f in fs.values():
        f.result(timeout=30)
    deadline = time.time() + 20
    for t, n in specs:
        while len(ADMIN.list_topics(t, timeout=10).topics[t].partitions) != n:
            assert time.time() < deadline, f"topic {t} never showed {n} partitions"
            time.sleep(0.1)


class EosLog(logging.Handler):
    """Keeps a producer's librdkafka log (debug=eos), to tell which error code the broker answered
    where librdkafka reports only its own (_FENCED for both INVALID_PRODUCER_EPOCH and
    PRODUCER_FENCED); warnings and errors still go to stderr."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        line = record.getMessage()
        self.lines.append(line)
        if record.levelno >= logging.WARNING:
            print(f"librdkafka: {line}", file=sys.stderr, flush=True)

    def broker_answers(self, producer, request):
        """The error names librdkafka logged for `request` ("EndTxn returned X in state ...").
        The log reaches Python through poll(), behind the API call's result: poll for a while."""
        deadline = time.time() + 3
        while True:
            found = [m.group(1) for line in self.lines for m in [re.search(rf"{request} returned (\w+)", line)] if m]
            if found or time.time() > deadline:
                return found
            try:
                producer.poll(0.1)
            except KafkaException:  # a producer in a fatal state raises its error from poll()
                time.sleep(0.1)


def txn_producer(txn_id, eos_log=None, **extra):
    conf = {"bootstrap.servers": BOOTSTRAP, "transactional.id": txn_id, "linger.ms": 5}
    conf.update(extra)
    if eos_log is None:
        return Producer(conf)
    log = logging.getLogger(f"rdkafka.{txn_id}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(eos_log)
    return Producer({**conf, "debug": "eos"}, logger=log)


def close_quietly(p):
    """Closes a producer; one in a fatal error state raises that error from close() (and warns
    that close's abort_transaction failed)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            p.close(5)
    except KafkaException as e:
        if not e.args[0].fatal():
            raise


def consumer(isolation, group=None, **extra):
    conf = {"bootstrap.servers": BOOTSTRAP, "group.id": group or f"txn-py-reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "enable.partition.eof": True}
    conf.update(extra)
    return Consumer(conf)


def read_all(topic, partitions, isolation, want=None, timeout=20):
    """Reads every partition from the beginning until each is at its end (with read_committed,
    the LSO) and, if `want` is given, at least that many records came. Returns
    {partition: [(offset, value)]}; the caller checks the counts."""
    c = consumer(isolation)
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got = {p: [] for p in range(partitions)}
        at_end = set()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if len(at_end) == partitions and (want is None or sum(map(len, got.values())) >= want):
                break
            for m in c.consume(num_messages=500, timeout=0.2):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                        continue
                    raise KafkaException(m.error())
                at_end.discard(m.partition())
                got[m.partition()].append((m.offset(), m.value().decode() if m.value() is not None else None))
        return got
    finally:
        c.close()


def high_watermark(topic, partition):
    c = consumer("read_uncommitted")
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)[1]
    finally:
        c.close()


def wait_high_watermark(topic, partition, want, timeout=15):
    deadline = time.time() + timeout
    hw = high_watermark(topic, partition)
    while hw < want and time.time() < deadline:
        time.sleep(0.1)
        hw = high_watermark(topic, partition)
    return hw


def describe(err):
    return (f"{err.name()} (code {err.code()}, fatal={err.fatal()}, "
            f"txn_requires_abort={err.txn_requires_abort()}, retriable={err.retriable()}): {err.str()}")


def delivered_into(sink):
    def cb(err, m):
        sink.append((err, m.partition() if m else None, m.offset() if m else None, m.value().decode() if m else None))
    return cb


# 1 --------------------------------------------------------------------------------------------
def read_committed_sees_exactly_the_committed_transactions_and_read_uncommitted_sees_all():
    """20 transactions of 50 records round-robin over 3 partitions, every third aborted (after its
    records were written). read_committed: exactly the committed records, per partition in produce
    order; read_uncommitted: all of them in produce order; no transaction marker surfaces as a
    message, and each transaction's marker takes one offset in every partition it wrote."""
    topic, parts, txns, per_txn = name("interleaved"), 3, 20, 50
    create_topics((topic, parts))
    p = txn_producer(name("interleaved-id"))
    p.init_transactions(30)
    reports = []
    committed = {q: [] for q in range(parts)}
    everything = {q: [] for q in range(parts)}
    for t in range(txns):
        p.begin_transaction()
        for r in range(per_txn):
            v = f"t{t}-r{r}"
            p.produce(topic, value=v, partition=r % parts, on_delivery=delivered_into(reports))
            everything[r % parts].append(v)
            if t % 3 != 2:
                committed[r % parts].append(v)
        if t % 3 == 2:
            assert p.flush(30) == 0, "aborted transaction's records not delivered"  # written, then aborted
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
    p.close()
    errs = [r for r in reports if r[0] is not None]
    assert not errs and len(reports) == txns * per_txn, (len(reports), errs[:3])
    for q in range(parts):
        want_hw = len(everything[q]) + txns
        hw = wait_high_watermark(topic, q, want_hw)
        assert hw == want_hw, f"partition {q}: high watermark {hw}, want {len(everything[q])} records + {txns} markers"
    rc = read_all(topic, parts, "read_committed", want=sum(map(len, committed.values())))
    ru = read_all(topic, parts, "read_uncommitted", want=txns * per_txn)
    for q in range(parts):
        got_rc = [v for _, v in rc[q]]
        assert got_rc == committed[q], (f"read_committed partition {q}: {len(got_rc)} records, "
                                        f"want {len(committed[q])}; first differences "
                                        f"{[(a, b) for a, b in zip(got_rc, committed[q]) if a != b][:3]}")
        got_ru = [v for _, v in ru[q]]
        assert got_ru == everything[q], (f"read_uncommitted partition {q}: {len(got_ru)} records, "
                                         f"want {len(everything[q])}")
        # Offsets rise strictly and skip exactly the markers: one per transaction.
        offs = [o for o, _ in ru[q]]
        assert offs == sorted(set(offs)), f"partition {q}: offsets not strictly rising"
        holes = offs[-1] + 1 - len(offs)  # the markers before the last record; the last one follows it
        assert holes == txns - 1, f"partition {q}: {holes} offsets before the last record hold no record, want {txns - 1}"
        by_offset = {o: v for o, v in ru[q]}
        assert [by_offset[o] for o, _ in rc[q]] == got_rc, f"partition {q}: read_committed offsets disagree"


# 2 --------------------------------------------------------------------------------------------
def a_second_producer_with_the_same_transactional_id_fences_the_first():
    """Producer A begins a transaction and writes; producer B with the same transactional.id
    calls init_transactions; A's commit then fails with a fatal fenced error, nothing A wrote
    in that transaction is visible to read_committed, and B's own transaction commits."""
    topic, txn_id = name("fencing"), name("fencing-id")
    create_topics((topic, 1))
    a_log = EosLog()
    a = txn_producer(txn_id, eos_log=a_log)
    a.init_transactions(30)
    a.begin_transaction()
    for i in range(10):
        a.produce(topic, value=f"zombie-{i}", partition=0)
    assert a.flush(30) == 0, "A's records not delivered"
    b = txn_producer(txn_id)
    b.init_transactions(30)  # bumps the epoch and aborts A's open transaction
    try:
        a.commit_transaction(30)
        raise AssertionError("the fenced producer's commit succeeded")
    except KafkaException as e:
        err = e.args[0]
        OBSERVED["fenced producer's commit_transaction"] = describe(err)
        OBSERVED["  the broker's EndTxn answer to the fenced producer"] = a_log.broker_answers(a, "EndTxn")
        assert err.code() in FENCED_CODES, f"want a fenced error, got {describe(err)}"
        assert err.fatal(), f"the fenced error is not fatal: {describe(err)}"
    # A fenced producer refuses any further transactional call.
    try:
        a.begin_transaction()
        raise AssertionError("the fenced producer began another transaction")
    except KafkaException as e:
        OBSERVED["fenced producer's next begin_transaction"] = describe(e.args[0])
        assert e.args[0].fatal(), describe(e.args[0])
    close_quietly(a)
    b.begin_transaction()
    for i in range(5):
        b.produce(topic, value=f"live-{i}", partition=0)
    b.commit_transaction(30)
    b.close()
    rc = read_all(topic, 1, "read_committed", want=5)
    assert [v for _, v in rc[0]] == [f"live-{i}" for i in range(5)], rc[0]
    ru = read_all(topic, 1, "read_uncommitted", want=15)
    assert [v for _, v in ru[0]] == [f"zombie-{i}" for i in range(10)] + [f"live-{i}" for i in range(5)], ru[0]


# 3 --------------------------------------------------------------------------------------------
def consume_transform_produce_outputs_each_input_once_and_commits_offsets_with_the_transaction():
    """An app in a consumer group reads chunks of an input topic, writes transformed records and
    sends its offsets with send_offsets_to_transaction; every other chunk it aborts and rewinds
    to the committed position instead. An aborted chunk leaves the committed offsets where they
    were; a committed one moves them to the chunk's end. At the end the read_committed output
    holds each input exactly once and the group's committed offsets are the input's end."""
    src, dst, group, parts, n = name("ctp-in"), name("ctp-out"), name("ctp-group"), 2, 200
    create_topics((src, parts), (dst, parts))
    plain = Producer({"bootstrap.servers": BOOTSTRAP})
    for i in range(n):
        plain.produce(src, value=f"in-{i}", partition=i % parts)
    assert plain.flush(30) == 0
    inputs_end = {q: high_watermark(src, q) for q in range(parts)}
    assert sum(inputs_end.values()) == n, inputs_end

    app_in = consumer("read_committed", group=group, **{"enable.partition.eof": False})
    app_out = txn_producer(name("ctp-id"))
    app_out.init_transactions(30)
    app_in.subscribe([src])

    def committed_offsets():
        tps = app_in.committed([TopicPartition(src, q) for q in range(parts)], timeout=15)
        return {tp.partition: tp.offset for tp in tps}

    chunks, aborted, commits, deadline = 0, 0, 0, time.time() + 60
    done = committed_offsets()
    while any(done.get(q) != inputs_end[q] for q in range(parts)):
        assert time.time() < deadline and chunks < 200, f"not done after {chunks} chunks: {done} vs {inputs_end}"
        msgs = [m for m in app_in.consume(num_messages=30, timeout=1.0) if not m.error()]
        if not msgs:
            continue
        chunks += 1
        app_out.begin_transaction()
        ends = {}
        for m in msgs:
            app_out.produce(dst, value=m.value().decode().replace("in-", "out-"), partition=m.partition())
            ends[m.partition()] = m.offset() + 1
        app_out.send_offsets_to_transaction([TopicPartition(src, q, o) for q, o in ends.items()],
                                            app_in.consumer_group_metadata(), 30)
        if chunks % 2 == 0:
            before = done
            # Delivered first: abort_transaction purges records still queued in the client,
            # and this check wants the aborted records in the log (hidden from read_committed).
            app_out.flush(30)
            app_out.abort_transaction(30)
            aborted += 1
            after = committed_offsets()
            assert after == before, f"abort moved the committed offsets: {before} -> {after}"
            for q in ends:
                app_in.seek(TopicPartition(src, q, after[q] if after[q] >= 0 else OFFSET_BEGINNING))
        else:
            app_out.commit_transaction(30)
            commits += 1
            done = committed_offsets()
            for q, o in ends.items():
                assert done[q] == o, f"committed chunk ends at {q}:{o}, group's committed offset {done[q]}"
    app_in.close()
    app_out.close()
    assert aborted > 0 and commits > 0, (aborted, commits)
    want = sorted(f"out-{i}" for i in range(n))
    rc = read_all(dst, parts, "read_committed", want=n)
    got = sorted(v for q in rc for _, v in rc[q])
    assert got == want, (f"read_committed output: {len(got)} records, {len(set(got))} distinct, want {n}; "
                         f"missing {sorted(set(want) - set(got))[:5]}, extra {sorted(set(got) - set(want))[:5]}")
    for q in range(parts):  # per partition in input order
        vals = [int(v[4:]) for _, v in rc[q]]
        assert vals == sorted(vals), f"output partition {q} out of input order"
    ru = read_all(dst, parts, "read_uncommitted", want=n + 1)
    assert sum(map(len, ru.values())) > n, "the aborted chunks' records are not in the log"
    # The group's offsets as another client (the admin API) sees them.
    fut = ADMIN.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], require_stable=True)
    res = fut[group].result(timeout=20)
    seen = {tp.partition: tp.offset for tp in res.topic_partitions if tp.topic == src}
    assert seen == inputs_end, f"group offsets {seen}, want {inputs_end}"
    OBSERVED["consume-transform-produce"] = f"{chunks} chunks, {commits} committed, {aborted} aborted"


# 4 --------------------------------------------------------------------------------------------
def the_broker_aborts_a_transaction_that_outlives_its_timeout():
    """A producer with transaction.timeout.ms=5000 begins a transaction, writes, and stalls. A
    plain producer's records written after it stay hidden from read_committed (the LSO is held at
    the stalled transaction) until the broker aborts it; then they become readable, the stalled
    records never do, and the stalled producer's commit fails."""
    topic, timeout_ms = name("timeout"), 5000
    create_topics((topic, 1))
    s_log = EosLog()
    s = txn_producer(name("timeout-id"), eos_log=s_log, **{"transaction.timeout.ms": timeout_ms})
    s.init_transactions(30)
    s.begin_transaction()
    for i in range(5):
        s.produce(topic, value=f"stalled-{i}", partition=0)
    assert s.flush(30) == 0
    started = time.time()
    plain = Producer({"bootstrap.servers": BOOTSTRAP})
    for i in range(5):
        plain.produce(topic, value=f"after-{i}", partition=0)
    assert plain.flush(30) == 0
    plain.close()
    # Before the timeout, read_committed sees nothing: the LSO is the stalled transaction's start.
    early = read_all(topic, 1, "read_committed", timeout=2)
    if time.time() - started < timeout_ms / 1000:
        assert early[0] == [], f"read_committed saw records behind an open transaction: {early[0]}"
    c = consumer("read_committed", **{"enable.partition.eof": False})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got, deadline = [], started + 30
    try:
        while len(got) < 5 and time.time() < deadline:
            got += [m.value().decode() for m in c.consume(num_messages=100, timeout=0.2) if not m.error()]
    finally:
        c.close()
    visible_after = time.time() - started
    OBSERVED["stalled transaction aborted by the broker after"] = f"{visible_after:.1f} s (timeout {timeout_ms / 1000:.0f} s)"
    assert got == [f"after-{i}" for i in range(5)], f"read_committed after {visible_after:.1f} s: {got}"
    assert visible_after >= timeout_ms / 1000 - 0.5, f"records visible after {visible_after:.1f} s, before the timeout"
    try:
        s.commit_transaction(30)
        raise AssertionError("the timed-out transaction committed")
    except KafkaException as e:
        err = e.args[0]
        OBSERVED["commit_transaction after the broker timed the transaction out"] = describe(err)
        OBSERVED["  the broker's EndTxn answer to it"] = s_log.broker_answers(s, "EndTxn")
        assert err.code() in FENCED_CODES or err.txn_requires_abort(), describe(err)
    if not err.fatal():  # an abortable error: abort and the producer goes on
        s.abort_transaction(30)
        s.begin_transaction()
        s.produce(topic, value="recovered", partition=0)
        s.commit_transaction(30)
    close_quietly(s)
    ru = read_all(topic, 1, "read_uncommitted", want=10)
    assert [v for _, v in ru[0]][:10] == [f"stalled-{i}" for i in range(5)] + [f"after-{i}" for i in range(5)], ru[0]
    rc = read_all(topic, 1, "read_committed", want=5)
    assert not any(v.startswith("stalled-") for _, v in rc[0]), rc[0]


# 5 --------------------------------------------------------------------------------------------
def init_transactions_with_a_timeout_above_the_broker_max_fails_with_invalid_transaction_timeout():
    p = txn_producer(name("bad-timeout-id"), **{"transaction.timeout.ms": 1_000_000})
    try:
        p.init_transactions(20)
        raise AssertionError("init_transactions accepted transaction.timeout.ms=1000000")
    except KafkaException as e:
        err = e.args[0]
        OBSERVED["init_transactions with transaction.timeout.ms=1000000"] = describe(err)
        assert err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT, describe(err)
    finally:
        close_quietly(p)


def a_transaction_writing_to_a_missing_topic_fails_within_its_timeout_and_can_be_aborted():
    """With topic auto-creation off, a record for a topic that does not exist fails its delivery
    within message.timeout.ms; the commit then fails with an abortable error, the abort succeeds,
    and the same producer commits its next transaction."""
    missing, good = name("missing"), name("after-missing")
    create_topics((good, 1))
    p = txn_producer(name("missing-id"), **{"allow.auto.create.topics": False, "message.timeout.ms": 5000,
                                            "transaction.timeout.ms": 10000, "topic.metadata.propagation.max.ms": 2000})
    p.init_transactions(30)
    p.begin_transaction()
    reports, started = [], time.time()
    try:
        p.produce(missing, value="nowhere", on_delivery=delivered_into(reports))
        produce_err = None
    except KafkaException as e:
        produce_err = e.args[0]
    except BufferError as e:
        produce_err = e
    if produce_err is None:
        p.flush(15)
        took = time.time() - started
        assert reports and reports[0][0] is not None, f"no failed delivery report after {took:.1f} s: {reports}"
        OBSERVED["delivery report for a missing topic"] = f"{describe(reports[0][0])} after {took:.1f} s"
        assert took < 10, f"delivery failed only after {took:.1f} s"
        try:
            p.commit_transaction(30)
            raise AssertionError("commit succeeded after a failed delivery")
        except KafkaException as e:
            OBSERVED["commit_transaction after it"] = describe(e.args[0])
            assert e.args[0].txn_requires_abort() and not e.args[0].fatal(), describe(e.args[0])
    else:
        OBSERVED["produce to a missing topic"] = str(produce_err)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(good, value="fine", partition=0)
    p.commit_transaction(30)
    p.close(5)
    md = ADMIN.list_topics(timeout=10)
    assert missing not in md.topics or md.topics[missing].error is not None, "the missing topic was created"
    assert [v for _, v in read_all(good, 1, "read_committed", want=1)[0]] == ["fine"]


# 6 --------------------------------------------------------------------------------------------
def read_committed_list_offsets_answers_the_first_offset_of_the_open_transaction():
    """10 plain records on each of partitions 0 and 1, then a transaction writes 5 more to
    partition 0 and stays open. Asked for the end with read_committed, the broker answers 10 for
    partition 0 (the LSO: the open transaction's first offset) and 10 for partition 1; with
    read_uncommitted 15 and 10. After the commit read_committed answers 16 (the records and the
    marker). Asked three ways: a consumer's ListOffsets when it is assigned OFFSET_END (seen in
    the offset its partition-EOF event carries), the consumer's get_watermark_offsets (librdkafka
    sends ListOffsets with the consumer's isolation level), and the admin client's list_offsets."""
    topic = name("lso")
    create_topics((topic, 2))
    plain = Producer({"bootstrap.servers": BOOTSTRAP})
    for i in range(20):
        plain.produce(topic, value=f"plain-{i}", partition=i % 2)
    assert plain.flush(30) == 0
    plain.close()
    p = txn_producer(name("lso-id"))
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=f"open-{i}", partition=0)
    assert p.flush(30) == 0

    def ends(isolation):
        tps = [TopicPartition(topic, q) for q in (0, 1)]
        c = consumer(isolation)
        try:
            c.assign([TopicPartition(topic, q, OFFSET_END) for q in (0, 1)])
            at_eof, deadline = {}, time.time() + 15
            while len(at_eof) < 2 and time.time() < deadline:
                m = c.poll(0.1)
                if m is not None and m.error() and m.error().code() == KafkaError._PARTITION_EOF:
                    at_eof[m.partition()] = m.offset()
                elif m is not None:
                    raise AssertionError(f"{isolation} consumer at the end got {m.error() or m.value()}")
            watermarks = {tp.partition: c.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in tps}
        finally:
            c.close()
        level = IsolationLevel.READ_COMMITTED if isolation == "read_committed" else IsolationLevel.READ_UNCOMMITTED
        fs = ADMIN.list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation_level=level, request_timeout=15)
        listed = {tp.partition: f.result().offset for tp, f in fs.items()}
        return {"consumer position at EOF": at_eof, "get_watermark_offsets high": watermarks,
                "admin list_offsets latest": listed}

    for isolation, want in (("read_committed", {0: 10, 1: 10}), ("read_uncommitted", {0: 15, 1: 10})):
        got = ends(isolation)
        for how, offsets in got.items():
            assert offsets == want, f"open transaction, {isolation}, {how}: {offsets}, want {want}"
    p.commit_transaction(30)
    p.close()
    want, deadline = {0: 16, 1: 10}, time.time() + 15
    while True:  # the markers are written after EndTxn answers
        got = ends("read_committed")
        if all(o == want for o in got.values()) or time.time() > deadline:
            break
        time.sleep(0.2)
    for how, offsets in got.items():
        assert offsets == want, f"committed, read_committed, {how}: {offsets}, want {want}"


CHECKS = [
    read_committed_sees_exactly_the_committed_transactions_and_read_uncommitted_sees_all,
    a_second_producer_with_the_same_transactional_id_fences_the_first,
    consume_transform_produce_outputs_each_input_once_and_commits_offsets_with_the_transaction,
    the_broker_aborts_a_transaction_that_outlives_its_timeout,
    init_transactions_with_a_timeout_above_the_broker_max_fails_with_invalid_transaction_timeout,
    a_transaction_writing_to_a_missing_topic_fails_within_its_timeout_and_can_be_aborted,
    read_committed_list_offsets_answers_the_first_offset_of_the_open_transaction,
]


def main():
    only = sys.argv[1:]
    failed, passed, t0 = [], 0, time.time()
    for check in CHECKS:
        if only and not any(o in check.__name__ for o in only):
            continue
        started = time.time()
        try:
            check()
            passed += 1
            print(f"ok   {check.__name__} ({time.time() - started:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 -- any failure of a check is reported, the rest still run
            failed.append(check.__name__)
            print(f"FAIL {check.__name__} ({time.time() - started:.1f} s): {type(e).__name__}: {e}", flush=True)
    for k, v in OBSERVED.items():
        print(f"  observed: {k}: {v}")
    print(f"txn client e2e: {passed} passed, {len(failed)} failed in {time.time() - t0:.1f} s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
