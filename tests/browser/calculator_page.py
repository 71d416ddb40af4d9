"""The calculator page as its browser tests open and read it (test_calculator.py and
test_calculator_layers.py import these by name: pytest puts this folder on the path for its tests)."""

from __future__ import annotations

from playwright.sync_api import expect

CALC = "#calculator"


def open_calc(page, server, query: str = "", hash_: str = ""):
    """The page at `server` with `query` and `hash_`, once the calculator says it is ready."""
    page.goto(f"{server.url}/{query}{hash_}")
    # Generous: the page's other figures load too, on a CPU shared with the model.
    expect(page.locator(f'{CALC}[data-ready="true"]')).to_be_attached(timeout=30_000)


def out(page, name: str):
    """One of the calculator's read-outs (`data-out`)."""
    return page.locator(f'{CALC} [data-out="{name}"]')


def field(page, name: str):
    """One of the calculator's inputs (`data-field`)."""
    return page.locator(f'{CALC} [data-field="{name}"]')


def enter(page, name: str, value) -> None:
    """Types `value` into a number or text field and presses Enter: the calculator uses a value only once it is
    committed (Enter or leaving the field), never per keystroke."""
    box = field(page, name)
    box.fill(str(value))
    box.press("Enter")
