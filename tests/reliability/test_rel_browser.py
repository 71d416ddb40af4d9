"""Cases 21–23 in Chromium: hostile model text renders as inert text under the CSP, a closed tab
stops its request on the server at once, and the last tokens and the finish event are shown even
when the server closes the socket right after sending them."""

from __future__ import annotations

import json
import time

from kvscope_testkit import Client, LogCursor, end_is
from playwright.sync_api import expect

RUN_TIMEOUT = 60_000  # ms, fake model on a shared 2-core machine
EVIL = ['<img src=x onerror="window.__xss=1">', "<script>window.__xss=2</script>", '"><svg onload="window.__xss=3">']

# Records the request ids the page sends, so a test can find its request in the server log.
RECORD_SENT = """
(() => {
  window.__sentIds = [];
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    try { window.__sentIds.push(JSON.parse(data).request_id); } catch {}
    return send.call(this, data);
  };
})();
"""


def open_lab(page, server) -> None:
    page.goto(f"{server.url}/")
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=60_000)
    page.locator("#lab").scroll_into_view_if_needed()


def run_and_wait(page, status: str = "finished") -> None:
    page.click("#lab-run")
    expect(page.locator(f'#lab-status[data-status="{status}"]')).to_be_attached(timeout=RUN_TIMEOUT)


def scripted_events(server) -> list[dict]:
    """A real run's events (from the fake model, 6 tokens) with every model-made text replaced by
    hostile markup: the shapes the page parses are genuine, only the text is evil."""
    client = Client(server)
    events = client.run("template", max_new_tokens=len(EVIL) * 2)
    client.close()
    tokens = [e for e in events if e["type"] == "token"]
    for i, token in enumerate(tokens):
        token["text"] = EVIL[i % len(EVIL)]
        token["pending"] = False
        for candidate in token["candidates"]:
            candidate["text"] = EVIL[(i + 1) % len(EVIL)]
    for event in events:
        if event["type"] == "prefill_end":
            event["first_token"]["text"] = EVIL[0]
    events[-1]["text"] = "".join(t["text"] for t in tokens)
    return events


def test_21_hostile_model_text_renders_inert_and_the_csp_blocks_inline_script(
    page, fake_server, console_errors, figures
):
    script = scripted_events(fake_server)

    def fake_model(ws):
        def on_message(message):
            rid = json.loads(message)["request_id"]
            for event in script:
                ws.send(json.dumps({**event, "request_id": rid}))

        ws.on_message(on_message)

    page.route_web_socket("**/ws", fake_model)
    response = page.goto(f"{fake_server.url}/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=60_000)
    page.locator("#lab").scroll_into_view_if_needed()
    run_and_wait(page)
    answer = page.locator("#lab-answer")
    shown = answer.inner_text()
    assert all(evil in shown for evil in EVIL), shown
    answer.locator(".atok").first.hover()
    expect(page.locator("#lab-candidates")).to_contain_text(EVIL[1])  # token 0's candidates
    assert page.locator("#lab img, #lab script, #lab-answer svg, #lab-candidates svg").count() == 0
    assert page.evaluate("window.__xss") is None
    assert console_errors == []

    # The CSP itself: an inline script injected into the page does not run, and says why.
    blocked = page.evaluate("""() => new Promise((resolve) => {
        document.addEventListener('securitypolicyviolation', (e) => resolve(e.violatedDirective), { once: true });
        const s = document.createElement('script');
        s.textContent = 'window.__inline = 1';
        document.body.append(s);
        setTimeout(() => resolve('no violation reported'), 2000);
    })""")
    assert blocked.startswith("script-src") and page.evaluate("window.__inline") is None
    figures["21"] = {
        "hostile_strings_shown_as_text": len(EVIL),
        "elements_injected": 0,
        "inline_script": f"blocked ({blocked})",
        "console_errors": 0,
    }


def test_22_closing_the_tab_mid_answer_cancels_on_the_server_within_a_second(context, slow_server, figures):
    log = LogCursor(slow_server)
    page = context.new_page()
    page.add_init_script(RECORD_SENT)
    open_lab(page, slow_server)
    page.fill("#lab-max-new", "400")
    page.click("#lab-run")
    expect(page.locator("#lab-answer .atok").nth(4)).to_be_attached(timeout=RUN_TIMEOUT)
    rid = page.evaluate("window.__sentIds")[-1]
    closed_at = time.monotonic()
    page.close()
    how = log.wait_end(rid, every=0.01)
    cancel_s = time.monotonic() - closed_at
    assert end_is(how, "cancelled", cause="disconnect", state="decode"), how
    assert cancel_s < 1.0, f"the server took {cancel_s:.2f} s to cancel"

    again = context.new_page()
    open_lab(again, slow_server)
    again.fill("#lab-max-new", "3")
    run_and_wait(again)
    again.close()
    figures["22"] = {"cancelled_after_close_s": round(cancel_s, 3), "server_saw": how, "reload": "finished"}


def test_23_the_last_tokens_and_finish_arrive_even_when_the_server_closes_right_after(
    page, fake_server, console_errors, figures
):
    ends = []

    def close_after_terminal(ws):
        server = ws.connect_to_server()

        def to_page(message):
            ws.send(message)
            event = json.loads(message)
            if event["type"] in ("finished", "cancelled", "error"):
                ws.close(code=1000, reason="done")  # the server hangs up the moment it has said the end
                ends.append(event)

        server.on_message(to_page)
        ws.on_message(lambda message: server.send(message))

    page.route_web_socket("**/ws", close_after_terminal)
    open_lab(page, fake_server)
    lengths = (5, 12, 30)
    for i, length in enumerate(lengths):
        page.fill("#lab-max-new", str(length))
        run_and_wait(page)  # not "connection_lost": the end was read before the close
        answer = page.locator("#lab-answer")
        expect(answer).to_have_attribute("data-complete", "true")
        assert answer.locator(".atok").count() == length
        shown = answer.evaluate("el => Array.from(el.querySelectorAll('.atok'), (s) => s.textContent).join('')")
        assert ends[i]["type"] == "finished" and shown == ends[i]["text"]
    assert len(ends) == len(lengths) and console_errors == []
    figures["23"] = {
        "runs": len(lengths),
        "closed_right_after_terminal": len(ends),
        "all_finished_complete": True,
        "tokens_shown": list(lengths),
    }
