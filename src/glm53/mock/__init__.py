"""CPU stand-ins for `lmcache server` (multiprocess mode) and `vllm serve`, faithful where the deployment looks.

Nobody can run GLM-5.3 in CI, yet the sidecar ordering, the startup probe, the metrics and the validation protocol must
be exercised for real. These servers reproduce what those parts observe: flags, start-up log lines, the chunk-size
handshake of both LMCache generations, chunk-aligned prefix storage with an L1 budget, the strict-prefix lookup rule,
OpenAI-compatible endpoints and the Prometheus metric names. The "model" is a hash, not a network.
"""
