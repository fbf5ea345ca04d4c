// The Video tab (placeholder until built).
import { el } from "../api.js";

export function init(panel) {
  panel.append(el("div", { class: "card" }, el("h2", {}, "Video"), el("p", { class: "muted" }, "Coming soon.")));
}
