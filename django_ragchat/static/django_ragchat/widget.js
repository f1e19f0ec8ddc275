/* The django-ragchat chat widget (an ES module; no build step, no dependencies).
 *
 * Put on a page by the {% ragchat_widget %} template tag, which renders the markup and a JSON
 * config (<script type="application/json">, never inline code). Every element with a
 * data-ragchat-widget attribute (the id of its config) is mounted when the module loads;
 * mount(root, config) does it by hand. docs/widget.md describes the widget; docs/protocol.md
 * the events it reads: ack, status, sources, delta, retry, replace, tool_call, tool_result, done, error.
 *
 * Tool calls show in the answer as they happen ("Looking up order ORD-17…"), each result folded
 * under its line; a call that needs the user's approval shows Approve and Reject, sent as a
 * tool_decision frame on the websocket or to the REST API (docs/tools.md).
 *
 * A conversation opened while its answer is still being written (in another tab, or by a page
 * left before it ended) shows that answer as saved so far and follows it until it ends,
 * reading it again every FOLLOW_MS: its calls waiting for the user's approval have their
 * Approve and Reject here too, and Stop stops it wherever it is written (the REST API's
 * cancel), so the conversation is never left waiting with no way out.
 *
 * Conversations are listed through the REST API. A new conversation is never created ahead of
 * its first message: the message goes to the websocket without a conversation id, or to the
 * server-sent events endpoint for new conversations, and the conversation exists once the
 * server has accepted it (the ack carries its id). An answer streams over the websocket when
 * the server has one (ASGI), over server-sent events otherwise.
 *
 * Everything that comes from the model, the documents or the user is untrusted: it reaches the
 * page only as text nodes (textContent, or markdown.js, which builds elements and never parses
 * HTML). Nothing here uses innerHTML.
 */
import { isSafeUrl, renderMarkdown } from "./markdown.js";

const STAGES = { retrieving: "Searching the documents…", generating: "Writing the answer…" };
const STOPPED = "Stopped before the end.";
// How often an answer being written elsewhere is read again (followSavedAnswer).
const FOLLOW_MS = 1000;
// How long Stop waits for a stream's own end (the server's "cancelled") before closing it.
const STOP_WAIT_MS = 3000;
const LOST = "The connection was lost before the answer ended.";
const EXCERPT_CHARS = 220;
// What a finished tool call says beside its label, by status (docs/protocol.md, tool_result).
const TOOL_STATES = { done: "Done", error: "Failed", rejected: "Declined", abandoned: "Not confirmed in time",
                      cancelled: "Stopped", pending: "Waiting for your approval", approved: "Approved" };
// A saved answer's statuses that offer Retry.
const FAILED = new Set(["error", "interrupted"]);
// Refusals a retry cannot fix: the message itself must change, or the site's settings (a
// profile that is no profile, or cannot be built; a setting every turn reads that is wrong).
const NOT_RETRYABLE = new Set(["empty", "invalid_type", "invalid_characters", "too_long", "too_large",
                               "parse_error", "forbidden", "not_found", "not_authenticated", "session_ended",
                               "invalid_client_id", "unknown_profile", "profile_unavailable",
                               "settings_invalid"]);

/* Whether a refusal with ``code`` may succeed if the same message is sent again (rate limits,
   busy): only then is Retry offered. */
export function retryable(code) {
  return !NOT_RETRYABLE.has(code);
}

/* The seconds to count down when the server asks for a wait worth saying (a second or two is
   not): 0 otherwise. */
function waitSeconds(error) {
  const seconds = Math.ceil(Number(error.retry_after) || 0);
  return seconds >= 3 ? seconds : 0;
}

const waitText = (seconds) => `Try again in ${seconds} s.`;
const READY = "You can try again now.";
/* Whole seconds left until ``end`` (a Date.now() time), rounded up: the one reading of a wait,
   for the bubble's count and the status line alike. */
const secondsLeft = (end) => Math.ceil((end - Date.now()) / 1000);

/* A question as the widget compares and names it: on one line, spaces collapsed. */
const oneLine = (text) => String(text || "").trim().replace(/\s+/g, " ");

/* ``text`` on one line, cut at the last word boundary within ``limit`` characters (mid-word only
   for a word longer than half of it), with "…" when cut: django_ragchat.text.shorten. */
function shorten(text, limit) {
  text = oneLine(text);
  if (text.length <= limit) return text;
  let cut = text.slice(0, limit + 1);  // a space just past the limit: the last word is whole
  const space = cut.lastIndexOf(" ");
  cut = space > Math.floor(limit / 2) ? cut.slice(0, space) : cut.slice(0, limit);
  return cut.replace(/[ ,;:.]+$/, "") + "…";
}

/* The longest conversation title the widget makes from a question. */
const TITLE_CHARS = 80;

/* The most of a refused question its bubble shows (the whole text stays in the box). */
const ECHO_CHARS = 300;

/* What the bubble of a refused question shows: null when the question is short enough to stand
   whole, else its first ``limit`` characters on one line, cut at a word boundary with "…", and
   its length in characters ({text, length}): a 20,000-character paste stood whole in the thread. */
export function refusedEcho(question, limit = ECHO_CHARS) {
  const whole = String(question || "");
  const length = [...whole].length;  // characters, as the server counts them
  return length <= limit ? null : { text: shorten(whole, limit), length };
}

/* What the bubble of a refused question that shows nothing says instead (the server refuses it,
   ``empty``: text.is_blank): null for a question with something to show. */
export function blankEcho(question) {
  const text = String(question || "");
  if (!/^[\s\p{Cc}\p{Cf}\u115f\u1160\u3164\uffa0\u2800]*$/u.test(text)) return null;
  return text.trim() ? "(nothing visible)" : "(only spaces)";
}

/* What the conversation list calls a conversation: the API's label, its title else its first
   question that no input guardrail refused (docs/api.md); the date when there is neither (no
   message yet, or only refused ones). */
function conversationLabel(conversation) {
  return conversation.label || conversation.title
    || `Conversation of ${new Date(conversation.created_at).toLocaleString()}`;
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

/* A random id (crypto.randomUUID needs a secure context; getRandomValues does not). */
function newClientId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return "w" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/* A tool's arguments or result for people: JSON indented, anything else as it is. */
function pretty(value) {
  let data = value;
  if (typeof value === "string") {
    try {
      data = JSON.parse(value);
    } catch {
      return value;
    }
  }
  return data === null || data === undefined ? "" : JSON.stringify(data, null, 2);
}

function button(className, text, label) {
  const node = el("button", className, text);
  node.type = "button";
  if (label) node.setAttribute("aria-label", label);
  return node;
}

/**
 * An excerpt of a source's snippet for people: whitespace folded, the Markdown heading lines
 * and a leading repeat of the heading dropped (the heading is shown once, beside the title), and
 * cut at a word boundary with "…" when longer than ``limit`` or cut short by the server.
 */
export function excerpt(snippet, heading, limit = EXCERPT_CHARS, serverLimit = 300) {
  let text = String(snippet || "");
  const truncated = text.length >= serverLimit;
  // A chunk's text starts with its heading path on a line of its own (ingestion/chunking.py).
  const path = String(heading || "").trim();
  if (path && text.trimStart().startsWith(path)) text = text.trimStart().slice(path.length);
  text = text.split("\n").filter((line) => !/^\s{0,3}#{1,6}\s/.test(line)).join(" ");
  text = text.replace(/\s+/g, " ").trim();
  if (text.length <= limit && !truncated) return text;
  let cut = text.slice(0, Math.min(limit, text.length));
  if (text.length > cut.length || truncated) {
    const space = cut.search(/\s\S*$/);
    if (space > limit / 2) cut = cut.slice(0, space);
    cut = cut.replace(/[\s,;:.–-]+$/, "") + "…";
  }
  return cut;
}

/** The sources to show: one entry per index, in order (a source repeated by a stream is shown once). */
export function uniqueSources(sources) {
  const seen = new Map();
  for (const source of sources || []) if (!seen.has(source.index)) seen.set(source.index, source);
  return [...seen.values()].sort((a, b) => a.index - b.index);
}

// A thumb (Material Icons "thumb_up", Apache 2.0); the "down" button turns it over in CSS.
const THUMB = "M1 21h4V9H1v12zm22-11c0-1.1-.9-2-2-2h-6.31l.95-4.57.03-.32c0-.41-.17-.79-.44-1.06L14.17 1 " +
  "7.59 7.59C7.22 7.95 7 8.45 7 9v10c0 1.1.9 2 2 2h9c.83 0 1.54-.5 1.84-1.22l3.02-7.05c.09-.23.14-.47.14-.73v-2z";

function thumbIcon() {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  const path = document.createElementNS(ns, "path");
  path.setAttribute("d", THUMB);
  svg.append(path);
  return svg;
}

class ChatWidget {
  constructor(root, config) {
    this.root = root;
    this.config = config;
    const $ = (selector) => root.querySelector(selector);
    this.ui = {
      toggle: $(".ragchat-toggle"),
      nav: $(".ragchat-nav"),
      list: $(".ragchat-conversations"),
      newButton: $(".ragchat-new"),
      log: $(".ragchat-log"),
      empty: $(".ragchat-empty"),
      form: $(".ragchat-form"),
      input: $(".ragchat-input"),
      send: $(".ragchat-send"),
      stop: $(".ragchat-stop"),
      status: $(".ragchat-status"),
      modelNotice: $(".ragchat-model-notice"),
    };
    this.conversationId = null;
    this.turn = null;      // the turn shown live in the open conversation (ours or another tab's)
    this.socket = null;    // {ws, ready} for the open conversation (or a new one), under ASGI
    this.websocket = Boolean(config.websocket && "WebSocket" in window);
    this.viewCount = 0;
    this.ratings = new Map();  // message id -> {rating, comment}
    this.waits = new Set();    // the views counting down a refusal's wait
    this.refused = new Set();  // the refused questions shown in the log
    this.statusWait = null;    // the refused question whose wait the status line says
    this.profileOf = new Map();  // conversation id -> its profile's name
    this.unnamed = new Set();    // the conversations this page started and has not named yet
    this.bind();
  }

  // --- helpers ---------------------------------------------------------------------------

  urlFor(template, id) {
    return template.replace(this.config.idPlaceholder, encodeURIComponent(id));
  }

  /* The status line is the live region: what it says is heard. ``heardOnly``: what a message's
     note already shows (a failed answer's error) is said, not shown a second time. */
  setStatus(text, isError, heardOnly = false) {
    this.statusWait = null;  // the line no longer says a refusal's wait (countDown)
    this.ui.status.textContent = heardOnly ? "" : text || "";
    if (heardOnly && text) this.ui.status.append(el("span", "ragchat-visually-hidden", text));
    this.ui.status.classList.toggle("ragchat-status-error", Boolean(isError));
  }

  async api(method, url, body) {
    const response = await fetch(url, {
      method,
      credentials: "same-origin",
      headers: { "Accept": "application/json", "Content-Type": "application/json", "X-CSRFToken": this.config.csrfToken },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      const failure = new Error(error.message || error.detail || `The server answered ${response.status}.`);
      failure.code = error.code;  // the API's stable code (docs/api.md)
      throw failure;
    }
    return response.status === 204 ? null : response.json();
  }

  async fetchAll(url) {
    const items = [];
    for (let next = url; next; ) {
      const page = await this.api("GET", next);
      items.push(...page.results);
      next = page.next;
    }
    return items;
  }

  scrollToEnd() {
    this.ui.log.scrollTop = this.ui.log.scrollHeight;
  }

  // --- messages on the page --------------------------------------------------------------

  /* One message: {node, body, progress, note, actions, sources, feedback, text, ...}. */
  addMessageView(role) {
    this.ui.empty.hidden = true;
    const node = el("article", `ragchat-message ragchat-${role}`);
    node.setAttribute("aria-label", role === "user" ? "You" : "Assistant");
    const view = {
      key: `${this.root.id}-${++this.viewCount}`, node, role, text: "", sources: [], sourceIds: new Map(),
      progress: el("p", "ragchat-progress"),
      tools: el("ul", "ragchat-tools"),
      toolItems: new Map(),  // call id -> its <li>
      body: el("div", "ragchat-body"),
      note: el("p", "ragchat-note"),
      actions: el("div", "ragchat-actions"),
      sourcesLabel: el("p", "ragchat-sources-label", "Sources"),
      sourceList: el("ol", "ragchat-sources"),
      feedback: el("div", "ragchat-feedback"),
      renderTimer: null,
    };
    view.sourcesLabel.id = `${view.key}-sources`;
    view.sourceList.setAttribute("aria-labelledby", view.sourcesLabel.id);
    for (const part of [view.progress, view.tools, view.note, view.actions, view.sourcesLabel, view.sourceList, view.feedback]) {
      part.hidden = true;
    }
    view.tools.setAttribute("aria-label", "What the assistant looked up");
    node.append(view.progress, view.tools, view.body, view.note, view.actions, view.sourcesLabel, view.sourceList,
                view.feedback);
    this.ui.log.append(node);
    return view;
  }

  setNote(view, text, isError) {
    view.note.textContent = text || "";
    view.note.hidden = !text;
    view.note.classList.toggle("ragchat-note-error", Boolean(isError));
  }

  setProgress(view, text) {
    view.progress.replaceChildren();
    view.progress.hidden = !text;
    if (text) view.progress.append(el("span", "ragchat-spinner"), el("span", null, text));
  }

  /* The citation [n] (or [1, 2]) as links to the sources it names. */
  citation(view, numbers, raw) {
    const parts = numbers.split(/(\s*[,\u2013-]\s*)/);
    if (!parts.some((part) => view.sourceIds.has(Number(part)))) return document.createTextNode(raw);
    const group = el("span", "ragchat-citation");
    group.append("[");
    for (const part of parts) {
      const targetId = /^\d+$/.test(part) && view.sourceIds.get(Number(part));
      if (targetId) {
        const link = el("a", "ragchat-cite", part);
        link.href = "#" + targetId;
        link.dataset.source = part;
        const source = view.sources.find((s) => s.index === Number(part));
        link.setAttribute("aria-label", `Source ${part}${source ? ": " + (source.title || source.source) : ""}`);
        group.append(link);
      } else {
        group.append(part);
      }
    }
    group.append("]");
    return group;
  }

  renderBody(view) {
    if (view.renderTimer !== null) {
      clearTimeout(view.renderTimer);
      view.renderTimer = null;
    }
    if (view.role === "user") {
      const refused = view.node.classList.contains("ragchat-refused");
      const echo = refused ? refusedEcho(view.text) : null;
      const blank = refused ? blankEcho(view.text) : null;
      view.body.textContent = echo ? echo.text : blank ? "" : view.text;  // else what the user typed, exactly
      if (echo) view.body.append(el("span", "ragchat-echo-length", ` (${echo.length.toLocaleString("en")} characters)`));
      if (blank) view.body.append(el("span", "ragchat-echo-length", blank));
    } else {
      view.body.replaceChildren(renderMarkdown(view.text, { cite: (numbers, raw) => this.citation(view, numbers, raw) }));
    }
  }

  /* Re-render at most every 40 ms while tokens arrive (a fast model sends hundreds a second). */
  scheduleRender(view) {
    if (view.renderTimer === null) view.renderTimer = setTimeout(() => {
      view.renderTimer = null;
      this.renderBody(view);
      this.scrollToEnd();
    }, 40);
  }

  renderSources(view, sources, citedIndexes) {
    view.sources = uniqueSources(sources);
    view.sourceIds = new Map();
    view.sourceList.replaceChildren();
    view.sourceList.hidden = view.sourcesLabel.hidden = view.sources.length === 0;
    view.sourcesLabel.textContent = "Sources";
    for (const source of view.sources) {
      const id = `${view.key}-source-${source.index}`;
      view.sourceIds.set(source.index, id);
      const item = el("li", "ragchat-source");
      item.id = id;
      item.value = source.index;
      item.tabIndex = -1;  // a citation moves the focus here
      const title = source.title || source.source || "Untitled";
      const url = source.url || source.source;
      let titleNode;
      if (url && isSafeUrl(url)) {
        titleNode = el("a", "ragchat-source-title", title);
        titleNode.href = url;
        titleNode.target = "_blank";
        titleNode.rel = "noopener noreferrer nofollow";
      } else {
        titleNode = el("span", "ragchat-source-title", title);
        if (source.source && source.source !== title) titleNode.title = source.source;
      }
      item.append(titleNode);
      let heading = String(source.heading || "");
      if (heading.toLowerCase().startsWith(title.toLowerCase())) heading = heading.slice(title.length).replace(/^\s*[>›»/:–-]\s*/, "");
      if (heading) item.append(el("span", "ragchat-source-heading", heading));
      const text = excerpt(source.snippet, source.heading);
      if (text) item.append(el("p", "ragchat-source-snippet", text));
      view.sourceList.append(item);
    }
    this.markCited(view, citedIndexes);
  }

  /* The passages the answer cites: class ragchat-source-cited and a "cited" badge on the title's
     line (the list stays in number order, so the mark is what sets them apart). */
  markCited(view, citedIndexes) {
    for (const item of view.sourceList.children) {
      const cited = citedIndexes.has(Number(item.value));
      item.classList.toggle("ragchat-source-cited", cited);
      const badge = item.querySelector(".ragchat-source-badge");
      if (cited && !badge) item.insertBefore(el("span", "ragchat-source-badge", "cited"), item.querySelector("p"));
      else if (!cited && badge) badge.remove();
    }
    this.showCitedOnly(view, citedIndexes);
  }

  /* CITED_SOURCES_ONLY (docs/widget.md): only the passages the answer cites are shown, so
     none while it is being written; the others stay in the page's data for its [n] links. */
  showCitedOnly(view, citedIndexes) {
    if (!this.config.citedSourcesOnly) return;
    let shown = 0;
    for (const item of view.sourceList.children) {
      item.hidden = !citedIndexes.has(Number(item.value));
      if (!item.hidden) shown += 1;
    }
    view.sourceList.hidden = view.sourcesLabel.hidden = shown === 0;
  }

  /* The saved answer's sources label, after markCited: "Searched, none cited" when the answer
     cited none (a decline is not read as sourced). The list stays in number order. */
  labelSources(view, citedIndexes) {
    const some = view.sourceList.children.length > 0;
    view.sourcesLabel.textContent = citedIndexes.size || !some ? "Sources" : "Searched, none cited";
  }

  /* A saved message (history, or the end of a turn) shown as the server has it; ``turn``: the
     turn that follows it while it is being written (its calls awaiting approval are offered). */
  applySavedMessage(view, message, turn = null) {
    view.text = message.content;
    view.messageId = message.id;
    for (const call of message.tool_calls || []) this.showSavedToolCall(view, call, turn);
    const cited = new Set((message.citations || []).map((c) => c.index));
    if (message.sources && message.sources.length) this.renderSources(view, message.sources, cited);
    else this.markCited(view, cited);
    this.labelSources(view, cited);
    this.renderBody(view);
    if (message.status === "incomplete") this.setNote(view, STOPPED);
    else if (FAILED.has(message.status)) {
      this.setNote(view, (message.error && message.error.message) || "The answer was not finished.", true);
    }
    else if (message.status === "streaming") this.setNote(view, "Being written…");
    else this.setNote(view, "");
    if (message.role === "assistant" && (message.status === "complete" || message.status === "incomplete")) {
      this.showFeedback(view);
    }
  }

  showSavedMessage(message) {
    const view = this.addMessageView(message.role);
    this.applySavedMessage(view, message);
    return view;
  }

  // --- tool calls ------------------------------------------------------------------------

  /* The line of a tool call in the answer (made on its first event): its label, its state, and
     its result folded under it. */
  toolItem(view, call) {
    let item = view.toolItems.get(call.id);
    if (item) return item;
    item = el("li", "ragchat-tool");
    item.dataset.id = call.id;
    const details = el("details", "ragchat-tool-details");
    const summary = el("summary", "ragchat-tool-summary");
    summary.append(el("span", "ragchat-spinner"), el("span", "ragchat-tool-label"), el("span", "ragchat-tool-state"));
    details.append(summary, el("pre", "ragchat-tool-result"));
    item.append(details);
    view.toolItems.set(call.id, item);
    view.tools.append(item);
    view.tools.hidden = false;
    return item;
  }

  setToolLine(item, call, state) {
    // A tool_result has no label of its own: the line keeps the one its tool_call gave it.
    if (call.label) item.dataset.label = call.label;
    const label = String(item.dataset.label || call.name || "Tool");
    item.querySelector(".ragchat-tool-label").textContent = state === "running" ? label : label.replace(/…$/, "");
    item.querySelector(".ragchat-tool-state").textContent = state === "running" ? "" : (TOOL_STATES[state] || state);
    item.querySelector(".ragchat-spinner").hidden = state !== "running";
    item.className = `ragchat-tool ragchat-tool-${state}`;
  }

  /* A tool_call event: the call is running, or it waits for the user's approval. The message's
     sources are listed below its calls, so Approve and Reject are scrolled into view rather
     than the end of the log (a trial's six sources hid them). */
  showToolCall(view, call, turn) {
    const item = this.toolItem(view, call);
    item.querySelector(".ragchat-tool-confirm")?.remove();
    this.setProgress(view, "");
    this.scrollToEnd();
    if (call.status === "awaiting_confirmation") {
      this.setToolLine(item, call, "pending");
      item.querySelector(".ragchat-tool-details").open = true;
      item.querySelector(".ragchat-tool-result").textContent = pretty(call.arguments);
      const box = this.confirmBox(call, turn);
      item.append(box);
      this.setStatus(TOOL_STATES.pending + "…");
      item.scrollIntoView({ block: "nearest" });  // what it would do, then (if long) the buttons
      box.scrollIntoView({ block: "nearest" });
    } else {
      this.setToolLine(item, call, "running");
      this.setStatus(item.dataset.label || "");
    }
  }

  confirmBox(call, turn) {
    const box = el("div", "ragchat-tool-confirm");
    box.setAttribute("role", "group");
    box.setAttribute("aria-label", "Allow this action?");
    const approve = button("ragchat-approve", "Approve");
    const reject = button("ragchat-reject", "Reject");
    const status = el("span", "ragchat-tool-decision");
    status.setAttribute("role", "status");
    box.append(el("span", "ragchat-tool-question", "Allow this?"), approve, reject, status);
    const decide = async (approved) => {
      approve.disabled = reject.disabled = true;
      status.textContent = approved ? "Approving…" : "Rejecting…";
      try {
        await this.decide(call.confirmation_id, approved, turn);
      } catch (error) {
        status.textContent = error.message;
        approve.disabled = reject.disabled = false;
      }
    };
    approve.addEventListener("click", () => decide(true));
    reject.addEventListener("click", () => decide(false));
    return box;
  }

  /* The user's decision: over the websocket when this turn uses it, else the REST API. */
  async decide(confirmationId, approve, turn) {
    const ws = turn && turn.socket ? turn.socket.ws : (this.socket && this.socket.opened ? this.socket.ws : null);
    if (ws && ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify({ type: "tool_decision", confirmation_id: confirmationId, approve }));
      return;
    }
    await this.api("POST", this.urlFor(this.config.api.toolDecision, confirmationId), { approve });
  }

  /* A tool_result event, or a saved message's tool call: the line says how it ended and its
     result is folded under it. */
  showToolResult(view, call) {
    const item = this.toolItem(view, call);
    item.querySelector(".ragchat-tool-confirm")?.remove();
    this.setToolLine(item, call, call.status || "done");
    const details = item.querySelector(".ragchat-tool-details");
    details.open = false;
    const shown = call.error && call.status !== "done" ? call.error.message : call.content;
    item.querySelector(".ragchat-tool-result").textContent = pretty(shown);
  }

  /* A saved message's tool call. While its answer is followed (``turn``), one that waits for
     the user's approval gets Approve and Reject (once: a later reading keeps the buttons and
     what they say) and an approved one runs; otherwise it shows how it ended. */
  showSavedToolCall(view, call, turn) {
    const live = turn && !turn.ended;
    if (live && call.status === "pending" && call.confirmation_id) {
      const item = view.toolItems.get(call.id);
      if (!item || !item.querySelector(".ragchat-tool-confirm")) {
        this.showToolCall(view, { ...call, status: "awaiting_confirmation" }, turn);
      }
    } else if (live && call.status === "approved") {
      if (!view.toolItems.get(call.id)?.classList.contains("ragchat-tool-running")) {
        this.showToolCall(view, { ...call, status: "approved" }, turn);
      }
    } else {
      this.showToolResult(view, { ...call, type: "tool_result" });
    }
  }

  // --- feedback --------------------------------------------------------------------------

  showFeedback(view) {
    const box = view.feedback;
    box.replaceChildren();
    box.hidden = false;
    box.setAttribute("role", "group");
    box.setAttribute("aria-label", "Rate this answer");
    const saved = this.ratings.get(view.messageId) || null;
    const up = button("ragchat-rate ragchat-rate-up", null, "Good answer");
    const down = button("ragchat-rate ragchat-rate-down", null, "Bad answer");
    up.append(thumbIcon());
    down.append(thumbIcon());
    up.title = "Good answer";
    down.title = "Bad answer";
    up.dataset.rating = "up";
    down.dataset.rating = "down";
    const form = el("form", "ragchat-comment");
    const commentId = `${view.key}-comment`;
    const label = el("label", "ragchat-visually-hidden", "Comment on this answer (optional)");
    label.htmlFor = commentId;
    const comment = el("textarea", "ragchat-comment-input");
    comment.id = commentId;
    comment.rows = 2;
    comment.maxLength = 2000;
    comment.placeholder = "What was good or wrong? (optional)";
    const save = el("button", "ragchat-comment-save", "Send feedback");
    save.type = "submit";
    form.append(label, comment, save);
    const status = el("span", "ragchat-feedback-status");
    status.setAttribute("role", "status");
    box.append(up, down, form, status);

    const show = (rating, note) => {
      up.setAttribute("aria-pressed", String(rating === "up"));
      down.setAttribute("aria-pressed", String(rating === "down"));
      form.hidden = !rating;
      status.textContent = note || "";
    };
    show(saved && saved.rating, "");
    if (saved) comment.value = saved.comment || "";

    const url = this.urlFor(this.config.api.feedback, view.messageId);
    const rate = async (rating) => {
      const current = this.ratings.get(view.messageId);
      try {
        if (current && current.rating === rating) {  // pressed again: withdraw it
          await this.api("DELETE", url);
          this.ratings.delete(view.messageId);
          comment.value = "";
          show(null, "Rating withdrawn.");
        } else {
          const feedback = await this.api("POST", url, { rating, comment: comment.value });
          this.ratings.set(view.messageId, feedback);
          show(feedback.rating, "Thanks for the feedback.");
        }
      } catch (error) {
        status.textContent = error.message;
      }
    };
    up.addEventListener("click", () => rate("up"));
    down.addEventListener("click", () => rate("down"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const current = this.ratings.get(view.messageId);
      if (!current) return;
      try {
        const feedback = await this.api("POST", url, { rating: current.rating, comment: comment.value });
        this.ratings.set(view.messageId, feedback);
        show(feedback.rating, "Comment saved. Thank you.");
      } catch (error) {
        status.textContent = error.message;
      }
    });
  }

  // --- conversations ---------------------------------------------------------------------

  /* The newest conversations, a page at a time ("Older conversations" fetches the next). */
  async loadConversations(url = this.config.api.conversations) {
    const page = await this.api("GET", url);
    if (url === this.config.api.conversations) {
      this.ui.list.replaceChildren();
      this.profileOf.clear();  // the profiles of the conversations listed (markProfiles)
    }
    for (const conversation of page.results) {
      if (!this.ui.list.querySelector(`[data-id="${CSS.escape(String(conversation.id))}"]`)) {
        this.addConversationItem(conversation, false);
      }
    }
    this.markProfiles();
    this.root.querySelector(".ragchat-more")?.remove();
    if (page.next) {
      const more = button("ragchat-more", "Older conversations");
      more.addEventListener("click", () => {
        more.disabled = true;
        this.loadConversations(page.next).catch((error) => {
          more.disabled = false;
          this.setStatus(error.message, true);
        });
      });
      this.ui.list.after(more);
    }
    this.markOpenConversation();
    return page.results;
  }

  addConversationItem(conversation, first) {
    const item = el("li");
    const label = conversationLabel(conversation);
    const entry = button("ragchat-conversation", "");
    entry.append(el("span", "ragchat-conversation-title", label));  // cut at two lines (widget.css)
    entry.title = label;  // whole on hover, where the list's width cuts it
    const profile = conversation.profile || this.config.defaultProfile;
    this.profileOf.set(conversation.id, profile);
    // Its profile, by title, shown when the list holds several (markProfiles).
    if (profile) entry.append(el("span", "ragchat-conversation-profile", this.profileTitle(profile)));
    entry.dataset.id = conversation.id;
    entry.addEventListener("click", () => {
      if (conversation.id !== this.conversationId) this.openConversation(conversation.id);
      this.setNavOpen(false);
    });
    item.append(entry);
    if (first) this.ui.list.prepend(item); else this.ui.list.append(item);
    return entry;
  }

  /* What a person sees for a profile: its title, or its name when the page does not list it
     (a conversation whose profile the settings no longer have). */
  profileTitle(profile) {
    return (this.config.profiles || {})[profile]?.title || profile;
  }

  /* Each conversation says its profile only when the conversations listed are of more than one:
     the same profile's name under every conversation (a site with one profile, or a user who
     uses one of several) tells them nothing apart. */
  markProfiles() {
    this.root.classList.toggle("ragchat-profiles-shown", new Set(this.profileOf.values()).size > 1);
  }

  /* The model notice (the chat page's "until a language model is configured") is about the
     profile of the conversation shown, or of the one a message would start. */
  showModelNotice(profile) {
    if (!this.ui.modelNotice) return;
    const known = (this.config.profiles || {})[profile];
    this.ui.modelNotice.hidden = !(known && known.extractive);
  }

  markOpenConversation() {
    for (const entry of this.ui.list.querySelectorAll(".ragchat-conversation")) {
      const open = entry.dataset.id === this.conversationId;
      entry.classList.toggle("ragchat-open", open);
      if (open) entry.setAttribute("aria-current", "true"); else entry.removeAttribute("aria-current");
    }
  }

  setNavOpen(open) {
    this.root.classList.toggle("ragchat-nav-open", open);
    this.ui.toggle.setAttribute("aria-expanded", String(open));
  }

  async openConversation(id) {
    this.stopFollowing();
    if (this.turn && !this.turn.ended) return;  // finish or stop the answer first
    this.conversationId = id;
    this.turn = null;
    this.markOpenConversation();
    this.showModelNotice(id === null ? this.config.defaultProfile : this.profileOf.get(id));
    for (const view of this.waits) this.stopCountDown(view);  // their bubbles go with the log
    this.refused.clear();
    this.ui.log.replaceChildren(this.ui.empty);
    this.ui.empty.hidden = false;
    this.setStatus("");
    this.connectSocket(id);
    if (id === null) return;
    try {
      const [messages, ratings] = await Promise.all([
        this.fetchAll(this.urlFor(this.config.api.messages, id)),
        this.fetchAll(`${this.config.api.feedbackList}?conversation=${encodeURIComponent(id)}`).catch(() => []),
      ]);
      if (this.conversationId !== id) return;
      for (const feedback of ratings) this.ratings.set(feedback.message_id, feedback);
      let previous = null;
      let last = null;
      const shown = [];
      for (const message of messages) {
        previous = last;
        last = this.showSavedMessage(message);
        last.message = message;
        shown.push(last);
      }
      this.foldRetried(shown);
      // An answer that failed last time can be asked for again from here.
      if (last && previous && previous.role === "user" && FAILED.has(last.message.status)) {
        this.offerRetry(last, { question: previous.message.content, user: previous }, last.message.error || {});
      }
      if (last && last.role === "assistant" && last.message.status === "streaming" && !this.turn) {
        this.followSavedAnswer(previous, last);
      }
      this.scrollToEnd();
    } catch (error) {
      this.setStatus(error.message, true);
    }
  }

  /* The server accepted the first message of a new conversation: it exists now. Listed at once
     under its question; named once its answer is saved (nameConversation). */
  adoptConversation(id, question) {
    if (this.conversationId === id) return;
    this.conversationId = id;
    const title = shorten(question, TITLE_CHARS);  // at a word boundary, as the API's label
    this.addConversationItem({ id, title, created_at: new Date().toISOString(), profile: this.config.defaultProfile }, true);
    this.unnamed.add(id);
    this.markProfiles();
    this.markOpenConversation();
    this.setBusy(true);  // the new entry too
  }

  /* A conversation this page started, its answer saved: named after its first question the
     server lets name it (the API's label, which is never a question an input guardrail refused:
     a password pasted by mistake must not stand in the list, the admin and the API), with a
     PATCH of its title, best effort. While every question it was asked was refused, it stays
     unnamed and its entry reads as one with no question yet; the next accepted one names it. */
  async nameConversation(id) {
    const url = this.urlFor(this.config.api.conversation, id);
    try {
      let conversation = await this.api("GET", url);
      if (!conversation.title && conversation.label) {
        conversation = await this.api("PATCH", url, { title: conversation.label });
      }
      if (conversation.title) this.unnamed.delete(id);
      this.relabelConversation(conversation);
    } catch {
      // Unnamed, it is listed by the API's label (docs/api.md) when the list is read again.
    }
  }

  /* The list's entry of ``conversation`` says its label now. */
  relabelConversation(conversation) {
    const entry = this.ui.list.querySelector(`.ragchat-conversation[data-id="${CSS.escape(String(conversation.id))}"]`);
    if (!entry) return;
    const label = conversationLabel(conversation);
    entry.querySelector(".ragchat-conversation-title").textContent = label;
    entry.title = label;
  }

  /* An answer still being written when its conversation is opened: another tab's, or one
     whose page was left before it ended. It is the open turn (Send waits, Stop shows): read
     again every FOLLOW_MS until it ends, its calls awaiting approval offered with Approve and
     Reject, Stop asking the server to stop it wherever it is written. */
  followSavedAnswer(user, answer) {
    const turn = { own: false, followed: true, question: user ? user.text : "", user, answer, nextIndex: null,
                   ended: false, accepted: true, abort: null, clientId: null,
                   assistantMessageId: answer.messageId, seq: answer.message.seq };
    turn.abort = () => this.cancelAnswer(turn).catch((error) => this.setStatus(error.message, true));
    this.turn = turn;
    answer.node.setAttribute("aria-busy", "true");
    this.applySavedMessage(answer, answer.message, turn);
    this.setBusy(true, false);  // not ours: the other conversations stay open to the user
    this.followLater(turn);
    return turn;
  }

  /* Another conversation opened while one was followed: the following stops (the answer goes on
     where it is written). */
  stopFollowing() {
    const turn = this.turn;
    if (!turn || !turn.followed || turn.ended) return;
    turn.ended = true;
    clearTimeout(turn.timer);
    this.turn = null;
    this.setBusy(false);
  }

  followLater(turn) {
    clearTimeout(turn.timer);  // one reading at a time, whoever asked for it
    turn.timer = setTimeout(() => this.follow(turn), FOLLOW_MS);
  }

  /* One reading of a followed answer: shown as saved, and the turn ended once it has. */
  async follow(turn) {
    if (turn.ended || this.turn !== turn) return;
    const id = this.conversationId;
    try {
      const page = await this.api("GET", `${this.urlFor(this.config.api.messages, id)}?after=${turn.seq - 1}&limit=1`);
      const message = page.results[0];
      if (turn.ended || this.turn !== turn || this.conversationId !== id) return;
      if (!message) return this.finishTurn(turn, null, { code: "not_found", message: "This answer is gone." });
      if (message.status !== "streaming") {
        return this.finishTurn(turn, message, FAILED.has(message.status) ? { code: message.status, ...message.error } : null);
      }
      this.applySavedMessage(turn.answer, message, turn);
    } catch (error) {
      if (error.code === "not_found") return this.finishTurn(turn, null, error);  // deleted meanwhile
      // Otherwise a network hiccup: the next reading tries again.
    }
    this.followLater(turn);
  }

  /* Stop an answer wherever it is written (another tab's stream, a page left): the REST API's
     cancel. The answer then ends as saved, "incomplete"; one that ended meanwhile is left as it is. */
  async cancelAnswer(turn) {
    try {
      await this.api("POST", this.urlFor(this.config.api.cancel, this.conversationId));
    } catch (error) {
      if (error.code !== "not_in_progress") throw error;  // it ended meanwhile: its end is on its way
    }
    if (turn.followed && !turn.ended) {
      clearTimeout(turn.timer);
      this.follow(turn);  // read now: the answer saved as stopped
    }
  }

  // --- a live turn -----------------------------------------------------------------------

  startTurnView(own, question) {
    const user = this.addMessageView("user");
    user.text = question || "";
    this.renderBody(user);
    const answer = this.addMessageView("assistant");
    answer.node.setAttribute("aria-busy", "true");  // read out once it is complete
    this.setProgress(answer, "Sending…");
    // The client id labels the message: the websocket's frames about it carry it back, and
    // the server treats a resend with the same id (after a lost connection) as the same message.
    const turn = { own, question, user, answer, nextIndex: 0, ended: false, abort: null, accepted: false,
                   clientId: own ? newClientId() : null };
    this.turn = turn;
    this.setBusy(true);
    this.scrollToEnd();
    return turn;
  }

  /* An answer is being written in the open conversation: Send waits, Stop shows and, with
     ``lockNavigation``, the user stays in it (ours; one followed from elsewhere does not hold them). */
  setBusy(busy, lockNavigation = true) {
    this.ui.send.disabled = busy;
    this.ui.stop.hidden = !busy;
    const locked = busy && lockNavigation;
    this.ui.newButton.disabled = locked;
    for (const entry of this.ui.list.querySelectorAll(".ragchat-conversation")) entry.disabled = locked;
  }

  /* Apply one protocol event to the turn on the page. */
  onEvent(turn, event) {
    if (turn.ended) return;
    const answer = turn.answer;
    switch (event.type) {
      case "ack":
        turn.accepted = true;
        turn.assistantMessageId = event.assistant_message_id;
        if (turn.own && event.conversation_id) this.adoptConversation(event.conversation_id, turn.question);
        if (turn.own) this.dropRefused(turn);
        this.setProgress(answer, turn.stopRequested ? "Stopping…" : "Thinking…");
        if (turn.stopRequested) turn.abort();
        break;
      case "status":
        this.setProgress(answer, STAGES[event.stage] || "Working…");
        this.setStatus(STAGES[event.stage] || "");
        break;
      case "sources":
        this.renderSources(answer, event.sources || [], new Set());
        this.renderBody(answer);
        break;
      case "delta":
        if (turn.nextIndex !== null && event.index !== turn.nextIndex) {
          this.setNote(answer, "Part of the answer was lost on the way; it is complete once saved.");
        }
        turn.nextIndex = event.index + 1;
        answer.text += event.text;
        if (!answer.progress.hidden && answer.text) this.setProgress(answer, "");
        this.scheduleRender(answer);
        break;
      case "retry":
        // An output guardrail had the model answer again: the text so far is discarded and the
        // new answer's deltas count from 0 again.
        answer.text = "";
        turn.nextIndex = 0;
        this.setProgress(answer, "Revising the answer…");
        this.renderBody(answer);
        break;
      case "tool_call":
        this.showToolCall(answer, event, turn);
        break;
      case "tool_result":
        this.showToolResult(answer, event);
        break;
      case "replace":
        // The final text differs from what the deltas spelled (changed after the model).
        answer.text = event.text || "";
        turn.nextIndex = null;
        if (!answer.progress.hidden && answer.text) this.setProgress(answer, "");
        this.renderBody(answer);
        break;
      case "done":
        this.finishTurn(turn, event.message, null);
        break;
      case "error":
        this.finishTurn(turn, event.assistant_message || null, event);
        break;
      default:
        break;  // newer protocol versions may add events: ignore what we don't know
    }
  }

  finishTurn(turn, message, error) {
    turn.ended = true;
    clearTimeout(turn.timer);
    const { answer, user } = turn;
    answer.node.removeAttribute("aria-busy");
    this.setProgress(answer, "");
    if (this.turn === turn) this.turn = null;
    this.setBusy(false);
    if (message) {
      // The saved message is the truth (whatever a stream lost on the way).
      this.applySavedMessage(answer, message);
      // Its question has been through the input guardrails: whether it may name the
      // conversation is known now.
      const id = message.conversation_id;
      if (turn.own && message.status !== "streaming" && this.unnamed.has(id)) this.nameConversation(id);
    } else {
      this.renderBody(answer);
      // Nothing saved to say how they ended: the calls still running were stopped with the answer.
      for (const item of answer.tools.querySelectorAll(".ragchat-tool-running, .ragchat-tool-pending")) {
        item.querySelector(".ragchat-tool-confirm")?.remove();
        this.setToolLine(item, {}, "cancelled");
      }
    }
    const cancelled = error && error.code === "cancelled";
    if (error && !cancelled) {
      const text = error.message || "The answer failed.";
      if (!turn.accepted && !message) {
        // Refused: nothing was saved. Say so on the question (a long one shortened: the whole
        // text is in the box), and offer it again when sending it again may work.
        answer.node.remove();
        user.node.classList.add("ragchat-refused");
        this.renderBody(user);
        this.refused.add(user);
        this.setNote(user, `Not sent: ${text}`, true);
        if (turn.own && !this.ui.input.value) this.ui.input.value = turn.question;
        if (turn.own && retryable(error.code)) this.offerRetry(user, turn, error);
        // Shown once, on the question, a wait counted down there beside Retry; the status line
        // says it to screen readers only (it was shown twice, there and on the question).
        this.setStatus(text, true, true);
        const seconds = waitSeconds(error);
        if (seconds) this.countDown(user, seconds);
      } else {
        this.setNote(answer, text, true);
        if (turn.own || (turn.followed && retryable(error.code))) this.offerRetry(answer, turn, error);
        this.setStatus(text, true, true);
      }
    } else {
      if (cancelled) this.setNote(answer, STOPPED);
      this.setStatus("");
    }
    this.scrollToEnd();
  }

  /* "Try again in N s." on a refused question, counting down to "You can try again now.", which
     emphasises Retry (nothing is sent by itself: the user decides). The count is aria-live="off"
     inside the log's live region; the status line says the wait once, for screen readers, and
     its end once, so a screen reader hears neither every second. One deadline: the count and
     the status line read the same seconds left from it, and the status line's number goes at
     the first tick (a removal is not announced), so it never says a wait the count has left
     behind ("Try again in 62 s." there, "60 s." on the message). */
  countDown(view, seconds) {
    const end = Date.now() + seconds * 1000;
    const counter = el("span", "ragchat-wait", waitText(secondsLeft(end)));
    counter.setAttribute("aria-live", "off");
    view.note.append(" ", counter);
    // Heard on the status line, not seen there (the count is on the message).
    const heard = el("span", "ragchat-visually-hidden", counter.textContent);
    this.ui.status.append(" ", heard);
    this.statusWait = view;
    // Counted from the clock, not the ticks: a background tab's timers run late.
    view.waitTimer = setInterval(() => {
      if (!view.node.isConnected) return this.stopCountDown(view);  // the bubble is gone
      if (heard.isConnected) {  // said: not to be read later, stale
        heard.previousSibling?.remove();  // its space
        heard.remove();
      }
      const left = secondsLeft(end);
      if (left > 0) {
        counter.textContent = waitText(left);
        return;
      }
      this.stopCountDown(view);
      counter.textContent = READY;
      view.node.classList.add("ragchat-wait-over");
      view.actions.querySelector(".ragchat-retry")?.classList.add("ragchat-retry-ready");
      // Announced once (the count shows it), unless the status line has moved on meanwhile.
      if (this.statusWait === view) this.setStatus(READY, false, true);
    }, 1000);
    this.waits.add(view);
  }

  stopCountDown(view) {
    clearInterval(view.waitTimer);
    this.waits.delete(view);
  }

  /* A question sent and accepted while an earlier, refused copy of it is still shown: the
     refused one goes (it was never saved), so the question stands once and no Retry is left
     to send it a second time, as when Retry itself sends it. */
  dropRefused(turn) {
    const question = oneLine(turn.question);
    for (const view of this.refused) {
      if (view === turn.user || oneLine(view.text) !== question) continue;
      this.stopCountDown(view);
      view.node.remove();
      this.refused.delete(view);
    }
  }

  /* A failed answer asked for again: the question and its failed answer leave the page (the
     conversation keeps both, as the admin shows), so the question stands once, where it is
     asked again, as the model reads it (memory leaves a failed turn out). */
  foldAttempt(user, answer) {
    for (const view of [user, answer]) {
      view.node.hidden = true;
      view.node.classList.add("ragchat-retried");
    }
  }

  /* Saved messages: the same folding for every failed answer whose question was asked again
     right after it. */
  foldRetried(views) {
    for (let i = 0; i + 2 < views.length; i++) {
      const [user, answer, again] = views.slice(i, i + 3);
      if (user.role === "user" && answer.role === "assistant" && again.role === "user"
          && FAILED.has(answer.message.status) && oneLine(again.text) === oneLine(user.text)) {
        this.foldAttempt(user, answer);
      }
    }
  }

  offerRetry(view, turn, error) {
    const retry = button("ragchat-retry", "Retry");
    // A short wait is in the tooltip; a longer one is counted on the message (countDown).
    if (error.retry_after && !waitSeconds(error)) retry.title = `The server asks to wait ${Math.ceil(error.retry_after)} s.`;
    retry.addEventListener("click", () => {
      if (this.turn && !this.turn.ended) return;
      this.stopCountDown(view);
      view.actions.hidden = true;
      // A refused question was never saved: sent again, it stands once, where it is sent.
      if (view.node.classList.contains("ragchat-refused")) {
        view.node.remove();
        this.refused.delete(view);
      }
      if (this.ui.input.value === turn.question) this.ui.input.value = "";
      if (turn.user && !view.node.classList.contains("ragchat-refused")) this.foldAttempt(turn.user, view);
      this.send(turn.question);
    });
    view.actions.replaceChildren(retry);
    view.actions.hidden = false;
  }

  // --- transports ------------------------------------------------------------------------

  /* Server-sent events over fetch (works under WSGI and ASGI; EventSource cannot POST). */
  async streamOverHTTP(turn, conversationId, content) {
    const controller = new AbortController();
    turn.abort = () => {
      // Accepted, the answer is stopped by the server (at once, wherever this stream is served)
      // and the stream ends with its "cancelled" and the answer as saved; else, or when that
      // does not come, the stream is closed, which the server sees as the client gone.
      if (!turn.accepted || this.conversationId === null) return controller.abort();
      this.cancelAnswer(turn).catch(() => controller.abort());
      setTimeout(() => { if (!turn.ended) controller.abort(); }, STOP_WAIT_MS);
    };
    const url = conversationId === null ? this.config.streamNew : this.urlFor(this.config.stream, conversationId);
    try {
      const response = await fetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "Accept": "text/event-stream", "X-CSRFToken": this.config.csrfToken },
        body: JSON.stringify(conversationId === null && this.config.profile
          ? { content, client_id: turn.clientId, profile: this.config.profile } : { content, client_id: turn.clientId }),
        signal: controller.signal,
      });
      if (!response.ok) {
        const refusal = await response.json().catch(() => null);
        const retryAfter = Number(response.headers.get("Retry-After")) || undefined;
        this.onEvent(turn, refusal && refusal.type === "error" ? refusal
          : { type: "error", code: "http_error", message: `The server answered ${response.status}.`, retry_after: retryAfter });
        return;
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = block.split("\n").filter((line) => line.startsWith("data:"))
            .map((line) => line.slice(5).replace(/^ /, "")).join("\n");
          if (data) this.onEvent(turn, JSON.parse(data));
        }
      }
      if (!turn.ended) this.onEvent(turn, { type: "error", code: "connection_lost", message: LOST });
    } catch (error) {
      if (controller.signal.aborted) {
        // The server saw us leave: it stopped the model and saved the partial answer.
        this.finishTurn(turn, null, { code: "cancelled" });
      } else {
        this.onEvent(turn, { type: "error", code: "connection_lost", message: LOST });
      }
    }
  }

  /* The websocket of the open conversation (our turns, and other tabs' turns in it), or an
   * unbound one for a new conversation (its first message creates it). */
  connectSocket(conversationId) {
    if (this.socket) {
      this.socket.ws.onclose = null;
      this.socket.ws.close();
      this.socket = null;
      delete this.ui.log.dataset.live;
    }
    if (!this.websocket) return;
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const path = conversationId === null ? this.config.websocket
      : `${this.config.websocket}conversations/${encodeURIComponent(conversationId)}/`;
    const ws = new WebSocket(`${scheme}${location.host}${path}`);
    const socket = { ws, opened: false };
    socket.ready = new Promise((resolve, reject) => {
      socket.resolve = resolve;
      socket.reject = reject;
    });
    socket.ready.catch(() => {});
    ws.onmessage = (message) => {
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      this.onFrame(socket, frame);
    };
    ws.onclose = (event) => {
      if (this.socket !== socket) return;
      this.socket = null;
      delete this.ui.log.dataset.live;
      socket.reject(new Error("closed"));
      if (!socket.opened) this.websocket = false;  // no websocket here: server-sent events from now on
      const turn = this.turn;
      if (turn && !turn.ended && (turn.socket === socket || !turn.own)) {
        this.onEvent(turn, { type: "error", code: "connection_lost", message: LOST });
      }
      // A socket that worked and dropped (a server restart, a network change) comes back, so
      // answers asked in other tabs show here again. Not after an application close code
      // (4000-4999: conversation not found, session ended).
      if (socket.opened && !(event.code >= 4000 && event.code < 5000)) {
        const open = this.conversationId;  // a new conversation's socket may have adopted one since
        setTimeout(() => {
          if (this.socket === null && this.conversationId === open && (!this.turn || this.turn.ended)) {
            this.connectSocket(open);
          }
        }, 2000);
      }
    };
    this.socket = socket;
  }

  onFrame(socket, frame) {
    if (frame.type === "ready") {
      socket.opened = true;
      socket.resolve(socket);
      this.ui.log.dataset.live = "websocket";  // for styling and tests: this conversation is live
      return;
    }
    if (frame.type === "pong" || frame.type === "tool_decision") return;  // the turn's own events follow
    const turn = this.turn;
    // Our own message's frames are matched by client_id: a refusal may carry no conversation id.
    if (turn && turn.own && frame.client_id !== undefined && frame.client_id === turn.clientId) {
      this.onEvent(turn, frame);
      return;
    }
    if (!frame.conversation_id || frame.conversation_id !== this.conversationId) return;
    if (frame.type === "ack" && (!turn || turn.ended)) {
      this.onEvent(this.watchOtherTab(socket, frame), frame);  // a turn started in another tab or window
    } else if (turn && turn.followed) {
      // Its text comes from its readings (the deltas before this page opened were never seen
      // here); what each frame says whole is applied at once.
      if (["tool_call", "tool_result", "done", "error"].includes(frame.type)) this.onEvent(turn, frame);
    } else if (turn && !turn.own) {
      this.onEvent(turn, frame);
    }
  }

  watchOtherTab(socket, ack) {
    const turn = this.startTurnView(false, "");
    turn.abort = () => socket.ws.send(JSON.stringify({ type: "cancel" }));  // Stop works here too
    const after = ack.user_seq - 1;
    this.api("GET", `${this.urlFor(this.config.api.messages, ack.conversation_id)}?after=${after}&limit=1`).then((page) => {
      const question = page.results[0];
      if (question) {
        turn.user.text = question.content;
        this.renderBody(turn.user);
      }
    }).catch(() => {});
    return turn;
  }

  async streamOverSocket(turn, content) {
    const socket = await this.socket.ready;
    const clientId = turn.clientId;
    turn.socket = socket;
    const frame = { type: "message", content, client_id: clientId };
    if (this.conversationId !== null) frame.conversation_id = this.conversationId;
    else if (this.config.profile) frame.profile = this.config.profile;  // a new conversation: the widget's profile
    turn.abort = () => {
      const cancel = { type: "cancel", client_id: clientId };
      if (this.conversationId !== null) cancel.conversation_id = this.conversationId;
      socket.ws.send(JSON.stringify(cancel));
    };
    socket.ws.send(JSON.stringify(frame));
  }

  // --- sending ---------------------------------------------------------------------------

  async send(content) {
    this.setStatus("");
    const turn = this.startTurnView(true, content);
    if (this.socket) {
      try {
        await this.streamOverSocket(turn, content);
        return;
      } catch {
        // The websocket did not open: this server has none. Send it over HTTP instead.
      }
    }
    await this.streamOverHTTP(turn, this.conversationId, content);
  }

  bind() {
    const { ui } = this;
    ui.form.addEventListener("submit", (event) => {
      event.preventDefault();
      const content = ui.input.value;
      // Only spaces: sent, and refused as the server refuses every message that shows nothing
      // ("Not sent: The message is empty.", as for a message too long); not dropped in silence.
      if (!content || (this.turn && !this.turn.ended)) return;
      ui.input.value = "";
      this.send(content);
    });
    ui.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        ui.form.requestSubmit();
      }
    });
    this.root.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && this.turn && !this.turn.ended) {
        event.preventDefault();
        this.stop();
      } else if (event.key === "Escape" && this.root.classList.contains("ragchat-nav-open")) {
        this.setNavOpen(false);
        ui.toggle.focus();
      }
    });
    ui.stop.addEventListener("click", () => this.stop());
    ui.newButton.addEventListener("click", () => {
      this.openConversation(null);
      this.setNavOpen(false);
      ui.input.focus();
    });
    ui.toggle.addEventListener("click", () => this.setNavOpen(!this.root.classList.contains("ragchat-nav-open")));
    // A citation moves the reader, and the focus, to its source.
    ui.log.addEventListener("click", (event) => {
      const link = event.target.closest && event.target.closest("a.ragchat-cite");
      if (!link) return;
      const target = document.getElementById(link.hash.slice(1));
      if (!target) return;
      for (const item of this.root.querySelectorAll(".ragchat-source-current")) item.classList.remove("ragchat-source-current");
      target.classList.add("ragchat-source-current");
      setTimeout(() => target.focus({ preventScroll: true }), 0);
    });
  }

  stop() {
    const turn = this.turn;
    if (!turn || turn.ended) return;
    this.setProgress(turn.answer, "Stopping…");
    // Over the websocket a cancel names a conversation, which a first message only has once
    // it is accepted: stop at the ack then.
    if (turn.own && !turn.accepted && turn.socket) turn.stopRequested = true;
    else if (turn.abort) turn.abort();
  }

  start() {
    this.connectSocket(null);
    this.loadConversations().then((conversations) => {
      if (conversations.length && this.conversationId === null && !this.turn) this.openConversation(conversations[0].id);
    }).catch((error) => this.setStatus(error.message, true));
  }
}

/** Mount the widget on ``root`` (the markup of templates/django_ragchat/widget.html). */
export function mount(root, config) {
  if (root.ragchat) return root.ragchat;
  const widget = new ChatWidget(root, config);
  root.ragchat = widget;
  root.dataset.ready = "true";
  widget.start();
  return widget;
}

for (const root of document.querySelectorAll("[data-ragchat-widget]")) {
  const config = document.getElementById(root.dataset.ragchatWidget);
  if (config) mount(root, JSON.parse(config.textContent));
}
