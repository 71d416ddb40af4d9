"""The Content-Security-Policy as Chromium enforces it on the live page: the page and its
same-origin WebSocket work, inline script and connections to other origins are blocked."""

from __future__ import annotations

import pytest
from kvscope_testkit import screenshot

WATCH_VIOLATIONS = """() => {
  window.__violations = [];
  document.addEventListener('securitypolicyviolation',
    (e) => window.__violations.push(e.effectiveDirective + ' ' + e.blockedURI));
}"""


@pytest.mark.parametrize("width", [375, 1440])
def test_the_page_loads_under_the_csp_without_violations(page, console_errors, fake_server, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.add_init_script(f"({WATCH_VIOLATIONS})()")
    page.goto(fake_server.url + "/")
    page.wait_for_load_state("networkidle")
    screenshot(page, f"security-page-{width}")
    assert page.evaluate("window.__violations") == []
    assert not [e for e in console_errors if "Content Security Policy" in e]


def test_connect_src_self_allows_the_same_origin_websocket(page, fake_server):
    page.goto(fake_server.url + "/")
    page.evaluate(WATCH_VIOLATIONS)
    first_event = page.evaluate("""() => new Promise((resolve) => {
      const ws = new WebSocket(`ws://${location.host}/ws`);
      ws.onopen = () => ws.send(JSON.stringify({type: 'generate', request_id: 'csp-1',
        messages: [{role: 'user', content: 'hi'}], max_new_tokens: 2}));
      ws.onmessage = (m) => { ws.close(); resolve(JSON.parse(m.data)); };
      ws.onerror = () => resolve({type: 'socket-error'});
    })""")
    assert (first_event["type"], first_event["request_id"]) == ("accepted", "csp-1")
    assert page.evaluate("window.__violations") == []


def test_inline_script_and_foreign_connections_are_blocked(page, fake_server):
    page.goto(fake_server.url + "/")
    page.evaluate(WATCH_VIOLATIONS)
    page.evaluate("""() => {
      const s = document.createElement('script');
      s.textContent = 'window.__inlineRan = true';
      document.body.append(s);
      try { new WebSocket('ws://localhost:1/ws'); } catch (e) { /* some browsers throw instead */ }
    }""")
    page.wait_for_function("window.__violations.length >= 2")
    violations = page.evaluate("window.__violations")
    assert page.evaluate("window.__inlineRan") is None
    assert any(v.startswith("script-src") for v in violations)
    assert any(v.startswith("connect-src") for v in violations)
