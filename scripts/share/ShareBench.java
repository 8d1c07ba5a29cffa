// Share-group (KIP-932) benchmark client for scripts/bench-share-groups.sh: Kafka's own
// KafkaProducer and M KafkaShareConsumer threads in one JVM, on one partition. Run in Java's
// source-file mode on the Kafka kit's classpath:
//   scripts/kafka/tool.sh class scripts/share/ShareBench.java BOOTSTRAP BROKER_PID MEMBERS \
//     RECORDS SIZE RATE LAT_SECONDS TAG [REPLICAS]
// (BROKER_PID may be several pids, comma-separated; REPLICAS, 1 by default, is the topic's
// replication factor.)
// Two phases, each on its own fresh one-partition topic and share group:
//   throughput: RECORDS records of SIZE bytes are produced first (the pre-fill); then MEMBERS
//     consumers read them. Acknowledgement is explicit (share.acknowledgement.mode=explicit,
//     ACCEPT for every record, sent with the next poll); a record counts once the broker has
//     confirmed its acceptance (the AcknowledgementCommitCallback without an exception). The
//     rate is distinct offsets accepted / (last confirmation - first record received).
//   latency: the MEMBERS consumers join first; a producer (linger.ms=0) sends RATE records/s
//     for LAT_SECONDS s, each value starting with System.nanoTime() at send; the latency is
//     receive (poll returns it) - send, in the same JVM. The first 2 s are left out.
// Broker CPU: utime+stime of /proc/BROKER_PID/stat at the start and end of each measured part
// (the consume of the pre-fill, from the first record received to the last acceptance; the
// whole fixed-rate run), in clock ticks.
// Every phase is bounded: the consume of the pre-fill by 180 s, the fixed-rate run by its
// count and LAT_SECONDS + 30 s. Prints one "RESULT key=value ..." line per phase.
import java.nio.ByteBuffer;
import java.nio.file.*;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ShareBench {
    static String bootstrap, brokerPid, tag;
    static short replicas;
    static int members, size;

    public static void main(String[] args) throws Exception {
        bootstrap = args[0]; brokerPid = args[1]; members = Integer.parseInt(args[2]);
        int records = Integer.parseInt(args[3]); size = Integer.parseInt(args[4]);
        int rate = Integer.parseInt(args[5]); int latSeconds = Integer.parseInt(args[6]); tag = args[7];
        replicas = args.length > 8 ? Short.parseShort(args[8]) : 1;
        throughput(records);
        latency(rate, latSeconds);
        System.exit(0);
    }

    // BROKER_PID may list several pids (a cluster's nodes, comma-separated): their ticks add up.
    static long cpuTicks() {
        long total = 0;
        for (String pid : brokerPid.split(",")) {
            try {
                String s = Files.readString(Path.of("/proc/" + pid + "/stat"));
                String[] f = s.substring(s.lastIndexOf(')') + 2).split(" ");
                total += Long.parseLong(f[11]) + Long.parseLong(f[12]); // utime, stime (fields 14, 15)
            } catch (Exception e) { return -1; }
        }
        return total;
    }

    static void setup(String topic, String group) throws Exception {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin a = Admin.create(p)) {
            a.createTopics(List.of(new NewTopic(topic, 1, replicas))).all().get(60, TimeUnit.SECONDS);
            // Kafka: a share group starts at the latest offset unless its group config says
            // earliest. (spate: SPATE_SHARE_AUTO_OFFSET_RESET=earliest; the config is tried too.)
            try {
                a.incrementalAlterConfigs(Map.of(new ConfigResource(ConfigResource.Type.GROUP, group),
                    List.of(new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET))))
                    .all().get(30, TimeUnit.SECONDS);
            } catch (Exception e) {
                System.err.println("note: group config share.auto.offset.reset not set: " + e);
            }
        }
    }

    static KafkaProducer<byte[], byte[]> producer(int lingerMs) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, String.valueOf(lingerMs));
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "65536");
        return new KafkaProducer<>(p);
    }

    static byte[] value(long stamp) {
        byte[] v = new byte[size];
        ByteBuffer.wrap(v).putLong(stamp);
        return v;
    }

    static KafkaShareConsumer<byte[], byte[]> consumer(String group, int i) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, group + "-" + i);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put("share.acknowledgement.mode", "explicit");
        return new KafkaShareConsumer<>(p);
    }

    // Shared by the member threads of one phase.
    static class Tally {
        final AtomicIntegerArray accepted; // times each offset's acceptance was confirmed
        final AtomicLong distinct = new AtomicLong(), dups = new AtomicLong(), ackErrors = new AtomicLong(),
            redelivered = new AtomicLong(), received = new AtomicLong(), beyond = new AtomicLong(),
            polls = new AtomicLong(), emptyPolls = new AtomicLong();
        final AtomicLong firstReceiveNs = new AtomicLong(0), lastAcceptNs = new AtomicLong(0);
        volatile long cpuAtFirst = -1;
        final AtomicInteger joined = new AtomicInteger();
        volatile boolean stop;
        Tally(int n) { accepted = new AtomicIntegerArray(n); }
        void confirm(Map<TopicIdPartition, Set<Long>> offsets, Exception e) {
            if (e != null) { ackErrors.incrementAndGet(); System.err.println("ack error: " + e); return; }
            for (Set<Long> s : offsets.values()) for (long o : s) {
                if (o < 0 || o >= accepted.length()) { beyond.incrementAndGet(); continue; }
                if (accepted.getAndIncrement((int) o) == 0) distinct.incrementAndGet(); else dups.incrementAndGet();
            }
            lastAcceptNs.set(System.nanoTime());
        }
    }

    // A member: polls, ACCEPTs everything, until the tally says stop; latencies (if given) in ns.
    static Thread member(String group, int i, Tally t, long[] lat, AtomicInteger latN, long latFrom) {
        Thread th = new Thread(() -> {
            try (KafkaShareConsumer<byte[], byte[]> c = consumer(group, i)) {
                c.setAcknowledgementCommitCallback(t::confirm);
                c.subscribe(List.of(group));
                t.joined.incrementAndGet();
                while (!t.stop) {
                    ConsumerRecords<byte[], byte[]> rs = c.poll(Duration.ofMillis(200));
                    if (rs.isEmpty()) { t.emptyPolls.incrementAndGet(); continue; }
                    t.polls.incrementAndGet();
                    long now = System.nanoTime();
                    if (t.firstReceiveNs.compareAndSet(0, now)) t.cpuAtFirst = cpuTicks();
                    for (ConsumerRecord<byte[], byte[]> r : rs) {
                        t.received.incrementAndGet();
                        if (r.deliveryCount().orElse((short) 1) > 1) t.redelivered.incrementAndGet();
                        if (lat != null && r.value() != null && r.value().length >= 8) {
                            long sent = ByteBuffer.wrap(r.value()).getLong();
                            if (sent >= latFrom) { int k = latN.getAndIncrement(); if (k < lat.length) lat[k] = now - sent; }
                        }
                        c.acknowledge(r, AcknowledgeType.ACCEPT);
                    }
                }
                c.commitSync(Duration.ofSeconds(10)); // the last acknowledgements
            } catch (Exception e) {
                System.err.println("member " + group + "-" + i + ": " + e);
            }
        }, group + "-" + i);
        th.start();
        return th;
    }

    static void throughput(int n) throws Exception {
        String name = "sbt-" + tag + "-m" + members;
        setup(name, name);
        long f0 = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> p = producer(5)) {
            long now = System.currentTimeMillis();
            for (int i = 0; i < n; i++) p.send(new ProducerRecord<>(name, value(now)));
            p.flush();
        }
        System.err.printf("pre-filled %d x %d B in %.1f s%n", n, size, (System.nanoTime() - f0) / 1e9);
        Thread.sleep(2000); // the broker settles after the pre-fill
        Tally t = new Tally(n);
        long cpuStart = cpuTicks(), w0 = System.nanoTime();
        List<Thread> ts = new ArrayList<>();
        for (int i = 0; i < members; i++) ts.add(member(name, i, t, null, null, 0));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(180);
        while (t.distinct.get() < n && System.nanoTime() < deadline) Thread.sleep(20);
        long cpu1 = cpuTicks(), w1 = System.nanoTime(), cpu0 = t.cpuAtFirst;
        t.stop = true;
        for (Thread th : ts) th.join(30_000);
        long first = t.firstReceiveNs.get(), last = t.lastAcceptNs.get();
        double secs = (last - first) / 1e9;
        System.out.printf(Locale.ROOT,
            "RESULT phase=throughput members=%d records=%d accepted=%d dups=%d ack_errors=%d redelivered=%d beyond=%d " +
            "first_record_s=%.2f secs=%.3f rps=%.0f cpu_ticks=%d join_cpu_ticks=%d wall_s=%.3f polls=%d empty_polls=%d records_per_poll=%.1f%n",
            members, n, t.distinct.get(), t.dups.get(), t.ackErrors.get(), t.redelivered.get(), t.beyond.get(),
            (first - w0) / 1e9, secs, t.distinct.get() / secs, cpu1 - cpu0, cpu0 - cpuStart, (w1 - w0) / 1e9,
            t.polls.get(), t.emptyPolls.get(), t.received.get() / (double) Math.max(1, t.polls.get()));
    }

    static void latency(int rate, int seconds) throws Exception {
        String name = "sbl-" + tag + "-m" + members;
        setup(name, name);
        int n = rate * seconds;
        Tally t = new Tally(n);
        long[] lat = new long[n];
        AtomicInteger latN = new AtomicInteger();
        long start = System.nanoTime();
        long latFrom = start + TimeUnit.SECONDS.toNanos(5 + 2); // members settle 5 s; 2 s warm-up
        List<Thread> ts = new ArrayList<>();
        for (int i = 0; i < members; i++) ts.add(member(name, i, t, lat, latN, latFrom));
        Thread.sleep(5000);
        long cpu0 = cpuTicks(), w0 = System.nanoTime();
        AtomicLong sendErrors = new AtomicLong();
        try (KafkaProducer<byte[], byte[]> p = producer(0)) {
            long t0 = System.nanoTime(), interval = 1_000_000_000L / rate;
            long stopAt = t0 + TimeUnit.SECONDS.toNanos(seconds + 10);
            for (int i = 0; i < n && System.nanoTime() < stopAt; i++) {
                long due = t0 + i * interval;
                long w;
                while ((w = due - System.nanoTime()) > 0) LockSupport_parkNanos(w);
                p.send(new ProducerRecord<>(name, value(System.nanoTime())), (md, e) -> { if (e != null) sendErrors.incrementAndGet(); });
            }
            p.flush();
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (t.distinct.get() < n && System.nanoTime() < deadline) Thread.sleep(20);
        long cpu1 = cpuTicks(), w1 = System.nanoTime();
        t.stop = true;
        for (Thread th : ts) th.join(30_000);
        int m = Math.min(latN.get(), lat.length);
        long[] l = Arrays.copyOf(lat, m);
        Arrays.sort(l);
        double p50 = m > 0 ? l[(int) Math.min(m - 1, Math.ceil(0.50 * m) - 1)] / 1e6 : Double.NaN;
        double p99 = m > 0 ? l[(int) Math.min(m - 1, Math.ceil(0.99 * m) - 1)] / 1e6 : Double.NaN;
        double max = m > 0 ? l[m - 1] / 1e6 : Double.NaN;
        System.out.printf(Locale.ROOT,
            "RESULT phase=latency members=%d rate=%d records=%d accepted=%d dups=%d ack_errors=%d send_errors=%d redelivered=%d " +
            "beyond=%d samples=%d p50_ms=%.2f p99_ms=%.2f max_ms=%.2f cpu_ticks=%d wall_s=%.3f polls=%d empty_polls=%d%n",
            members, rate, n, t.distinct.get(), t.dups.get(), t.ackErrors.get(), sendErrors.get(), t.redelivered.get(),
            t.beyond.get(), m, p50, p99, max, cpu1 - cpu0, (w1 - w0) / 1e9, t.polls.get(), t.emptyPolls.get());
    }

    static void LockSupport_parkNanos(long ns) { java.util.concurrent.locks.LockSupport.parkNanos(Math.min(ns, 1_000_000L)); }
}
