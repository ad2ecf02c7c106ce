"""The CPU stand-in for `vllm serve` (`glm53 mock vllm`), paired with the REAL `lmcache server` as its sidecar.

Nobody can run GLM-5.3 in CI, yet the sidecar ordering, the startup probe, the metrics and the validation protocol must
be exercised for real. The sidecar therefore is the released LMCache 0.5.6 server itself; the engine stand-in keeps
vLLM 0.33's HTTP surface, log format and metric names, and moves KV data to and from the server through the classes
LMCache's own vLLM connector drives (`kv_client`), applying the connector's and vLLM's scheduler's rules (`engine`),
so that a sidecar that dies, restarts or freezes after Ready plays out as with the real engine. The "model" is a
hash, not a network. torch and LMCache (the `pod` extra) are imported only when the stand-in connects, never by the
slim toolkit.
"""
