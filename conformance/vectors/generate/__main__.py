"""`python -m kvcert.conformance.vectors.generate [--check]`."""

import sys

from kvcert.conformance.vectors.generate import main

sys.exit(main())
