// Producer and consumer throughput with Kafka's own Java clients, transactional or not, against
// any Kafka-compatible broker (scripts/bench-txn-vs-kafka.sh drives it). Source-file mode:
//   tool.sh class scripts/txn/TxnBench.java produce BOOTSTRAP TOPIC MODE SECONDS MAX_RECORDS SIZE
//     MODE: idempotent (enable.idempotence, no transactions), txn-ms:M (a transaction committed
//     every M ms) or txn-n:K (a transaction committed every K records). Records of SIZE bytes,
//     acks=all, linger.ms=5, batch.size=131072, sent until SECONDS pass or MAX_RECORDS are sent;
//     only acknowledged (and, in a transaction, committed) records count.
//   tool.sh class scripts/txn/TxnBench.java consume BOOTSTRAP TOPIC ISOLATION SECONDS
//     reads every partition from the start to its end offset (read_committed: the last stable
//     offset), for at most SECONDS.
// Both print one line: "records=N bytes=B seconds=S rate=R mib_s=M [transactions=T]"; exit 1 on
// an error (after printing what was done).
import java.time.Duration;
import java.util.*;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class TxnBench {
    public static void main(String[] args) throws Exception {
        if (args.length < 5) usage();
        switch (args[0]) {
            case "produce" -> System.exit(produce(args[1], args[2], args[3], Double.parseDouble(args[4]),
                Long.parseLong(args[5]), Integer.parseInt(args[6])));
            case "consume" -> System.exit(consume(args[1], args[2], args[3], Double.parseDouble(args[4])));
            default -> usage();
        }
    }

    static void usage() {
        System.err.println("usage: TxnBench produce|consume ... (see the header of TxnBench.java)");
        System.exit(2);
    }

    static void report(long records, long bytes, double seconds, String extra) {
        System.out.printf("records=%d bytes=%d seconds=%.2f rate=%.0f mib_s=%.2f%s%n",
            records, bytes, seconds, records / seconds, bytes / seconds / 1048576.0, extra);
    }

    static int produce(String bootstrap, String topic, String mode, double seconds, long max, int size) {
        long commitMs = mode.startsWith("txn-ms:") ? Long.parseLong(mode.substring(7)) : 0;
        long commitN = mode.startsWith("txn-n:") ? Long.parseLong(mode.substring(6)) : 0;
        boolean txn = commitMs > 0 || commitN > 0;
        if (!txn && !mode.equals("idempotent")) usage();
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "131072");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        if (txn) {
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, topic + "-bench-" + ProcessHandle.current().pid());
            p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "60000");
        }
        byte[] value = new byte[size];
        new Random(42).nextBytes(value);
        AtomicLong acked = new AtomicLong();
        AtomicReference<Exception> error = new AtomicReference<>();
        Callback cb = (md, e) -> { if (e != null) error.compareAndSet(null, e); else acked.incrementAndGet(); };
        long committed = 0, transactions = 0, sent = 0;
        long start = System.nanoTime(), deadline = start + (long) (seconds * 1e9);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            try {
                if (txn) producer.initTransactions();
                start = System.nanoTime();
                deadline = start + (long) (seconds * 1e9);
                while (sent < max && System.nanoTime() < deadline && error.get() == null) {
                    if (!txn) {
                        producer.send(new ProducerRecord<>(topic, value), cb);
                        sent++;
                        continue;
                    }
                    producer.beginTransaction();
                    long txnStart = System.nanoTime(), inTxn = 0;
                    while (sent < max && error.get() == null
                            && (commitN > 0 ? inTxn < commitN : System.nanoTime() - txnStart < commitMs * 1_000_000)) {
                        producer.send(new ProducerRecord<>(topic, value), cb);
                        sent++;
                        inTxn++;
                    }
                    producer.commitTransaction();
                    committed += inTxn;
                    transactions++;
                }
                producer.flush();
            } catch (Exception e) {
                error.compareAndSet(null, e);
            }
        }
        double s = (System.nanoTime() - start) / 1e9;
        long records = txn ? committed : acked.get();
        report(records, records * size, s, txn ? " transactions=" + transactions : "");
        if (error.get() != null) {
            System.out.println("error: " + error.get());
            return 1;
        }
        return 0;
    }

    static int consume(String bootstrap, String topic, String isolation, double seconds) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "10000");
        p.put(ConsumerConfig.FETCH_MAX_BYTES_CONFIG, String.valueOf(50 << 20));
        p.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, String.valueOf(8 << 20));
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        long records = 0, bytes = 0;
        long start = System.nanoTime();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            List<TopicPartition> tps = c.partitionsFor(topic, Duration.ofSeconds(30)).stream()
                .map(i -> new TopicPartition(topic, i.partition())).collect(Collectors.toList());
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(30));
            start = System.nanoTime();
            long deadline = start + (long) (seconds * 1e9);
            Set<TopicPartition> left = new HashSet<>(tps);
            while (!left.isEmpty()) {
                if (System.nanoTime() > deadline) {
                    report(records, bytes, (System.nanoTime() - start) / 1e9, " incomplete=1");
                    System.out.println("error: did not reach the end offsets " + end + " within " + seconds + " s");
                    return 1;
                }
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    records++;
                    bytes += r.serializedValueSize();
                }
                left.removeIf(tp -> c.position(tp) >= end.get(tp));
            }
        } catch (Exception e) {
            report(records, bytes, (System.nanoTime() - start) / 1e9, "");
            System.out.println("error: " + e);
            return 1;
        }
        report(records, bytes, (System.nanoTime() - start) / 1e9, "");
        return 0;
    }
}
