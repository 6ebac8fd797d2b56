// Edge LLM web chat. Talks to this server's public POST /v1/chat/completions (streaming) like any
// other client; loads nothing from anywhere else. Settings and the API key stay in localStorage.
"use strict";

(() => {
  const SETTINGS_KEY = "edge-llm.settings";
  const API_KEY_KEY = "edge-llm.api-key";
  const MODEL_KEY = "edge-llm.model";
  const DEFAULTS = { system: "", temperature: 0.7, top_p: 0.9, max_tokens: 512 };

  const $ = (id) => document.getElementById(id);
  const ui = {
    conversation: $("conversation"),
    messages: $("messages"),
    empty: $("empty"),
    prompt: $("prompt"),
    form: $("composer-form"),
    send: $("send"),
    stop: $("stop"),
    newChat: $("new-chat"),
    notice: $("notice"),
    settings: $("settings"),
    toggleSettings: $("toggle-settings"),
    system: $("system-prompt"),
    temperature: $("temperature"),
    temperatureValue: $("temperature-value"),
    topP: $("top-p"),
    topPValue: $("top-p-value"),
    maxTokens: $("max-tokens"),
    apiKey: $("api-key"),
    resetSettings: $("reset-settings"),
    modelPicker: $("model-picker"),
  };

  const state = {
    messages: [], // the conversation sent to the server (without the system prompt)
    controller: null, // AbortController of the answer being streamed
  };

  // ---- a tiny markdown renderer: everything is HTML-escaped before any markup is added ----------

  function escapeHtml(text) {
    return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  function inline(text) {
    const codes = [];
    let html = text.replace(/\u0000/g, "").replace(/`([^`\n]+)`/g, (_, code) => {
      codes.push(code);
      return `\u0000${codes.length - 1}\u0000`;
    });
    html = escapeHtml(html);
    html = html.replace(/\*\*(?=\S)([^*]*?\S)\*\*/g, "<strong>$1</strong>");
    html = html.replace(/(^|[^\w])__(?=\S)([^_]*?\S)__(?!\w)/g, "$1<strong>$2</strong>");
    html = html.replace(/(^|[^*\w])\*(?=[^\s*])([^*\n]*?[^\s*])\*(?!\*)/g, "$1<em>$2</em>");
    html = html.replace(/(^|[^_\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?![_\w])/g, "$1<em>$2</em>");
    html = html.replace(/~~(?=\S)([^~]*?\S)~~/g, "<del>$1</del>");
    html = html.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s()]+)\)/g,
      '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
    return html.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${escapeHtml(codes[Number(i)])}</code>`);
  }

  function codeBlock(code, lang, open) {
    const label = escapeHtml(lang || "code");
    return `<div class="codeblock${open ? " open" : ""}"><div class="codehead"><span>${label}</span>` +
      `<button class="copy" type="button">Copy</button></div><pre><code>${escapeHtml(code)}</code></pre></div>`;
  }

  const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/;
  const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
  const TABLE_RULE = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;

  function tableCells(line) {
    return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((cell) => inline(cell.trim()));
  }

  // Parses a list starting at lines[i]; returns [html, next index]. Deeper indentation nests.
  function list(lines, i) {
    const first = lines[i].match(LIST_ITEM);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const items = [];
    while (i < lines.length) {
      const line = lines[i];
      const item = line.match(LIST_ITEM);
      if (FENCE.test(line)) break; // code inside an item is shown as a block after the list
      if (item && item[1].length <= indent + 1 && /\d/.test(item[2]) === ordered && item[1].length >= indent) {
        items.push({ text: [item[3]], nested: "" });
        i += 1;
      } else if (item && item[1].length > indent + 1 && items.length) {
        const [html, next] = list(lines, i);
        items[items.length - 1].nested += html;
        i = next;
      } else if (!item && line.trim() !== "" && /^\s/.test(line) && items.length) {
        items[items.length - 1].text.push(line.trim());
        i += 1;
      } else if (line.trim() === "" && i + 1 < lines.length) {
        const after = lines[i + 1].match(LIST_ITEM);
        if (!after || after[1].length < indent) break;
        i += 1;
      } else {
        break;
      }
    }
    const start = ordered ? parseInt(first[2], 10) : 1;
    const open = ordered ? (start !== 1 ? `<ol start="${start}">` : "<ol>") : "<ul>";
    const body = items.map((it) => `<li>${it.text.map(inline).join("<br>")}${it.nested}</li>`).join("");
    return [`${open}${body}${ordered ? "</ol>" : "</ul>"}`, i];
  }

  function renderMarkdown(source) {
    const lines = source.replace(/\r\n?/g, "\n").split("\n");
    const out = [];
    let paragraph = [];
    const flush = () => {
      if (paragraph.length) out.push(`<p>${paragraph.map(inline).join("<br>")}</p>`);
      paragraph = [];
    };
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(FENCE);
      if (fence) {
        flush();
        const body = [];
        i += 1;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        const closed = i < lines.length;
        i += 1;
        out.push(codeBlock(body.join("\n"), fence[2], !closed));
        continue;
      }
      if (line.trim() === "") { flush(); i += 1; continue; }
      const heading = line.match(HEADING);
      if (heading) {
        flush();
        const level = Math.min(heading[1].length, 4);
        out.push(`<h${level}>${inline(heading[2])}</h${level}>`);
        i += 1;
        continue;
      }
      if (RULE.test(line)) { flush(); out.push("<hr>"); i += 1; continue; }
      if (LIST_ITEM.test(line)) {
        flush();
        const [html, next] = list(lines, i);
        out.push(html);
        i = next;
        continue;
      }
      if (/^\s*>/.test(line)) {
        flush();
        const quoted = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
        out.push(`<blockquote>${renderMarkdown(quoted.join("\n"))}</blockquote>`);
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1])) {
        flush();
        const head = tableCells(line).map((c) => `<th>${c}</th>`).join("");
        const rows = [];
        i += 2;
        while (i < lines.length && lines[i].includes("|") && lines[i].trim() !== "") {
          rows.push(`<tr>${tableCells(lines[i]).map((c) => `<td>${c}</td>`).join("")}</tr>`);
          i += 1;
        }
        out.push(`<div class="table"><table><thead><tr>${head}</tr></thead><tbody>${rows.join("")}</tbody></table></div>`);
        continue;
      }
      paragraph.push(line);
      i += 1;
    }
    flush();
    return out.join("");
  }

  // ---- settings (localStorage) -----------------------------------------------------------------

  function loadSettings() {
    let saved = {};
    try { saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}") || {}; } catch { saved = {}; }
    const settings = { ...DEFAULTS, ...saved };
    ui.system.value = settings.system;
    ui.temperature.value = settings.temperature;
    ui.topP.value = settings.top_p;
    ui.maxTokens.value = settings.max_tokens;
    ui.apiKey.value = localStorage.getItem(API_KEY_KEY) || "";
    showSliderValues();
  }

  function currentSettings() {
    const number = (input, fallback) => {
      const value = Number(input.value);
      return Number.isFinite(value) && input.value !== "" ? value : fallback;
    };
    return {
      system: ui.system.value,
      temperature: number(ui.temperature, DEFAULTS.temperature),
      top_p: number(ui.topP, DEFAULTS.top_p),
      max_tokens: Math.max(1, Math.round(number(ui.maxTokens, DEFAULTS.max_tokens))),
    };
  }

  function saveSettings() {
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(currentSettings()));
    const key = ui.apiKey.value.trim();
    if (key) localStorage.setItem(API_KEY_KEY, key); else localStorage.removeItem(API_KEY_KEY);
    showSliderValues();
  }

  function showSliderValues() {
    ui.temperatureValue.textContent = Number(ui.temperature.value).toFixed(2);
    ui.topPValue.textContent = Number(ui.topP.value).toFixed(2);
  }

  function headers() {
    const result = { "Content-Type": "application/json" };
    const key = ui.apiKey.value.trim();
    if (key) result.Authorization = `Bearer ${key}`;
    return result;
  }

  // ---- the conversation view -------------------------------------------------------------------

  function nearBottom() {
    const c = ui.conversation;
    return c.scrollHeight - c.scrollTop - c.clientHeight < 80;
  }

  function scrollToBottom() {
    ui.conversation.scrollTop = ui.conversation.scrollHeight;
  }

  function addMessage(role, text) {
    ui.empty.hidden = true;
    const item = document.createElement("li");
    item.className = `msg ${role}`;
    const label = document.createElement("div");
    label.className = "role";
    label.textContent = role === "user" ? "You" : "Assistant";
    const body = document.createElement("div");
    body.className = "body";
    if (role === "user") body.textContent = text;
    item.append(label, body);
    ui.messages.append(item);
    scrollToBottom();
    return item;
  }

  class AnswerView {
    constructor() {
      this.item = addMessage("assistant", "");
      this.body = this.item.querySelector(".body");
      this.body.classList.add("cursor");
      this.statsLine = document.createElement("div");
      this.statsLine.className = "stats";
      this.item.append(this.statsLine);
      this.text = "";
      this.pending = false;
    }

    update(text) {
      this.text = text;
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => {
        this.pending = false;
        const stick = nearBottom();
        this.body.innerHTML = renderMarkdown(this.text);
        if (stick) scrollToBottom();
      });
    }

    stats(figures) {
      const parts = [];
      if (figures.ttft != null) parts.push(`TTFT ${(figures.ttft / 1000).toFixed(2)} s`);
      if (figures.rate != null) parts.push(`${figures.rate.toFixed(1)} tok/s`);
      parts.push(`${figures.tokens} token${figures.tokens === 1 ? "" : "s"}`);
      if (figures.prompt != null) {
        parts.push(`prompt ${figures.prompt}${figures.cached ? ` (${figures.cached} cached)` : ""}`);
      }
      this.statsLine.textContent = parts.join(" · ");
      if (figures.note) {
        const note = document.createElement("span");
        note.className = figures.noteClass || "";
        note.textContent = ` · ${figures.note}`;
        this.statsLine.append(note);
      }
    }

    finish() {
      this.body.classList.remove("cursor");
      this.body.innerHTML = renderMarkdown(this.text);
      this.item.dataset.done = "true";
    }

    fail(message) {
      this.item.classList.add("error");
      this.body.classList.remove("cursor");
      this.body.textContent = message;
      this.item.dataset.done = "true";
    }
  }

  function notice(message) {
    ui.notice.textContent = message || "";
    ui.notice.hidden = !message;
  }

  function setBusy(busy) {
    ui.send.hidden = busy;
    ui.stop.hidden = !busy;
    document.body.dataset.busy = busy ? "true" : "false";
  }

  // ---- talking to the server -------------------------------------------------------------------

  async function errorMessage(response) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch { /* not JSON */ }
    if (response.status === 401) {
      return `${message}. Enter the server's API key in Settings.`;
    }
    if (response.status === 400 && /context length/i.test(message)) {
      return `${message}. Start a new chat or lower Max tokens.`;
    }
    return message;
  }

  // Server-Sent Events from a fetch response: yields each event's data (multi-line data joined).
  async function* sseData(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""));
        if (data.length) yield data.join("\n");
      }
    }
  }

  async function send() {
    const text = ui.prompt.value.trim();
    if (!text || state.controller) return;
    saveSettings();
    notice("");
    ui.prompt.value = "";
    autoResize();
    const settings = currentSettings();
    const userItem = addMessage("user", text);
    const history = state.messages; // "New chat" replaces it: a late end of this answer then changes nothing
    history.push({ role: "user", content: text });
    const view = new AnswerView();
    const controller = new AbortController();
    state.controller = controller;
    setBusy(true);

    const messages = settings.system.trim()
      ? [{ role: "system", content: settings.system }, ...history]
      : [...history];
    const body = {
      messages,
      stream: true,
      stream_options: { include_usage: true },
      temperature: settings.temperature,
      top_p: settings.top_p,
      max_tokens: settings.max_tokens,
    };
    if (ui.modelPicker.value) body.model = ui.modelPicker.value;
    const started = performance.now();
    let firstAt = null;
    let content = "";
    let pieces = 0;
    let usage = null;
    let finishReason = null;

    const figures = (end) => {
      const tokens = usage ? usage.completion_tokens : pieces;
      const now = end ?? performance.now();
      const seconds = firstAt != null ? (now - firstAt) / 1000 : 0;
      return {
        ttft: firstAt != null ? firstAt - started : null,
        rate: seconds > 0.05 && tokens > 1 ? (tokens - 1) / seconds : null,
        tokens,
        prompt: usage ? usage.prompt_tokens : null,
        cached: usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0,
      };
    };

    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      for await (const data of sseData(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        const piece = choice.delta && choice.delta.content;
        if (piece) {
          if (firstAt == null) firstAt = performance.now();
          content += piece;
          pieces += 1;
          view.update(content);
          view.stats(figures());
        }
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
      const final = figures(performance.now());
      if (finishReason === "length") {
        final.note = "cut at max tokens";
      }
      view.finish();
      view.stats(final);
      history.push({ role: "assistant", content });
    } catch (error) {
      if (error.name === "AbortError") {
        view.finish();
        view.stats({ ...figures(), note: "stopped", noteClass: "stopped" });
        view.item.dataset.stopped = "true";
        if (content) {
          history.push({ role: "assistant", content });
        } else {
          history.pop(); // nothing came back: this question is not part of the conversation
          userItem.classList.add("dropped");
        }
      } else {
        view.fail(error.message || String(error));
        history.pop();
        userItem.classList.add("dropped");
        if (!ui.prompt.value) { ui.prompt.value = text; autoResize(); }
        if (/API key/.test(error.message)) openSettings(ui.apiKey);
      }
    } finally {
      state.controller = null;
      setBusy(false);
      ui.prompt.focus();
    }
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  function newChat() {
    stop();
    state.messages = [];
    ui.messages.replaceChildren();
    ui.empty.hidden = false;
    notice("");
    ui.prompt.focus();
  }

  function pickerSays(text) {
    const option = document.createElement("option");
    option.value = "";
    option.textContent = text;
    ui.modelPicker.replaceChildren(option);
    ui.modelPicker.disabled = true;
  }

  // Every model the server can serve (as /api/tags lists them), the chosen one kept in this browser.
  async function showModel() {
    try {
      const response = await fetch("/v1/models", { headers: headers() });
      if (response.status === 401) {
        pickerSays("API key needed");
        notice("This server needs an API key: enter it in Settings.");
        return;
      }
      const models = (await response.json()).data || [];
      const saved = localStorage.getItem(MODEL_KEY);
      const chosen = models.find((m) => m.id === saved) || models.find((m) => m.state === "loaded") || models[0];
      ui.modelPicker.replaceChildren(...models.map((model) => {
        const option = document.createElement("option");
        option.value = model.id;
        option.textContent = model.state === "loaded" ? model.id : `${model.id} (${model.state})`;
        option.dataset.state = model.state;
        return option;
      }));
      if (chosen) ui.modelPicker.value = chosen.id;
      ui.modelPicker.disabled = models.length < 2;
    } catch {
      pickerSays("server unreachable");
    }
  }

  // Loads the picked model now (POST /models/load), the time it takes shown as it goes.
  async function pickModel() {
    const model = ui.modelPicker.value;
    if (!model) return;
    localStorage.setItem(MODEL_KEY, model);
    const picked = ui.modelPicker.selectedOptions[0];
    if (picked && picked.dataset.state === "loaded") return;
    const started = performance.now();
    const progress = () => notice(`Loading ${model}… ${((performance.now() - started) / 1000).toFixed(0)} s`);
    progress();
    const timer = setInterval(progress, 500);
    document.body.dataset.loading = "true";
    try {
      const response = await fetch("/models/load", { method: "POST", headers: headers(), body: JSON.stringify({ model }) });
      if (!response.ok) throw new Error(await errorMessage(response));
      notice("");
    } catch (error) {
      notice(`Loading ${model} failed: ${error.message}`);
    } finally {
      clearInterval(timer);
      delete document.body.dataset.loading;
      await showModel();
    }
  }

  // ---- wiring ------------------------------------------------------------------------------------

  function autoResize() {
    ui.prompt.style.height = "auto";
    ui.prompt.style.height = `${Math.min(ui.prompt.scrollHeight + 2, window.innerHeight * 0.4)}px`;
  }

  function openSettings(focus) {
    ui.settings.classList.add("open");
    ui.toggleSettings.setAttribute("aria-expanded", "true");
    if (focus) focus.focus();
  }

  function closeSettings() {
    ui.settings.classList.remove("open");
    ui.toggleSettings.setAttribute("aria-expanded", "false");
  }

  ui.form.addEventListener("submit", (event) => { event.preventDefault(); send(); });
  ui.settings.addEventListener("submit", (event) => event.preventDefault());
  ui.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  ui.prompt.addEventListener("input", autoResize);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      if (state.controller) stop(); else closeSettings();
    }
  });
  ui.stop.addEventListener("click", stop);
  ui.newChat.addEventListener("click", newChat);
  ui.toggleSettings.addEventListener("click", () => {
    if (ui.settings.classList.contains("open")) closeSettings(); else openSettings();
  });
  for (const input of [ui.system, ui.temperature, ui.topP, ui.maxTokens]) {
    input.addEventListener("input", saveSettings);
  }
  ui.apiKey.addEventListener("change", () => { saveSettings(); showModel(); });
  ui.modelPicker.addEventListener("change", pickModel);
  ui.resetSettings.addEventListener("click", () => {
    localStorage.removeItem(SETTINGS_KEY);
    loadSettings();
  });
  ui.messages.addEventListener("click", async (event) => {
    const button = event.target.closest(".copy");
    if (!button) return;
    const code = button.closest(".codeblock").querySelector("code").textContent;
    try {
      await navigator.clipboard.writeText(code);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });

  loadSettings();
  setBusy(false);
  showModel();
  ui.prompt.focus();
  window.edgeChat = { renderMarkdown }; // for tests and the curious
})();
