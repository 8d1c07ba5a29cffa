// Exactly-once Kafka Streams against any Kafka-compatible broker, with Kafka's own Streams library
// (processing.guarantee=exactly_once_v2, in-memory state: no RocksDB). Run in Java's source-file
// mode on the Kafka kit's classpath (scripts/txn-streams-e2e.sh drives it):
//   tool.sh class scripts/txn/StreamsEos.java produce BOOTSTRAP INPUT N RATE
//     writes N records with an idempotent producer (acks=all): record i (0..N-1) has key k<i%100>
//     and value i+1 as a decimal string; RATE records/s (0: as fast as it goes).
//   tool.sh class scripts/txn/StreamsEos.java run BOOTSTRAP APP_ID INPUT OUTPUT STATE_DIR [MAX_S]
//     the app: sums INPUT's values per key and writes every new running sum (decimal string) to
//     OUTPUT, until SIGTERM or MAX_S seconds (default 600). Exits 1 if the app dies of an error.
//   tool.sh class scripts/txn/StreamsEos.java await BOOTSTRAP APP_ID INPUT TARGET TIMEOUT_S [PID]
//     waits until the app's consumer group has committed at least TARGET input records (sum of
//     its committed offsets over INPUT's partitions); exits 3 at once if process PID is gone.
//   tool.sh class scripts/txn/StreamsEos.java done BOOTSTRAP APP_ID INPUT OUTPUT N TIMEOUT_S [PID]
//     waits until the group's committed offsets equal INPUT's end offsets and add up to N, and no
//     transaction is open on OUTPUT (read_committed end offset = high watermark everywhere).
//   tool.sh class scripts/txn/StreamsEos.java check BOOTSTRAP INPUT OUTPUT N
//     reads INPUT and OUTPUT with isolation.level=read_committed and checks that INPUT holds each
//     of the N records once, that every key's last running sum on OUTPUT equals the sum of its
//     inputs (each counted exactly once), that every running sum is one of the key's prefix sums,
//     bigger than the one before and not above the final, and (the app runs with its record cache
//     off, so every input gives one output) that each key's running sums are exactly its prefix
//     sums in input order: N committed outputs. Prints one summary line; exits 1 on any failure.
import java.time.Duration;
import java.util.*;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.BuiltInDslStoreSuppliers;
import org.apache.kafka.streams.state.Stores;

public class StreamsEos {
    static final int KEYS = 100;

    /** The changelog's topic configs: Streams' default (cleanup.policy=compact), unless
     *  STREAMS_CHANGELOG_POLICY says otherwise (delete: a changelog that keeps everything, no
     *  retention, which restores the same state more slowly, for brokers without compaction). */
    static <K, V, S extends org.apache.kafka.streams.processor.StateStore> Materialized<K, V, S> changelog(Materialized<K, V, S> m) {
        String policy = System.getenv("STREAMS_CHANGELOG_POLICY");
        if (policy == null || policy.isEmpty() || policy.equals("compact")) return m;
        return m.withLoggingEnabled(Map.of("cleanup.policy", policy, "retention.ms", "-1"));
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 0) usage();
        switch (args[0]) {
            case "produce" -> System.exit(produce(args[1], args[2], Long.parseLong(args[3]), Long.parseLong(args[4])));
            case "run" -> System.exit(run(args[1], args[2], args[3], args[4], args[5],
                args.length > 6 ? Long.parseLong(args[6]) : 600));
            case "await" -> System.exit(await(args[1], args[2], args[3], Long.parseLong(args[4]),
                Long.parseLong(args[5]), args.length > 6 ? Long.parseLong(args[6]) : -1));
            case "done" -> System.exit(done(args[1], args[2], args[3], args[4], Long.parseLong(args[5]),
                Long.parseLong(args[6]), args.length > 7 ? Long.parseLong(args[7]) : -1));
            case "check" -> System.exit(check(args[1], args[2], args[3], Long.parseLong(args[4])));
            default -> usage();
        }
    }

    static void usage() {
        System.err.println("usage: StreamsEos produce|run|await|done|check ... (see the header of StreamsEos.java)");
        System.exit(2);
    }

    static String key(long i) { return "k" + (i % KEYS); }

    // ---- produce -------------------------------------------------------------------------------

    static int produce(String bootstrap, String topic, long n, long rate) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        AtomicReference<Exception> error = new AtomicReference<>();
        AtomicInteger acked = new AtomicInteger();
        long start = System.nanoTime();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (long i = 0; i < n && error.get() == null; i++) {
                producer.send(new ProducerRecord<>(topic, key(i), Long.toString(i + 1)), (md, e) -> {
                    if (e != null) error.compareAndSet(null, e); else acked.incrementAndGet();
                });
                if (rate > 0 && i % 500 == 499) {
                    long dueNs = (long) ((i + 1) * 1e9 / rate);
                    long aheadMs = (dueNs - (System.nanoTime() - start)) / 1_000_000;
                    if (aheadMs > 0) Thread.sleep(aheadMs);
                }
            }
            producer.flush();
        }
        double s = (System.nanoTime() - start) / 1e9;
        if (error.get() != null) {
            System.out.printf("produce FAILED after %d acknowledged records: %s%n", acked.get(), error.get());
            return 1;
        }
        System.out.printf("produced %d records to %s in %.1f s (%.0f records/s), idempotent, acks=all%n",
            acked.get(), topic, s, acked.get() / s);
        return acked.get() == n ? 0 : 1;
    }

    // ---- run -----------------------------------------------------------------------------------

    static int run(String bootstrap, String appId, String input, String output, String stateDir, long maxS)
            throws Exception {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        // Commit every second (EOS's default is 100 ms): most of the time records of an open
        // transaction sit on the broker, so a kill -9 leaves some behind for the broker to abort.
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        // No record cache: every input record gives its own output record (the checker counts them).
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        p.put(StreamsConfig.DSL_STORE_SUPPLIERS_CLASS_CONFIG, BuiltInDslStoreSuppliers.InMemoryDslStoreSuppliers.class);
        p.put("processing.exception.handler.global.enabled", true);  // Kafka 5.0's default; quiets a warning
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // A killed instance's partitions move to its successor within 10 s, not the default 45 s.
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 10_000);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1_000);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .groupByKey()
            .aggregate(() -> 0L, (k, v, sum) -> sum + Long.parseLong(v),
                changelog(Materialized.<String, Long>as(Stores.inMemoryKeyValueStore("sums"))
                    .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long())))
            .toStream()
            .mapValues(sum -> Long.toString(sum))
            .to(output, Produced.with(Serdes.String(), Serdes.String()));

        CountDownLatch stopped = new CountDownLatch(1);
        AtomicReference<Throwable> fatal = new AtomicReference<>();
        KafkaStreams streams = new KafkaStreams(builder.build(), p);
        streams.setStateListener((now, before) -> {
            System.out.printf("%tT state %s -> %s%n", System.currentTimeMillis(), before, now);
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) stopped.countDown();
        });
        streams.setUncaughtExceptionHandler(e -> {
            fatal.compareAndSet(null, e);
            System.out.printf("%tT fatal: %s%n", System.currentTimeMillis(), e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        // SIGTERM: a clean close (its transaction committed), then exit 0 rather than the JVM's 143.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(30));
            System.out.println(fatal.get() == null ? "stopped" : "stopped after a fatal error");
            System.out.flush();
            Runtime.getRuntime().halt(fatal.get() == null ? 0 : 1);
        }));
        streams.start();
        stopped.await(maxS, TimeUnit.SECONDS);
        streams.close(Duration.ofSeconds(30));
        if (fatal.get() != null) return 1;
        System.out.println("stopped");
        return 0;
    }

    // ---- await / done --------------------------------------------------------------------------

    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 30_000);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, 15_000);
        return Admin.create(p);
    }

    static List<TopicPartition> partitions(Admin admin, String topic) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
        return d.partitions().stream().map(i -> new TopicPartition(topic, i.partition())).collect(Collectors.toList());
    }

    static Map<TopicPartition, Long> ends(Admin admin, List<TopicPartition> tps, IsolationLevel iso) throws Exception {
        Map<TopicPartition, OffsetSpec> q = new HashMap<>();
        for (TopicPartition tp : tps) q.put(tp, OffsetSpec.latest());
        Map<TopicPartition, Long> out = new TreeMap<>(Comparator.comparing(TopicPartition::toString));
        admin.listOffsets(q, new ListOffsetsOptions(iso)).all().get().forEach((tp, r) -> out.put(tp, r.offset()));
        return out;
    }

    static Map<TopicPartition, Long> committed(Admin admin, String group, List<TopicPartition> tps) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> c = admin.listConsumerGroupOffsets(group)
            .partitionsToOffsetAndMetadata().get();
        Map<TopicPartition, Long> out = new TreeMap<>(Comparator.comparing(TopicPartition::toString));
        for (TopicPartition tp : tps) {
            OffsetAndMetadata o = c.get(tp);
            out.put(tp, o == null ? 0L : o.offset());
        }
        return out;
    }

    static long sum(Map<TopicPartition, Long> m) { return m.values().stream().mapToLong(Long::longValue).sum(); }

    static boolean alive(long pid) { return pid < 0 || ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false); }

    static int await(String bootstrap, String group, String input, long target, long timeoutS, long pid) throws Exception {
        long start = System.currentTimeMillis();
        long seen = -1;
        try (Admin admin = admin(bootstrap)) {
            List<TopicPartition> tps = partitions(admin, input);
            while (System.currentTimeMillis() - start < timeoutS * 1000) {
                if (!alive(pid)) { System.out.printf("await: process %d is gone (committed %d)%n", pid, seen); return 3; }
                try {
                    seen = sum(committed(admin, group, tps));
                    if (seen >= target) {
                        System.out.printf("await: group %s committed %d >= %d input records after %.1f s%n",
                            group, seen, target, (System.currentTimeMillis() - start) / 1e3);
                        return 0;
                    }
                } catch (ExecutionException e) {
                    System.out.println("await: " + e.getCause());
                }
                Thread.sleep(200);
            }
        }
        System.out.printf("await: TIMEOUT after %d s: group %s committed %d of %d%n", timeoutS, group, seen, target);
        return 1;
    }

    static int done(String bootstrap, String group, String input, String output, long n, long timeoutS, long pid)
            throws Exception {
        long start = System.currentTimeMillis();
        String last = "nothing yet";
        try (Admin admin = admin(bootstrap)) {
            List<TopicPartition> in = partitions(admin, input), out = partitions(admin, output);
            while (System.currentTimeMillis() - start < timeoutS * 1000) {
                if (!alive(pid)) { System.out.printf("done: process %d is gone (%s)%n", pid, last); return 3; }
                try {
                    Map<TopicPartition, Long> c = committed(admin, group, in), e = ends(admin, in, IsolationLevel.READ_UNCOMMITTED);
                    Map<TopicPartition, Long> lso = ends(admin, out, IsolationLevel.READ_COMMITTED);
                    Map<TopicPartition, Long> hwm = ends(admin, out, IsolationLevel.READ_UNCOMMITTED);
                    last = String.format("committed %d of %d (input end %d), output read_committed end %d, high watermark %d",
                        sum(c), n, sum(e), sum(lso), sum(hwm));
                    if (c.equals(e) && sum(e) == n && lso.equals(hwm)) {
                        System.out.printf("done after %.1f s: %s%n", (System.currentTimeMillis() - start) / 1e3, last);
                        return 0;
                    }
                } catch (ExecutionException ex) {
                    last = ex.getCause().toString();
                }
                Thread.sleep(250);
            }
        }
        System.out.printf("done: TIMEOUT after %d s: %s%n", timeoutS, last);
        return 1;
    }

    // ---- check ---------------------------------------------------------------------------------

    /** Every record of TOPIC up to its end offsets (for read_committed: the last stable offsets). */
    static List<ConsumerRecord<String, String>> readAll(String bootstrap, String topic, IsolationLevel iso) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, iso.toString());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        List<ConsumerRecord<String, String>> out = new ArrayList<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p)) {
            List<TopicPartition> tps = c.partitionsFor(topic, Duration.ofSeconds(30)).stream()
                .map(i -> new TopicPartition(topic, i.partition())).collect(Collectors.toList());
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(30));
            long deadline = System.currentTimeMillis() + 180_000;
            while (tps.stream().anyMatch(tp -> c.position(tp, Duration.ofSeconds(30)) < end.get(tp))) {
                if (System.currentTimeMillis() > deadline)
                    throw new IllegalStateException("could not read " + topic + " to " + end + " within 180 s");
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) out.add(r);
            }
        }
        return out;
    }

    static int check(String bootstrap, String input, String output, long n) {
        List<String> problems = new ArrayList<>();
        // Inputs per key in offset order (a key lives in one partition).
        List<ConsumerRecord<String, String>> in = readAll(bootstrap, input, IsolationLevel.READ_COMMITTED);
        in.sort(Comparator.comparingInt((ConsumerRecord<String, String> r) -> r.partition()).thenComparingLong(r -> r.offset()));
        BitSet seenValue = new BitSet();
        long duplicates = 0, strays = 0;
        Map<String, Long> total = new HashMap<>();
        Map<String, Set<Long>> prefixes = new HashMap<>();
        Map<String, List<Long>> prefixList = new HashMap<>();
        for (ConsumerRecord<String, String> r : in) {
            long v = Long.parseLong(r.value());
            if (v < 1 || v > n || !r.key().equals(key(v - 1))) { strays++; continue; }
            if (seenValue.get((int) v)) duplicates++;
            seenValue.set((int) v);
            long s = total.merge(r.key(), v, Long::sum);
            prefixes.computeIfAbsent(r.key(), k -> new HashSet<>()).add(s);
            prefixList.computeIfAbsent(r.key(), k -> new ArrayList<>()).add(s);
        }
        long distinct = seenValue.cardinality();
        if (in.size() != n || distinct != n || duplicates > 0 || strays > 0)
            problems.add(String.format("input holds %d records (%d distinct of the %d written, %d duplicates, %d strays)",
                in.size(), distinct, n, duplicates, strays));
        // The sums the inputs must give: record i has key k<i%100> and value i+1.
        Map<String, Long> expected = new HashMap<>();
        for (long i = 0; i < n; i++) expected.merge(key(i), i + 1, Long::sum);

        List<ConsumerRecord<String, String>> out = readAll(bootstrap, output, IsolationLevel.READ_COMMITTED);
        out.sort(Comparator.comparingInt((ConsumerRecord<String, String> r) -> r.partition()).thenComparingLong(r -> r.offset()));
        Map<String, Long> last = new HashMap<>();
        Map<String, List<Long>> perKey = new HashMap<>();
        long notPrefix = 0, backwards = 0, above = 0;
        List<String> examples = new ArrayList<>();
        for (ConsumerRecord<String, String> r : out) {
            long s = Long.parseLong(r.value());
            String k = r.key();
            Long prev = last.put(k, s);
            perKey.computeIfAbsent(k, x -> new ArrayList<>()).add(s);
            long fin = expected.getOrDefault(k, -1L);
            if (!prefixes.getOrDefault(k, Set.of()).contains(s)) {
                notPrefix++;
                if (examples.size() < 5) examples.add(k + "=" + s + " at " + r.partition() + "@" + r.offset() + " is no prefix sum");
            }
            if (prev != null && s <= prev) {
                backwards++;
                if (examples.size() < 5) examples.add(k + " went " + prev + " -> " + s + " at " + r.partition() + "@" + r.offset());
            }
            if (s > fin) above++;
        }
        long wrongFinal = 0;
        for (Map.Entry<String, Long> e : expected.entrySet()) {
            Long got = last.get(e.getKey());
            if (got == null || got.longValue() != e.getValue()) {
                wrongFinal++;
                if (examples.size() < 10) examples.add(e.getKey() + " final " + got + " != " + e.getValue());
            }
        }
        long inexact = 0;
        for (String k : expected.keySet()) {
            if (!perKey.getOrDefault(k, List.of()).equals(prefixList.getOrDefault(k, List.of()))) inexact++;
        }
        if (wrongFinal > 0) problems.add(wrongFinal + " of " + expected.size() + " keys' final sums differ from their inputs' sums");
        if (notPrefix > 0) problems.add(notPrefix + " running sums are no prefix sum of their key's inputs (an input counted twice or skipped)");
        if (backwards > 0) problems.add(backwards + " running sums did not grow");
        if (above > 0) problems.add(above + " running sums exceed their key's final sum");
        if (inexact > 0) problems.add(inexact + " keys' running sums are not exactly their prefix sums in input order"
            + " (" + out.size() + " committed outputs for " + in.size() + " inputs)");
        long uncommitted = readAll(bootstrap, output, IsolationLevel.READ_UNCOMMITTED).size();
        String stats = String.format("%d input records, %d keys, %d committed output records (%d more read_uncommitted: aborted transactions' records)",
            in.size(), expected.size(), out.size(), uncommitted - out.size());
        if (problems.isEmpty()) {
            System.out.println("check ok: " + stats + "; every key's final sum equals the sum of its inputs, "
                + "every running sum is a prefix sum of its key's inputs, growing, none above the final; "
                + "each input gave exactly one committed running sum, in input order");
            return 0;
        }
        System.out.println("check FAILED: " + String.join("; ", problems) + " [" + stats + "] e.g. " + examples);
        return 1;
    }
}
