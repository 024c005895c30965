/*
 * Sends messages to a real RocketMQ cluster with RocketMQ's own Java client, so the tests can
 * check what the Python side decodes against records written exactly as Java producers write
 * them (UNIQ_KEY, compressed bodies, batches, delay levels, user properties).
 *
 * Usage: java -cp "classes:lib/*" JavaProducer NAMESRV_ADDR PRODUCER_GROUP [FILE]
 *        java -cp "classes:lib/*" JavaProducer --mqadmin COMMAND ARGS...
 *
 * Input (FILE, or stdin when FILE is absent or "-"): one JSON object per line:
 *   {"topic": "T", "body": "<base64>", "tags": "A", "keys": ["k1", "k2"],
 *    "properties": {"p": "v"}, "delayLevel": 2, "broker": "broker-a", "queueId": 1, "batch": 7}
 * Only "topic" and "body" are required. "broker" + "queueId" pin the message queue (otherwise the
 * client's round robin over all queues of all brokers picks one). Consecutive lines with the same
 * non-null "batch" value are sent as one MessageBatch (one SEND_BATCH_MESSAGE request; the first
 * line's queue is used for the whole batch).
 *
 * Output (stdout): one line per message, in input order, tab-separated:
 *   SENT <sendStatus> <msgId> <offsetMsgId> <brokerName> <queueId> <queueOffset>
 * Anything else the client prints is not prefixed with SENT. Exit status 1 on any failure, with
 * the exception on stderr.
 *
 * --mqadmin runs RocketMQ's MQAdminStartup (the mqadmin tool) and exits as soon as it returns:
 * left alone, its JVM lingers ~2 s for Netty's graceful shutdown after every command.
 */

import com.alibaba.fastjson2.JSON;
import com.alibaba.fastjson2.JSONArray;
import com.alibaba.fastjson2.JSONObject;
import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.tools.command.MQAdminStartup;

public final class JavaProducer {
    private JavaProducer() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length > 0 && "--mqadmin".equals(args[0])) {
            MQAdminStartup.main(Arrays.copyOfRange(args, 1, args.length));
            System.out.flush();
            System.err.flush();
            System.exit(0);
        }
        if (args.length < 2 || args.length > 3) {
            System.err.println("usage: JavaProducer NAMESRV_ADDR PRODUCER_GROUP [FILE]");
            System.exit(2);
        }
        List<JSONObject> lines = readLines(args.length == 3 ? args[2] : "-");

        DefaultMQProducer producer = new DefaultMQProducer(args[1]);
        producer.setNamesrvAddr(args[0]);
        // Loaded 2-core CI machines: the 3 s default makes first sends (route fetch, JIT) flaky.
        producer.setSendMsgTimeout(15000);
        producer.setRetryTimesWhenSendFailed(2);
        // Explicit, as the tests rely on it: bodies above 4 KiB are stored zlib-compressed.
        producer.setCompressMsgBodyOverHowmuch(4096);
        producer.start();
        int status = 0;
        try {
            int i = 0;
            while (i < lines.size()) {
                Object batchId = lines.get(i).get("batch");
                int j = i + 1;
                if (batchId != null) {
                    while (j < lines.size() && Objects.equals(batchId, lines.get(j).get("batch"))) {
                        j++;
                    }
                }
                List<JSONObject> group = lines.subList(i, j);
                if (batchId == null) {
                    sendOne(producer, group.get(0));
                } else {
                    sendBatch(producer, group);
                }
                i = j;
            }
            System.out.flush();
        } catch (Exception e) {
            e.printStackTrace();
            status = 1;
        } finally {
            producer.shutdown();
        }
        System.exit(status);
    }

    private static List<JSONObject> readLines(String file) throws Exception {
        List<JSONObject> out = new ArrayList<>();
        InputStream in = "-".equals(file) ? System.in : new FileInputStream(file);
        try (BufferedReader reader = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = reader.readLine()) != null) {
                if (!line.isBlank()) {
                    out.add(JSON.parseObject(line));
                }
            }
        }
        return out;
    }

    private static Message toMessage(JSONObject o) {
        Message msg = new Message(o.getString("topic"), Base64.getDecoder().decode(o.getString("body")));
        String tags = o.getString("tags");
        if (tags != null) {
            msg.setTags(tags);
        }
        JSONArray keys = o.getJSONArray("keys");
        if (keys != null && !keys.isEmpty()) {
            List<String> ks = new ArrayList<>();
            for (int k = 0; k < keys.size(); k++) {
                ks.add(keys.getString(k));
            }
            msg.setKeys(ks);
        }
        JSONObject props = o.getJSONObject("properties");
        if (props != null) {
            for (Map.Entry<String, Object> e : props.entrySet()) {
                msg.putUserProperty(e.getKey(), String.valueOf(e.getValue()));
            }
        }
        Integer delay = o.getInteger("delayLevel");
        if (delay != null && delay > 0) {
            msg.setDelayTimeLevel(delay);
        }
        return msg;
    }

    private static MessageQueue queueOf(JSONObject o) {
        String broker = o.getString("broker");
        Integer queueId = o.getInteger("queueId");
        if (broker == null && queueId == null) {
            return null;
        }
        if (broker == null || queueId == null) {
            throw new IllegalArgumentException("\"broker\" and \"queueId\" go together: " + o);
        }
        return new MessageQueue(o.getString("topic"), broker, queueId);
    }

    private static void sendOne(DefaultMQProducer producer, JSONObject o) throws Exception {
        Message msg = toMessage(o);
        MessageQueue mq = queueOf(o);
        SendResult r = mq == null ? producer.send(msg) : producer.send(msg, mq);
        print(r, r.getMsgId(), r.getOffsetMsgId(), r.getQueueOffset());
    }

    private static void sendBatch(DefaultMQProducer producer, List<JSONObject> group) throws Exception {
        List<Message> msgs = new ArrayList<>();
        for (JSONObject o : group) {
            msgs.add(toMessage(o));
        }
        MessageQueue mq = queueOf(group.get(0));
        SendResult r = mq == null ? producer.send(msgs) : producer.send(msgs, mq);
        // A batch answers once: msgId and offsetMsgId list every message, comma-separated, and
        // queueOffset is the first message's (the rest follow it in the same queue).
        String[] ids = r.getMsgId().split(",");
        String[] offsetIds = r.getOffsetMsgId() == null ? new String[0] : r.getOffsetMsgId().split(",");
        if (ids.length != msgs.size()) {
            throw new IllegalStateException("batch of " + msgs.size() + " answered with msgIds " + r.getMsgId());
        }
        for (int k = 0; k < ids.length; k++) {
            print(r, ids[k], k < offsetIds.length ? offsetIds[k] : "", r.getQueueOffset() + k);
        }
    }

    private static void print(SendResult r, String msgId, String offsetMsgId, long queueOffset) {
        MessageQueue mq = r.getMessageQueue();
        System.out.println(String.join("\t", "SENT", r.getSendStatus().name(), msgId,
            offsetMsgId == null ? "" : offsetMsgId, mq.getBrokerName(), Integer.toString(mq.getQueueId()),
            Long.toString(queueOffset)));
    }
}
