// Watches a consumer group through Kafka's own Admin client, or measures a rebalance with
// Kafka's own consumer. Run in Java's source-file mode on the Kafka kit's classpath:
//   scripts/kafka/tool.sh class scripts/kip848/GroupWatch.java watch BOOTSTRAP GROUP STOP_FILE
//     polls the group every 100 ms until STOP_FILE exists: fails if a partition is ever in two
//     members' current assignments, or if a committed offset ever moves backwards.
//   scripts/kafka/tool.sh class scripts/kip848/GroupWatch.java rebalance BOOTSTRAP GROUP TOPIC PROTOCOL ROUNDS
//     runs 3 consumers (group.protocol=PROTOCOL) in this JVM until the group is stable, then
//     starts a 4th and measures until every partition is owned once by the 4 (state Stable);
//     prints one "rebalance_ms=N" line per round.
import java.util.*;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class GroupWatch {
    static final long DEADLINE_MS = 180_000;

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "watch" -> System.exit(watch(args[1], args[2], args[3]));
            case "rebalance" -> System.exit(rebalance(args[1], args[2], args[3], args[4], Integer.parseInt(args[5])));
            default -> throw new IllegalArgumentException("watch | rebalance");
        }
    }

    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return Admin.create(p);
    }

    /** Partitions in more than one member's current assignment, as "topic-p by a,b". */
    static List<String> doubles(ConsumerGroupDescription d) {
        Map<TopicPartition, String> owner = new HashMap<>();
        List<String> out = new ArrayList<>();
        for (MemberDescription m : d.members()) {
            for (TopicPartition tp : m.assignment().topicPartitions()) {
                String prev = owner.put(tp, m.consumerId());
                if (prev != null) out.add(tp + " by " + prev + "," + m.consumerId());
            }
        }
        return out;
    }

    static int watch(String bootstrap, String group, String stopFile) throws Exception {
        int polls = 0, maxMembers = 0, violations = 0;
        Map<TopicPartition, Long> committed = new HashMap<>();
        long start = System.currentTimeMillis();
        try (Admin admin = admin(bootstrap)) {
            while (!new java.io.File(stopFile).exists() && System.currentTimeMillis() - start < 20 * 60_000) {
                try {
                    ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group))
                        .describedGroups().get(group).get();
                    polls++;
                    maxMembers = Math.max(maxMembers, d.members().size());
                    for (String x : doubles(d)) {
                        violations++;
                        System.out.println("DOUBLE-OWNED " + x);
                    }
                    Map<TopicPartition, OffsetAndMetadata> now = admin.listConsumerGroupOffsets(group)
                        .partitionsToOffsetAndMetadata().get();
                    for (var e : now.entrySet()) {
                        if (e.getValue() == null) continue;
                        Long before = committed.put(e.getKey(), e.getValue().offset());
                        if (before != null && e.getValue().offset() < before) {
                            violations++;
                            System.out.println("OFFSET-BACKWARDS " + e.getKey() + " " + before + " -> " + e.getValue().offset());
                        }
                    }
                } catch (java.util.concurrent.ExecutionException e) {
                    // The group may not exist yet, or the coordinator moves: poll again.
                }
                Thread.sleep(100);
            }
        }
        System.out.println("polls=" + polls + " max_members=" + maxMembers + " violations=" + violations);
        return violations == 0 && polls > 0 ? 0 : 1;
    }

    static final class Member implements Runnable {
        final KafkaConsumer<byte[], byte[]> consumer;
        final AtomicBoolean stop = new AtomicBoolean();
        final Thread thread = new Thread(this);

        Member(String bootstrap, String group, String topic, String protocol) {
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
            p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
            p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
            consumer = new KafkaConsumer<>(p);
            this.topic = topic;
        }

        final String topic;

        public void run() {
            consumer.subscribe(List.of(topic));
            while (!stop.get()) consumer.poll(java.time.Duration.ofMillis(50));
            consumer.close();
        }

        void halt() throws InterruptedException {
            stop.set(true);
            thread.join();
        }
    }

    /** Milliseconds until the group is Stable with `members` members owning all `partitions` once. */
    static long settle(Admin admin, String group, int members, int partitions, long from) throws Exception {
        while (System.currentTimeMillis() - from < DEADLINE_MS) {
            try {
                ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group))
                    .describedGroups().get(group).get();
                int owned = d.members().stream().mapToInt(m -> m.assignment().topicPartitions().size()).sum();
                if (d.groupState() == GroupState.STABLE && d.members().size() == members
                    && owned == partitions && doubles(d).isEmpty()) {
                    return System.currentTimeMillis() - from;
                }
            } catch (java.util.concurrent.ExecutionException e) {
                // Not there yet.
            }
            Thread.sleep(10);
        }
        throw new IllegalStateException("group " + group + " did not settle with " + members + " members");
    }

    static int rebalance(String bootstrap, String group, String topic, String protocol, int rounds) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            int partitions = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions().size();
            for (int round = 0; round < rounds; round++) {
                String g = group + "-" + round;
                List<Member> three = new ArrayList<>();
                for (int i = 0; i < 3; i++) {
                    Member m = new Member(bootstrap, g, topic, protocol);
                    three.add(m);
                    m.thread.start();
                }
                settle(admin, g, 3, partitions, System.currentTimeMillis());
                long t0 = System.currentTimeMillis();
                Member fourth = new Member(bootstrap, g, topic, protocol);
                fourth.thread.start();
                long ms = settle(admin, g, 4, partitions, t0);
                System.out.println("rebalance_ms=" + ms);
                fourth.halt();
                for (Member m : three) m.halt();
            }
        }
        return 0;
    }
}
