/* Safe Markdown for the chat widget: text in, DOM nodes out.
 *
 * Model output and document text are untrusted. This renderer never parses HTML: every piece
 * of text goes into the page through document.createTextNode / textContent, and the only
 * elements it makes are the ones below, with no attributes taken from the text except a link's
 * href, which must be http(s) or mailto (anything else, "javascript:" included, stays text).
 * Raw HTML in the input ("<img onerror=...>", "<script>") is therefore shown as the characters
 * it is made of.
 *
 * The subset chat answers use: paragraphs (single newlines kept as line breaks), headings,
 * bullet and numbered lists, block quotes, fenced code blocks, horizontal rules, **bold**,
 * *italic*, `code`, [links](https://...), and citations [n] / [1, 2] (handed to a callback
 * that makes the link to the source).
 */

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)\s*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

// One alternative per inline construct; the earliest match in the text wins.
const INLINE = new RegExp([
  /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/.source,                           // 1, 2: code span
  /\*\*(?=\S)([\s\S]*?\S)\*\*(?!\*)/.source,                              // 3: bold
  /(?<![\p{L}\p{N}_])__(?=\S)([\s\S]*?\S)__(?![\p{L}\p{N}_])/.source,     // 4: bold
  /\*(?=[^\s*])([\s\S]*?[^\s*])\*(?!\*)/.source,                           // 5: italic
  /(?<![\p{L}\p{N}_])_(?=[^\s_])([\s\S]*?[^\s_])_(?![\p{L}\p{N}_])/.source, // 6: italic
  /\[([^\[\]\n]+)\]\(\s*<?([^()\s<>]+)>?\s*\)/.source,                     // 7, 8: link
  /\[(\d{1,3}(?:\s*[,\u2013-]\s*\d{1,3})*)\]/.source,                     // 9: citation
].join("|"), "gu");

const SAFE_URL = /^(?:https?:\/\/|mailto:)/i;

function element(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

/** Whether ``url`` may be a link's href (http, https or mailto, nothing else). */
export function isSafeUrl(url) {
  return SAFE_URL.test(String(url).trim());
}

/* Inline markup of ``text`` appended to ``parent``. */
function renderInline(parent, text, options) {
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) parent.append(document.createTextNode(text.slice(last, match.index)));
    last = match.index + match[0].length;
    if (match[2] !== undefined) {
      const code = element("code");
      code.textContent = match[2];
      parent.append(code);
    } else if (match[3] !== undefined || match[4] !== undefined) {
      const strong = element("strong");
      renderInline(strong, match[3] ?? match[4], options);
      parent.append(strong);
    } else if (match[5] !== undefined || match[6] !== undefined) {
      const em = element("em");
      renderInline(em, match[5] ?? match[6], options);
      parent.append(em);
    } else if (match[7] !== undefined) {
      if (isSafeUrl(match[8])) {
        const link = element("a");
        link.href = match[8];
        link.rel = "noopener noreferrer nofollow";
        link.target = "_blank";
        renderInline(link, match[7], { ...options, cite: null });  // no links inside links
        parent.append(link);
      } else {
        parent.append(document.createTextNode(match[0]));  // not a URL we follow: plain text
      }
    } else if (match[9] !== undefined) {
      parent.append(options.cite ? options.cite(match[9], match[0]) : document.createTextNode(match[0]));
    }
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

/* Lines joined by line breaks, each with its inline markup. */
function renderLines(parent, lines, options) {
  lines.forEach((line, i) => {
    if (i > 0) parent.append(element("br"));
    renderInline(parent, line, options);
  });
}

function isBlockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function renderBlocks(parent, lines, options, depth) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let match;
    if (!line.trim()) {
      i += 1;
    } else if ((match = FENCE.exec(line))) {
      const close = new RegExp(`^\\s{0,3}${match[1][0] === "`" ? "`" : "~"}{${match[1].length},}\\s*$`);
      const body = [];
      for (i += 1; i < lines.length && !close.test(lines[i]); i += 1) body.push(lines[i]);
      i += 1;  // the closing fence (or the end: a block still being streamed)
      const pre = element("pre");
      const code = element("code");
      if (match[2]) code.dataset.language = match[2];
      code.textContent = body.join("\n");
      pre.append(code);
      parent.append(pre);
    } else if ((match = HEADING.exec(line))) {
      // Headings inside an answer sit below the page's own: h3 at most.
      const heading = element(`h${Math.min(match[1].length + 2, 6)}`, "ragchat-md-heading");
      renderInline(heading, match[2], options);
      parent.append(heading);
      i += 1;
    } else if (RULE.test(line)) {
      parent.append(element("hr"));
      i += 1;
    } else if (QUOTE.test(line) && depth < 8) {
      const quoted = [];
      for (; i < lines.length && (match = QUOTE.exec(lines[i])); i += 1) quoted.push(match[1]);
      const quote = element("blockquote");
      renderBlocks(quote, quoted, options, depth + 1);
      parent.append(quote);
    } else if (ITEM.test(line)) {
      i = renderList(parent, lines, i, options, depth);
    } else {
      const paragraph = [];
      for (; i < lines.length && lines[i].trim() && !(paragraph.length && isBlockStart(lines[i])); i += 1) {
        paragraph.push(lines[i].trim());
      }
      const p = element("p");
      renderLines(p, paragraph, options);
      parent.append(p);
    }
  }
}

/* A list starting at lines[start]; returns the index of the first line after it. Items
 * indented further than the list's own marker make a nested list. */
function renderList(parent, lines, start, options, depth) {
  const first = ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = element(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  let i = start;
  while (i < lines.length) {
    const match = ITEM.exec(lines[i]);
    if (!match || match[1].length !== indent || /\d/.test(match[2]) !== ordered) break;
    const item = element("li");
    const text = [match[3]];
    i += 1;
    // Continuation lines (indented, not a new item) belong to this item.
    while (i < lines.length && lines[i].trim() && !ITEM.test(lines[i]) && /^\s+/.test(lines[i])) {
      text.push(lines[i].trim());
      i += 1;
    }
    renderLines(item, text, options);
    while (i < lines.length && depth < 8) {
      const nested = ITEM.exec(lines[i]);
      if (!nested || nested[1].length <= indent) break;
      i = renderList(item, lines, i, options, depth + 1);
    }
    list.append(item);
    if (i + 1 < lines.length && !lines[i].trim() && ITEM.test(lines[i + 1])) i += 1;  // a loose list goes on
  }
  parent.append(list);
  return i;
}

/**
 * Render ``text`` as Markdown into a new DocumentFragment.
 *
 * ``options.cite(numbers, raw)``: called for each citation, ``numbers`` the text between the
 * brackets ("1" or "1, 2"); returns the node to put there. Without it, citations stay text.
 */
export function renderMarkdown(text, options = {}) {
  const fragment = document.createDocumentFragment();
  renderBlocks(fragment, String(text ?? "").split(/\r\n|\r|\n/), options, 0);
  return fragment;
}
