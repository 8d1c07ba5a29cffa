// Produces through Confluent's Node.js REST Proxy client (kafka-rest) and prints, as JSON, what
// it was told was written: [{partition, offset, key, value}] with keys and values in base64.
// Exits 1 when the client reports something other than what the checks expect.
"use strict";
const KafkaRest = require("kafka-rest");
const assert = require("assert");

const client = new KafkaRest({ url: process.argv[2] });
const topic = client.topics.topic("rest-client");

// The client rewrites the messages it is given (base64, envelopes), so it gets copies.
function produce(target, messages) {
  const copy = Array.isArray(messages) ? messages.map((m) => (typeof m === "object" && !Buffer.isBuffer(m) ? { ...m } : m)) : messages;
  return new Promise((resolve, reject) => {
    target.produce(copy, (err, res) => (err ? reject(err) : resolve(res)));
  });
}

const b64 = (x) => (x === null ? null : Buffer.from(x).toString("base64"));

async function main() {
  const sent = [];
  const record = (res, msgs) => {
    assert.strictEqual(res.offsets.length, msgs.length, JSON.stringify(res));
    res.offsets.forEach((o, i) => {
      assert.strictEqual(o.error_code, null, JSON.stringify(o));
      assert.ok(o.offset >= 0 && o.partition >= 0, JSON.stringify(o));
      sent.push({ partition: o.partition, offset: o.offset, key: b64(msgs[i].key), value: b64(msgs[i].value) });
    });
  };

  // Values only, as strings: the client base64-encodes them (the v1 binary format).
  const plain = ["first", "second", "third"];
  record(await produce(topic, plain), plain.map((v) => ({ key: null, value: v })));

  // Keys and values, one of them binary.
  const keyed = [
    { key: "user-1", value: "signed up" },
    { key: "user-2", value: Buffer.from([0, 1, 2, 255, 254]) },
    { key: "user-1", value: "logged in" },
  ];
  const res = await produce(topic, keyed);
  record(res, keyed);
  // Same key, same partition.
  assert.strictEqual(res.offsets[0].partition, res.offsets[2].partition);

  // An explicit partition through the topic, and the partition resource.
  const pinned = [{ partition: 2, value: "pinned to 2" }];
  const r2 = await produce(topic, pinned);
  assert.strictEqual(r2.offsets[0].partition, 2);
  record(r2, [{ key: null, value: "pinned to 2" }]);
  const r1 = await produce(topic.partition(1), "through partition 1");
  assert.strictEqual(r1.offsets[0].partition, 1);
  record(r1, [{ key: null, value: "through partition 1" }]);

  // A partition the topic lacks: the client reports the broker's error, nothing is written.
  let refused = null;
  try {
    await produce(topic.partition(7), "nowhere");
  } catch (e) {
    refused = e;
  }
  assert.ok(refused, "producing to partition 7 of 3 must fail");
  assert.strictEqual(refused.status, 404, String(refused));

  process.stdout.write(JSON.stringify(sent));
  process.stderr.write(`rest-client-e2e: kafka-rest produced ${sent.length} records, refusals as expected\n`);
}

main().catch((e) => {
  process.stderr.write(`rest-client-e2e: ${e.stack || e}\n`);
  process.exit(1);
});
