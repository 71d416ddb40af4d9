"""`kvscope bench`: measures queue, TTFT, TPOT, ITL and E2E on the real model through the engine,
beside baselines run in the same process; ratios, never absolute timed assertions."""
