// A small MQTT 3.1.1 client over WebSocket for the dashboard's panel: CONNECT,
// SUBSCRIBE, PUBLISH at QoS 0 and 1 (PUBACK both ways), PINGREQ. Enough to check that
// a broker works; not a general client (no QoS 2 sending, no reconnect, no session).
//
//   const c = new MqttWsClient("ws://host:port/mqtt", {clientId, onMessage, onClose});
//   await c.connect(); await c.subscribe("a/#", 1); await c.publish("a/b", "hi", 1);

const TYPE = { CONNECT: 1, CONNACK: 2, PUBLISH: 3, PUBACK: 4, PUBREC: 5, PUBREL: 6, PUBCOMP: 7,
               SUBSCRIBE: 8, SUBACK: 9, PINGREQ: 12, PINGRESP: 13, DISCONNECT: 14 };

const encoder = new TextEncoder();
const decoder = new TextDecoder();

// -- encoding ----------------------------------------------------------------

function varint(n) {  // the Remaining Length: 7 bits a byte, high bit "more follows"
  const out = [];
  do {
    let byte = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) byte |= 0x80;
    out.push(byte);
  } while (n > 0);
  return out;
}

function utf8(text) {  // a length-prefixed UTF-8 string
  const bytes = encoder.encode(text);
  return [bytes.length >> 8, bytes.length & 0xff, ...bytes];
}

function u16(n) { return [n >> 8, n & 0xff]; }

function packet(firstByte, body) {
  return new Uint8Array([firstByte, ...varint(body.length), ...body]);
}

function connectPacket(clientId, keepAlive) {
  const flags = 0x02;  // clean session
  return packet(TYPE.CONNECT << 4, [...utf8("MQTT"), 4, flags, ...u16(keepAlive), ...utf8(clientId)]);
}

function subscribePacket(id, topicFilter, qos) {
  return packet((TYPE.SUBSCRIBE << 4) | 0x02, [...u16(id), ...utf8(topicFilter), qos]);
}

export function publishPacket(id, topic, payload, qos, retain) {
  const header = (TYPE.PUBLISH << 4) | (qos << 1) | (retain ? 1 : 0);
  return packet(header, [...utf8(topic), ...(qos > 0 ? u16(id) : []), ...payload]);
}

// -- decoding ----------------------------------------------------------------

// Splits a byte stream into packets: a WebSocket message may hold part of a packet
// or several (MQTT over WebSocket, section 6).
export class PacketReader {
  constructor() { this.buffer = new Uint8Array(0); }

  push(bytes) {
    const joined = new Uint8Array(this.buffer.length + bytes.length);
    joined.set(this.buffer);
    joined.set(bytes, this.buffer.length);
    this.buffer = joined;
    const packets = [];
    for (;;) {
      let length = 0, multiplier = 1, i = 1;
      for (;; i++) {
        if (i >= this.buffer.length) return packets;  // the length is not all here yet
        length += (this.buffer[i] & 0x7f) * multiplier;
        multiplier *= 128;
        if ((this.buffer[i] & 0x80) === 0) break;
      }
      const end = i + 1 + length;
      if (end > this.buffer.length) return packets;
      packets.push({ type: this.buffer[0] >> 4, flags: this.buffer[0] & 0x0f, body: this.buffer.slice(i + 1, end) });
      this.buffer = this.buffer.slice(end);
    }
  }
}

export function readPublish(p) {
  const topicLength = (p.body[0] << 8) | p.body[1];
  const topic = decoder.decode(p.body.slice(2, 2 + topicLength));
  const qos = (p.flags >> 1) & 0x03;
  let at = 2 + topicLength, id = 0;
  if (qos > 0) { id = (p.body[at] << 8) | p.body[at + 1]; at += 2; }
  return { topic, qos, id, retain: (p.flags & 1) === 1, payload: p.body.slice(at) };
}

// -- the client --------------------------------------------------------------

export class MqttWsClient {
  constructor(url, { clientId, keepAlive = 30, onMessage = () => {}, onClose = () => {} } = {}) {
    this.url = url;
    this.clientId = clientId || `dashboard-${Math.random().toString(16).slice(2, 10)}`;
    this.keepAlive = keepAlive;
    this.onMessage = onMessage;
    this.onClose = onClose;
    this.nextId = 1;
    this.waiting = new Map();  // packet id -> resolve, for SUBACK and PUBACK
    this.reader = new PacketReader();
  }

  connect() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(this.url, ["mqtt"]);
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      this.connected = false;
      ws.onopen = () => ws.send(connectPacket(this.clientId, this.keepAlive));
      ws.onerror = () => { if (!this.connected) reject(new Error(`cannot open ${this.url}`)); };
      ws.onclose = () => {
        clearInterval(this.pinger);
        if (!this.connected) reject(new Error("connection closed before CONNACK"));
        this.connected = false;
        this.onClose();
      };
      ws.onmessage = (event) => {
        for (const p of this.reader.push(new Uint8Array(event.data))) {
          if (p.type === TYPE.CONNACK) {
            const code = p.body[1];
            if (code !== 0) { reject(new Error(`CONNACK refused: return code ${code}`)); ws.close(); return; }
            this.connected = true;
            this.pinger = setInterval(() => this.send(packet(TYPE.PINGREQ << 4, [])), this.keepAlive * 500);
            resolve();
          } else {
            this.handle(p);
          }
        }
      };
    });
  }

  handle(p) {
    if (p.type === TYPE.PUBLISH) {
      const msg = readPublish(p);
      if (msg.qos === 1) this.send(packet(TYPE.PUBACK << 4, u16(msg.id)));
      if (msg.qos === 2) this.send(packet(TYPE.PUBREC << 4, u16(msg.id)));  // then PUBREL -> PUBCOMP
      this.onMessage({ topic: msg.topic, payload: decoder.decode(msg.payload), qos: msg.qos, retain: msg.retain });
    } else if (p.type === TYPE.PUBREL) {
      this.send(packet((TYPE.PUBCOMP << 4), [p.body[0], p.body[1]]));
    } else if (p.type === TYPE.SUBACK || p.type === TYPE.PUBACK) {
      const id = (p.body[0] << 8) | p.body[1];
      const resolve = this.waiting.get(id);
      this.waiting.delete(id);
      if (resolve) resolve(p.type === TYPE.SUBACK ? p.body[2] : 0);
    }
    // PINGRESP needs nothing: a broker that stops answering closes the socket.
  }

  send(bytes) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(bytes);
  }

  packetId() {
    const id = this.nextId;
    this.nextId = id === 65535 ? 1 : id + 1;
    return id;
  }

  acknowledged(id) {
    return new Promise((resolve) => this.waiting.set(id, resolve));
  }

  // Resolves with the granted QoS (0x80: refused).
  subscribe(topicFilter, qos = 0) {
    const id = this.packetId();
    const done = this.acknowledged(id);
    this.send(subscribePacket(id, topicFilter, qos));
    return done;
  }

  // QoS 1 resolves on the PUBACK; QoS 0 at once.
  publish(topic, text, qos = 0, retain = false) {
    const id = qos > 0 ? this.packetId() : 0;
    const done = qos > 0 ? this.acknowledged(id) : Promise.resolve(0);
    this.send(publishPacket(id, topic, encoder.encode(text), qos, retain));
    return done;
  }

  disconnect() {
    this.send(packet(TYPE.DISCONNECT << 4, []));
    if (this.ws) this.ws.close();
  }
}
