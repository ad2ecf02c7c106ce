"""Allow `python -m glm53`, which behaves exactly like the `glm53` console script."""

import sys

from glm53.cli import main

sys.exit(main())
