"""After Ready: the sidecar's faults played on the chart's pod under load (`glm53 faults`)."""
