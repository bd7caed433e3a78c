"""The chat page's replies as Markdown (safe, incremental), its conversations kept in IndexedDB, and
the chat turn both UIs share (web/chat.js), in headless Chromium.

Replies come from `ChunkEngine`, a stand-in for the engine in the page's worker that sends given
pieces of text, one `delta` message each, a few ms apart: so the text takes the page's real path
(worker → webgguf.js stream → chatTurn → MarkdownView) with chunk boundaries the test chooses, in
seconds instead of minutes of SwiftShader decoding. The session's page (conftest.chat_page, SmolLM2
loaded) hosts them; the widget test starts its own engine on a page of another origin.
"""

import json
from pathlib import Path

import pytest
from browser_env import ARTIFACTS, MODEL
from page_calls import call, run_python, wait_ready
from test_embed_widget import HOST, LOAD_TIMEOUT_MS, host_pages, open_page, wait_state  # noqa: F401 (a fixture)

XSS = json.loads((Path(__file__).resolve().parents[1] / "web" / "xss_corpus.json").read_text())
REPLY_TIMEOUT_MS = 120_000
NOT_STREAMING = "() => !document.querySelector('.message.assistant.streaming')"

# A reply with every kind of block the page renders, a code block first on screen.
MARKDOWN_REPLY = """Here is **Fibonacci** in *Python*, with `memo` as a cache:

```python
def fib(n, memo={}):
    if n < 2:
        return n
    if n not in memo:
        memo[n] = fib(n - 1) + fib(n - 2)
    return memo[n]
```

1. Call `fib(30)`.
2. See [the docs](https://docs.python.org/3/) for more.

| n | fib(n) |
|---:|---:|
| 10 | 55 |
| 20 | 6765 |

> Memoization turns ~~exponential~~ time into linear time.
"""

CHUNK_ENGINE = """
import asyncio, json, webgguf_worker

class Reply:
    def __init__(self):
        self.ids, self.finish_reason = [], "stop"

class ChunkEngine:
    # The engine's generate(), replying `pieces` (one on_text each, `delay` s apart) after `wait` s;
    # `prompts` keeps the prompt ids of each request (after the worker fitted the chat to the context).
    def __init__(self, pieces, delay, wait):
        self.pieces, self.delay, self.wait = pieces, delay, wait
        self.prompts = []

    async def generate(
        self, prompt_ids, params, max_tokens, stop=(), on_text=None, should_abort=None, ignore_eos=False
    ):
        self.prompts.append(list(prompt_ids))
        reply = Reply()
        waited = 0.0
        while waited < self.wait and not should_abort():
            await asyncio.sleep(0.02)
            waited += 0.02
        for piece in self.pieces:
            if should_abort():
                reply.finish_reason = "abort"
                break
            await asyncio.sleep(self.delay)
            on_text(piece)
            reply.ids.append(0)
        return reply

chat_page_session = webgguf_worker.session
previous = chat_page_session.engine  # the real one, or a ChunkEngine installed before in this test
engine = ChunkEngine(json.loads(PIECES), DELAY, WAIT)
engine.real = getattr(previous, "real", previous)
engine.real_n_ctx = getattr(previous, "real_n_ctx", chat_page_session.n_ctx)
engine.prompts = getattr(previous, "prompts", []) if hasattr(previous, "real") else []
chat_page_session.engine = engine
"""
RESTORE_ENGINE = """
engine = chat_page_session.engine
chat_page_session.engine, chat_page_session.n_ctx = engine.real, engine.real_n_ctx
"""


def chunk_engine_code(pieces: list[str], delay: float = 0.03, wait: float = 0.0) -> str:
    code = CHUNK_ENGINE.replace("PIECES", repr(json.dumps(pieces)))
    return code.replace("DELAY", repr(delay)).replace("WAIT", repr(wait))


def split_adversarially(text: str, every: int = 11) -> list[str]:
    """`text` in pieces that end right after each '<', ':', '(', '&', '[' and at least every `every`
    characters: tags, URLs, entities and links arrive cut in two."""
    pieces, start = [], 0
    for i, char in enumerate(text):
        if char in "<:(&[" or i + 1 - start >= every:
            pieces.append(text[start : i + 1])
            start = i + 1
    if start < len(text):
        pieces.append(text[start:])
    return pieces


@pytest.fixture
def reply_with(chat_page):
    """Installs a ChunkEngine replying the given pieces; the real engine is back after the test."""

    def install(pieces: list[str], delay: float = 0.03, wait: float = 0.0, n_ctx: int | None = None):
        chat_page.python(chunk_engine_code(pieces, delay, wait))
        if n_ctx:
            chat_page.python(f"chat_page_session.n_ctx = {n_ctx}")

    yield install
    chat_page.python(RESTORE_ENGINE)


def send(page, text: str):
    """Sends `text` from the composer and waits until the reply has ended; the reply's bubble."""
    page.fill("#prompt", text)
    page.click("#send")
    page.wait_for_function(NOT_STREAMING, timeout=REPLY_TIMEOUT_MS)
    return page.locator(".message.assistant").last


# The elements and attributes a rendered reply may hold (its bubble, Markdown, copy buttons, notes).
SAFE_DOM = """(root) => {
    const tags = new Set(["DIV", "P", "H1", "H2", "H3", "H4", "H5", "H6", "BLOCKQUOTE", "UL", "OL", "LI",
        "HR", "TABLE", "THEAD", "TBODY", "TR", "TH", "TD", "EM", "STRONG", "S", "CODE", "PRE", "A", "BR",
        "SPAN", "BUTTON"]);
    const attributes = new Set(["class", "href", "title", "target", "rel", "start", "type", "aria-label",
        "data-finish"]);
    const problems = [];
    for (const element of [root, ...root.querySelectorAll("*")]) {
        const tag = element.tagName;
        if (!tags.has(tag)) problems.push(`element ${tag}`);
        for (const { name, value } of element.attributes) {
            if (!attributes.has(name)) problems.push(`${tag} has ${name}=${value}`);
            const link = /^(https?:\\/\\/|mailto:)/;
            if (name === "href" && !link.test(value)) problems.push(`${tag} href=${value}`);
        }
        if (tag === "A" && (element.target !== "_blank" || element.rel !== "noopener noreferrer")) {
            problems.push(`a link without target/rel: ${element.outerHTML}`);
        }
    }
    return problems;
}"""

# Watches `root` (a document or a shadow root) from now on: window.__added collects every element added
# under it that is not of the reply's kinds or carries an on* handler or a javascript:/data: URL; a
# payload that ran calls window.xss(n) (or alert: Playwright's dialog event).
WATCH = """(root) => {
    window.__hits = [];
    window.xss = (n) => window.__hits.push(n);
    window.__added = [];
    const bad = new RegExp("^(SCRIPT|IFRAME|OBJECT|EMBED|STYLE|LINK|META|BASE|FORM|IMG|SVG|MATH|VIDEO|AUDIO|"
        + "SOURCE|INPUT|TEMPLATE|NOSCRIPT|DETAILS|BODY)$", "i");
    const url = /^\\s*(javascript|data|vbscript):/i;
    const check = (element) => {
        if (bad.test(element.tagName)) window.__added.push(element.tagName);
        for (const { name, value } of element.attributes) {
            if (/^on/i.test(name) || url.test(value) || name === "style" || name === "srcdoc") {
                window.__added.push(`${element.tagName} ${name}=${value}`);
            }
        }
    };
    window.__watch = new MutationObserver((records) => {
        for (const record of records) {
            if (record.type === "attributes") check(record.target);
            for (const node of record.addedNodes) {
                if (node.nodeType !== 1) continue;
                check(node);
                node.querySelectorAll("*").forEach(check);
            }
        }
    });
    window.__watch.observe(root, { subtree: true, childList: true, attributes: true });
}"""


def test_a_reply_renders_as_markdown_with_a_code_block(chat_page, reply_with):
    page = chat_page.page
    page.click("#new-chat")
    reply_with(split_adversarially(MARKDOWN_REPLY, every=5))
    reply = send(page, "Show me Fibonacci in Python.")
    markdown = reply.locator(".markdown")
    code = markdown.locator(".md-code")
    assert code.count() == 1
    assert code.locator(".md-code-language").text_content() == "python"
    assert code.locator("pre code").text_content() == MARKDOWN_REPLY.split("```python\n")[1].split("\n```")[0]
    font = code.locator("pre code").evaluate("(e) => getComputedStyle(e).fontFamily")
    assert "mono" in font.lower(), font
    assert markdown.locator("p code").first.text_content() == "memo"
    assert markdown.locator("strong").text_content() == "Fibonacci"
    assert markdown.locator("em").text_content() == "Python"
    assert markdown.locator("ol > li").count() == 2
    link = markdown.locator("a")
    assert link.get_attribute("href") == "https://docs.python.org/3/"
    assert (link.get_attribute("target"), link.get_attribute("rel")) == ("_blank", "noopener noreferrer")
    assert markdown.locator("table td").all_text_contents() == ["10", "55", "20", "6765"]
    assert markdown.locator("td.align-right").count() == 4
    assert markdown.locator("blockquote s").text_content() == "exponential"
    assert reply.evaluate(SAFE_DOM) == []

    # Screenshots with the code block in sight, at desktop and phone widths.
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width, height in ((1280, 800), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(300)  # the layout settles (transitions are 150-200 ms)
        code.scroll_into_view_if_needed()
        path = ARTIFACTS / f"chat-markdown-{width}x{height}.png"
        page.screenshot(path=str(path))
        assert path.stat().st_size > 10_000
        box = code.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, (width, box)  # no sideways overflow
    page.set_viewport_size({"width": 1280, "height": 800})

    # The copy button puts the code on the clipboard.
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    code.locator("button.md-copy").click()
    page.wait_for_function("() => document.querySelector('.md-copy').textContent !== 'Copy'", timeout=10_000)
    assert code.locator("button.md-copy").text_content() == "Copied"
    copied = call(page, "() => navigator.clipboard.readText()", what="reading the clipboard")
    assert copied == code.locator("pre code").text_content()

    assert chat_page.console_errors == []


def test_streaming_touches_only_the_last_block(chat_page, reply_with):
    """While the reply streams, every DOM change is inside the last top-level block (or adds blocks
    after it): finished blocks keep their nodes, so earlier text is never re-laid out or flickers."""
    page = chat_page.page
    page.click("#new-chat")
    reply_with(split_adversarially(f"{MARKDOWN_REPLY}\n{MARKDOWN_REPLY}", every=3))
    # Mutation records come after each drawing (an animation frame): a block that was not the last
    # one after a drawing is finished, and no later record may touch it.
    page.evaluate(
        """() => {
            window.__touched = [];  // changes to finished blocks
            window.__changes = 0;
            const finished = new Set();
            const blockOf = (node, markdown) => {
                while (node && node.parentNode !== markdown) node = node.parentNode;
                return node;
            };
            window.__watchBlocks = new MutationObserver((records) => {
                for (const record of records) {
                    const target = record.target.nodeType === 1 ? record.target : record.target.parentElement;
                    const markdown = target?.closest(".markdown");
                    if (!markdown) continue;
                    window.__changes += 1;
                    for (const node of record.removedNodes) {
                        if (finished.has(node)) window.__touched.push(`removed ${node.outerHTML}`);
                    }
                    const block = blockOf(record.target, markdown);
                    if (finished.has(block)) window.__touched.push(`${record.type} in ${block.outerHTML}`);
                }
                const markdown = document.querySelector(".message.assistant .markdown");
                for (const block of [...(markdown?.children ?? [])].slice(0, -1)) finished.add(block);
            });
            window.__watchBlocks.observe(document.getElementById("messages"),
                { subtree: true, childList: true, characterData: true, attributes: true });
        }"""
    )
    reply = send(page, "Twice, please.")
    page.evaluate("() => window.__watchBlocks.disconnect()")
    assert page.evaluate("() => window.__touched") == []
    blocks = reply.locator(".markdown > *").count()
    assert blocks == 10  # twice: a paragraph, code, a list, a table, a quote
    assert page.evaluate("() => window.__changes") > blocks  # drawn as it streamed, not once at the end
    assert reply.locator(".md-code").count() == 2


def test_xss_payloads_in_replies_never_run(chat_page, reply_with):
    """The XSS corpus (tests/web/xss_corpus.json) as a model's reply, streamed in pieces that cut
    tags, URLs and entities in two: no payload runs, no element or attribute of theirs appears at any
    moment of the stream, and every payload is shown as text."""
    page = chat_page.page
    page.click("#new-chat")
    requests = []
    dialogs = []

    def on_dialog(dialog):
        dialogs.append(dialog.message)
        dialog.dismiss()

    def on_request(request):
        requests.append(request.url)

    page.on("request", on_request)
    page.on("dialog", on_dialog)
    title = page.title()
    page.evaluate(f"() => ({WATCH})(document.getElementById('messages'))")
    reply_text = "\n\n".join(XSS)
    reply_with(split_adversarially(reply_text), delay=0.005)
    try:
        reply = send(page, "Say something dangerous.")
        page.wait_for_timeout(500)  # anything a payload scheduled (a load, a timer) has had time to run
    finally:
        page.remove_listener("request", on_request)
        page.remove_listener("dialog", on_dialog)
    assert page.evaluate("() => window.__hits") == []
    assert dialogs == []
    assert page.evaluate("() => window.__added") == []
    assert reply.evaluate(SAFE_DOM) == []
    assert page.title() == title
    assert page.locator("#messages").evaluate("(e) => getComputedStyle(e).display") != "none"
    assert not [url for url in requests if "pixel.png" in url or url.startswith("javascript")]
    shown = reply.locator(".markdown").text_content()
    for literal in (
        "<script>xss(1)</script>",
        "<img src=x onerror=xss(2)>",
        '<iframe src="javascript:xss(7)">',
    ):
        assert literal in shown, literal
    stored = page.evaluate("() => window.webgguf.conversation().messages.at(-1).content")
    assert stored == reply_text
    page.evaluate("() => window.__watch.disconnect()")
    assert chat_page.console_errors == []


def test_no_reply_rule_and_truncation_notice_in_the_page(chat_page, reply_with):
    """chatTurn's rule in the page: a message stopped before any reply stays, marked, and is not sent to
    the model again (the next prompt has no two user turns in a row); the notice of messages left out."""
    page = chat_page.page
    page.click("#new-chat")
    reply_with(["never shown"], wait=60)
    page.fill("#prompt", "A question I give up on.")
    page.click("#send")
    page.click("#stop")
    page.wait_for_function(NOT_STREAMING, timeout=REPLY_TIMEOUT_MS)
    user = page.locator(".message.user").last
    assert user.locator(".note").text_content() == "No reply: the model is not sent this message again."
    assert page.locator(".message.assistant").count() == 0

    # A context of 256 tokens: after a few turns the oldest ones are left out, and the page says so.
    reply_with(["Fine", "."], n_ctx=256)
    turn = "Tell me about the rivers, the bridges and the old town of the city, in detail please. " * 2
    notes = []
    for i in range(4):
        reply = send(page, f"{i}: {turn}")
        notes.append(reply.locator(".note").all_text_contents())
    assert notes[0] == []
    assert any(n and "oldest messages were left out to fit the context" in n[0] for n in notes), notes
    # What the model was sent: never the unanswered message; at last without the oldest turn.
    prompts = chat_page.python(
        "[chat_page_session.model.tokenizer.decode(ids) for ids in chat_page_session.engine.prompts]"
    )
    assert len(prompts) == 5  # the one that was stopped, then the four turns
    assert "A question I give up on." in prompts[0]
    assert not [p for p in prompts[1:] if "A question I give up on." in p]
    assert prompts[1].count("user") == 1 and "0: Tell me" in prompts[1]
    assert "0: Tell me" not in prompts[-1] and "3: Tell me" in prompts[-1]


def test_conversations_survive_a_reload(browser, server_url, model_path):
    """Two conversations made in a page of a fresh profile (SmolLM2 loaded, replies from a ChunkEngine);
    after a reload the list is there and the open conversation comes back; rename, export and delete
    persist across the next reload."""
    model_path(MODEL)  # in the cache, so the server has it
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))

    def replies(pieces, wait=0.0):
        run_python(page, chunk_engine_code(pieces, wait=wait))

    try:
        page.goto(f"{server_url}/?model={MODEL}")
        wait_ready(page)
        replies(["The capital ", "is **Paris**."])
        send(page, "What is the capital of France?")
        send(page, "And of Italy?")
        first = page.evaluate("() => window.webgguf.conversation()")
        page.click("#new-chat")
        replies(split_adversarially(MARKDOWN_REPLY))
        send(page, "Fibonacci, please")
        replies(["never"], wait=60)
        page.fill("#prompt", "Stopped at once")
        page.click("#send")
        page.click("#stop")
        page.wait_for_function(NOT_STREAMING, timeout=REPLY_TIMEOUT_MS)
        second = page.evaluate("() => window.webgguf.conversation()")
        manifest = call(
            page, "() => fetch('/models/manifest.json').then((r) => r.json())", what="the manifest"
        )
        entry = manifest["models"][MODEL]
        assert second["messages"][1]["model"] == {
            "name": page.evaluate("() => window.webgguf.engine.model.model_name"),
            "file": entry["file"],
            "size": entry["size"],
            "sha256": entry["sha256"],
        }

        # The reload (to the page without a model: the conversations need none).
        page.goto(f"{server_url}/")
        rows = page.locator("#conversation-list li")
        rows.nth(1).wait_for(timeout=60_000)
        titles = rows.locator(".conversation-title").all_text_contents()
        assert titles == ["Fibonacci, please", "What is the capital of France?"]
        assert "current" in rows.first.get_attribute("class")
        # The open conversation came back: the reply rendered, the stopped message marked.
        assert page.locator(".message").count() == 3
        assert page.locator(".message.assistant .md-code-language").text_content() == "python"
        assert page.locator(".message.user").last.locator(".note").count() == 1
        assert page.evaluate("() => window.webgguf.conversation().messages") == second["messages"]
        assert "Answered by" in page.locator(".message.assistant").get_attribute("title")

        # Open the first one.
        rows.nth(1).locator(".conversation-open").click()
        page.wait_for_function("() => document.querySelectorAll('.message').length === 4")
        assert page.locator(".message.assistant strong").all_text_contents() == ["Paris", "Paris"]

        # Rename it (Enter saves), export the second, delete the first.
        rows.nth(1).get_by_role("button", name="Rename").click()
        page.locator(".conversation-rename input").fill("Capitals <b>of</b> Europe")
        page.keyboard.press("Enter")
        page.wait_for_function(
            """() => [...document.querySelectorAll('.conversation-title')]
                .some((t) => t.textContent.startsWith('Capitals'))"""
        )
        with page.expect_download() as download:
            rows.filter(has_text="Fibonacci, please").get_by_role("button", name="Export").click()
        exported = json.loads(Path(download.value.path()).read_text())
        assert download.value.suggested_filename.startswith("chat-fibonacci-please-")
        assert exported["format"] == "webgguf-conversation" and exported["messages"] == second["messages"]
        assert exported["messages"][1]["model"]["sha256"] == entry["sha256"]

        # The phone layout: the list is in the sheet the top bar opens.
        page.set_viewport_size({"width": 390, "height": 844})
        page.click("#panel-toggle")
        page.wait_for_timeout(300)
        assert page.locator("#conversation-list").is_visible()
        page.screenshot(path=str(ARTIFACTS / "chat-390x844-conversations.png"))
        page.click("#panel-toggle")
        page.set_viewport_size({"width": 1280, "height": 800})

        capitals = rows.filter(has_text="Capitals")
        capitals.get_by_role("button", name="Delete").click()
        capitals.get_by_role("button", name="Confirm: delete Capitals <b>of</b> Europe").click()
        page.wait_for_function(
            "(id) => !document.querySelector(`#conversation-list li[data-id='${id}']`)", arg=first["id"]
        )
        assert page.locator(".message").count() == 0  # it was open: a new chat now

        page.reload()
        rows.first.wait_for(timeout=60_000)
        titles = rows.locator(".conversation-title").all_text_contents()
        assert titles == ["Fibonacci, please"]
        assert page.evaluate("() => window.webgguf.conversation().messages") == []  # the new chat
        assert errors == []
    finally:
        context.close()


def widget_python(page, code: str):
    """Runs Python in the widget's engine (its own worker, on the host page)."""
    return call(
        page, "(code) => webggufEmbed.widgets[0].engine.runPython(code)", code, what="Python in the widget"
    )


def test_the_widget_renders_replies_and_keeps_unanswered_turns_like_the_page(browser, server_url, host_pages):  # noqa: F811
    """embed.js on another origin renders through the same MarkdownView and chat turn: the XSS corpus
    does not run in its shadow root, code blocks have their label and copy button, and a message
    stopped before any reply stays, marked, and is not sent again."""
    tag = (
        f'<script src="{server_url}/embed.js" data-model="{MODEL}" data-target="#chat" '
        'data-title="Markdown" defer></script>'
    )
    html = f'<title>Widget</title><div id="chat" style="height: 640px; max-width: 760px"></div>{tag}'
    page = open_page(browser, host_pages.add("/markdown", html))
    try:
        assert wait_state(page, "ready error", LOAD_TIMEOUT_MS) == "ready"
        widget_python(page, chunk_engine_code(["never shown"], wait=60))
        page.locator(f"{HOST} textarea").fill("A question I give up on.")
        page.keyboard.press("Enter")
        assert wait_state(page, "generating", 10_000) == "generating"
        page.locator(f"{HOST} button.stop").click()
        assert wait_state(page, "ready error", REPLY_TIMEOUT_MS) == "ready"
        user = page.locator(f"{HOST} .message.user")
        assert user.locator(".note").text_content() == "No reply: the model is not sent this message again."
        assert page.locator(f"{HOST} .message.assistant").count() == 0

        dialogs = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.evaluate(f"""() => ({WATCH})(
            document.querySelector("[data-webgguf-embed]").shadowRoot.querySelector(".messages"))""")
        reply_text = MARKDOWN_REPLY + "\n\n" + "\n\n".join(XSS)
        widget_python(page, chunk_engine_code(split_adversarially(reply_text), delay=0.005))
        page.locator(f"{HOST} textarea").fill("Fibonacci, and something dangerous.")
        page.keyboard.press("Enter")
        assert wait_state(page, "generating", 10_000) == "generating"
        assert wait_state(page, "ready error", REPLY_TIMEOUT_MS) == "ready"
        page.wait_for_timeout(500)  # anything a payload scheduled has had time to run
        assert page.evaluate("() => window.__hits") == [] and dialogs == []
        assert page.evaluate("() => window.__added") == []
        reply = page.locator(f"{HOST} .message.assistant")
        assert reply.get_attribute("data-finish") == "stop"
        assert reply.evaluate(SAFE_DOM) == []
        code = reply.locator(".md-code").first
        assert code.locator(".md-code-language").text_content() == "python"
        assert code.locator("button.md-copy").is_visible()
        font = code.locator("pre code").evaluate("(e) => getComputedStyle(e).fontFamily")
        assert "mono" in font.lower(), font
        assert "<script>xss(1)</script>" in reply.locator(".markdown").text_content()
        session = "webgguf_worker.session"
        prompts = widget_python(
            page, f"[{session}.model.tokenizer.decode(p) for p in {session}.engine.prompts]"
        )
        assert len(prompts) == 2  # the stopped one, then this one: without the stopped question
        assert "A question I give up on." in prompts[0] and "A question I give up on." not in prompts[1]

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for width, height in ((1280, 800), (390, 844)):
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(300)
            code.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / f"embed-markdown-{width}x{height}.png"))
        assert page.errors == []
    finally:
        page.close()
