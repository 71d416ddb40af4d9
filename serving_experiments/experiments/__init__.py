"""The serving chapter's experiments, one module each: every one takes validated params, runs its
requests on a live engine in a job (serving_experiments.harness) and returns its result dict, every
number measured in this run; the registry (serving_experiments.registry) names them."""
