"""Classroom mode: the HTTP routes (/class, teacher controls), the room without Flask, and what
`kvscope serve --class` sets up."""
