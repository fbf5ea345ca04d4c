"""``python -m omni_triton`` is ``omni-triton``."""
import sys

from omni_triton.cli import main

sys.exit(main())
