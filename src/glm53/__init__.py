"""glm53: the toolkit behind the glm53-serving reference deployment (GLM-5.3 on vLLM with an LMCache sidecar)."""

__version__ = "0.1.0"
