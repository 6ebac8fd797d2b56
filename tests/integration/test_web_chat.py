"""The web chat at `/` in a real browser (Debian's chromium driven by Playwright) against a real server
with the real model and an API key. Screenshots of each state go to test-artifacts/ (git-ignored).

Without the browser these tests fail (a browser test that does not run shows nothing), each with the
line saying how to install it; the rest of the run goes on. scripts/bootstrap.sh test installs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge_llm.testing.server import RunningServer, environment, run_server
from tests.helpers import CHAT_FRONT_ENDS_FLAGS, WEB_CHAT_KEY, Samples, scrape, small_model, total, wait_for
from tests.server_pool import ServerWith

CHROMIUM = Path(os.environ.get("EDGE_LLM_TEST_CHROMIUM") or "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
KEY = WEB_CHAT_KEY
AUTH = {"Authorization": f"Bearer {KEY}"}



def require_chromium() -> None:
    """Called first by both module fixtures, so a missing browser fails before a server is started."""
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing, so the web chat cannot be tested: run `scripts/bootstrap.sh test` "
                    "as root (it installs it), or: sudo apt-get install -y --no-install-recommends chromium",
                    pytrace=False)


@pytest.fixture(scope="module")
def web_server(server_with: ServerWith) -> RunningServer:
    require_chromium()
    return server_with(*CHAT_FRONT_ENDS_FLAGS)  # shared with edge-llm chat's tests


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class ChatPage:
    """One browser tab on the chat, recording what it sends and every request it makes."""

    def __init__(self, browser: Any, server: RunningServer, **context_options: Any) -> None:
        self.server = server
        self.context = browser.new_context(**{"viewport": {"width": 1100, "height": 760}, **context_options})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.urls: list[str] = []
        self.chat_requests: list[dict[str, Any]] = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", self._record)
        self.page.goto(server.url + "/")
        self.page.wait_for_selector("#prompt")

    def _record(self, request: Any) -> None:
        self.urls.append(request.url)
        if request.url.endswith("/v1/chat/completions"):
            self.chat_requests.append({"body": json.loads(request.post_data or "{}"), "headers": request.headers})

    def set_key(self, key: str = KEY) -> None:
        self.page.fill("#api-key", key)
        self.page.dispatch_event("#api-key", "change")

    def ask(self, text: str) -> None:
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")

    def answers(self) -> Any:
        return self.page.locator(".msg.assistant")

    def last_answer_text(self) -> str:
        return str(self.page.evaluate(
            "() => { const a = document.querySelectorAll('.msg.assistant .body'); "
            "return a.length ? a[a.length - 1].textContent : ''; }"))

    def wait_done(self, count: int, timeout: float = 180) -> None:
        self.page.wait_for_function(
            f"() => document.querySelectorAll('.msg.assistant[data-done]').length >= {count}", timeout=timeout * 1000)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(ARTIFACTS / name))

    def close(self) -> None:
        assert not self.errors, self.errors
        self.context.close()


@pytest.fixture
def chat(browser: Any, web_server: RunningServer) -> Iterator[ChatPage]:
    page = ChatPage(browser, web_server)
    yield page
    page.close()


def set_temperature(chat: ChatPage, value: float) -> None:
    chat.page.evaluate("(v) => { const t = document.getElementById('temperature'); t.value = String(v);"
                       " t.dispatchEvent(new Event('input')); }", value)


def samples(server: RunningServer) -> Samples:
    return scrape(server, AUTH)


def test_the_page_needs_no_key_and_loads_nothing_from_elsewhere(chat: ChatPage, web_server: RunningServer) -> None:
    response = httpx.get(web_server.url + "/", headers={"Accept": "text/html"}, timeout=10)  # no Authorization
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    for asset, kind in (("/web/chat.js", "text/javascript"), ("/web/chat.css", "text/css")):
        reply = httpx.get(web_server.url + asset, timeout=10)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith(kind)
    assert httpx.get(web_server.url + "/web/other.js", timeout=10).status_code == 401  # only the chat's files are open
    assert httpx.get(web_server.url + "/v1/models", timeout=10).status_code == 401  # the API still needs the key

    assert chat.page.title() == "Edge LLM chat"
    assert chat.page.is_visible("#empty")
    chat.page.wait_for_function("() => document.getElementById('model-picker').textContent.includes('key')")
    chat.set_key()
    chat.page.wait_for_function("() => document.getElementById('model-picker').value.includes('qwen')")
    assert chat.page.is_disabled("#model-picker")  # one model: nothing to pick
    assert chat.urls and all(url.startswith(web_server.url + "/") or url.startswith("data:") for url in chat.urls)
    chat.shot("web-chat-empty.png")


def test_markdown_is_rendered_safely(chat: ChatPage) -> None:
    source = ("Intro with **bold**, `inline <code>` and <script>alert(1)</script>\n\n"
              "- one\n- two with `x`\n\n1. first\n2. second\n\n"
              "```python\nprint('<b>hi</b>')\n```\n\n[link](javascript:alert(1)) [ok](https://example.org)")
    html = chat.page.evaluate("(s) => window.edgeChat.renderMarkdown(s)", source)
    assert "<strong>bold</strong>" in html
    assert "<code>inline &lt;code&gt;</code>" in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<ul><li>one</li><li>two with <code>x</code></li></ul>" in html
    assert "<ol><li>first</li><li>second</li></ol>" in html
    assert "<pre><code>print(&#39;&lt;b&gt;hi&lt;/b&gt;&#39;)</code></pre>" in html
    assert 'href="javascript' not in html and 'href="https://example.org"' in html
    # A code block still streaming (no closing fence yet) renders as a code block.
    assert "<pre><code>x = 1</code></pre>" in chat.page.evaluate("(s) => window.edgeChat.renderMarkdown(s)",
                                                                   "Here:\n```python\nx = 1")


def test_an_answer_streams_with_live_figures_and_the_conversation_is_kept(chat: ChatPage) -> None:
    chat.set_key()
    chat.page.fill("#system-prompt", "You are a terse assistant.")
    chat.page.fill("#max-tokens", "24")
    set_temperature(chat, 0.2)
    # Every rendering of the answer is recorded in the page as it happens (a MutationObserver): each replaces the
    # answer body's children, and the text of the children it adds is the answer's text at that moment.
    chat.page.evaluate(
        "() => { window.answerLengths = []; new MutationObserver((records) => { for (const r of records) {"
        " if (!r.target.matches || !r.target.matches('.msg.assistant .body')) continue;"
        " let n = 0; for (const node of r.addedNodes) n += (node.textContent || '').length;"
        " window.answerLengths.push(n); } })"
        ".observe(document.getElementById('messages'), {childList: true, subtree: true}); }")
    chat.ask("List three uses of a Python dictionary, in markdown.")
    chat.page.wait_for_function("() => new Set(window.answerLengths.filter(n => n > 0)).size >= 3"
                                " || document.querySelector('.msg.assistant[data-done]')", timeout=180_000)
    chat.shot("web-chat-streaming.png")
    chat.wait_done(1)
    lengths = chat.page.evaluate("() => window.answerLengths")
    growth = sorted(set(length for length in lengths if length))
    assert len(growth) >= 3, f"the answer did not grow while streaming: {lengths[:50]}"
    # (Rendered text may shrink by a few characters when a closing "**" or "`" arrives and becomes markup.)
    stats = chat.page.inner_text(".msg.assistant .stats")
    assert "TTFT" in stats and "tok/s" in stats and "tokens" in stats and "prompt" in stats, stats
    chat.shot("web-chat-answer.png")

    first = chat.chat_requests[0]
    assert first["headers"]["authorization"] == f"Bearer {KEY}"
    body = first["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.2 and body["max_tokens"] == 24 and body["top_p"] == 0.9
    assert body["messages"][0] == {"role": "system", "content": "You are a terse assistant."}

    # Shift+Enter is a new line, not a send.
    chat.page.fill("#prompt", "")
    chat.page.type("#prompt", "Now one more")
    chat.page.keyboard.press("Shift+Enter")
    chat.page.keyboard.type("use, please.")
    assert chat.page.input_value("#prompt") == "Now one more\nuse, please."
    assert len(chat.chat_requests) == 1
    chat.page.keyboard.press("Enter")
    chat.wait_done(2)
    roles = [message["role"] for message in chat.chat_requests[1]["body"]["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert chat.chat_requests[1]["body"]["messages"][3]["content"] == "Now one more\nuse, please."


def test_stop_cancels_the_generation_on_the_server_and_new_chat_clears(chat: ChatPage,
                                                                       web_server: RunningServer) -> None:
    chat.set_key()
    chat.page.fill("#max-tokens", "2000")
    set_temperature(chat, 0)
    before = samples(web_server)
    chat.ask("Count from 1 to 1000, each number on its own line. Do not stop early.")

    def long_answer_started() -> bool:
        assert not chat.page.locator(".msg.assistant[data-done]").count(), "the answer ended before the stop"
        return len(chat.last_answer_text()) > 40

    wait_for(long_answer_started, 180, "the long answer to start")
    chat.page.click("#stop")
    chat.page.wait_for_selector(".msg.assistant[data-stopped]", timeout=10_000)
    partial = chat.last_answer_text()
    # From here on, every change of the stopped answer is counted in the page, until the server has ended it.
    chat.page.evaluate(
        "() => { window.changesAfterStop = 0; const a = document.querySelectorAll('.msg.assistant');"
        " new MutationObserver(() => { window.changesAfterStop += 1; }).observe(a[a.length - 1],"
        " {childList: true, subtree: true, characterData: true}); }")

    def cancelled() -> bool:
        after = samples(web_server)
        return (total(after, "edge_llm_cancellations_total") > total(before, "edge_llm_cancellations_total")
                and after.get(("edge_llm_generations_finished_total", (("reason", "cancelled"),)), 0)
                > before.get(("edge_llm_generations_finished_total", (("reason", "cancelled"),)), 0))

    wait_for(cancelled, 15, "the server to count the cancellation")
    assert chat.page.is_visible("#send") and not chat.page.is_visible("#stop")
    assert "stopped" in chat.page.inner_text(".msg.assistant .stats")
    # nothing more arrived after the stop, up to the moment the server counted it cancelled (it sends nothing since)
    assert chat.page.evaluate("() => window.changesAfterStop") == 0
    assert chat.last_answer_text() == partial
    chat.shot("web-chat-stopped.png")

    chat.page.click("#new-chat")
    assert chat.page.locator(".msg").count() == 0
    assert chat.page.is_visible("#empty")
    chat.page.fill("#max-tokens", "16")
    chat.ask("Say hi.")
    chat.wait_done(1)
    assert [m["role"] for m in chat.chat_requests[-1]["body"]["messages"]] == ["user"]
    chat.shot("web-chat-new-chat.png")


def test_a_missing_key_is_explained(chat: ChatPage) -> None:
    chat.set_key("")
    chat.ask("Hello?")
    chat.page.wait_for_selector(".msg.assistant.error", timeout=30_000)
    assert "API key" in chat.page.inner_text(".msg.assistant.error")
    assert chat.page.input_value("#prompt") == "Hello?"  # given back, to send again with the key


def test_phone_sized_screen_in_dark_mode(browser: Any, web_server: RunningServer) -> None:
    phone = ChatPage(browser, web_server, viewport={"width": 390, "height": 844}, color_scheme="dark",
                     is_mobile=True, has_touch=True)
    try:
        page = phone.page
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        box = page.locator("#prompt").bounding_box()
        assert box is not None and box["y"] + box["height"] <= 844 and box["width"] > 200
        assert page.is_visible("#send")
        assert not page.is_visible("#system-prompt")  # settings fold away on a small screen
        background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(21, 23, 27)", background  # the dark palette
        page.click("#toggle-settings")
        assert page.is_visible("#system-prompt") and page.is_visible("#api-key")
        page.fill("#max-tokens", "48")
        phone.set_key()
        phone.shot("web-chat-phone-settings-dark.png")
        page.click("#toggle-settings")
        phone.ask("Show a one-line Python hello world in a code block.")
        phone.wait_done(1)
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        phone.shot("web-chat-phone-dark.png")
    finally:
        phone.close()


def test_new_chat_during_an_answer_aborts_it_and_starts_clean(chat: ChatPage, web_server: RunningServer) -> None:
    chat.set_key()
    chat.page.fill("#max-tokens", "2000")
    set_temperature(chat, 0)
    before = total(samples(web_server), "edge_llm_cancellations_total")
    chat.ask("Count from 1 to 1000, each number on its own line. Do not stop early.")
    wait_for(lambda: len(chat.last_answer_text()) > 10, 180, "the answer to start")
    chat.page.click("#new-chat")
    wait_for(lambda: total(samples(web_server), "edge_llm_cancellations_total") > before, 15, "the cancellation")
    wait_for(lambda: chat.page.is_visible("#send"), 10, "the send button")
    assert chat.page.locator(".msg").count() == 0
    chat.page.fill("#max-tokens", "8")
    chat.ask("Say hi.")
    chat.wait_done(1)
    assert [m["role"] for m in chat.chat_requests[-1]["body"]["messages"]] == ["user"]


@pytest.fixture(scope="module")
def picker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of a directory holding both catalogued models (links), none loaded until asked for."""
    require_chromium()
    from edge_llm.testing.server import require_model

    directory = tmp_path_factory.mktemp("picker-models")
    (directory / require_model().name).symlink_to(require_model())
    gemma = small_model()
    (directory / gemma.name).symlink_to(gemma)
    with run_server(tmp_path_factory.mktemp("picker"), "--models-dir", str(directory), "--ctx-size", "2048",
                    "--parallel", "2", "--cache-slots", "0", model=None) as running:
        yield running


def test_the_picker_lists_every_model_loads_the_one_picked_and_chats_with_it(browser: Any,
                                                                              picker_server: RunningServer) -> None:
    chat = ChatPage(browser, picker_server)
    options = "() => Array.from(document.querySelectorAll('#model-picker option')).map(o => o.value)"
    chat.page.wait_for_function(f"() => ({options})().length >= 2")
    listed = chat.page.evaluate(options)
    served = [model["id"] for model in httpx.get(picker_server.url + "/v1/models", timeout=30).json()["data"]]
    assert sorted(listed) == sorted(served) and any("qwen" in name for name in listed)
    qwen = next(name for name in listed if "qwen" in name)
    assert "(unloaded)" in chat.page.locator(f"#model-picker option[value='{qwen}']").text_content()

    chat.page.select_option("#model-picker", qwen)
    chat.page.wait_for_function("() => document.body.dataset.loading === 'true' || "
                                "document.getElementById('notice').textContent.includes('Loading')")
    chat.page.wait_for_function(f"() => document.querySelector(\"#model-picker option[value='{qwen}']\")"
                                f".textContent === '{qwen}'", timeout=120_000)  # loaded: no state after the name
    states = {m["id"]: m["state"] for m in httpx.get(picker_server.url + "/v1/models", timeout=30).json()["data"]}
    assert states[qwen] == "loaded"
    chat.shot("web-chat-picker.png")

    chat.ask("Say OK.")
    chat.wait_done(1)
    assert chat.chat_requests[-1]["body"]["model"] == qwen
    assert chat.last_answer_text().strip()
    chat.close()

    again = ChatPage(browser, picker_server)  # the choice is kept in this browser
    again.page.wait_for_function(f"() => document.getElementById('model-picker').value === '{qwen}'")
    again.close()


def test_a_missing_browser_fails_these_tests_and_the_others_still_run(tmp_path: Path) -> None:
    missing = tmp_path / "no-chromium"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{Path(__file__).relative_to(REPO)}::test_markdown_is_rendered_safely",
         "tests/unit/test_ops_config.py::test_api_keys_stay_out_of_repr"],
        cwd=REPO, env=environment({"EDGE_LLM_TEST_CHROMIUM": str(missing)}), capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"\b1 passed, 1 error\b", result.stdout), result.stdout
    assert f"{missing} is missing, so the web chat cannot be tested" in result.stdout
