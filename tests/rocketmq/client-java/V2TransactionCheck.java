// RocketMQ 5's official Java client's transactions against the embedded broker's apache.rocketmq.v2
// service, run by tests/test_v2_java_client.py:
//   java -cp <client jars>:<classes> V2TransactionCheck ENDPOINT TOPIC GROUP
// Three transactions: one committed, one rolled back, one left open that the broker checks back
// and the TransactionChecker commits. A SimpleConsumer then reads what became visible. One line
// per fact on stdout, for the test.
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

public class V2TransactionCheck {
    public static void main(String[] args) throws Exception {
        String endpoint = args[0], topic = args[1], group = args[2];
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration config = ClientConfiguration.newBuilder().setEndpoints(endpoint).enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(5)).build();
        Map<String, FilterExpression> all = Collections.singletonMap(topic, new FilterExpression("*", FilterExpressionType.TAG));
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(config).setTopics(topic)
                .setTransactionChecker(view -> {
                    String body = StandardCharsets.UTF_8.decode(view.getBody()).toString();
                    System.out.println("CHECKED " + body);
                    return body.equals("checked-commit") ? TransactionResolution.COMMIT : TransactionResolution.ROLLBACK;
                }).build()) {
            for (String body : new String[] {"commit-me", "rollback-me", "checked-commit"}) {
                Message m = provider.newMessageBuilder().setTopic(topic).setTag("T")
                    .setBody(body.getBytes(StandardCharsets.UTF_8)).build();
                Transaction tx = producer.beginTransaction();
                producer.send(m, tx);
                if (body.equals("commit-me")) {
                    tx.commit();
                } else if (body.equals("rollback-me")) {
                    tx.rollback();
                }  // "checked-commit": left open for the broker's check-back
                System.out.println("SENT " + body);
            }
            try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config)
                    .setConsumerGroup(group).setAwaitDuration(Duration.ofSeconds(1))
                    .setSubscriptionExpressions(all).build()) {
                List<String> got = new ArrayList<>();
                long deadline = System.currentTimeMillis() + 30_000;
                while (got.size() < 2 && System.currentTimeMillis() < deadline) {
                    for (MessageView view : consumer.receive(16, Duration.ofSeconds(30))) {
                        got.add(StandardCharsets.UTF_8.decode(view.getBody()).toString());
                        consumer.ack(view);
                    }
                }
                long settle = System.currentTimeMillis() + 2_000;  // a rolled-back message would show here
                while (System.currentTimeMillis() < settle) {
                    for (MessageView view : consumer.receive(16, Duration.ofSeconds(30))) {
                        got.add(StandardCharsets.UTF_8.decode(view.getBody()).toString());
                        consumer.ack(view);
                    }
                }
                Collections.sort(got);
                System.out.println("RECEIVED " + got);
            }
        }
        System.out.println("DONE");
        System.exit(0);
    }
}
