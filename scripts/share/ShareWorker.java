// One member of a share group, with Kafka's own KafkaShareConsumer (explicit acknowledgement
// mode). Run in Java's source-file mode on the Kafka kit's classpath:
//   scripts/kafka/tool.sh class scripts/share/ShareWorker.java work BOOTSTRAP TOPIC GROUP NAME STOP_FILE
//     accepts every record it gets; once a commitSync confirms an acceptance, prints
//     "accepted VALUE DELIVERY_COUNT NAME" (flushed), until STOP_FILE exists.
//   scripts/kafka/tool.sh class scripts/share/ShareWorker.java hold BOOTSTRAP TOPIC GROUP NAME
//     polls until it gets records, prints "held VALUE" for each and "holding N", then keeps
//     them without acknowledging (and without polling again) until it is killed.
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

public class ShareWorker {
    public static void main(String[] args) throws Exception {
        String mode = args[0], bootstrap = args[1], topic = args[2], group = args[3], name = args[4];
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, name);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put("share.acknowledgement.mode", "explicit");
        try (KafkaShareConsumer<String, String> c = new KafkaShareConsumer<>(p)) {
            c.subscribe(List.of(topic));
            switch (mode) {
                case "work" -> work(c, name, args[5]);
                case "hold" -> hold(c);
                default -> throw new IllegalArgumentException("work | hold");
            }
        }
    }

    static void work(KafkaShareConsumer<String, String> c, String name, String stopFile) {
        while (!new java.io.File(stopFile).exists()) {
            ConsumerRecords<String, String> records = c.poll(Duration.ofMillis(500));
            if (records.isEmpty()) continue;
            List<ConsumerRecord<String, String>> batch = new ArrayList<>();
            for (ConsumerRecord<String, String> r : records) {
                c.acknowledge(r, AcknowledgeType.ACCEPT);
                batch.add(r);
            }
            Map<TopicIdPartition, Optional<KafkaException>> result = c.commitSync();
            boolean ok = result.values().stream().allMatch(Optional::isEmpty);
            if (!ok) {
                System.err.println("commitSync failed: " + result);
                continue;
            }
            StringBuilder out = new StringBuilder();
            for (ConsumerRecord<String, String> r : batch) {
                out.append("accepted ").append(r.value()).append(' ')
                   .append(r.deliveryCount().map(String::valueOf).orElse("?")).append(' ')
                   .append(name).append('\n');
            }
            System.out.print(out);
            System.out.flush();
        }
    }

    static void hold(KafkaShareConsumer<String, String> c) throws InterruptedException {
        while (true) {
            ConsumerRecords<String, String> records = c.poll(Duration.ofMillis(500));
            if (records.isEmpty()) continue;
            StringBuilder out = new StringBuilder();
            for (ConsumerRecord<String, String> r : records) out.append("held ").append(r.value()).append('\n');
            out.append("holding ").append(records.count()).append('\n');
            System.out.print(out);
            System.out.flush();
            // Keep the records locked: no acknowledgement, no further poll, until killed.
            Thread.sleep(Long.MAX_VALUE);
        }
    }
}
