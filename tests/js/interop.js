// MQTT.js under Node against one meshd node (issue 25): over the URL given (mqtt://
// for TCP, ws:// for WebSocket) and the protocol version given (4: 3.1.1, 5: 5.0),
// each check on clients of its own. Prints one JSON line {check: result}; a check
// that threw has {error}. tests/js/test_mqttjs.py judges the results.
//   node interop.js URL VERSION
"use strict";
const mqtt = require("mqtt");

const [url, versionText] = process.argv.slice(2);
const version = Number(versionText);
const tag = `${url.startsWith("ws") ? "ws" : "tcp"}-${version}`;  // topics and ids of this run
const WAIT_MS = 10000;

function connect(clientId, options = {}) {
  return mqtt.connectAsync(url, {
    clientId: `${tag}-${clientId}`,
    protocolVersion: version,
    reconnectPeriod: 0,  // a lost connection must show, not be papered over
    connectTimeout: WAIT_MS,
    ...options,
  });
}

// Resolves with the first `count` messages `client` receives (topic, payload, qos, retain).
function collect(client, count) {
  return new Promise((resolve, reject) => {
    const got = [];
    const timer = setTimeout(() => reject(new Error(`got ${got.length} of ${count} messages`)), WAIT_MS);
    client.on("message", (topic, payload, packet) => {
      got.push({ topic, payload: payload.toString(), qos: packet.qos, retain: packet.retain });
      if (got.length === count) { clearTimeout(timer); resolve(got); }
    });
  });
}

const checks = {
  // A subscriber at QoS 2 gets each message at the QoS it was published with.
  async qos() {
    const sub = await connect("qos-sub");
    await sub.subscribeAsync(`js/${tag}/qos/+`, { qos: 2 });
    const pub = await connect("qos-pub");
    const received = collect(sub, 3);
    for (const qos of [0, 1, 2]) await pub.publishAsync(`js/${tag}/qos/${qos}`, `at ${qos}`, { qos });
    const got = await received;
    await Promise.all([sub.endAsync(), pub.endAsync()]);
    return got.sort((a, b) => a.qos - b.qos).map((m) => [m.topic.split("/").pop(), m.payload, m.qos]);
  },

  // A retained message goes to a later subscriber, flagged retained; an empty
  // retained publish clears it.
  async retained() {
    const pub = await connect("ret-pub");
    await pub.publishAsync(`js/${tag}/retained`, "kept", { qos: 1, retain: true });
    const late = await connect("ret-late");
    const received = collect(late, 1);
    await late.subscribeAsync(`js/${tag}/retained`, { qos: 1 });
    const [message] = await received;
    await pub.publishAsync(`js/${tag}/retained`, "", { qos: 1, retain: true });
    await Promise.all([pub.endAsync(), late.endAsync()]);
    return message;
  },

  // A client that vanishes without DISCONNECT has its will published.
  async will() {
    const watcher = await connect("will-watch");
    await watcher.subscribeAsync(`js/${tag}/will`, { qos: 1 });
    const received = collect(watcher, 1);
    const doomed = await connect("will-doomed", { will: { topic: `js/${tag}/will`, payload: "gone", qos: 1, retain: false } });
    doomed.stream.destroy();  // the socket closes; no DISCONNECT is sent
    const [message] = await received;
    doomed.end(true);
    await watcher.endAsync();
    return message;
  },

  // A persistent session keeps its subscription and queues QoS 1 messages while the
  // client is away; reconnecting finds the session and gets them, in order.
  async resume() {
    const persistent = version === 5
      ? { clean: false, properties: { sessionExpiryInterval: 300 } }
      : { clean: false };
    const first = await connect("resume", persistent);
    await first.subscribeAsync(`js/${tag}/resume`, { qos: 1 });
    await first.endAsync();
    const pub = await connect("resume-pub");
    for (const n of [1, 2, 3]) await pub.publishAsync(`js/${tag}/resume`, `m${n}`, { qos: 1 });
    await pub.endAsync();
    let sessionPresent = null;
    // Not connectAsync: the queued messages may come right behind the CONNACK, so the
    // handlers are in place before the connection opens (on the next tick).
    const again = mqtt.connect(url, {
      clientId: `${tag}-resume`, protocolVersion: version, reconnectPeriod: 0, connectTimeout: WAIT_MS, ...persistent,
    });
    again.on("connect", (connack) => { sessionPresent = connack.sessionPresent; });
    const got = await collect(again, 3);
    await again.endAsync();
    return { sessionPresent, payloads: got.map((m) => m.payload) };
  },
};

(async () => {
  const results = {};
  for (const [name, check] of Object.entries(checks)) {
    try {
      results[name] = await check();
    } catch (err) {
      results[name] = { error: String(err) };
    }
  }
  console.log(JSON.stringify(results));
  process.exit(0);
})();
