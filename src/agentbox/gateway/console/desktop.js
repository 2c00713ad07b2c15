// The sandbox's desktop in the browser: noVNC (Debian's, served at /console/novnc/) on
// the gateway's WebSocket relay. The token lives in a variable only (never storage, a
// cookie or a URL); a browser cannot send it as a header on a WebSocket, so it travels as
// a subprotocol the gateway reads and never echoes. View only unless "Take control" is
// ticked, which the gateway grants only to a token with desktop_control.
import RFB from "/console/novnc/core/rfb.js";

const form = document.getElementById("connect");
document.body.dataset.ready = "1"; // for tests: the handlers below are in place
const status = document.getElementById("status");
const screen = document.getElementById("screen");
let rfb = null;

function say(text) {
  status.textContent = text;
}

form.addEventListener("submit", (event) => event.preventDefault());
document.getElementById("connect-button").addEventListener("click", () => {
  const token = document.getElementById("token").value.trim();
  const sandbox = document.getElementById("sandbox").value.trim();
  const control = document.getElementById("control").checked;
  if (rfb !== null) rfb.disconnect();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/v1/sandboxes/${encodeURIComponent(sandbox)}` +
    `/desktop/vnc${control ? "?control=true" : ""}`;
  rfb = new RFB(screen, url, { wsProtocols: ["binary", `agentbox.bearer.${token}`] });
  rfb.viewOnly = !control;
  rfb.scaleViewport = false;
  say("Connecting...");
  rfb.addEventListener("connect", () => {
    say(control ? "Connected: you have control." : "Connected: view only.");
    document.body.dataset.connected = control ? "control" : "view";
  });
  rfb.addEventListener("disconnect", (e) => {
    say(e.detail.clean ? "Disconnected." : "The gateway refused or lost the connection.");
    delete document.body.dataset.connected;
  });
});
