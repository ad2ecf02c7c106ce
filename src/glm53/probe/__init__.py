"""The startup probe: is this pod's cache geometry right, from what vLLM and the LMCache server logged?

Modules by step: `logparse` (recognising the start-up lines in decorated log text, pure), `logtail` (reading only what
a log gained since the last run, across rotation), `judge` (the verdict over the parsed facts, pure), `warmup` (the
one request through the cache path once the geometry is right).
"""
