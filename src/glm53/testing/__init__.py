"""What only tests and benchmarks use: never imported by the pod, the CLI or the images.

`sidecar` (one real `lmcache server` as a plain child), `chart_sidecar` (the chart's command line for it),
`hub_standin` (the Hugging Face Hub's file API on loopback), `processes` (stopping a child's whole process group),
`redis_server` (a real Redis on loopback for the shared L2 tier). The real Prometheus on loopback is the main job's
too: `glm53.pod.prometheus`.
"""
