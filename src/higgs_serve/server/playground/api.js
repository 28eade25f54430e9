// The server's API as the page calls it: the key (kept in this tab only), requests that carry it,
// the server's errors (OpenAI's shape) as errors whose message is the server's, and SSE events.

const KEY_ITEM = "higgs-serve-api-key";

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_ITEM, key);
  else sessionStorage.removeItem(KEY_ITEM);
}

/** An error the server answered: `message` is the server's own, with its status and code. */
export class ServerError extends Error {
  constructor(status, error) {
    super(error && error.message ? error.message : `the server answered HTTP ${status}`);
    this.status = status;
    this.code = error ? error.code : null;
    this.param = error ? error.param : null;
  }
}

export async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON (a proxy's page): the status alone
  }
  return new ServerError(response.status, body && body.error);
}

/** fetch(path) with the key as a bearer token; throws the server's error on a non-2xx answer. */
export async function call(path, { method = "GET", json, form, signal } = {}) {
  const headers = new Headers();
  if (apiKey()) headers.set("Authorization", `Bearer ${apiKey()}`);
  let body;
  if (json !== undefined) {
    headers.set("Content-Type", "application/json");
    body = JSON.stringify(json);
  } else if (form !== undefined) {
    body = form;
  }
  const response = await fetch(path, { method, headers, body, signal });
  if (!response.ok) throw await errorOf(response);
  return response;
}

/** The events of a text/event-stream body, each its `data:` JSON, as they arrive. */
export async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = buffer.slice(0, end).split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart()).join("\n");
      buffer = buffer.slice(end + 2);
      if (data) yield JSON.parse(data);
    }
  }
}

/** ws(s):// URL of `path` on this server; browsers cannot set a WebSocket's headers, so the
 * key travels as the `api_key` query parameter the server accepts instead. */
export function websocketUrl(path) {
  const url = new URL(path, location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (apiKey()) url.searchParams.set("api_key", apiKey());
  return url.href;
}
