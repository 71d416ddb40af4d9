// "What the model reads": asks the server to render and count the prompt (debounced, latest edit
// wins), then shows the tokens coloured by provenance, the counts, and the context-budget bar with
// the server's decision. The server is the only judge of the budget; this module only draws it.
import { html } from '../shared/dom.js';
import { describePrompt } from './api.js';
import { budgetParts, describeBudget, describeRejection } from './composer-model.js';

const DEBOUNCE_MS = 250;
// The prompt token's flag for a control marker typed inside a message (model_runner/text/prompt.py sets
// it; tests/unit/test_text_pipeline.py checks this name against the server's). Named here because
// shared/protocol.js declares events, not /api/prompt's token fields.
export const TYPED_CONTROL_FIELD = 'typed_control';
export const TYPED_CONTROL_CLASS = 'is-typed-control';
export const TYPED_CONTROL_NOTE = 'typed by the user, read as a control token';

// Newlines get a visible mark so the template's line structure shows inside the token boxes.
function visible(text) { return text.replace(/\n/g, '↵\n'); }

// The debounce timer and the request in flight end with the lab's `figure`.
export function mountPromptView(root, figure) {
  const tokensEl = root.querySelector('#lab-prompt-tokens');
  const countsEl = root.querySelector('#lab-counts');
  const budgetEl = root.querySelector('#lab-budget');
  const barEl = root.querySelector('#lab-budget-bar');
  const decisionEl = root.querySelector('#lab-budget-decision');
  const parts = {
    prompt: root.querySelector('#lab-budget-prompt'),
    output: root.querySelector('#lab-budget-output'),
    over: root.querySelector('#lab-budget-over'),
    window: root.querySelector('#lab-budget-window'),
  };
  let timer = 0;
  let controller = null;
  let latest = null; // {key, data}: the description of the last payload that was counted
  figure.onDestroy(() => controller?.abort());

  function renderTokens(tokens) {
    const frag = document.createDocumentFragment();
    tokens.forEach((t, i) => {
      // A control marker typed inside a message: the tokenizer read it as the real control token
      // (the server flags it), so a user can open a turn of their own.
      const typed = t[TYPED_CONTROL_FIELD] === true;
      const cls = `ptok src-${t.source}${typed ? ` ${TYPED_CONTROL_CLASS}` : ''}`;
      const span = html('span', { cls, text: visible(t.text), parent: frag });
      span.title = `token ${i} · id ${t.id} · ${t.source}${t.message != null ? ` · message ${t.message}` : ''}`
        + (typed ? ` · ${TYPED_CONTROL_NOTE}` : '');
      if (typed) span.dataset.typedControl = 'true';
    });
    tokensEl.replaceChildren(frag);
  }

  function drawBar(budget) {
    const p = budgetParts(budget);
    parts.prompt.style.width = `${p.promptFrac * 100}%`;
    parts.output.style.width = `${p.outputFrac * 100}%`;
    parts.over.style.width = `${p.overFrac * 100}%`;
    parts.window.style.left = `${p.windowFrac * 100}%`;
  }

  function setDecision(state, text) {
    budgetEl.dataset.state = state;
    decisionEl.textContent = text;
    barEl.setAttribute('aria-label', `Context budget. ${text}`);
  }

  function renderAccepted(data) {
    const { counts, budget } = data;
    renderTokens(data.tokens);
    countsEl.textContent = `${counts.total} prompt tokens: ${counts.content} from your messages, `
      + `${counts.template} added by the chat template.`;
    drawBar(budget);
    const full = budget.prompt_tokens + budget.max_new_tokens === budget.context_window;
    setDecision(budget.action !== 'none' ? 'adjusted' : full ? 'full' : 'fits', describeBudget(budget));
  }

  // A rejected budget carries no numbers, so the prompt alone is counted again (one new token).
  async function renderRejected(payload, error, signal) {
    const probe = await describePrompt({ ...payload, max_new_tokens: 1, overflow: 'reject' }, signal);
    if (!probe.ok) {
      tokensEl.replaceChildren();
      countsEl.textContent = 'The prompt alone does not fit in the context window.';
      setDecision('rejected', error.message);
      return;
    }
    const { budget } = probe.data;
    renderTokens(probe.data.tokens);
    countsEl.textContent = `${probe.data.counts.total} prompt tokens.`;
    drawBar({ ...budget, max_new_tokens: payload.max_new_tokens });
    setDecision('rejected', describeRejection(budget.prompt_tokens, payload.max_new_tokens, budget.context_window));
  }

  async function refresh(payload) {
    controller?.abort(); // the next edit, or the lab's destroy(), abandons this count
    controller = new AbortController();
    const { signal } = controller;
    try {
      const result = await describePrompt(payload, signal);
      if (result.ok) {
        latest = { key: JSON.stringify(payload), data: result.data };
        renderAccepted(result.data);
      } else if (result.error.code === 'context_overflow') {
        latest = null;
        await renderRejected(payload, result.error, signal);
      } else {
        latest = null;
        const where = result.error.field ? ` (${result.error.field})` : '';
        countsEl.textContent = `Cannot count this prompt${where}: ${result.error.message}`;
        setDecision('error', 'No budget decision until the request is valid.');
      }
    } catch (err) {
      if (err.name !== 'AbortError') throw err;
    }
  }

  return {
    // Called on every edit; only the last edit in a quiet spell is counted.
    schedule(payload) {
      figure.cancelTimeout(timer);
      timer = figure.timeout(() => refresh(payload), DEBOUNCE_MS);
    },
    // The description of exactly this payload, if it is the one last counted.
    describedFor(payload) {
      return latest && latest.key === JSON.stringify(payload) ? latest.data : null;
    },
  };
}
