"""The walkthrough's stages in reading order, as its browser tests step through them (the page's own
list is STAGES in static/js/walkthrough/stages.js; test_walkthrough.py checks the page against this)."""

STAGES = ["input", "template", "tokens", "queue", "prefill", "first-token", "decode", "cache", "delivery", "end", "map"]
