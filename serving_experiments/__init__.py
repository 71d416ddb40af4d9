"""The serving chapter's experiments: a job harness (harness), the experiments themselves, one module
each (experiments/), their registry (registry), the contract checks (contract), speculative decoding's
algorithm (speculative) and the roofline's arithmetic (roofline)."""
