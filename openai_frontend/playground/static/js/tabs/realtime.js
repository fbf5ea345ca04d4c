// The Realtime tab (placeholder until built).
import { el } from "../api.js";

export function init(panel) {
  panel.append(el("div", { class: "card" }, el("h2", {}, "Realtime"), el("p", { class: "muted" }, "Coming soon.")));
}
