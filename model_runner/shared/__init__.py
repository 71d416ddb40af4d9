"""What both engines share, written once: the engine base (readiness, end listeners), one request's
object and its event stream, the scheduling policy, the engine feed, and the events a request hears."""
