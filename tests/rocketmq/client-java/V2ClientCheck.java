// RocketMQ 5's official Java client (rocketmq-client-java) against the embedded broker's
// apache.rocketmq.v2 service, run by tests/test_v2_java_client.py:
//   java -cp <client jars>:<classes> V2ClientCheck ENDPOINT TOPIC SIMPLE_GROUP PUSH_GROUP
// A Producer sends three messages and a SimpleConsumer receives and acks them; then a
// PushConsumer's listener fails the message "fail" on every attempt (the broker dead-letters it
// after the group's max attempts) and consumes "ok" and "ok-0" (whose body's CRC32, 007076CB,
// begins with a 0: the client takes a message whose digest it computes otherwise for corrupted).
// One line per fact on stdout, for the test.
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;

public class V2ClientCheck {
    public static void main(String[] args) throws Exception {
        String endpoint = args[0], topic = args[1], simpleGroup = args[2], pushGroup = args[3];
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration config = ClientConfiguration.newBuilder().setEndpoints(endpoint).enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(5)).build();
        Map<String, FilterExpression> all = Collections.singletonMap(topic, new FilterExpression("*", FilterExpressionType.TAG));
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(config).setTopics(topic).build()) {
            for (int i = 0; i < 3; i++) {
                Message m = provider.newMessageBuilder().setTopic(topic).setTag("J").setKeys("k" + i)
                    .addProperty("lang", "java").setBody(("java-" + i).getBytes(StandardCharsets.UTF_8)).build();
                SendReceipt receipt = producer.send(m);
                System.out.println("SENT " + receipt.getMessageId());
            }
            try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config)
                    .setConsumerGroup(simpleGroup).setAwaitDuration(Duration.ofSeconds(2))
                    .setSubscriptionExpressions(all).build()) {
                List<MessageView> got = new ArrayList<>();
                long deadline = System.currentTimeMillis() + 30_000;
                while (got.size() < 3 && System.currentTimeMillis() < deadline) {
                    for (MessageView view : consumer.receive(16, Duration.ofSeconds(30))) {
                        got.add(view);
                        System.out.println("RECEIVED " + StandardCharsets.UTF_8.decode(view.getBody()) + " "
                            + view.getTag().orElse("") + " " + String.join(",", view.getKeys()) + " "
                            + view.getProperties().get("lang") + " " + view.getDeliveryAttempt() + " "
                            + view.getMessageId());
                        consumer.ack(view);
                    }
                }
            }
            List<Integer> failedAttempts = new CopyOnWriteArrayList<>();
            List<String> consumed = new CopyOnWriteArrayList<>();
            try (PushConsumer push = provider.newPushConsumerBuilder().setClientConfiguration(config)
                    .setConsumerGroup(pushGroup).setSubscriptionExpressions(all)
                    .setMessageListener(view -> {
                        String body = StandardCharsets.UTF_8.decode(view.getBody()).toString();
                        if (body.equals("fail")) {
                            failedAttempts.add(view.getDeliveryAttempt());
                            return ConsumeResult.FAILURE;
                        }
                        if (body.startsWith("ok")) {
                            consumed.add(body);
                        }
                        return ConsumeResult.SUCCESS;
                    }).build()) {
                for (String body : new String[] {"ok", "ok-0", "fail"}) {
                    producer.send(provider.newMessageBuilder().setTopic(topic).setTag("P")
                        .setBody(body.getBytes(StandardCharsets.UTF_8)).build());
                }
                long deadline = System.currentTimeMillis() + 40_000;
                while ((failedAttempts.size() < 3 || consumed.size() < 2) && System.currentTimeMillis() < deadline) {
                    Thread.sleep(100);
                }
                Thread.sleep(500);  // a fourth attempt would show here
            }
            System.out.println("PUSH_FAILED_ATTEMPTS " + failedAttempts);
            System.out.println("PUSH_CONSUMED " + new java.util.TreeSet<>(consumed));
        }
        System.out.println("DONE");
        System.exit(0);
    }
}
