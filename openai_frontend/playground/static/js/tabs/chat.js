// The Chat tab (placeholder until built).
import { el } from "../api.js";

export function init(panel) {
  panel.append(el("div", { class: "card" }, el("h2", {}, "Chat"), el("p", { class: "muted" }, "Coming soon.")));
}
