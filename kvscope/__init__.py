"""The `kvscope` command line, on top of the web app (`app`) and the benchmarks (`bench`)."""
