"""The cold-versus-cached validation protocol of the seeds, runnable against any OpenAI-compatible vLLM, real or mock.

One module per concern: `client` (HTTP), `metrics` (Prometheus text), `stats` (Welch's t-test), `prompts` (workloads),
`protocol` (the three checks), `report` / `plot` / `progress` (output). `glm53 validate` and `glm53 pod` drive it.
"""
