"""What crosses the engine's front door (model_runner/interface.py), written once: the `generate` request and
its field checks (request.py, fields.py), the error a bad one gets (errors.py), every event a request emits
(events.py), the recorded-trace format (trace.py) and the metrics a request's clock stamps give (metrics.py)."""
