"""The chart's names, stated once in Python: what the runners, the kind smoke test and the tests look for in a pod.

Why: the chart (`charts/glm53`) is the pod's one definition, and every runner reads what it rendered by these names:
its container names, the LMCache sidecar's per-rank naming, the labels that select a component, the LMCache
generations and mock engines its values accept. Restated in each runner they drift apart the day the chart renames
one; here they are written once, and `tests/pod/test_contract.py` holds them to what the chart renders and to its
values schema.
"""

from __future__ import annotations

import re
from pathlib import Path

# The chart (charts/glm53/Chart.yaml `name`), which `glm53.fullname` looks for in the release name, and its place in
# this checkout (the toolkit is installed editable from it: `scripts/bootstrap.sh`).
CHART_NAME = "glm53"
CHECKOUT_CHART = Path(__file__).resolve().parents[3] / "charts" / CHART_NAME
# The README's release: `helm install glm53-flash charts/glm53`.
DEFAULT_RELEASE = "glm53-flash"

# The engine pod's containers (`glm53.*Container` in the chart's templates), and the `helm test` pod's one container.
ENGINE_CONTAINER = "vllm"
SIDECAR_CONTAINER = "lmcache"
EXPORTER_CONTAINER = "exporter"
VALIDATE_CONTAINER = "validate"
# The pod's model volume (templates/engine/_pod.tpl): one claim every replica mounts, in a cluster.
WEIGHTS_VOLUME = "weights"
# With lmcache.serverLayout=perRank the sidecars are `lmcache-0` ... `lmcache-<TP-1>`, one per tensor-parallel rank.
_PER_RANK_SIDECAR = re.compile(rf"^{SIDECAR_CONTAINER}-(\d+)$")

# The labels the chart selects by (selector = name + instance + component), and the engine pod's component.
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
ENGINE_COMPONENT = "engine"

# The LMCache generations the chart knows (lmcache.generation): the released default, and the pre-release that
# negotiates the chunk size and keys its HTTP API.
LMCACHE_GENERATIONS = ("0.5.6", "0.5.7rc2")
DEFAULT_LMCACHE_GENERATION = LMCACHE_GENERATIONS[0]
# The Secret the pod's LMCache API key comes from with a negotiating generation (the loopback runner fills it).
LMCACHE_API_KEY_SECRET = "glm53-lmcache-api-key"

# The engines the chart's mock mode can run (mock.engine): the real vLLM CPU engine, or the stand-in.
ENGINES = ("vllm", "standin")


def is_lmcache_sidecar(name: str) -> bool:
    """Whether a container of the pod is one of the chart's LMCache sidecars (pod layout or per rank)."""
    return name == SIDECAR_CONTAINER or _PER_RANK_SIDECAR.match(name) is not None
