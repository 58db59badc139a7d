// The dashboard's pages. Each is {id, title, render(root, api)}: render builds the
// page's frame once and returns {refresh, stop}; the shell (app.js) calls refresh
// every two seconds while the page is on screen. `api(method, path, body)` is the
// JSON API with the token.

import { h, table, tile, replace, ago, bytes } from "./dom.js";
import { drawChart, formatNumber } from "./chart.js";
import { MqttWsClient } from "./mqttws.js";

const state = (s) => h("span", { class: `state-${s}` }, s);
const when = (ts) => (ts ? new Date(ts * 1000).toLocaleString() : "—");
const enc = encodeURIComponent;

// -- Cluster: members as this node sees them, partitions, held traffic ---------

function clusterPage(root, api) {
  const members = h("div"), partitions = h("div"), history = h("div");
  root.append(h("h1", {}, "Cluster"), members, h("h2", {}, "Partitions"), partitions,
              h("h2", {}, "Partition history"), history);
  return {
    async refresh() {
      const c = await api("GET", "/api/v1/cluster");
      const unreachable = new Set(c.unreachable);
      replace(members, table(
        ["Member", "State", "Incarnation", "Address", "Last contact", "Netsplit", "Held messages"],
        c.members.map((m) => [
          m.id + (m.id === c.node_id ? " (this node)" : ""), state(m.state), m.incarnation, m.address,
          m.id === c.node_id ? "—" : ago(m.last_contact_s),
          unreachable.has(m.id) ? "unreachable" : "reachable",
          c.held[m.id] ?? 0,
        ]),
        { id: "members" }));
      const summary = c.partitioned
        ? `Partitioned${c.minority ? " — this node is in the minority" : ""}: ${c.partitions.length} partition(s), unreachable: ${c.unreachable.join(", ")}`
        : "No partition: every member that did not leave is reachable.";
      replace(partitions, h("p", { id: "partition-summary" }, summary),
        c.partitions.length ? table(["Partition", "Since", "This side", "Other side", "Side", "Returned"],
          c.partitions.map((p) => [p.id, when(p.onset_ts_us / 1e6), p.local.join(", "), p.remote.join(", "),
                                   p.majority ? "majority" : "minority", p.returned.join(", ") || "—"]),
          { id: "partitions" }) : null,
        h("p", { class: "muted" }, `detected ${c.detected_total}, healed ${c.healed_total}`));
      replace(history, c.history.length
        ? table(["When", "Event", "Partition", "Other side", "Details"], c.history.slice().reverse().map((e) => [
          when(e.ts_us / 1e6), e.event.replace("partition_", ""), e.id, e.peers.join(", "),
          e.event === "partition_healed"
            ? `healed in ${e.heal_s} s after ${e.duration_s} s${e.missing.length ? `; still missing ${e.missing.join(", ")}` : ""}`
            : `detected in ${e.detection_s} s; this side ${e.local.join(", ")} (${e.majority ? "majority" : "minority"})` +
              (e.revision ? `, revision ${e.revision}` : ""),
        ]), { id: "partition-history" })
        : h("p", { class: "muted" }, "none since this node started"));
    },
  };
}

// -- Node: this node's load and the last ten minutes ---------------------------

const SERIES = [
  { key: "messages_in_per_s", label: "messages in /s", color: "#1a73e8" },
  { key: "messages_out_per_s", label: "messages out /s", color: "#e8710a" },
  { key: "store_records_per_s", label: "RocksDB records written /s", color: "#137333" },
];

function nodePage(root, api) {
  const tiles = h("div", { class: "tiles" });
  const canvas = h("canvas", { class: "chart", id: "rates-chart" });
  const legend = h("div", { class: "legend" }, SERIES.map((s) => {
    const label = h("span", {}, `— ${s.label}`);
    label.style.color = s.color;  // a style attribute would break the page's CSP
    return label;
  }));
  const listeners = h("p", { class: "muted" });
  root.append(h("h1", {}, "Node"), tiles, listeners, h("h2", {}, "Message rates, last 10 minutes"), canvas, legend);
  return {
    async refresh() {
      const [n, s] = await Promise.all([api("GET", "/api/v1/node"), api("GET", "/api/v1/status")]);
      const last = n.rates[n.rates.length - 1] || {};
      replace(tiles,
        tile("clients connected", n.connected_clients, "tile-clients"), tile("sessions", n.sessions),
        tile("subscriptions", n.subscriptions), tile("inflight", n.inflight), tile("queued", n.queued),
        tile("messages in /s", formatNumber(last.messages_in_per_s || 0), "tile-rate-in"),
        tile("messages out /s", formatNumber(last.messages_out_per_s || 0)),
        tile("RocksDB size", bytes(n.store_size_bytes), "tile-store-size"),
        tile("RocksDB writes /s", formatNumber(last.store_records_per_s || 0)),
        tile("uptime", s.uptime_s < 60 ? `${Math.floor(s.uptime_s)} s` : `${Math.floor(s.uptime_s / 60)} min`));
      listeners.textContent = `Listeners: ${Object.entries(s.listeners).map(([k, v]) => `${k} ${v.address}`).join(", ")}`;
      drawChart(canvas, {
        spanSeconds: 600,
        series: SERIES.map((d) => ({ ...d, points: n.rates.map((r) => [r.t, r[d.key]]) })),
      });
    },
  };
}

// -- Clients and sessions: search, detail, kick, delete --------------------------

function clientsPage(root, api) {
  const search = h("input", { id: "client-search", placeholder: "client id starts with…", type: "search" });
  const list = h("div", { id: "client-list" }), detail = h("div", { id: "client-detail" });
  let selected = null;
  const refresh = async () => {
    const q = search.value ? `?clientid_prefix=${enc(search.value)}` : "";
    const page = await api("GET", `/api/v1/clients${q}`);
    replace(list, table(["Client id", "Node", "Connected", "Address", "Protocol", "Subscriptions", "Inflight", "Queued"],
      page.data.map((c) => [
        h("a", { href: "#clients", onclick: (e) => { e.preventDefault(); selected = c.clientid; showDetail(); } }, c.clientid),
        c.node, c.connected ? "yes" : "no", c.ip_address ? `${c.ip_address}:${c.port}` : "—", c.proto_ver,
        c.subscriptions_cnt, c.inflight_cnt, c.mqueue_len,
      ]), { id: "clients" }),
      page.missing.length ? h("p", { class: "error" }, `no answer from: ${page.missing.map((m) => m.node).join(", ")}`) : null);
    if (selected) await showDetail();
  };
  const act = async (method, path) => {
    try { await api(method, path); } catch (err) { replace(detail, h("p", { class: "error" }, err.message)); return; }
    await refresh();
  };
  async function showDetail() {
    let c;
    try { c = await api("GET", `/api/v1/clients/${enc(selected)}`); } catch (err) {
      replace(detail, h("p", { class: "muted" }, err.message));
      return;
    }
    replace(detail, h("h2", {}, `Client ${c.clientid}`),
      h("div", { class: "row" },
        h("button", { id: "kick", disabled: !c.connected, onclick: () => act("POST", `/api/v1/clients/${enc(c.clientid)}/kick`) }, "Kick"),
        h("button", { id: "delete-session", onclick: () => act("DELETE", `/api/v1/sessions/${enc(c.clientid)}`) }, "Delete session")),
      h("p", {}, `on ${c.node}; ${c.connected ? "connected since " + c.connected_at : "offline since " + c.disconnected_at}; ` +
                 `clean start ${c.clean_start}, expiry ${c.expiry_interval} s`),
      h("h2", {}, "Subscriptions"),
      table(["Filter", "QoS", "No local", "Retain as published", "Retain handling"],
        c.subscriptions.map((s) => [s.topic, s.qos, s.nl, s.rap, s.rh])),
      h("h2", {}, `Inflight (${c.inflight_cnt})`),
      table(["Packet id", "Topic", "QoS", "State"], c.inflight.map((m) => [m.packet_id, m.topic, m.qos, m.state])),
      h("h2", {}, `Queue (${c.mqueue_len}, dropped ${c.mqueue_dropped})`),
      table(["Topic", "QoS"], c.mqueue.map((m) => [m.topic, m.qos])));
  }
  search.addEventListener("input", () => refresh().catch(() => {}));
  root.append(h("h1", {}, "Clients and sessions"), h("div", { class: "row" }, search), list, detail);
  return { refresh };
}

// -- Routes: filter -> nodes, and how far each origin's routes have come ----------

function routesPage(root, api) {
  const routes = h("div"), versions = h("div");
  root.append(h("h1", {}, "Routes"), routes, h("h2", {}, "Route table version per origin"), versions);
  return {
    async refresh() {
      const r = await api("GET", "/api/v1/routes");
      replace(routes, table(["Topic filter", "Nodes"], r.routes.map((x) => [x.filter, x.nodes.join(", ")]), { id: "routes" }));
      replace(versions, table(["Origin", "Epoch", "Version"],
        Object.entries(r.versions).map(([origin, v]) => [origin, v.epoch, v.version]), { id: "route-versions" }));
    },
  };
}

// -- Config: every value with its source; cluster settings editable ---------------

function configPage(root, api) {
  const list = h("div"), message = h("p", { id: "config-message" });
  let editing = false;  // do not redraw under someone typing
  const set = async (key, input) => {
    let value = input.value;
    try { value = JSON.parse(value); } catch { /* a bare word: a string */ }
    try {
      await api("PUT", `/api/v1/config/${enc(key)}`, { value });
      message.textContent = `${key} set to ${JSON.stringify(value)}: it spreads to every member by gossip.`;
    } catch (err) { message.textContent = err.message; }
    editing = false;
    await refresh();
  };
  const source = (e) => (e.source === "cluster" ? `cluster (from ${e.origin})` : e.source + (e.source_detail ? ` (${e.source_detail})` : ""));
  const refresh = async () => {
    if (editing) return;
    const c = await api("GET", "/api/v1/config");
    const changeable = new Set(c.cluster_keys);
    replace(list, table(["Key", "Value", "Source", "Change cluster-wide"], c.config.map((e) => {
      let edit = "";
      if (changeable.has(e.key)) {
        const input = h("input", { id: `set-${e.key}`, size: 12, onfocus: () => { editing = true; }, onblur: () => { editing = false; } });
        edit = h("span", {}, input, h("button", { id: `apply-${e.key}`, onmousedown: () => { editing = true; }, onclick: () => set(e.key, input) }, "Set"));
      }
      return [e.key, typeof e.value === "object" ? JSON.stringify(e.value) : String(e.value), source(e), edit];
    }), { id: "config" }));
  };
  root.append(h("h1", {}, "Config"), message, list);
  return { refresh };
}

// -- WebSocket client: this node over MQTT-over-WebSocket ---------------------------

function websocketPage(root, api) {
  const url = h("input", { id: "ws-url", size: 40 });
  const status = h("span", { id: "ws-state" }, "disconnected");
  const subTopic = h("input", { id: "ws-sub-topic", value: "#" });
  const subQos = h("select", { id: "ws-sub-qos" }, [0, 1, 2].map((q) => h("option", { value: q }, `QoS ${q}`)));
  const pubTopic = h("input", { id: "ws-pub-topic", value: "dashboard/test" });
  const pubPayload = h("input", { id: "ws-pub-payload", value: "hello" });
  const pubQos = h("select", { id: "ws-pub-qos" }, [0, 1].map((q) => h("option", { value: q }, `QoS ${q}`)));
  const pubRetain = h("input", { id: "ws-pub-retain", type: "checkbox" });
  const log = h("div", { id: "ws-log" });
  let client = null;

  const note = (text, cls) => { log.append(h("div", { class: cls || "" }, `${new Date().toLocaleTimeString()}  ${text}`)); log.scrollTop = log.scrollHeight; };
  const connect = async () => {
    if (client) client.disconnect();
    client = new MqttWsClient(url.value, {
      onMessage: (m) => note(`← ${m.topic} [QoS ${m.qos}${m.retain ? ", retained" : ""}] ${m.payload}`, "message"),
      onClose: () => { status.textContent = "disconnected"; },
    });
    status.textContent = "connecting…";
    try {
      await client.connect();
      status.textContent = `connected as ${client.clientId}`;
    } catch (err) { status.textContent = "disconnected"; note(err.message, "error"); }
  };
  const subscribe = async () => {
    const granted = await client.subscribe(subTopic.value, Number(subQos.value));
    note(granted >= 0x80 ? `subscription to ${subTopic.value} refused` : `subscribed to ${subTopic.value} (QoS ${granted})`);
  };
  const publish = async () => {
    await client.publish(pubTopic.value, pubPayload.value, Number(pubQos.value), pubRetain.checked);
    note(`→ ${pubTopic.value} ${pubPayload.value}${Number(pubQos.value) ? " (acknowledged)" : ""}`);
  };

  root.append(h("h1", {}, "WebSocket client"),
    h("p", { class: "muted" }, "MQTT 3.1.1 over this node's WebSocket listener, from this page."),
    h("div", { class: "row" }, url, h("button", { id: "ws-connect", onclick: connect }, "Connect"),
      h("button", { onclick: () => client && client.disconnect() }, "Disconnect"), status),
    h("div", { class: "row" }, "Subscribe", subTopic, subQos, h("button", { id: "ws-subscribe", onclick: subscribe }, "Subscribe")),
    h("div", { class: "row" }, "Publish", pubTopic, pubPayload, pubQos, h("label", {}, pubRetain, "retain"),
      h("button", { id: "ws-publish", onclick: publish }, "Publish")),
    log);

  // The default address: this page's host, the node's WebSocket port and path.
  api("GET", "/api/v1/status").then((s) => {
    const ws = s.listeners.ws;
    if (!ws) { url.value = ""; note("this node has no WebSocket listener (ws = off)", "error"); return; }
    const port = ws.address.split(":").pop();
    url.value = `ws://${location.hostname}:${port}${ws.path}`;
  }).catch(() => {});
  return { stop: () => client && client.disconnect() };
}

// -- Features with a list endpoint (rules, bridges, ...): list and inspect -----------

// The rows of a list answer: its `data` (the paged lists), else its first array.
function rowsOf(answer) {
  if (Array.isArray(answer)) return answer;
  if (Array.isArray(answer.data)) return answer.data;
  return Object.values(answer).find(Array.isArray) || [];
}

// A cell of the list: objects as JSON, cut short (the whole item is one click away).
function cellText(v) {
  const text = v !== null && typeof v === "object" ? JSON.stringify(v) : String(v ?? "—");
  return text.length > 60 ? `${text.slice(0, 57)}…` : text;
}

// `path` lists the items; a click on one inspects it: `path/KEY` when the API has an
// endpoint for one item (`item`), else the row as listed. KEY: the row's `key` field.
function featurePage(title, path, { key = "id", item = true } = {}) {
  return (root, api) => {
    const list = h("div", { id: "feature-list" }), detail = h("div", { id: "feature-detail" });
    let selected = null;  // the key of the row inspected
    let rows = [];
    const inspect = async () => {
      const shown = item
        ? await api("GET", `${path}/${enc(selected)}`).catch((err) => ({ error: err.message }))
        : rows.find((r) => r[key] === selected) || { error: `${selected}: gone` };
      replace(detail, h("h2", {}, String(selected)), h("pre", {}, JSON.stringify(shown, null, 2)));
    };
    root.append(h("h1", {}, title), list, detail);
    return {
      async refresh() {
        rows = rowsOf(await api("GET", path));
        const columns = [key, ...new Set(rows.flatMap((r) => Object.keys(r)).filter((c) => c !== key))].slice(0, 8);
        replace(list, rows.length ? table(columns, rows.map((r) => columns.map((c, i) => (i === 0
          ? h("a", { href: location.hash, onclick: (e) => { e.preventDefault(); selected = r[key]; inspect(); } }, cellText(r[c]))
          : cellText(r[c])))), { id: "features" }) : h("p", { class: "muted" }, "none"));
        if (selected !== null) await inspect();
      },
    };
  };
}

export const PAGES = [
  { id: "cluster", title: "Cluster", render: clusterPage },
  { id: "node", title: "Node", render: nodePage },
  { id: "clients", title: "Clients and sessions", render: clientsPage },
  { id: "routes", title: "Routes", render: routesPage },
  { id: "config", title: "Config", render: configPage },
  { id: "websocket", title: "WebSocket client", render: websocketPage },
  { id: "rules", title: "Rules", render: featurePage("Rules", "/api/v1/rules") },
  { id: "bridges", title: "Bridges", render: featurePage("Bridges", "/api/v1/bridges") },
  { id: "delayed", title: "Delayed", render: featurePage("Delayed messages", "/api/v1/delayed") },
  { id: "streams", title: "Streams", render: featurePage("Streams", "/api/v1/streams", { key: "filter", item: false }) },
];
