// The dashboard's shell: the admin token, the API calls, the pages' navigation and
// their refresh. The pages themselves are in pages.js; everything they show comes
// from the node's JSON API (mesh/api.py), polled every 2 s (or as chosen in the header).
//
// The token lives in sessionStorage (gone with the tab) and travels only in the
// Authorization header, never in a URL.

import { PAGES } from "./pages.js";
import { replace } from "./dom.js";

const TOKEN_KEY = "meshd-token";
const REFRESH_KEY = "meshd-refresh-ms";  // the operator's choice of refresh period (header)

class LoginNeeded extends Error {}

export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 401) {
    showLogin(token ? "The token was refused." : "");
    throw new LoginNeeded("the API needs the admin token");
  }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `${method} ${path}: HTTP ${response.status}`);
  return data;
}

const $ = (id) => document.getElementById(id);
let current = null;  // {page, handle}: the page on screen and what its render returned
let timer = null;

function showLogin(message) {
  clearInterval(timer);
  current = null;
  $("page").hidden = true;
  $("nav").hidden = true;
  $("refresh-label").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message;
  $("token").focus();
}

async function login(event) {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  $("token").value = "";
  await start();
}

function logout() {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin("");
}

async function start() {
  let status;
  try {
    status = await api("GET", "/api/v1/status");
  } catch (err) {
    if (!(err instanceof LoginNeeded)) $("status-line").textContent = String(err);
    return;
  }
  $("login").hidden = true;
  $("page").hidden = false;
  $("nav").hidden = false;
  $("refresh-label").hidden = false;
  $("logout").hidden = !sessionStorage.getItem(TOKEN_KEY);
  $("node-name").textContent = `${status.node_id} · ${status.version}`;
  replace($("nav"), PAGES.map((p) => Object.assign(document.createElement("a"), { href: `#${p.id}`, textContent: p.title, id: `nav-${p.id}` })));
  show();
}

async function show() {
  const id = location.hash.slice(1) || PAGES[0].id;
  const page = PAGES.find((p) => p.id === id) || PAGES[0];
  if (current && current.handle.stop) current.handle.stop();
  clearInterval(timer);
  for (const a of $("nav").children) a.classList.toggle("current", a.id === `nav-${page.id}`);
  const root = $("page");
  replace(root);
  $("status-line").textContent = "";
  root.dataset.page = page.id;
  current = { page, handle: page.render(root, api) || {} };
  if (current.handle.refresh) {
    const refresh = async () => {
      try {
        await current.handle.refresh();
        $("status-line").textContent = `updated ${new Date().toLocaleTimeString()}`;
      } catch (err) {
        if (!(err instanceof LoginNeeded)) $("status-line").textContent = `update failed: ${err.message}`;
      }
    };
    await refresh();
    timer = setInterval(refresh, Number($("refresh").value));
  }
}

window.addEventListener("hashchange", () => { if (current) show(); });
$("refresh").value = localStorage.getItem(REFRESH_KEY) || "2000";
$("refresh").addEventListener("change", () => {
  localStorage.setItem(REFRESH_KEY, $("refresh").value);
  if (current) show();
});
$("login").addEventListener("submit", login);
$("logout").addEventListener("click", logout);
start();
