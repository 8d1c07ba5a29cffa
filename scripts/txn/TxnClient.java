// Kafka's own transactional Java producer, consumer and Admin client against any Kafka-compatible
// broker, for scripts/txn-tools-e2e.sh. Run in Java's source-file mode on the Kafka kit's classpath:
//   tool.sh class scripts/txn/TxnClient.java MODE ARGS...
// Every record's value is TAG-i; counts are per TAG.
//   rounds BOOTSTRAP TOPIC TXN_ID TAG ROUNDS PER
//       ROUNDS transactions of PER records each (partition 0): even rounds commit, odd rounds
//       abort (TAG-commit / TAG-abort); ROUNDS=1 is one committed transaction.
//   hang BOOTSTRAP TOPIC TXN_ID N READY_FILE
//       begins a transaction (transaction.timeout.ms TXN_HANG_TIMEOUT_MS, default 300000), writes
//       N records (hang-i) to partition 0, flushes, writes the first record's offset to
//       READY_FILE and then waits without committing, until killed (or 10 minutes).
//   fence BOOTSTRAP TOPIC TXN_ID
//       zombie fencing, three producers with one transactional.id: A writes zombie-0 in a
//       transaction, B initializes (A's transaction is aborted), A's commit must fail with
//       ProducerFencedException; B writes zombie-1 in a transaction, C initializes, B's next send
//       must fail with a fencing error (InvalidProducerEpochException, what a partition leader
//       answers to an old epoch, or ProducerFencedException) and its commit must fail; C commits
//       fencer-0..9. Exits 1 if a zombie was not fenced.
//   count BOOTSTRAP TOPIC ISOLATION
//       reads partition 0 to its end offset (read_committed: the last stable offset) and prints
//       "total=N TAG=n ..." (sorted by tag).
//   offsets BOOTSTRAP TOPIC PARTITION
//       ListOffsets latest with read_uncommitted and read_committed: prints "hwm=H lso=L".
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnClient {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) usage();
        switch (args[0]) {
            case "rounds" -> System.exit(rounds(args[1], args[2], args[3], args[4], Integer.parseInt(args[5]), Integer.parseInt(args[6])));
            case "hang" -> System.exit(hang(args[1], args[2], args[3], Integer.parseInt(args[4]), args[5]));
            case "fence" -> System.exit(fence(args[1], args[2], args[3]));
            case "count" -> System.exit(count(args[1], args[2], args[3]));
            case "offsets" -> System.exit(offsets(args[1], args[2], Integer.parseInt(args[3])));
            default -> usage();
        }
    }

    static void usage() {
        System.err.println("usage: TxnClient rounds|hang|fence|count|offsets ... (see the header of TxnClient.java)");
        System.exit(2);
    }

    static KafkaProducer<String, String> producer(String bootstrap, String txnId, int txnTimeoutMs) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, txnTimeoutMs);
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, 60_000);
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 60_000);
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 30_000);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    static ProducerRecord<String, String> rec(String topic, String value) {
        return new ProducerRecord<>(topic, 0, null, value);
    }

    static int rounds(String bootstrap, String topic, String txnId, String tag, int rounds, int per) {
        int committed = 0, aborted = 0;
        try (KafkaProducer<String, String> p = producer(bootstrap, txnId, 60_000)) {
            p.initTransactions();
            for (int r = 0; r < rounds; r++) {
                boolean commit = r % 2 == 0;
                p.beginTransaction();
                for (int i = 0; i < per; i++) p.send(rec(topic, tag + "-" + (commit ? "commit" : "abort") + "-" + (r * per + i)));
                p.flush();
                if (commit) { p.commitTransaction(); committed += per; } else { p.abortTransaction(); aborted += per; }
            }
        }
        System.out.printf("rounds: %d transactions of %d records: %d records committed, %d aborted%n", rounds, per, committed, aborted);
        return 0;
    }

    static int hang(String bootstrap, String topic, String txnId, int n, String readyFile) throws Exception {
        int timeoutMs = Integer.parseInt(System.getenv().getOrDefault("TXN_HANG_TIMEOUT_MS", "300000"));
        KafkaProducer<String, String> p = producer(bootstrap, txnId, timeoutMs);
        p.initTransactions();
        p.beginTransaction();
        List<Future<RecordMetadata>> acks = new ArrayList<>();
        for (int i = 0; i < n; i++) acks.add(p.send(rec(topic, "hang-" + i)));
        p.flush();
        long first = acks.get(0).get().offset();
        Files.writeString(Path.of(readyFile + ".tmp"), first + "\n");
        Files.move(Path.of(readyFile + ".tmp"), Path.of(readyFile));
        System.out.printf("hang: transaction %s open with %d records from offset %d; not committing%n", txnId, n, first);
        System.out.flush();
        Thread.sleep(600_000);  // the test kills this process long before
        return 0;
    }

    static String describe(Throwable e) {
        StringBuilder b = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (b.length() > 0) b.append(" <- ");
            b.append(t.getClass().getSimpleName());
        }
        return b.toString();
    }

    static int fence(String bootstrap, String topic, String txnId) throws Exception {
        List<String> problems = new ArrayList<>();
        // Commit path: A's open transaction is aborted when B initializes the same
        // transactional.id (a new epoch); A's EndTxn carries the old epoch.
        KafkaProducer<String, String> a = producer(bootstrap, txnId, 60_000);
        a.initTransactions();
        a.beginTransaction();
        a.send(rec(topic, "zombie-0")).get();
        KafkaProducer<String, String> b = producer(bootstrap, txnId, 60_000);
        b.initTransactions();
        String outcome = attempt(a::commitTransaction);
        System.out.println("fence: A wrote zombie-0, B initialized the same transactional.id, A's commit: " + outcome);
        if (!outcome.contains("ProducerFencedException")) problems.add("A's commit: " + outcome);
        close(a);
        // Send path: B writes in a transaction, C takes the transactional.id over, B's next send
        // carries the old epoch to the partition leader.
        b.beginTransaction();
        b.send(rec(topic, "zombie-1")).get();
        KafkaProducer<String, String> c = producer(bootstrap, txnId, 60_000);
        c.initTransactions();
        String send = attempt(() -> b.send(rec(topic, "zombie-2")).get());
        String commit = attempt(b::commitTransaction);
        System.out.println("fence: B wrote zombie-1, C initialized the same transactional.id, B's next send: "
            + send + "; B's commit: " + commit);
        // A fenced send reads INVALID_PRODUCER_EPOCH (InvalidProducerEpochException) or
        // PRODUCER_FENCED, by broker and transaction version: either fences.
        if (!send.contains("InvalidProducerEpochException") && !send.contains("ProducerFencedException"))
            problems.add("B's send: " + send);
        if (commit.equals("succeeded")) problems.add("B's commit succeeded");
        close(b);
        c.beginTransaction();
        for (int i = 0; i < 10; i++) c.send(rec(topic, "fencer-" + i));
        c.commitTransaction();
        close(c);
        System.out.println("fence: C committed fencer-0..9");
        if (problems.isEmpty()) return 0;
        System.out.println("fence: FAILED: " + problems);
        return 1;
    }

    interface Step { void run() throws Exception; }

    static String attempt(Step step) {
        try {
            step.run();
            return "succeeded";
        } catch (Exception e) {
            return describe(e);
        }
    }

    static void close(KafkaProducer<String, String> p) {
        try { p.close(Duration.ofSeconds(5)); } catch (Exception ignored) { }
    }

    static int count(String bootstrap, String topic, String isolation) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        TreeMap<String, Integer> tags = new TreeMap<>();
        int total = 0;
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p)) {
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            long end = c.endOffsets(List.of(tp), Duration.ofSeconds(30)).get(tp);
            long deadline = System.currentTimeMillis() + 120_000;
            while (c.position(tp, Duration.ofSeconds(30)) < end) {
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("could not read " + tp + " to " + end);
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                    total++;
                    String v = r.value();
                    int dash = v.lastIndexOf('-');
                    tags.merge(dash > 0 ? v.substring(0, dash) : v, 1, Integer::sum);
                }
            }
        }
        StringBuilder b = new StringBuilder("total=" + total);
        tags.forEach((t, n) -> b.append(' ').append(t).append('=').append(n));
        System.out.println(b);
        return 0;
    }

    static int offsets(String bootstrap, String topic, int partition) throws Exception {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        TopicPartition tp = new TopicPartition(topic, partition);
        try (Admin admin = Admin.create(p)) {
            long hwm = admin.listOffsets(Map.of(tp, OffsetSpec.latest()), new ListOffsetsOptions(IsolationLevel.READ_UNCOMMITTED))
                .partitionResult(tp).get().offset();
            long lso = admin.listOffsets(Map.of(tp, OffsetSpec.latest()), new ListOffsetsOptions(IsolationLevel.READ_COMMITTED))
                .partitionResult(tp).get().offset();
            System.out.printf("hwm=%d lso=%d%n", hwm, lso);
        }
        return 0;
    }
}
