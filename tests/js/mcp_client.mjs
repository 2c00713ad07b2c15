// The official MCP TypeScript SDK client against agentbox, as a real client uses it.
//
//   node mcp_client.mjs http|http-oauth URL TOKEN|- [TOOL ARGS_JSON]
//   node mcp_client.mjs stdio COMMAND ARG... -- [TOOL ARGS_JSON]
//
// Connects, lists tools and, when TOOL is given, calls it. Prints one JSON line:
// {"ok": true, "protocol": ..., "tools": [...], "result": {...}} or
// (with CANCEL_ON_PROGRESS=TEXT: the call asks for progress and is cancelled once a
// progress message contains TEXT) {"ok": true, ..., "progress": [messages], "cancelled": true} or
// {"ok": false, "stage": "connect"|"list"|"call", "error": {"name", "status", "code", "message"}}
// where name is the error's class (UnauthorizedError, StreamableHTTPError, McpError, ...).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, ...rest] = process.argv.slice(2);
let transport;
let call = [];
if (mode === "http") {
  const [url, token, ...more] = rest;
  const headers = token === "-" ? {} : { Authorization: `Bearer ${token}` };
  transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  call = more;
} else if (mode === "http-oauth") {
  // A client with an OAuth provider holding a pre-issued bearer token: on a 401 the SDK
  // runs discovery (RFC 9728, then RFC 8414 at the origin) and, finding no authorization
  // server, must fail rather than loop.
  const [url, token, ...more] = rest;
  const authProvider = {
    get redirectUrl() { return "http://127.0.0.1:1/callback"; },
    get clientMetadata() { return { redirect_uris: ["http://127.0.0.1:1/callback"], client_name: "t" }; },
    clientInformation: () => undefined,
    saveClientInformation: () => {},
    tokens: () => ({ access_token: token, token_type: "Bearer" }),
    saveTokens: () => {},
    redirectToAuthorization: () => { throw new Error("redirectToAuthorization"); },
    saveCodeVerifier: () => {},
    codeVerifier: () => "v",
  };
  transport = new StreamableHTTPClientTransport(new URL(url), { authProvider });
  call = more;
} else if (mode === "stdio") {
  const end = rest.indexOf("--");
  const [command, ...args] = rest.slice(0, end);
  transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
  call = rest.slice(end + 1);
} else {
  throw new Error(`unknown mode ${mode}`);
}

function described(error) {
  return {
    name: error?.constructor?.name,
    status: error?.code,
    code: error?.code,
    data: error?.data,
    message: String(error?.message ?? error),
  };
}

const client = new Client({ name: "agentbox-ts-test", version: "1.0.0" });
let stage = "connect";
try {
  await client.connect(transport);
  stage = "list";
  const tools = (await client.listTools()).tools.map((t) => t.name);
  const out = { ok: true, protocol: transport.protocolVersion ?? null, tools };
  const cancelOn = process.env.CANCEL_ON_PROGRESS;
  if (call.length && cancelOn) {
    stage = "call";
    const abort = new AbortController();
    out.progress = [];
    const onprogress = (p) => {
      out.progress.push(p.message ?? "");
      if ((p.message ?? "").includes(cancelOn)) abort.abort("enough");
    };
    const request = { name: call[0], arguments: JSON.parse(call[1] ?? "{}") };
    await client.callTool(request, undefined, { onprogress, signal: abort.signal }).then(
      (result) => { out.result = result; },
      (error) => { out.cancelled = abort.signal.aborted; out.error = described(error); },
    );
  } else if (call.length) {
    stage = "call";
    out.result = await client.callTool({ name: call[0], arguments: JSON.parse(call[1] ?? "{}") });
  }
  console.log(JSON.stringify(out));
} catch (error) {
  console.log(JSON.stringify({ ok: false, stage, error: described(error) }));
} finally {
  await client.close().catch(() => {});
}
