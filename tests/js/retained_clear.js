// MQTT.js under Node against meshd over ws:// (issue 21, "Done when"): connect,
// publish a retained message, clear it with an empty retained publish, and keep the
// connection. Prints one JSON line of what it saw; exits 0 only if all of it held.
//   node retained_clear.js ws://127.0.0.1:PORT/mqtt PROTOCOL_VERSION
"use strict";
const mqtt = require("mqtt");

const [url, version] = process.argv.slice(2);
const topic = `js/retained/${version}`;
const seen = { version: Number(version), closes: 0, retained: [], echoed: null, error: null };

let done = false;
function finish(ok) {
  if (done) return; // the first verdict stands (ending the client fails what is pending)
  done = true;
  seen.ok = ok;
  console.log(JSON.stringify(seen));
  client.end(true, () => process.exit(ok ? 0 : 1));
}

const client = mqtt.connect(url, {
  clientId: `mqttjs-${version}`,
  protocolVersion: Number(version),
  protocolId: version === "3" ? "MQIsdp" : "MQTT",
  reconnectPeriod: 0, // a lost connection must show, not be papered over
  connectTimeout: 10000,
});
client.on("close", () => { seen.closes += 1; });
client.on("error", (err) => { seen.error = String(err); finish(false); });
const timer = setTimeout(() => { seen.error = "timed out"; finish(false); }, 20000);

client.on("message", (t, payload, packet) => {
  if (packet.retain) seen.retained.push(payload.toString());
  if (t === `${topic}/echo`) {
    seen.echoed = payload.toString();
    clearTimeout(timer);
    finish(seen.closes === 0 && client.connected);
  }
});

client.on("connect", async () => {
  try {
    await client.publishAsync(topic, "kept", { qos: 1, retain: true });
    await client.publishAsync(topic, "", { qos: 1, retain: true }); // clears it: an empty payload
    await client.publishAsync(topic, "", { qos: 0, retain: true });
    // Still connected: a fresh subscription finds no retained message, and a
    // message published now comes back over the same connection.
    await client.subscribeAsync([topic, `${topic}/echo`], { qos: 1 });
    await client.publishAsync(`${topic}/echo`, "alive", { qos: 1 });
  } catch (err) {
    seen.error = String(err);
    finish(false);
  }
});
