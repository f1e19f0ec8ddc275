/* The django-ragchat chat page.
 *
 * Conversations are listed and created through the REST API; an answer streams over the
 * websocket when the server has one (ASGI) and over server-sent events otherwise. Both carry
 * the same events (docs/protocol.md): ack, status, sources, delta, done, error.
 *
 * Everything that comes from the model or the documents is untrusted: it is only ever put on
 * the page as text (createElement + textContent), never as HTML.
 */
(() => {
  "use strict";

  const config = JSON.parse(document.getElementById("ragchat-config").textContent);
  const $ = (id) => document.getElementById(id);
  const ui = {
    list: $("ragchat-conversations"),
    newButton: $("ragchat-new"),
    log: $("ragchat-log"),
    empty: $("ragchat-empty"),
    form: $("ragchat-form"),
    input: $("ragchat-input"),
    send: $("ragchat-send"),
    stop: $("ragchat-stop"),
    status: $("ragchat-status"),
  };
  ui.input.maxLength = config.maxMessageChars;

  const STAGES = { retrieving: "Searching the documents…", generating: "Writing the answer…" };
  const CITATION = /\[(\d+(?:\s*[,\u2013-]\s*\d+)*)\]/g;

  const state = {
    conversationId: null,
    turn: null,       // the turn being shown live in the open conversation (ours or another tab's)
    socket: null,     // {ws, ready: Promise} bound to the open conversation, under ASGI
    websocket: Boolean(config.websocket && "WebSocket" in window),
    nextClientId: 1,
  };

  // --- helpers -----------------------------------------------------------------------------

  function urlFor(template, id) {
    return template.replace(config.idPlaceholder, encodeURIComponent(id));
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function setStatus(text, isError) {
    ui.status.textContent = text || "";
    ui.status.classList.toggle("ragchat-status-error", Boolean(isError));
  }

  async function api(method, url, body) {
    const response = await fetch(url, {
      method,
      credentials: "same-origin",
      headers: { "Accept": "application/json", "Content-Type": "application/json", "X-CSRFToken": config.csrfToken },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      throw new Error(error.detail || error.message || `The server answered ${response.status}.`);
    }
    return response.status === 204 ? null : response.json();
  }

  async function fetchAll(url) {
    const items = [];
    for (let next = url; next; ) {
      const page = await api("GET", next);
      items.push(...page.results);
      next = page.next;
    }
    return items;
  }

  // --- rendering ---------------------------------------------------------------------------

  /* The answer's text, with each [n] that names a known source turned into a link to it. */
  function renderBody(body, text, sourceIds) {
    body.replaceChildren();
    let last = 0;
    for (const match of text.matchAll(CITATION)) {
      body.append(text.slice(last, match.index));
      const group = el("span", "ragchat-citation");
      group.append("[");
      for (const part of match[1].split(/(\s*[,\u2013-]\s*)/)) {
        const targetId = sourceIds.get(Number(part));
        if (/^\d+$/.test(part) && targetId) {
          const link = el("a", "ragchat-cite", part);
          link.href = "#" + targetId;
          link.dataset.source = part;
          group.append(link);
        } else {
          group.append(part);
        }
      }
      group.append("]");
      body.append(group);
      last = match.index + match[0].length;
    }
    body.append(text.slice(last));
  }

  function renderSources(view, sources, citedIndexes) {
    view.sourceIds = new Map();
    view.sources.replaceChildren();
    view.sources.hidden = sources.length === 0;
    for (const source of sources) {
      const id = `ragchat-source-${view.key}-${source.index}`;
      view.sourceIds.set(source.index, id);
      const item = el("li", "ragchat-source");
      item.id = id;
      item.value = source.index;
      if (citedIndexes.has(source.index)) item.classList.add("ragchat-source-cited");
      item.append(el("span", "ragchat-source-title", source.title || source.source));
      if (source.heading) item.append(el("span", "ragchat-source-heading", source.heading));
      if (source.snippet) item.append(el("p", "ragchat-source-snippet", source.snippet));
      view.sources.append(item);
    }
  }

  let viewCount = 0;

  /* One message on the page: {node, body, sources, text, ...}. */
  function addMessageView(role) {
    ui.empty.hidden = true;
    const node = el("article", `ragchat-message ragchat-${role}`);
    const view = {
      key: String(++viewCount), node, role, text: "", sourceIds: new Map(),
      body: el("div", "ragchat-body"),
      sources: el("ol", "ragchat-sources"),
      note: el("p", "ragchat-note"),
    };
    view.sources.hidden = true;
    view.note.hidden = true;
    node.append(view.body, view.note, view.sources);
    ui.log.append(node);
    return view;
  }

  function setNote(view, text) {
    view.note.textContent = text || "";
    view.note.hidden = !text;
  }

  function showSavedMessage(message) {
    const view = addMessageView(message.role);
    view.text = message.content;
    if (message.role === "assistant") {
      const cited = new Set((message.citations || []).map((c) => c.index));
      renderSources(view, message.sources || [], cited);
      if (message.status === "incomplete") setNote(view, "Stopped before the end.");
      if (message.status === "interrupted") setNote(view, (message.error && message.error.message) || "Interrupted before the end.");
      if (message.status === "error") setNote(view, (message.error && message.error.message) || "The answer failed.");
      if (message.status === "streaming") setNote(view, "Being written…");
    }
    renderBody(view.body, view.text, view.sourceIds);
    return view;
  }

  function scrollToEnd() {
    ui.log.scrollTop = ui.log.scrollHeight;
  }

  // --- conversations -----------------------------------------------------------------------

  async function loadConversations() {
    const conversations = await fetchAll(config.api.conversations);
    ui.list.replaceChildren();
    for (const conversation of conversations) addConversationItem(conversation, false);
    markOpenConversation();
    return conversations;
  }

  function conversationLabel(conversation) {
    return conversation.title || `Conversation of ${new Date(conversation.created_at).toLocaleString()}`;
  }

  function addConversationItem(conversation, first) {
    const item = el("li");
    const button = el("button", "ragchat-conversation", conversationLabel(conversation));
    button.type = "button";
    button.dataset.id = conversation.id;
    button.addEventListener("click", () => openConversation(conversation.id));
    item.append(button);
    if (first) ui.list.prepend(item); else ui.list.append(item);
    return button;
  }

  function markOpenConversation() {
    for (const button of ui.list.querySelectorAll("button")) {
      const open = button.dataset.id === state.conversationId;
      button.classList.toggle("ragchat-open", open);
      if (open) button.setAttribute("aria-current", "true"); else button.removeAttribute("aria-current");
    }
  }

  async function openConversation(id) {
    if (state.turn && !state.turn.ended) return;  // finish or stop the answer first
    state.conversationId = id;
    state.turn = null;
    markOpenConversation();
    ui.log.replaceChildren(ui.empty);
    ui.empty.hidden = false;
    setStatus("");
    connectSocket(id);
    if (id === null) return;
    try {
      const messages = await fetchAll(urlFor(config.api.messages, id));
      if (state.conversationId !== id) return;
      for (const message of messages) showSavedMessage(message);
      scrollToEnd();
    } catch (error) {
      setStatus(error.message, true);
    }
  }

  async function createConversation(title) {
    const conversation = await api("POST", config.api.conversations, { title });
    addConversationItem(conversation, true);
    return conversation.id;
  }

  // --- a live turn -------------------------------------------------------------------------

  function startTurnView(own, question) {
    const user = addMessageView("user");
    user.text = question || "";
    renderBody(user.body, user.text, new Map());
    const turn = { own, user, answer: addMessageView("assistant"), nextIndex: 0, ended: false, abort: null };
    setNote(turn.answer, "…");
    state.turn = turn;
    setBusy(own);
    scrollToEnd();
    return turn;
  }

  function setBusy(busy) {
    ui.send.disabled = busy;
    ui.stop.hidden = !busy;
    ui.newButton.disabled = busy;
    for (const button of ui.list.querySelectorAll("button")) button.disabled = busy;
  }

  /* Apply one protocol event to the turn on the page. */
  function onEvent(turn, event) {
    if (turn.ended) return;
    const answer = turn.answer;
    switch (event.type) {
      case "ack":
        turn.assistantMessageId = event.assistant_message_id;
        break;
      case "status":
        setStatus(STAGES[event.stage] || "");
        break;
      case "sources":
        renderSources(answer, event.sources, new Set());
        renderBody(answer.body, answer.text, answer.sourceIds);
        break;
      case "delta":
        if (event.index !== turn.nextIndex) setNote(answer, "Part of the answer was lost on the way; it is complete once saved.");
        turn.nextIndex = event.index + 1;
        answer.text += event.text;
        renderBody(answer.body, answer.text, answer.sourceIds);
        if (answer.note.textContent === "…") setNote(answer, "");
        scrollToEnd();
        break;
      case "done":
        finishTurn(turn, event.message, "");
        break;
      case "error":
        finishTurn(turn, event.assistant_message, event.code === "cancelled" ? "Stopped before the end." : event.message,
                   event.code !== "cancelled");
        break;
      default:
        break;  // newer protocol versions may add events: ignore what we don't know
    }
  }

  function finishTurn(turn, message, note, isError) {
    turn.ended = true;
    const answer = turn.answer;
    if (message) {
      // The saved message is the truth (whatever a stream lost on the way).
      answer.text = message.content;
      const cited = new Set((message.citations || []).map((c) => c.index));
      if (message.sources && message.sources.length) renderSources(answer, message.sources, cited);
      else for (const item of answer.sources.children) if (cited.has(Number(item.value))) item.classList.add("ragchat-source-cited");
    }
    if (turn.own && turn.assistantMessageId === undefined && !message) {
      // Refused before anything was saved: take the question back into the box.
      turn.user.node.remove();
      answer.node.remove();
      if (!ui.input.value) ui.input.value = turn.user.text;
      ui.empty.hidden = ui.log.querySelector(".ragchat-message") !== null;
    } else {
      renderBody(answer.body, answer.text, answer.sourceIds);
      setNote(answer, note);
    }
    setStatus(isError ? note : "", isError);
    if (state.turn === turn) state.turn = null;
    setBusy(false);
    scrollToEnd();
  }

  // --- transports --------------------------------------------------------------------------

  /* Server-sent events over fetch (works under WSGI and ASGI; EventSource cannot POST). */
  async function streamOverHTTP(turn, conversationId, content) {
    const controller = new AbortController();
    turn.abort = () => controller.abort();
    let response;
    try {
      response = await fetch(urlFor(config.stream, conversationId), {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "Accept": "text/event-stream", "X-CSRFToken": config.csrfToken },
        body: JSON.stringify({ content }),
        signal: controller.signal,
      });
      if (!response.ok) {
        const refusal = await response.json().catch(() => null);
        onEvent(turn, refusal || { type: "error", code: "http_error", message: `The server answered ${response.status}.` });
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
          if (data) onEvent(turn, JSON.parse(data));
        }
      }
      if (!turn.ended) onEvent(turn, { type: "error", code: "connection_lost", message: "The connection was lost before the answer ended." });
    } catch (error) {
      if (controller.signal.aborted) {
        // The server saw us leave: it stopped the model and saved the partial answer.
        finishTurn(turn, null, "Stopped before the end.", false);
      } else {
        onEvent(turn, { type: "error", code: "connection_lost", message: "The connection was lost before the answer ended." });
      }
    }
  }

  /* The websocket bound to the open conversation: our turns, and other tabs' turns in it. */
  function connectSocket(conversationId) {
    if (state.socket) {
      state.socket.ws.onclose = null;
      state.socket.ws.close();
      state.socket = null;
      delete ui.log.dataset.live;
    }
    if (!state.websocket || conversationId === null) return;
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(`${scheme}${location.host}${config.websocket}conversations/${encodeURIComponent(conversationId)}/`);
    const socket = { ws };
    socket.ready = new Promise((resolve, reject) => {
      socket.resolve = resolve;
      socket.reject = reject;
    });
    socket.ready.catch(() => {});
    ws.onmessage = (message) => onFrame(socket, JSON.parse(message.data));
    ws.onclose = () => {
      if (state.socket !== socket) return;
      state.socket = null;
      delete ui.log.dataset.live;
      socket.reject(new Error("closed"));
      if (!socket.opened) state.websocket = false;  // no websocket here: server-sent events from now on
      const turn = state.turn;
      if (turn && !turn.ended && (turn.socket === socket || !turn.own)) onEvent(turn, { type: "error", code: "connection_lost", message: "The connection was lost before the answer ended." });
    };
    state.socket = socket;
  }

  function onFrame(socket, frame) {
    if (frame.type === "ready") {
      socket.opened = true;
      socket.resolve(socket);
      ui.log.dataset.live = "websocket";  // for styling and tests: this conversation is live
      return;
    }
    if (frame.type === "pong" || frame.conversation_id !== state.conversationId) return;
    const turn = state.turn;
    if (turn && turn.own && frame.client_id === turn.clientId) {
      onEvent(turn, frame);
    } else if (frame.type === "ack" && (!turn || turn.ended)) {
      onEvent(watchOtherTab(socket, frame), frame);  // a turn started in another tab or window
    } else if (turn && !turn.own) {
      onEvent(turn, frame);
    }
  }

  function watchOtherTab(socket, ack) {
    const turn = startTurnView(false, "");
    setBusy(true);  // one answer at a time in a conversation, whichever tab asked; Stop works too
    turn.abort = () => socket.ws.send(JSON.stringify({ type: "cancel" }));
    const after = ack.user_seq - 1;
    api("GET", `${urlFor(config.api.messages, ack.conversation_id)}?after=${after}&limit=1`).then((page) => {
      const question = page.results[0];
      if (question) {
        turn.user.text = question.content;
        renderBody(turn.user.body, turn.user.text, new Map());
      }
    }).catch(() => {});
    return turn;
  }

  async function streamOverSocket(turn, content) {
    const socket = await state.socket.ready;
    const clientId = `c${state.nextClientId++}`;
    turn.clientId = clientId;
    turn.socket = socket;
    turn.abort = () => socket.ws.send(JSON.stringify({ type: "cancel", client_id: clientId }));
    socket.ws.send(JSON.stringify({ type: "message", content, client_id: clientId }));
  }

  // --- sending -----------------------------------------------------------------------------

  async function send(content) {
    setStatus("");
    let conversationId = state.conversationId;
    if (conversationId === null) {
      try {
        conversationId = await createConversation(content.slice(0, 80));
      } catch (error) {
        setStatus(error.message, true);
        return;
      }
      await openConversation(conversationId);
    }
    const turn = startTurnView(true, content);
    if (state.socket) {
      try {
        await streamOverSocket(turn, content);
        return;
      } catch (error) {
        // The websocket did not open: this server has none. Send it over HTTP instead.
      }
    }
    await streamOverHTTP(turn, conversationId, content);
  }

  ui.form.addEventListener("submit", (event) => {
    event.preventDefault();
    const content = ui.input.value;
    if (!content.trim() || (state.turn && !state.turn.ended)) return;
    ui.input.value = "";
    send(content);
  });

  ui.input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      ui.form.requestSubmit();
    }
  });

  ui.stop.addEventListener("click", () => {
    const turn = state.turn;
    if (turn && !turn.ended && turn.abort) turn.abort();
  });

  ui.newButton.addEventListener("click", () => openConversation(null));

  loadConversations().then((conversations) => {
    if (conversations.length) openConversation(conversations[0].id);
  }).catch((error) => setStatus(error.message, true));
})();
