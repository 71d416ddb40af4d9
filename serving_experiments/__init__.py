"""The serving chapter's experiments: each one runs on a live engine and builds its result from the
engine feed; the contract checks and the roofline's arithmetic sit beside them."""
