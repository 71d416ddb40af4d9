"""kvscope's instrumented inference engine: every phase of a request is a measured event."""
